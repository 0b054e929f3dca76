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
import importlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from attngen.families.mha.cute_dsl.config import PAGED_PHASES, MhaCuteConfig, MhaCuteTraits
from attngen.families.mha.cute_dsl.kernels.common import CombineShape, FwdShape
from attngen.families.mha.cute_dsl.source import source_sha256

DECODE_TILE_M = 64  # decode: one consumer warpgroup; the group's heads are its rows
Shape = FwdShape | CombineShape


def fwd_shape(
    config: MhaCuteConfig, traits: MhaCuteTraits, *, paged: bool, tree: bool = False
) -> FwdShape:
    """The forward kernel's specialization for one config of a module: prefill, extend, or
    (``tree``) verify of draft trees, which replaces the causal rule by the trees' masks."""
    hooks = traits.mask
    return FwdShape(
        dtype=config.dtype,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        tile_m=config.fwd_paged_tile_m if paged else config.fwd_tile_m,
        tile_n=config.fwd_tile_n if paged else config.fwd_prefill_tile_n,
        num_stages=config.fwd_num_stages,
        causal=hooks.causal and not tree,
        window_left=hooks.window_left,
        logit_softcap=hooks.logit_softcap,
        sinks=hooks.sinks,
        paged=paged,
        overlap=bool(config.fwd_intra_wg_overlap),
        pack_gqa=config.gqa_group if config.fwd_pack_gqa else 1,
        pages_per_tile=max(1, config.fwd_tile_n // config.page_size) if paged else 1,
        tree=tree,
        staged_store=bool(config.fwd_staged_store),
    )


def verify_shape(config: MhaCuteConfig, traits: MhaCuteTraits) -> FwdShape:
    """Speculative verify: extend's kernel for draft chains (causal drafts), its tree
    specialization for draft trees (config.spec_topk > 1)."""
    return fwd_shape(config, traits, paged=True, tree=config.spec_topk > 1)


def decode_shape(config: MhaCuteConfig, traits: MhaCuteTraits) -> FwdShape:
    """Split-KV decode, stage 1: the paged forward's specialization on a 64-row tile of the
    group's heads; the sinks join in the combine, so this kernel has none."""
    shape = fwd_shape(config, traits, paged=True)
    return dataclasses.replace(
        shape,
        tile_m=DECODE_TILE_M,
        num_stages=config.decode_num_stages,
        sinks=False,
        overlap=False,
        pack_gqa=1,
        staged_store=False,  # decode writes fp32 partial rows (store_partial)
        decode_group=config.gqa_group,
        kv_dtype="" if config.kv_dtype == config.dtype else config.kv_dtype,
    )


def combine_shape(config: MhaCuteConfig, traits: MhaCuteTraits) -> CombineShape:
    """Split-KV decode, stage 2."""
    return CombineShape(dtype=config.dtype, v_head_dim=config.v_head_dim, sinks=traits.mask.sinks)


def kernel_kind(shape: Shape) -> str:
    """Which kernel module builds ``shape``: "fwd", "decode" or "combine"."""
    if isinstance(shape, CombineShape):
        return "combine"
    return "decode" if shape.decode else "fwd"


@dataclass(frozen=True)
class CompileSpec:
    """One kernel to build ahead of time (``attngen.backends.cute_dsl.aot`` reads these)."""

    name: str  # "prefill" | "extend" | "decode" | "decode_combine": unique within a variant
    arch: str  # "sm90" | "sm100": which forward kernel
    shape: Shape  # the specialization: equal (arch, shape) compile to the same cubin

    @property
    def dedupe_key(self) -> tuple[str, Shape]:
        return self.arch, self.shape

    @property
    def kernel(self) -> Any:
        """The object ``cute.compile`` takes first."""
        return kernel_module(self.arch, self.shape).KERNEL(self.shape)

    def fake_args(self) -> tuple[Any, ...]:
        return fake_args(self.shape)

    @property
    def requires(self) -> dict[str, tuple[str, ...]]:
        """Instructions every compiled kernel must contain ({"ptx": ..., "sass": ...})."""
        module = kernel_module(self.arch, self.shape)
        return module.requires(self.shape) if hasattr(module, "requires") else module.REQUIRES

    @property
    def shared_bytes(self) -> int:
        return kernel_module(self.arch, self.shape).shared_bytes(self.shape)


def kernel_module(arch: str, shape: Shape | None = None) -> Any:
    """The kernel module that builds ``shape`` on ``arch`` (KERNEL, REQUIRES or
    requires(shape), shared_bytes): the arch's forward kernel (the default), its split-KV
    decode kernel, or the arch-independent combine."""
    kind = "fwd" if shape is None else kernel_kind(shape)
    name = "combine" if kind == "combine" else f"{kind}_{arch}"
    return importlib.import_module(f"attngen.families.mha.cute_dsl.kernels.{name}")


def compile_specs(config: MhaCuteConfig, *, traits: MhaCuteTraits) -> list[CompileSpec]:
    """Every kernel the module's phases launch for ``config``."""
    specs = []
    if "prefill" in traits.phases:
        specs.append(CompileSpec("prefill", config.arch, fwd_shape(config, traits, paged=False)))
    tree = config.spec_topk > 1  # verify of draft trees has a kernel of its own
    if any(p in traits.phases for p in PAGED_PHASES if not (tree and p == "verify")):
        specs.append(CompileSpec("extend", config.arch, fwd_shape(config, traits, paged=True)))
    if tree and "verify" in traits.phases:
        specs.append(CompileSpec("verify", config.arch, verify_shape(config, traits)))
    if "decode" in traits.phases:
        specs.append(CompileSpec("decode", config.arch, decode_shape(config, traits)))
        specs.append(CompileSpec("decode_combine", config.arch, combine_shape(config, traits)))
    return specs


def fake_args(shape: Shape) -> tuple[Any, ...]:
    """Arguments with the launchers' types and dynamic sizes, but no memory (AOT compile)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from attngen.families.mha.cute_dsl.kernels.common import DTYPES, KV_DTYPES

    dtype = DTYPES[shape.dtype]

    def rows(*dims: Any, dt: Any = dtype) -> Any:
        elems = 128 // dt.width  # 16-byte multiples
        strides = [cute.sym_int64(divisibility=elems) for _ in dims[:-1]]
        return make_fake_tensor(dt, dims, (*strides, 1), assumed_align=16)

    def ints(*dims: Any) -> Any:
        strides = [cute.sym_int64() for _ in dims[:-1]]
        return make_fake_tensor(cutlass.Int32, dims, (*strides, 1), assumed_align=4)

    def floats(*dims: Any) -> Any:
        strides = [cute.sym_int64() for _ in dims[:-1]]
        return make_fake_tensor(cutlass.Float32, dims, (*strides, 1), assumed_align=4)

    tokens, heads, kv_heads = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    if isinstance(shape, CombineShape):
        batch, splits, dv = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
        sinks = floats(heads) if shape.sinks else None
        partial_o, partial_lse = floats(batch, heads, splits, dv), floats(batch, heads, splits)
        out = rows(batch, heads, dv)
        return (partial_o, partial_lse, ints(batch), sinks, out, make_fake_stream())
    if shape.decode:
        batch, splits, pages, page = (cute.sym_int32() for _ in range(4))
        kv_dt = KV_DTYPES[shape.kv_dtype or shape.dtype]
        q = rows(batch, heads, cute.sym_int32())
        k = rows(pages, page, kv_heads, cute.sym_int32(), dt=kv_dt)
        v = rows(pages, page, kv_heads, cute.sym_int32(), dt=kv_dt)
        partial_o = floats(batch, heads, splits, cute.sym_int32())
        page_table = ints(batch, cute.sym_int32())
        small = (ints(batch), ints(batch), page_table, floats(batch, heads, splits))
        scales = (floats(1), floats(1)) if shape.kv_fp8 else (None, None)
        return (q, k, v, partial_o, *small, *scales, cutlass.Float32(1.0), make_fake_stream())
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
    tree = (None, None)
    if shape.tree:
        tree_mask = make_fake_tensor(cutlass.Uint8, (cute.sym_int32(),), (1,), assumed_align=1)
        tree = (tree_mask, ints(cute.sym_int32()))
    lse = floats(cute.sym_int32(), heads)  # [T, Hq] or the one-element stand-in
    scalars = (cutlass.Float32(1.0), cutlass.Int32(1), cutlass.Int32(0))
    return (
        q, k, v, out, cu_seqlens, prefix_lens, page_table, sinks, *tree, lse, *scalars,
        make_fake_stream(),
    )  # fmt: skip


def compile_fwd(arch: str, shape: Shape, args: tuple[Any, ...]) -> Any:
    """``cute.compile`` of ``arch``'s kernel of ``shape`` for the arch's cubin target."""
    import cutlass.cute as cute

    from attngen.arch import facts

    kernel = kernel_module(arch, shape).KERNEL(shape)
    return cute.compile(kernel, *args, options=f"--gpu-arch {facts(arch).cubin_target}")


_COMPILED: dict[tuple[str, Shape], Any] = {}
_LOCK = threading.Lock()
# How the launchers type a kernel's arguments (host/launch.py: launch_args). Part of the
# on-disk identity: a kernel compiled for other argument types cannot be called with these.
LAUNCH_ARGS = "launch_args/3"


def disk_identity(arch: str, shape: Shape) -> dict[str, str]:
    """What determines the compiled kernel of (arch, shape) called through the launchers:
    the on-disk compile cache's identity (attngen.backends.cute_dsl.disk_cache)."""
    fields = json.dumps(dataclasses.asdict(shape), sort_keys=True)
    return {
        "kernel": kernel_module(arch, shape).__name__,
        "shape": fields,
        "source_sha256": source_sha256(arch),
        "args": LAUNCH_ARGS,
    }


def compiled_fwd(arch: str, shape: Shape, args: tuple[Any, ...]) -> Any:
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

    def __init__(self, key: tuple[str, Shape], fn: Any, path: Any) -> None:
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
