"""Compiling the CuTe DSL MHA kernels: one specialization per (config, traits, phase),
built on first use and kept for the process; ahead of time with fake tensors (no GPU).

A kernel is specialized on everything in :class:`FwdSm90Shape` (dtype, head dims, tiles,
mask hooks, paged or not); tensor sizes, strides and batch layout are dynamic, so one
compiled kernel serves every batch. Rows of q/k/v/out are 16-byte aligned (the launchers
check it) and their leading strides are promised to the compiler as multiples of 8
elements, which the TMA descriptors need.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.families.mha.cute_dsl.kernels.fwd_sm90 import FwdSm90Shape

ROW_ALIGN_ELEMS = 8  # 16 bytes of bf16 / fp16: what the strides of q/k/v/out are multiples of


def fwd_shape(config: MhaCuteConfig, traits: MhaCuteTraits, *, paged: bool) -> FwdSm90Shape:
    """The forward kernel's specialization for one config of a module, prefill or extend."""
    hooks = traits.mask
    return FwdSm90Shape(
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
    )


@dataclass(frozen=True)
class CompileSpec:
    """One kernel to build ahead of time (``attngen.backends.cute_dsl.aot`` reads these)."""

    name: str  # "prefill" | "extend": unique within a variant
    shape: FwdSm90Shape  # the specialization: equal shapes compile to the same cubin

    @property
    def dedupe_key(self) -> FwdSm90Shape:
        return self.shape

    @property
    def kernel(self) -> Any:
        """The object ``cute.compile`` takes first."""
        from attngen.families.mha.cute_dsl.kernels.fwd_sm90 import MhaFwdSm90

        return MhaFwdSm90(self.shape)

    def fake_args(self) -> tuple[Any, ...]:
        return fake_args(self.shape)

    @property
    def requires(self) -> dict[str, tuple[str, ...]]:
        """Instructions every compiled kernel must contain ({"ptx": ..., "sass": ...})."""
        from attngen.families.mha.cute_dsl.kernels.fwd_sm90 import REQUIRES

        return REQUIRES

    @property
    def shared_bytes(self) -> int:
        from attngen.families.mha.cute_dsl.kernels.fwd_sm90 import shared_bytes

        return shared_bytes(self.shape)


def compile_specs(config: MhaCuteConfig, *, traits: MhaCuteTraits) -> list[CompileSpec]:
    """Every kernel the module's phases launch for ``config``."""
    specs = []
    if "prefill" in traits.phases:
        specs.append(CompileSpec("prefill", fwd_shape(config, traits, paged=False)))
    if "extend" in traits.phases:
        specs.append(CompileSpec("extend", fwd_shape(config, traits, paged=True)))
    return specs


def fake_args(shape: FwdSm90Shape) -> tuple[Any, ...]:
    """Arguments with the launchers' types and dynamic sizes, but no memory (AOT compile)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from attngen.families.mha.cute_dsl.kernels.fwd_sm90 import DTYPES

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


def compile_fwd(shape: FwdSm90Shape, args: tuple[Any, ...], arch: str = "sm_90a") -> Any:
    """``cute.compile`` of the forward kernel for ``arch`` (a cubin target)."""
    import cutlass.cute as cute

    from attngen.families.mha.cute_dsl.kernels.fwd_sm90 import MhaFwdSm90

    return cute.compile(MhaFwdSm90(shape), *args, options=f"--gpu-arch {arch}")


_COMPILED: dict[FwdSm90Shape, Any] = {}
_LOCK = threading.Lock()


def compiled_fwd(shape: FwdSm90Shape, args: tuple[Any, ...]) -> Any:
    """The process's compiled kernel of ``shape`` (built from the first call's arguments)."""
    fn = _COMPILED.get(shape)
    if fn is None:
        with _LOCK:
            fn = _COMPILED.get(shape)
            if fn is None:
                fn = _COMPILED[shape] = compile_fwd(shape, args)
    return fn
