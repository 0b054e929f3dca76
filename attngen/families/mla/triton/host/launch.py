"""Launchers of the Triton MLA kernels: argument checks, grids and launch options.

Every public function checks its tensors (dtype, shape, device, unit last-dim stride) and
raises AttngenInputError before launching; ``trusted_metadata=True`` (the backend's own
metadata) skips the metadata checks only.
"""

from __future__ import annotations

import torch
import triton

from attngen.families.mla.triton.config import MlaTritonConfig
from attngen.families.mla.triton.kernels.absorbed import (
    absorbed_combine_kernel,
    absorbed_split_kernel,
)
from attngen.families.mla.triton.kernels.absorbed_keys_fp8 import absorbed_keys_fp8_kernel
from attngen.families.mla.triton.kernels.absorbed_keys_wg import absorbed_keys_wg_kernel
from attngen.families.mla.triton.kernels.absorbed_wg import absorbed_wg_kernel
from attngen.families.mla.triton.kernels.ragged import merge_state_kernel, ragged_attend_kernel
from attngen.backends.triton.gluon import refuse_interpreter
from attngen.runtime.checks import AttngenInputError, check_tensor, fail

I32 = torch.int32
KV_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "nvfp4": torch.uint8,  # e2m1 code pairs; the e4m3 block scales travel apart
}


def io_dtype(config: MlaTritonConfig) -> torch.dtype:
    return KV_DTYPES[config.dtype]


def kv_dtype(config: MlaTritonConfig) -> torch.dtype:
    return KV_DTYPES[config.kv_dtype]


def quantized(config: MlaTritonConfig) -> bool:
    return config.kv_dtype != config.dtype


def fp4(config: MlaTritonConfig) -> bool:
    return config.kv_dtype == "nvfp4"


def cache_width(config: MlaTritonConfig) -> int:
    """Last dim of a latent cache row: 576 elements, or 288 bytes of NVFP4 code pairs."""
    return config.kv_width // 2 if fp4(config) else config.kv_width


def absorbed_workspace(
    config: MlaTritonConfig, *, rows: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split partials of ``rows`` query rows: ``partial_o [rows, H, max_splits, LORA]`` and
    ``partial_lse [rows, H, max_splits]`` fp32 (graph captures allocate them once)."""
    h, s = config.num_heads, config.max_splits
    f32 = dict(dtype=torch.float32, device=device)
    return (
        torch.empty((rows, h, s, config.kv_lora_rank), **f32),
        torch.empty((rows, h, s), **f32),
    )


def split_q(
    q: torch.Tensor, q_rope: torch.Tensor | None, config: MlaTritonConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_nope [T, H, LORA], q_rope [T, H, ROPE]) from one ``[T, H, LORA + ROPE]`` tensor
    or the two parts, checked."""
    h, lora, rope = config.num_heads, config.kv_lora_rank, config.qk_rope_head_dim
    dtype = io_dtype(config)
    if q_rope is None:
        check_tensor("q", q, dtype=dtype, shape=[None, h, lora + rope], last_dim_contiguous=True)
        return q[..., :lora], q[..., lora:]
    check_tensor("q", q, dtype=dtype, shape=[None, h, lora], last_dim_contiguous=True)
    rows = q.shape[0]
    check_tensor(
        "q_rope",
        q_rope,
        dtype=dtype,
        shape=[rows, h, rope],
        device=q.device,
        last_dim_contiguous=True,
    )
    return q, q_rope


def absorbed(
    q: torch.Tensor,
    q_rope: torch.Tensor | None,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    row_lens: torch.Tensor,
    num_splits: torch.Tensor | None,
    out: torch.Tensor,
    partial_o: torch.Tensor | None,
    partial_lse: torch.Tensor | None,
    *,
    config: MlaTritonConfig,
    sm_scale: float,
    row_req: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    tree_mask_indptr: torch.Tensor | None = None,
    kv_block_scales: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> torch.Tensor:
    """Absorbed attention of ``T`` query rows over the paged latent cache, into ``out``.

    q ``[T, H, LORA + ROPE]`` (or q ``[T, H, LORA]`` and q_rope ``[T, H, ROPE]``);
    kv_cache ``[pages, page_size, 1, LORA + ROPE]`` (the config's kv dtype; fp8 needs
    kv_scale fp32 ``[1]``; NVFP4: uint8 ``[..., (LORA + ROPE) / 2]`` code pairs, low nibble
    first, kv_block_scales float8_e4m3fn ``[..., (LORA + ROPE) / 16]`` and kv_scale its
    global scale); row t reads request ``row_req[t]`` (``t`` when None: decode)
    through ``page_table [>= B, pages]`` and sees its keys ``0 .. row_lens[t]-1``.
    num_splits ``[T]`` int32 in 1 .. max_splits, with partial_o / partial_lse from
    ``absorbed_workspace`` (>= T rows); or None: one split per row, no partials. out
    ``[T, H, LORA]``; lse ``[T, H]`` fp32 (natural log) when given.
    Draft trees (tree_mask given; config.spec_topk > 1): row t is draft
    ``t % num_draft_tokens`` of request ``row_req[t]``, ``row_lens[t]`` its sequence length (prefix + drafts), tree_mask uint8
    the requests' bit-packed masks (``pack_tree_masks``) at byte offsets
    ``tree_mask_indptr [B + 1]`` int32.
    """
    q_nope, q_rope = split_q(q, q_rope, config)
    rows, device = q_nope.shape[0], q_nope.device
    h, lora = config.num_heads, config.kv_lora_rank
    _check_latent_cache(kv_cache, config, device)
    if fp4(config):
        width = config.kv_width // 16
        check_tensor(
            "kv_block_scales",
            kv_block_scales,
            dtype=torch.float8_e4m3fn,
            device=device,
            shape=[kv_cache.shape[0], config.page_size, 1, width],
            contiguous=True,
        )
    elif kv_block_scales is not None:
        fail("kv_block_scales", f"None (the {config.kv_dtype} cache has none)", "a tensor")
    check_tensor(
        "out",
        out,
        dtype=io_dtype(config),
        shape=[rows, h, lora],
        device=device,
        last_dim_contiguous=True,
    )
    if out.stride(1) % 16:
        fail("out", "rows starting on 16 elements (stride(1) % 16 == 0)", out.stride())
    if lse is not None:
        check_tensor(
            "lse", lse, dtype=torch.float32, shape=[rows, h], device=device, contiguous=True
        )
    if quantized(config):
        check_tensor("kv_scale", kv_scale, dtype=torch.float32, shape=[1], device=device)
    elif kv_scale is not None:
        fail("kv_scale", f"None (the {config.kv_dtype} cache is not quantized)", "a tensor")
    tree = tree_mask is not None
    if config.decode_gluon:
        _check_gluon(config)
    if tree:
        if config.spec_topk <= 1 or row_req is None:
            fail(
                "tree_mask",
                "None (the config verifies no draft trees; decode has none)",
                "a tensor",
            )
        check_tensor("tree_mask", tree_mask, dtype=torch.uint8, shape=[None], device=device)
        check_tensor(
            "tree_mask_indptr",
            tree_mask_indptr,
            dtype=I32,
            shape=[None],
            device=device,
            contiguous=True,
        )
    if not trusted_metadata:
        _check_rows(page_table, row_lens, num_splits, row_req, rows, device)
    if num_splits is not None:
        _check_partials(partial_o, partial_lse, config, rows, device)
    else:  # no partials: the kernel never touches them
        partial_o = partial_lse = out
    if rows == 0:
        return out
    split = num_splits is not None
    po_strides = partial_o.stride()[:3] if split else (0, 0, 0)
    pl_strides = partial_lse.stride()[:2] if split else (0, 0)
    lse_arg = lse if lse is not None else out  # not written without WRITE_LSE
    lse_stride = lse.stride(0) if lse is not None else 0
    programs = triton.cdiv(h, config.decode_block_h) * config.decode_lora_parts
    splits_axis = config.max_splits if split else 1
    if config.decode_gluon and not tree:  # rows x head blocks on one axis (row_and_head_block)
        kernel, options = gluon_kernel(config, write_lse=lse is not None)
        scale = (kv_scale,) if "KV_SCALE" in kernel.arg_names else ()
        cache = kv_cache.view(torch.int32) if cache_words(config) else kv_cache
        kernel[(rows * programs, 1, splits_axis)](
            q_nope,
            q_rope,
            cache,
            page_table,
            row_lens,
            row_req,
            num_splits,
            *scale,
            out,
            lse_arg,
            partial_o,
            partial_lse,
            sm_scale,
            q_nope.stride(0),
            q_nope.stride(1),
            q_rope.stride(0),
            q_rope.stride(1),
            cache.stride(1),
            page_table.stride(0),
            out.stride(0),
            out.stride(1),
            lse_stride,
            *po_strides,
            *pl_strides,
            **options,
        )
    else:
        absorbed_split_kernel[(rows, programs, splits_axis)](
            q_nope,
            q_rope,
            kv_cache,
            page_table,
            row_lens,
            row_req,
            tree_mask if tree else None,
            tree_mask_indptr if tree else None,
            num_splits,
            kv_scale,
            kv_block_scales,
            out,
            lse_arg,
            partial_o,
            partial_lse,
            sm_scale,
            q_nope.stride(0),
            q_nope.stride(1),
            q_rope.stride(0),
            q_rope.stride(1),
            kv_cache.stride(1),
            kv_block_scales.stride(1) if kv_block_scales is not None else 0,
            page_table.stride(0),
            out.stride(0),
            out.stride(1),
            lse_stride,
            *po_strides,
            *pl_strides,
            **absorbed_options(config, write_lse=lse is not None, tree=tree),
        )
    if split:
        absorbed_combine_kernel[(rows, h)](
            partial_o,
            partial_lse,
            num_splits,
            out,
            lse_arg,
            *po_strides,
            *pl_strides,
            out.stride(0),
            out.stride(1),
            lse_stride,
            **combine_options(config, write_lse=lse is not None),
        )
    return out


def _check_gluon(config: MlaTritonConfig) -> None:
    """The Gluon absorbed kernels' fixed shapes (``MlaTritonConfig.gluon_shape_problems``:
    an NVFP4 cache keys-major went to the fp8 kernel before), on a GPU (the Triton
    interpreter cannot run Gluon)."""
    for problem in config.gluon_shape_problems():
        raise AttngenInputError(f"config.decode_gluon: {problem}")
    refuse_interpreter("config.decode_gluon")


def _check_latent_cache(kv_cache: torch.Tensor, config: MlaTritonConfig, device) -> None:
    check_tensor(
        "kv_cache",
        kv_cache,
        dtype=kv_dtype(config),
        device=device,
        shape=[None, config.page_size, 1, cache_width(config)],
        last_dim_contiguous=True,
    )
    if kv_cache.stride(1) % 16 or kv_cache.data_ptr() % 16:
        fail(
            "kv_cache",
            "rows starting on 16 elements (stride(1) % 16 == 0, aligned data)",
            kv_cache.stride(),
        )
    if kv_cache.stride(0) != config.page_size * kv_cache.stride(1):
        fail(
            "kv_cache",
            "pages laid out back to back (stride(0) = page_size * stride(1))",
            kv_cache.stride(),
        )


def _check_rows(page_table, row_lens, num_splits, row_req, rows: int, device) -> None:
    check_tensor(
        "page_table",
        page_table,
        dtype=I32,
        shape=[None, None],
        device=device,
        last_dim_contiguous=True,
    )
    check_tensor("row_lens", row_lens, dtype=I32, shape=[rows], device=device, contiguous=True)
    if num_splits is not None:
        check_tensor(
            "num_splits", num_splits, dtype=I32, shape=[rows], device=device, contiguous=True
        )
    if row_req is not None:
        check_tensor("row_req", row_req, dtype=I32, shape=[rows], device=device, contiguous=True)
    elif page_table.shape[0] < rows:
        fail("page_table", f">= {rows} rows (one per decode request)", page_table.shape[0])


def _check_partials(partial_o, partial_lse, config: MlaTritonConfig, rows: int, device) -> None:
    h, s, lora = config.num_heads, config.max_splits, config.kv_lora_rank
    check_tensor(
        "partial_o",
        partial_o,
        dtype=torch.float32,
        shape=[None, h, s, lora],
        device=device,
        contiguous=True,
    )
    check_tensor(
        "partial_lse",
        partial_lse,
        dtype=torch.float32,
        shape=[None, h, s],
        device=device,
        contiguous=True,
    )
    if partial_o.shape[0] < rows or partial_lse.shape[0] < rows:
        fail("partial_o / partial_lse", f">= {rows} rows", partial_o.shape[0])


def absorbed_options(config: MlaTritonConfig, *, write_lse: bool, tree: bool = False) -> dict:
    return dict(
        NUM_DRAFTS=config.num_draft_tokens if tree else 0,
        NUM_HEADS=config.num_heads,
        LORA=config.kv_lora_rank,
        ROPE=config.qk_rope_head_dim,
        PAGE_SIZE=config.page_size,
        BLOCK_H=config.decode_block_h,
        BLOCK_N=config.decode_block_n,
        MAX_SPLITS=config.max_splits,
        KV_SCALED=quantized(config),
        KV_FP4=fp4(config),
        WRITE_LSE=write_lse,
        LORA_PARTS=config.decode_lora_parts,
        KEYS_MAJOR=bool(config.decode_keys_major),
        VALUE_RELOAD=bool(config.decode_value_reload),
        num_warps=config.decode_num_warps,
        num_stages=config.decode_num_stages,
    )


def cache_words(config: MlaTritonConfig) -> bool:
    """Whether the absorbed kernel reads the cache as int32 words of four values (the Gluon
    kernels' fp8 paths: an int32 view of the same bytes)."""
    return bool(config.decode_gluon and quantized(config))


def gluon_kernel(config: MlaTritonConfig, *, write_lse: bool) -> tuple:
    """The sm90 Gluon absorbed kernel of ``config`` and its constexprs: head-major (64
    heads x 64 rows, 16-bit or fp8 latents) or, with ``decode_keys_major``, keys-major (16
    or 32 heads, 16-bit latents; 16 heads, fp8 latents; both STAGES deep)."""
    options = dict(
        NUM_HEADS=config.num_heads,
        LORA=config.kv_lora_rank,
        ROPE=config.qk_rope_head_dim,
        PAGE_SIZE=config.page_size,
        BLOCK_H=config.decode_block_h,
        BLOCK_N=config.decode_block_n,
        MAX_SPLITS=config.max_splits,
        WRITE_LSE=write_lse,
        num_warps=config.decode_num_warps,
    )
    if config.decode_max_registers:
        options["maxnreg"] = config.decode_max_registers
    if config.decode_keys_major:
        fn = absorbed_keys_fp8_kernel if quantized(config) else absorbed_keys_wg_kernel
        return fn, {**options, "STAGES": config.decode_num_stages}
    return absorbed_wg_kernel, {**options, "KV_SCALED": quantized(config)}


def combine_options(config: MlaTritonConfig, *, write_lse: bool) -> dict:
    return dict(
        LORA=config.kv_lora_rank,
        MAX_SPLITS=config.max_splits,
        WRITE_LSE=write_lse,
        num_warps=config.combine_num_warps,
    )


def ragged(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    max_q_len: int,
    causal: bool,
    config: MlaTritonConfig,
    sm_scale: float,
    trusted_metadata: bool = False,
) -> torch.Tensor:
    """Ragged MHA of the non-absorbed path, with its LSE.

    q ``[Tq, H, NOPE + ROPE]``, k_nope ``[Tk, H, NOPE]``, k_rope ``[Tk, 1 or H, ROPE]`` (one
    shared rope key, or per head), v ``[Tk, H, V]``; request b's queries are rows
    ``qo_indptr[b] ..`` and its keys rows ``kv_indptr[b] ..`` (int32 ``[B + 1]``). causal:
    the new tokens over themselves (queries aligned to the end of the keys); otherwise
    every key (a prefix chunk). out ``[Tq, H, V]``, lse ``[Tq, H]`` fp32 (natural log).
    """
    h, nope, rope, dv = (
        config.num_heads,
        config.qk_nope_head_dim,
        config.qk_rope_head_dim,
        config.v_head_dim,
    )
    dtype, device = io_dtype(config), q.device
    check_tensor("q", q, dtype=dtype, shape=[None, h, nope + rope], last_dim_contiguous=True)
    tq = q.shape[0]
    check_tensor(
        "k_nope",
        k_nope,
        dtype=dtype,
        shape=[None, h, nope],
        device=device,
        last_dim_contiguous=True,
    )
    tk = k_nope.shape[0]
    check_tensor(
        "k_rope",
        k_rope,
        dtype=dtype,
        shape=[tk, None, rope],
        device=device,
        last_dim_contiguous=True,
    )
    if k_rope.shape[1] not in (1, h):
        fail("k_rope", f"[{tk}, 1 or {h}, {rope}]", tuple(k_rope.shape))
    check_tensor("v", v, dtype=dtype, shape=[tk, h, dv], device=device, last_dim_contiguous=True)
    check_tensor(
        "out", out, dtype=dtype, shape=[tq, h, dv], device=device, last_dim_contiguous=True
    )
    check_tensor("lse", lse, dtype=torch.float32, shape=[tq, h], device=device, contiguous=True)
    if not trusted_metadata:
        check_tensor(
            "qo_indptr", qo_indptr, dtype=I32, shape=[None], device=device, contiguous=True
        )
        check_tensor(
            "kv_indptr",
            kv_indptr,
            dtype=I32,
            shape=[qo_indptr.shape[0]],
            device=device,
            contiguous=True,
        )
    for name, x in (("q", q), ("k_nope", k_nope), ("k_rope", k_rope), ("v", v), ("out", out)):
        _check_rows_aligned(name, x)
    batch = qo_indptr.shape[0] - 1
    if tq == 0 or batch < 1 or max_q_len < 1:
        return out
    rope_head_stride = 0 if k_rope.shape[1] == 1 else k_rope.stride(1)
    grid = (h, batch, triton.cdiv(max_q_len, config.ragged_block_m))
    ragged_attend_kernel[grid](
        q,
        k_nope,
        k_rope,
        v,
        qo_indptr,
        kv_indptr,
        out,
        lse,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_nope.stride(0),
        k_nope.stride(1),
        k_rope.stride(0),
        rope_head_stride,
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        lse.stride(0),
        **ragged_options(config, causal=causal),
    )
    return out


def _check_rows_aligned(name: str, x: torch.Tensor) -> None:
    """Rows (per token and head) start on 16 elements and 16 bytes: the kernels say so."""
    if any(st % 16 for st in x.stride()[:2] if st) or x.data_ptr() % 16:
        fail(
            name,
            "token and head strides that are multiples of 16 and 16-byte aligned data",
            f"strides {x.stride()}",
        )


def ragged_options(config: MlaTritonConfig, *, causal: bool) -> dict:
    return dict(
        NOPE=config.qk_nope_head_dim,
        ROPE=config.qk_rope_head_dim,
        V_DIM=config.v_head_dim,
        BLOCK_M=config.ragged_block_m,
        BLOCK_N=config.ragged_block_n,
        CAUSAL=causal,
        num_warps=config.ragged_num_warps,
        num_stages=config.ragged_num_stages,
    )


MERGE_BLOCK_H = 16


def merge_state(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    out: torch.Tensor,
    lse_out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions over disjoint keys: ``o_* [T, H, D]`` (D a power of
    two; any float dtype, out's may differ), ``lse_* [T, H]`` fp32 natural log. ``out`` may
    be ``o_a`` (in place)."""
    check_tensor("o_a", o_a, shape=[None, None, None], last_dim_contiguous=True)
    t, h, d = o_a.shape
    if d & (d - 1):
        fail("o_a", "a power-of-two last dim", d)
    for name, x in (("o_b", o_b), ("out", out)):
        check_tensor(name, x, shape=[t, h, d], device=o_a.device, last_dim_contiguous=True)
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b), ("lse_out", lse_out)):
        check_tensor(name, x, dtype=torch.float32, shape=[t, h], device=o_a.device, contiguous=True)
    if t == 0:
        return out, lse_out
    grid = (t, triton.cdiv(h, MERGE_BLOCK_H))
    merge_state_kernel[grid](
        o_a,
        lse_a,
        o_b,
        lse_b,
        out,
        lse_out,
        o_a.stride(0),
        o_a.stride(1),
        o_b.stride(0),
        o_b.stride(1),
        out.stride(0),
        out.stride(1),
        lse_out.stride(0),
        NUM_HEADS=h,
        DIM=d,
        BLOCK_H=MERGE_BLOCK_H,
        num_warps=4,
    )
    return out, lse_out
