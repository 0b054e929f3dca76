"""Compiling the CuTe DSL MHA kernels: one specialization per (arch, config, traits, phase),
built on first use and kept for the process; ahead of time with fake tensors (no GPU).

A first use loads the kernel from the on-disk compile cache
(:mod:`attngen.backends.cute_dsl.disk_cache`, keyed by :func:`disk_identity`), or compiles
it (about 1 s of host time per kernel on the H200's host and on a CPU-only builder:
bench/results/cute_mha_check_2026-11-30.json) and stores it there, so each kernel is
compiled once per machine.

A kernel is specialized on everything in :class:`FwdShape` (dtype, head dims, tiles,
mask hooks, paged or not); tensor sizes, strides and batch layout are dynamic, so one
compiled kernel serves every batch. Rows of q/k/v/out are 16-byte aligned (the launchers
check it) and their leading strides are promised to the compiler as multiples of 8
elements, which the TMA descriptors need.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from attngen.families.mha.cute_dsl.config import PAGED_PHASES, MhaCuteConfig, MhaCuteTraits
from attngen.families.mha.cute_dsl.kernels.common import FwdShape
from attngen.families.mha.cute_dsl.source import source_sha256

ROW_ALIGN_ELEMS = 8  # 16 bytes of bf16 / fp16: what the strides of q/k/v/out are multiples of


def fwd_shape(config: MhaCuteConfig, traits: MhaCuteTraits, *, paged: bool) -> FwdShape:
    """The forward kernel's specialization for one config of a module, prefill or extend."""
    hooks = traits.mask
    return FwdShape(
        dtype=config.dtype,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        tile_m=config.fwd_tile_m,
        tile_n=config.fwd_tile_n,
        num_stages=config.fwd_num_stages,
        causal=hooks.causal,
        window_left=hooks.window_left,
        logit_softcap=hooks.logit_softcap,
        sinks=hooks.sinks,
        paged=paged,
        overlap=bool(config.fwd_intra_wg_overlap),
        pages_per_tile=max(1, config.fwd_tile_n // config.page_size) if paged else 1,
    )


@dataclass(frozen=True)
class CompileSpec:
    """One kernel to build ahead of time (``attngen.backends.cute_dsl.aot`` reads these)."""

    name: str  # "prefill" | "extend": unique within a variant
    arch: str  # "sm90" | "sm100": which forward kernel
    shape: FwdShape  # the specialization: equal (arch, shape) compile to the same cubin

    @property
    def dedupe_key(self) -> tuple[str, FwdShape]:
        return self.arch, self.shape

    @property
    def kernel(self) -> Any:
        """The object ``cute.compile`` takes first."""
        return kernel_module(self.arch).KERNEL(self.shape)

    def fake_args(self) -> tuple[Any, ...]:
        return fake_args(self.shape)

    @property
    def requires(self) -> dict[str, tuple[str, ...]]:
        """Instructions every compiled kernel must contain ({"ptx": ..., "sass": ...})."""
        module = kernel_module(self.arch)
        return module.requires(self.shape) if hasattr(module, "requires") else module.REQUIRES

    @property
    def shared_bytes(self) -> int:
        return kernel_module(self.arch).shared_bytes(self.shape)


def kernel_module(arch: str) -> Any:
    """The forward kernel module of an arch (KERNEL, REQUIRES or requires(shape),
    shared_bytes)."""
    return importlib.import_module(f"attngen.families.mha.cute_dsl.kernels.fwd_{arch}")


def compile_specs(config: MhaCuteConfig, *, traits: MhaCuteTraits) -> list[CompileSpec]:
    """Every kernel the module's phases launch for ``config``."""
    specs = []
    if "prefill" in traits.phases:
        specs.append(CompileSpec("prefill", config.arch, fwd_shape(config, traits, paged=False)))
    if any(p in traits.phases for p in PAGED_PHASES):  # verify and draft extend: extend's
        specs.append(CompileSpec("extend", config.arch, fwd_shape(config, traits, paged=True)))
    return specs


def fake_args(shape: FwdShape) -> tuple[Any, ...]:
    """Arguments with the launchers' types and dynamic sizes, but no memory (AOT compile)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from attngen.families.mha.cute_dsl.kernels.common import DTYPES

    dtype = DTYPES[shape.dtype]

    def rows(*dims: Any) -> Any:
        strides = [cute.sym_int64(divisibility=ROW_ALIGN_ELEMS) for _ in dims[:-1]]
        return make_fake_tensor(dtype, dims, (*strides, 1), assumed_align=16)

    def ints(*dims: Any) -> Any:
        strides = [cute.sym_int64() for _ in dims[:-1]]
        return make_fake_tensor(cutlass.Int32, dims, (*strides, 1), assumed_align=4)

    tokens, heads, kv_heads = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    if shape.paged:
        pages = cute.sym_int32()
        page = cute.sym_int32()  # == tile_n, checked by the launcher (dynamic, as at run time)
        k = rows(pages, page, kv_heads, cute.sym_int32())
        v = rows(pages, page, kv_heads, cute.sym_int32())
        prefix_lens, page_table = ints(cute.sym_int32()), ints(cute.sym_int32(), cute.sym_int32())
    else:
        k = rows(tokens, kv_heads, cute.sym_int32())
        v = rows(tokens, kv_heads, cute.sym_int32())
        prefix_lens = page_table = None
    q = rows(tokens, heads, cute.sym_int32())  # head dims too: DLPack tensors are dynamic
    out = rows(tokens, heads, cute.sym_int32())
    sinks = None
    if shape.sinks:
        sinks = make_fake_tensor(cutlass.Float32, (heads,), (1,), assumed_align=4)
    cu_seqlens = ints(cute.sym_int32())
    scalars = (cutlass.Float32(1.0), cutlass.Int32(1))
    return (q, k, v, out, cu_seqlens, prefix_lens, page_table, sinks, *scalars, make_fake_stream())


def compile_fwd(arch: str, shape: FwdShape, args: tuple[Any, ...]) -> Any:
    """``cute.compile`` of ``arch``'s forward kernel for the arch's cubin target."""
    import cutlass.cute as cute

    from attngen.arch import facts

    kernel = kernel_module(arch).KERNEL(shape)
    return cute.compile(kernel, *args, options=f"--gpu-arch {facts(arch).cubin_target}")


_COMPILED: dict[tuple[str, FwdShape], Any] = {}
_LOCK = threading.Lock()
# How the launchers type a kernel's arguments (host/launch.py: launch_args). Part of the
# on-disk identity: a kernel compiled for other argument types cannot be called with these.
LAUNCH_ARGS = "launch_args/1"


def disk_identity(arch: str, shape: FwdShape) -> dict[str, str]:
    """What determines the compiled kernel of (arch, shape) called through the launchers:
    the on-disk compile cache's identity (attngen.backends.cute_dsl.disk_cache)."""
    fields = json.dumps(dataclasses.asdict(shape), sort_keys=True)
    return {
        "kernel": kernel_module(arch).__name__,
        "shape": fields,
        "source_sha256": _source_sha256(),
        "args": LAUNCH_ARGS,
    }


@functools.cache
def _source_sha256() -> str:
    return source_sha256()


def compiled_fwd(arch: str, shape: FwdShape, args: tuple[Any, ...]) -> Any:
    """The process's compiled kernel of (arch, shape): on its first use, loaded from the
    on-disk cache or compiled from ``args`` (launch_args' types) and stored there."""
    from attngen.arch import facts
    from attngen.backends.cute_dsl.disk_cache import load_or_compile

    key = (arch, shape)
    fn = _COMPILED.get(key)
    if fn is None:
        with _LOCK:
            fn = _COMPILED.get(key)
            if fn is None:
                target = facts(arch).cubin_target
                found = load_or_compile(
                    disk_identity(arch, shape), target, lambda: compile_fwd(arch, shape, args)
                )
                fn = found.function
                if found.status == "hit":
                    fn = _FirstCallOfLoaded(key, fn, found.path)
                _COMPILED[key] = fn
    return fn


class _FirstCallOfLoaded:
    """A kernel loaded from the disk cache, until its first call returns: if that call
    raises (an entry its loader accepted but that cannot take these arguments), the kernel
    is compiled afresh and called instead; after the first call the loaded kernel itself
    is what the table holds."""

    def __init__(self, key: tuple[str, FwdShape], fn: Any, path: Any) -> None:
        self.key, self.fn, self.path = key, fn, path

    def __call__(self, *args: Any) -> Any:
        try:
            result = self.fn(*args)
        except Exception as e:  # noqa: BLE001 - any failure of a cached kernel: recompile
            import warnings

            from attngen.backends.cute_dsl.disk_cache import CacheWarning

            warnings.warn(f"attngen: cached CuTe DSL kernel {self.path} failed ({e}); "
                          "compiling it afresh", CacheWarning)  # fmt: skip
            fn = _COMPILED[self.key] = compile_fwd(*self.key, args)
            return fn(*args)
        _COMPILED[self.key] = self.fn
        return result
