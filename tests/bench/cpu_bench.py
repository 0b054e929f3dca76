"""bench/run.py set up to run on CPU tensors in fp16 (the Triton interpreter's numpy has no
bf16), Triton backends only: what the CPU tests of its parts share."""

from __future__ import annotations

import sys

import torch

from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import run  # noqa: E402


def cpu_fp16_bench(monkeypatch) -> list:
    """Patch ``bench.run`` for CPU fp16 and return its generated variants."""
    monkeypatch.setattr(run, "torch", torch)
    monkeypatch.setattr(run, "DEV", "cpu")
    monkeypatch.setattr(run, "DTYPE", "float16")
    defaults = list(run.find_variant.__defaults__)
    defaults[1] = "float16"  # kv dtype
    monkeypatch.setattr(run.find_variant, "__defaults__", tuple(defaults))
    monkeypatch.setattr(run, "RESULT", {"triton": "attngen"})
    variants, errors = run.load_attngen()
    assert not errors
    return variants
