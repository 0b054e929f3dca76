"""Where the repository is, for tests and benchmarks that read specs/, generated/, evidence/."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
