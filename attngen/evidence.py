"""Recorded test evidence, checked into evidence/: what the docs may call verified or compiles.

- evidence/gpu/<arch>.json: GPU numerical and CUDA-graph checks that passed on a device,
  written by the GPU test suite (tests/gpu/conftest.py) with commit, date and device.
- evidence/compile/<backend>/<arch>.json: ahead-of-time compile results of every generated kernel
  (registers, spills, shared memory), written by ``python -m attngen.aot``.

Each record is keyed by what was proved: the **kernel identity** of one variant, a sha256
over the kernel library's sources, the module's traits (hooks, phases, arch quirks) and the
variant's config (:func:`kernel_identity`). Moving a package or generating the same kernel
from two specs keeps its evidence; changing the library, the hooks or a tile drops it. The
``module`` field of a record only says where the check ran.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

# The GPU checks a record may name, in the order the per-variant docs tables show them.
GPU_CHECKS: tuple[str, ...] = (
    "prefill",
    "extend",
    "decode",
    "cuda_graph",
    "verify",
    "cuda_graph_verify",
    "draft_extend",
    "cuda_graph_draft_extend",
    "quantized_vs_bf16",
    "mqa",
)


def kernel_identity(library_sha256: str, traits: object, config: object) -> str:
    """sha256 of what a variant's kernels are: library sources, module traits, config.

    ``traits`` and ``config`` are frozen dataclasses; their repr is deterministic and lists
    every field, so two equal reprs are the same kernels.
    """
    text = f"{library_sha256}\n{traits!r}\n{config!r}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def module_identity(module: ModuleType, uri: str) -> str:
    """The identity of variant ``uri`` of a generated kernels module (LIBRARY_SHA256,
    TRAITS and CONFIGS are every binding's contract)."""
    return kernel_identity(module.LIBRARY_SHA256, module.TRAITS, module.CONFIGS[uri])


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
    passed: frozenset[tuple[str, str]]  # (identity, check)
    details: dict[tuple[str, str], str] = field(default_factory=dict)  # measured figures

    def has(self, identity: str, check: str) -> bool:
        return (identity, check) in self.passed

    def detail(self, identity: str, check: str) -> str:
        return self.details.get((identity, check), "")


@dataclass(frozen=True)
class CompileEvidence:
    paths: tuple[str, ...]  # one file per backend with a compile check
    compilers: tuple[str, ...]  # e.g. "triton 3.6.0"
    usage: dict[str, tuple[KernelUsage, ...]] = field(default_factory=dict)  # by identity

    def kernels(self, identity: str) -> tuple[KernelUsage, ...]:
        return self.usage.get(identity, ())


def gpu_path(arch: str) -> str:
    return f"evidence/gpu/{arch}.json"


COMPILE_DIR = "evidence/compile"  # one file per backend and arch below it


def compile_file(backend: str, arch: str) -> str:
    """A backend's compile evidence for an arch, relative to COMPILE_DIR."""
    return f"{backend}/{arch}.json"


def load_gpu(root: Path, arch: str) -> GpuEvidence | None:
    rel = gpu_path(arch)
    if not (root / rel).is_file():
        return None
    data = _read(root, rel, "results")
    ok = [r for r in data["results"] if r.get("passed") is True]
    passed = frozenset((r["identity"], r["check"]) for r in ok)
    details = {(r["identity"], r["check"]): r["detail"] for r in ok if r.get("detail")}
    return GpuEvidence(rel, data["device"], data["commit"], data["date"], passed, details)


def load_compile(root: Path, arch: str) -> CompileEvidence | None:
    """Every backend's compile evidence for ``arch``, merged (identities never collide:
    they hash the backend's library)."""
    rels = sorted(
        p.relative_to(root).as_posix()
        for p in root.glob(f"{COMPILE_DIR}/{compile_file('*', arch)}")
    )
    if not rels:
        return None
    usage: dict[str, list[KernelUsage]] = {}
    compilers = []
    for rel in rels:
        data = _read(root, rel, "kernels")
        compilers.append(data.get("compiler", "?"))
        for r in data["kernels"]:
            usage.setdefault(r["identity"], []).append(
                KernelUsage(r["kernel"], r["registers"], r["spill_bytes"], r["shared_bytes"])
            )
    frozen = {k: tuple(v) for k, v in usage.items()}
    return CompileEvidence(tuple(rels), tuple(compilers), frozen)


class EvidenceFormatError(ValueError):
    """An evidence file is not in the identity-keyed format."""


def _read(root: Path, rel: str, records: str) -> dict:
    data = json.loads((root / rel).read_text(encoding="utf-8"))
    old = [r for r in data.get(records, []) if "identity" not in r]
    if old:
        raise EvidenceFormatError(
            f"{rel}: {len(old)} records have no kernel identity (the format before kernel "
            "identities): record the evidence again (README: Recording evidence)"
        )
    return data
