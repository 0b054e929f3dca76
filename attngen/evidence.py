"""Recorded test evidence, checked into evidence/: what the docs may call verified or compiles.

- evidence/gpu/<arch>.json: GPU numerical and CUDA-graph checks that passed on a device,
  written by the GPU test suite (tests/gpu/conftest.py) with commit, date and device.
- evidence/compile/<arch>.json: AOT compile results of every generated kernel (registers,
  spills, shared memory), written by ``python -m attngen.aot``.

Each record names the generated kernels file and its sha256, so evidence about an older
kernel never vouches for a changed one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class KernelUsage:
    kernel: str
    registers: int
    spill_bytes: int
    shared_bytes: int


@dataclass(frozen=True)
class GpuEvidence:
    path: str  # repo-relative
    device: str
    commit: str
    date: str
    passed: frozenset[tuple[str, str, str, str]]  # (module, sha256, variant, check)
    details: dict[tuple[str, str, str, str], str] = field(default_factory=dict)  # measured

    def has(self, module: str, sha: str, variant: str, check: str) -> bool:
        return (module, sha, variant, check) in self.passed

    def detail(self, module: str, sha: str, variant: str, check: str) -> str:
        return self.details.get((module, sha, variant, check), "")


@dataclass(frozen=True)
class CompileEvidence:
    path: str
    triton: str
    usage: dict[tuple[str, str, str], tuple[KernelUsage, ...]] = field(default_factory=dict)

    def kernels(self, module: str, sha: str, variant: str) -> tuple[KernelUsage, ...]:
        return self.usage.get((module, sha, variant), ())


def gpu_path(arch: str) -> str:
    return f"evidence/gpu/{arch}.json"


def compile_path(arch: str) -> str:
    return f"evidence/compile/{arch}.json"


def load_gpu(root: Path, arch: str) -> GpuEvidence | None:
    rel = gpu_path(arch)
    if not (root / rel).is_file():
        return None
    data = json.loads((root / rel).read_text(encoding="utf-8"))
    ok = [r for r in data["results"] if r.get("passed") is True]
    passed = frozenset((r["module"], r["sha256"], r["variant"], r["check"]) for r in ok)
    details = {
        (r["module"], r["sha256"], r["variant"], r["check"]): r["detail"]
        for r in ok
        if r.get("detail")
    }
    return GpuEvidence(rel, data["device"], data["commit"], data["date"], passed, details)


def load_compile(root: Path, arch: str) -> CompileEvidence | None:
    rel = compile_path(arch)
    if not (root / rel).is_file():
        return None
    data = json.loads((root / rel).read_text(encoding="utf-8"))
    usage: dict[tuple[str, str, str], list[KernelUsage]] = {}
    for r in data["kernels"]:
        key = (r["module"], r["sha256"], r["variant"])
        usage.setdefault(key, []).append(
            KernelUsage(r["kernel"], r["registers"], r["spill_bytes"], r["shared_bytes"])
        )
    return CompileEvidence(rel, data.get("triton", "?"), {k: tuple(v) for k, v in usage.items()})
