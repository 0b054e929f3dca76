"""Compiling the CuTe DSL GDN kernels: the prepare kernel and the chunk kernel's forms, one
specialization each per (arch, shape), built on first use and kept for the process (and on
disk: :mod:`attngen.backends.cute_dsl.disk_cache`); ahead of time with fake tensors (no
GPU: ``attngen.backends.cute_dsl.aot``).

Tensor sizes, strides and the batch are dynamic, so one compiled kernel serves every batch;
rows of q, k, v, T and the output are 16-byte aligned (the launcher checks it). Kernels are
compiled from fake arguments for TVM FFI calls: the launcher passes torch tensors and Python
scalars as they are (TVM FFI checks their dtypes, devices, ranks and shared sizes) and the
kernel runs on the caller's current stream.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from attngen.families.gdn.cute_dsl.config import GdnCuteConfig, GdnCuteTraits
from attngen.families.gdn.cute_dsl.source import source_sha256


@dataclass(frozen=True)
class PrepareShape:
    """The prepare kernel's specialization: value heads per key head."""

    KERNEL = "prepare"  # kernels/prepare_<arch>.py

    group: int

    def build(self, module: Any) -> Any:
        return module.GdnPrepSm90(self.group)

    def fake_args(self, module: Any) -> tuple[Any, ...]:
        return module.fake_args(self.group)

    def shared_bytes(self, module: Any) -> int:
        return module.shared_bytes()


@dataclass(frozen=True)
class ChunkShape:
    """The chunk kernel's: value heads per key head, consumer warpgroups (1: 64 value rows
    a CTA; 2: a head's 128 rows), S^T Q^T off the chain (one consumer only), each run's
    mode bits read (context parallelism's launches: host/segments.py), always on prepare's
    fp16 T."""

    KERNEL = "chunk"  # kernels/chunk_<arch>.py
    ROWS = 64  # value rows a consumer warpgroup holds (chunk_sm90.VB)

    group: int
    consumers: int
    early_d: bool = False
    modes: bool = False

    @property
    def form(self) -> dict[str, Any]:
        """The kernel's constructor arguments (chunk_sm90.FORMS: c1pd, c2p)."""
        return {"consumers": self.consumers, "half": True, "t16": True,
                "early_d": self.early_d, "modes": self.modes}  # fmt: skip

    def build(self, module: Any) -> Any:
        return module.GdnFusedSm90(self.group, **self.form)

    def fake_args(self, module: Any) -> tuple[Any, ...]:
        from cutlass import Float16

        return module.fake_args(self.group, Float16)  # (prepare's fp16 T)

    def shared_bytes(self, module: Any) -> int:
        return module.shared_bytes(self.consumers)


Shape = PrepareShape | ChunkShape


def kernel_module(arch: str, shape: Shape) -> Any:
    """The module that builds ``shape`` on ``arch``."""
    return importlib.import_module(f"attngen.families.gdn.cute_dsl.kernels.{shape.KERNEL}_{arch}")


def kernel_object(arch: str, shape: Shape) -> Any:
    """The object ``cute.compile`` takes first."""
    return shape.build(kernel_module(arch, shape))


@dataclass(frozen=True)
class CompileSpec:
    """One kernel to build ahead of time (``attngen.backends.cute_dsl.aot`` reads these)."""

    name: str  # "prepare" | "chunk_c1" | "chunk_c2" | "chunk_c1_segments"
    arch: str
    shape: Shape

    @property
    def dedupe_key(self) -> tuple[str, Shape]:
        return self.arch, self.shape

    @property
    def kernel(self) -> Any:
        return kernel_object(self.arch, self.shape)

    def fake_args(self) -> tuple[Any, ...]:
        return fake_args(self.arch, self.shape)

    @property
    def options(self) -> str:
        """Compile options besides the arch (the AOT check compiles as the launcher does)."""
        return " " + CALL_OPTIONS

    @property
    def requires(self) -> dict[str, tuple[str, ...]]:
        return kernel_module(self.arch, self.shape).REQUIRES

    @property
    def shared_bytes(self) -> int:
        return self.shape.shared_bytes(kernel_module(self.arch, self.shape))


def chunk_shape(config: GdnCuteConfig, request_heads: int) -> ChunkShape:
    """The chunk kernel's form for a batch of ``request_heads`` (request, value head) pairs."""
    if request_heads >= config.two_consumers_min_heads:
        return ChunkShape(config.v_heads_per_k_head, 2)
    return ChunkShape(config.v_heads_per_k_head, 1, bool(config.chunk_early_d))


def segments_shape(config: GdnCuteConfig) -> ChunkShape | None:
    """The form context parallelism launches (the one-consumer form reading mode bits), or
    None where the config takes no segments."""
    if config.segments_max <= 1 or config.two_consumers_min_heads <= 1:
        return None
    return dataclasses.replace(chunk_shape(config, 1), modes=True)


def compile_specs(config: GdnCuteConfig, *, traits: GdnCuteTraits) -> list[CompileSpec]:
    """Every kernel the module's phases launch for ``config``: the prepare kernel and each
    chunk form some batch takes (one consumer below ``two_consumers_min_heads`` pairs, two
    from it on, the one-consumer form with mode bits for segments; the conv is Triton's)."""
    if "extend" not in traits.phases:
        return []
    group = config.v_heads_per_k_head
    forms = {chunk_shape(config, 1), chunk_shape(config, config.two_consumers_min_heads)}
    specs = [
        CompileSpec("prepare", config.arch, PrepareShape(group)),
        *(
            CompileSpec(f"chunk_c{s.consumers}", config.arch, s)
            for s in sorted(forms, key=lambda s: s.consumers)
        ),
    ]
    segmented = segments_shape(config)
    if segmented is not None:
        specs.append(CompileSpec("chunk_c1_segments", config.arch, segmented))
    return specs


def fake_args(arch: str, shape: Shape) -> tuple[Any, ...]:
    """Arguments with the launcher's types and dynamic sizes, but no memory: what the
    launcher compiles from, and the AOT check."""
    return shape.fake_args(kernel_module(arch, shape))


CALL_OPTIONS = "--enable-tvm-ffi"  # torch tensors in, the current stream


def compile_kernel(arch: str, shape: Shape) -> Any:
    """``cute.compile`` of ``shape``'s kernel for the arch's cubin target, from its fake
    arguments, for TVM FFI calls."""
    import cutlass.cute as cute

    from attngen.arch import facts

    target = facts(arch).cubin_target
    options = f"--gpu-arch {target} {CALL_OPTIONS}"
    return cute.compile(kernel_object(arch, shape), *fake_args(arch, shape), options=options)


_COMPILED: dict[tuple[str, Shape], Any] = {}
_LOCK = threading.Lock()
# How the launcher passes a kernel's arguments (host/launch.py); part of the on-disk identity.
LAUNCH_ARGS = "gdn_launch_args/2:tvm_ffi"


def disk_identity(arch: str, shape: Shape) -> dict[str, str]:
    """What determines the compiled kernel of (arch, shape) called through the launcher."""
    return {
        "kernel": kernel_module(arch, shape).__name__,
        "shape": json.dumps(dataclasses.asdict(shape), sort_keys=True),
        "source_sha256": source_sha256(arch),
        "args": LAUNCH_ARGS,
    }


def compiled(arch: str, shape: Shape) -> Any:
    """The process's compiled kernel of (arch, shape): on first use loaded from the on-disk
    cache, or compiled and stored there. Call it with the kernel's arguments as torch
    tensors and Python scalars, no stream."""
    from attngen.arch import facts
    from attngen.backends.cute_dsl.disk_cache import load_or_compile

    key = (arch, shape)
    fn = _COMPILED.get(key)
    if fn is None:
        with _LOCK:
            fn = _COMPILED.get(key)
            if fn is None:
                found = load_or_compile(
                    disk_identity(arch, shape),
                    facts(arch).cubin_target,
                    lambda: compile_kernel(arch, shape),
                    tvm_ffi=True,
                )
                fn = _COMPILED[key] = found.function
    return fn
