"""Launchers of the Triton DSA kernels: argument checks, grids and launch options.

Every public function checks its tensors (dtype, shape, device, strides) and raises
AttngenInputError before launching; ``trusted_metadata=True`` (the backend's own metadata)
skips the checks of index tensors only. Nothing reads device values on the host, so every
launcher is CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton

from attngen.backends.triton.gluon import refuse_interpreter
from attngen.families.dsa.triton.config import DsaTritonConfig
from attngen.families.dsa.triton.kernels.indexer import indexer_logits_kernel
from attngen.families.dsa.triton.kernels.sparse import sparse_mla_kernel
from attngen.families.dsa.triton.kernels.sparse_fp8_wg import sparse_fp8_wg_kernel
from attngen.families.dsa.triton.kernels.sparse_wg import sparse_wg_kernel
from attngen.families.dsa.triton.kernels.topk import topk_kernel
from attngen.families.mla.triton.kernels.absorbed import absorbed_combine_kernel
from attngen.runtime.checks import check_tensor, fail

I32 = torch.int32
F32 = torch.float32
FP8 = torch.float8_e4m3fn
IO_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
INDEXER_TORCH_DTYPES = {**IO_DTYPES, "float32": F32, "float8_e4m3fn": FP8}
SCALE_BYTES = 4  # one fp32 scale per fp8 index key


def io_dtype(config: DsaTritonConfig) -> torch.dtype:
    return IO_DTYPES[config.dtype]


def kv_dtype(config: DsaTritonConfig) -> torch.dtype:
    return FP8 if config.fp8_cache else io_dtype(config)


def index_dtype(config: DsaTritonConfig) -> torch.dtype:
    """The indexer's q and key dtype."""
    return INDEXER_TORCH_DTYPES[config.index_dtype]


def index_page_bytes(config: DsaTritonConfig) -> int:
    """Bytes of one index-key page: page_size fp8 keys, then their fp32 scales (8448), or
    page_size keys of the index dtype."""
    if config.fp8_index:
        return config.page_size * (config.index_head_dim + SCALE_BYTES)
    return config.page_size * config.index_head_dim * index_dtype(config).itemsize


def _index_vector(name: str, t: object, rows: int, device, trusted: bool) -> None:
    if not trusted:
        check_tensor(name, t, dtype=I32, shape=[rows], device=device, contiguous=True)


# -- indexer ----


def indexer_options(config: DsaTritonConfig, *, paged: bool) -> dict:
    return dict(
        HEADS=config.index_heads,
        DIM=config.index_head_dim,
        PAGE_SIZE=config.page_size,
        PAGED=paged,
        BLOCK_N=config.indexer_block_n,
        BLOCK_S=config.indexer_block_s,
        SCALED=config.fp8_index,
        IEEE=config.index_dtype == "float32",
        num_warps=config.indexer_num_warps,
        num_stages=2,
    )


def _check_indexer_q(q, weights, logits, config: DsaTritonConfig) -> tuple[int, torch.device]:
    h, d = config.index_heads, config.index_head_dim
    check_tensor("q", q, dtype=index_dtype(config), shape=[None, h, d], last_dim_contiguous=True)
    rows, device = int(q.shape[0]), q.device
    check_tensor("weights", weights, dtype=F32, shape=[rows, h], device=device)
    if weights.stride(1) != 1:
        fail("weights", "stride 1 in the last dim", weights.stride())
    check_tensor("logits", logits, dtype=F32, shape=[rows, None], device=device)
    if logits.stride(1) != 1:
        fail("logits", "stride 1 in the last dim", logits.stride())
    return rows, device


def indexer_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    page_table: torch.Tensor,
    row_lens: torch.Tensor,
    logits: torch.Tensor,
    *,
    config: DsaTritonConfig,
    row_req: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> torch.Tensor:
    """Indexer scores of ``T`` query rows over the paged index-key pool, into ``logits``.

    q ``[T, index_heads, index_head_dim]`` in the index dtype (float8_e4m3fn, or the
    bf16 / fp16 / fp32 of the model); weights fp32 ``[T, index_heads]`` (with fp8, q's
    dequant scale folded in); index_cache uint8 ``[pages, index_page_bytes(config)]``; row
    t reads request ``row_req[t]`` (t when None) through ``page_table [>= B, pages]`` int32
    and scores its keys ``0 .. row_lens[t]-1`` (causal by position: the caller passes the
    token's own position + 1). logits fp32 ``[T, >= max row_lens]``: only visible entries
    are written.
    """
    rows, device = _check_indexer_q(q, weights, logits, config)
    check_tensor(
        "index_cache",
        index_cache,
        dtype=torch.uint8,
        shape=[None, index_page_bytes(config)],
        device=device,
        contiguous=True,
    )
    if not trusted_metadata:
        check_tensor("page_table", page_table, dtype=I32, shape=[None, None], device=device)
        if page_table.stride(1) != 1:
            fail("page_table", "stride 1 in the last dim", page_table.stride())
        if row_req is not None:
            _index_vector("row_req", row_req, rows, device, False)
    _index_vector("row_lens", row_lens, rows, device, trusted_metadata)
    if rows == 0:
        return logits
    keys = index_cache.view(index_dtype(config))
    scales = index_cache.view(F32) if config.fp8_index else None
    grid = (rows, triton.cdiv(logits.shape[1], config.indexer_block_s))
    indexer_logits_kernel[grid](
        q,
        weights,
        keys,
        scales,
        page_table,
        row_req,
        None,
        row_lens,
        logits,
        q.stride(0),
        q.stride(1),
        weights.stride(0),
        keys.stride(0),
        0 if scales is None else scales.stride(0),
        page_table.stride(0),
        logits.stride(0),
        **indexer_options(config, paged=True),
    )
    return logits


def indexer_logits_ragged(
    q: torch.Tensor,
    weights: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor | None,
    row_start: torch.Tensor,
    row_lens: torch.Tensor,
    logits: torch.Tensor,
    *,
    config: DsaTritonConfig,
    trusted_metadata: bool = False,
) -> torch.Tensor:
    """Indexer scores over contiguous keys (prefill): k ``[S, D]`` in the index dtype,
    k_scale fp32 ``[S]`` with fp8 keys (None otherwise); row t scores keys ``row_start[t] ..
    row_start[t] + row_lens[t] - 1``, written at ``logits[t, 0 .. row_lens[t]-1]``
    (positions relative to row_start[t])."""
    rows, device = _check_indexer_q(q, weights, logits, config)
    check_tensor(
        "k", k, dtype=index_dtype(config), shape=[None, config.index_head_dim], device=device
    )
    if k.stride(1) != 1:
        fail("k", "stride 1 in the last dim", k.stride())
    if config.fp8_index:
        check_tensor("k_scale", k_scale, dtype=F32, shape=[k.shape[0]], device=device)
        if k_scale.stride(0) != 1:
            fail("k_scale", "a contiguous tensor", k_scale.stride())
    elif k_scale is not None:
        fail("k_scale", f"None ({config.index_dtype} keys carry no scales)", type(k_scale).__name__)
    _index_vector("row_start", row_start, rows, device, trusted_metadata)
    _index_vector("row_lens", row_lens, rows, device, trusted_metadata)
    if rows == 0:
        return logits
    grid = (rows, triton.cdiv(logits.shape[1], config.indexer_block_s))
    indexer_logits_kernel[grid](
        q,
        weights,
        k,
        k_scale,
        None,
        None,
        row_start,
        row_lens,
        logits,
        q.stride(0),
        q.stride(1),
        weights.stride(0),
        k.stride(0),
        0,
        0,
        logits.stride(0),
        **indexer_options(config, paged=False),
    )
    return logits


# -- top-k ----


def topk_options(config: DsaTritonConfig) -> dict:
    return dict(
        TOPK=config.index_topk,
        PAGE_SIZE=config.page_size,
        BLOCK=config.topk_block,
        num_warps=config.topk_num_warps,
        num_stages=1,
    )


def topk(
    logits: torch.Tensor,
    row_lens: torch.Tensor,
    out_pos: torch.Tensor,
    *,
    config: DsaTritonConfig,
    page_table: torch.Tensor | None = None,
    row_req: torch.Tensor | None = None,
    out_slot: torch.Tensor | None = None,
    trusted_metadata: bool = False,
) -> torch.Tensor:
    """The ``index_topk`` best keys of each row of ``logits [T, >= row_lens]`` fp32 among
    its first ``row_lens[t]``: higher score first, then lower position; written in
    ascending position order to out_pos int32 ``[T, topk]``, -1 after them. With out_slot
    (int32 ``[T, topk]``), also the token slots of the same keys through ``page_table``
    row ``row_req[t]`` (t when None)."""
    check_tensor("logits", logits, dtype=F32, shape=[None, None])
    rows, device, k = int(logits.shape[0]), logits.device, config.index_topk
    if logits.stride(1) != 1:
        fail("logits", "stride 1 in the last dim", logits.stride())
    check_tensor("out_pos", out_pos, dtype=I32, shape=[rows, k], device=device)
    if out_pos.stride(1) != 1:
        fail("out_pos", "stride 1 in the last dim", out_pos.stride())
    _index_vector("row_lens", row_lens, rows, device, trusted_metadata)
    if out_slot is not None:
        check_tensor("out_slot", out_slot, dtype=I32, shape=[rows, k], device=device)
        if out_slot.stride(1) != 1:
            fail("out_slot", "stride 1 in the last dim", out_slot.stride())
        if not trusted_metadata:
            check_tensor("page_table", page_table, dtype=I32, shape=[None, None], device=device)
            if row_req is not None:
                _index_vector("row_req", row_req, rows, device, False)
    elif page_table is not None or row_req is not None:
        fail("page_table / row_req", "None without out_slot", "a tensor")
    if rows == 0:
        return out_pos
    topk_kernel[(rows,)](
        logits,
        row_lens,
        row_req if out_slot is not None else None,
        page_table,
        out_pos,
        out_slot,
        logits.stride(0),
        out_pos.stride(0),
        out_slot.stride(0) if out_slot is not None else 0,
        page_table.stride(0) if out_slot is not None else 0,
        **topk_options(config),
    )
    return out_pos


# -- sparse MLA ----


def sparse_workspace(
    config: DsaTritonConfig, *, rows: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split partials of ``rows`` query rows: ``partial_o [rows, H, max_splits, LORA]``,
    ``partial_lse [rows, H, max_splits]`` fp32 and the split count per row (int32, set by
    ``sparse_mla``); graph captures allocate them once."""
    h, s = config.num_heads, config.max_splits
    return (
        torch.empty((rows, h, s, config.kv_lora_rank), dtype=F32, device=device),
        torch.empty((rows, h, s), dtype=F32, device=device),
        torch.ones((rows,), dtype=I32, device=device),
    )


def choose_splits(config: DsaTritonConfig, rows: int, num_sms: int) -> int:
    """Top-k splits per row, a power of two up to max_splits (each split keeps at least two
    slot tiles): rows x head blocks split while the programs fit in one wave of SMs for the
    Gluon kernels (one program an SM: 218 KiB of shared memory), two waves for the Triton
    kernel (several programs an SM). On the H200 (bench/results/dsa-h200-20261202T1323Z-
    7b3be68.json) the Gluon kernels ran 10-21% faster at the one-wave count than at the
    two-wave one, at 64 and 128 heads, fp8 and bf16, B64 and B128."""
    programs = rows * triton.cdiv(config.num_heads, config.sparse_block_h)
    waves = 1 if config.sparse_gluon else 2
    splits = 1
    tiles = config.index_topk // config.sparse_block_n
    while (
        splits * 2 <= config.max_splits
        and programs * splits * 2 <= waves * num_sms
        and tiles // (splits * 2) >= 2
    ):
        splits *= 2
    return splits


def _sparse_common(config: DsaTritonConfig, *, splits: int, write_lse: bool) -> dict:
    """The constexprs and warp count that both sparse kernels take."""
    return dict(
        NUM_HEADS=config.num_heads,
        LORA=config.kv_lora_rank,
        ROPE=config.qk_rope_head_dim,
        TOPK=config.index_topk,
        BLOCK_H=config.sparse_block_h,
        BLOCK_N=config.sparse_block_n,
        SPLITS=splits,
        WRITE_LSE=write_lse,
        num_warps=config.sparse_num_warps,
    )


def sparse_options(config: DsaTritonConfig, *, splits: int, write_lse: bool) -> dict:
    """Launch options of the Triton sparse kernel (``sparse_mla_kernel``): the common ones,
    its FP8 cache switch and its pipeline depth."""
    return dict(
        _sparse_common(config, splits=splits, write_lse=write_lse),
        FP8=config.fp8_cache,
        num_stages=config.sparse_num_stages,
    )


def sparse_wg_options(config: DsaTritonConfig, *, splits: int, write_lse: bool) -> dict:
    """Launch options of the Gluon sparse kernels (config.sparse_gluon: ``sparse_wg_kernel``
    for 16-bit rows, ``sparse_fp8_wg_kernel`` for the 656-byte fp8 rows): the common ones
    only, as each reads one row layout (no FP8 switch) and pipelines itself (no
    num_stages)."""
    return _sparse_common(config, splits=splits, write_lse=write_lse)


def gluon_sparse_kernel(config: DsaTritonConfig):
    """The Gluon sparse kernel config.sparse_gluon runs for the config's row layout."""
    return sparse_fp8_wg_kernel if config.fp8_cache else sparse_wg_kernel


def combine_options(config: DsaTritonConfig, *, write_lse: bool) -> dict:
    return dict(
        LORA=config.kv_lora_rank,
        MAX_SPLITS=config.max_splits,
        WRITE_LSE=write_lse,
        num_warps=config.combine_num_warps,
    )


def _check_gluon(config: DsaTritonConfig) -> None:
    """The Gluon sparse kernels' shape rules (``DsaTritonConfig.gluon_shape_problems``), on
    a GPU (the Triton interpreter cannot run Gluon)."""
    problems = config.gluon_shape_problems()
    if problems:
        fail(
            "config.sparse_gluon",
            "0 unless the tile is 64 heads x 64 slots on 8 warps (and, over fp8 rows, the "
            "activations bf16)",
            f"1 with kv {config.kv_dtype}: " + "; ".join(problems),
        )
    refuse_interpreter("config.sparse_gluon")


def _split_q(q, q_rope, config: DsaTritonConfig) -> tuple[torch.Tensor, torch.Tensor]:
    h, lora, rope = config.num_heads, config.kv_lora_rank, config.qk_rope_head_dim
    dtype = io_dtype(config)
    if q_rope is None:
        check_tensor("q", q, dtype=dtype, shape=[None, h, lora + rope], last_dim_contiguous=True)
        return q[..., :lora], q[..., lora:]
    check_tensor("q", q, dtype=dtype, shape=[None, h, lora], last_dim_contiguous=True)
    check_tensor(
        "q_rope",
        q_rope,
        dtype=dtype,
        shape=[q.shape[0], h, rope],
        device=q.device,
        last_dim_contiguous=True,
    )
    return q, q_rope


def _cache_views(kv_cache: torch.Tensor, config: DsaTritonConfig, device) -> tuple:
    """(KV, KVF, KV16) kernel arguments and their row strides."""
    check_tensor(
        "kv_cache",
        kv_cache,
        dtype=kv_dtype(config),
        shape=[None, config.page_size, 1, config.kv_width],
        device=device,
        contiguous=True,
    )
    rows = kv_cache.view(-1, config.kv_width)
    if not config.fp8_cache:
        return (rows, None, None), (config.kv_width, 0, 0)
    raw = rows.view(torch.uint8)
    f32, i16 = raw.view(F32), raw.view(torch.int16)
    return (rows, f32, i16), (config.kv_width, f32.shape[1], i16.shape[1])


def sparse_mla(
    q: torch.Tensor,
    q_rope: torch.Tensor | None,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    *,
    config: DsaTritonConfig,
    sm_scale: float,
    lse: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    splits: int = 1,
) -> torch.Tensor:
    """Sparse absorbed MLA of ``T`` query rows over their selected slots, into ``out``.

    q ``[T, H, 576]`` (or ``[T, H, 512]`` + q_rope ``[T, H, 64]``); kv_cache ``[pages,
    page_size, 1, 576]`` in the activations' dtype, or float8_e4m3fn ``[pages, page_size,
    1, 656]`` (DeepSeek-V3.2's layout); indices int32 ``[T, topk]`` token slots (-1: none;
    slots must lie in the cache: not checked on device). out ``[T, H, 512]``; lse fp32
    ``[T, H]`` (natural log) when given. ``splits`` > 1 (a power of two <= max_splits)
    splits each row's top-k over that many programs, merged through ``workspace``
    (``sparse_workspace``, >= T rows).
    """
    q_nope, q_rope = _split_q(q, q_rope, config)
    rows, device = int(q_nope.shape[0]), q_nope.device
    h, lora, k = config.num_heads, config.kv_lora_rank, config.index_topk
    (kv, kvf, kv16), (s_kv, s_kvf, s_kv16) = _cache_views(kv_cache, config, device)
    check_tensor("indices", indices, dtype=I32, shape=[rows, k], device=device)
    if indices.stride(1) != 1:
        fail("indices", "stride 1 in the last dim", indices.stride())
    check_tensor(
        "out",
        out,
        dtype=io_dtype(config),
        shape=[rows, h, lora],
        device=device,
        last_dim_contiguous=True,
    )
    if lse is not None:
        check_tensor("lse", lse, dtype=F32, shape=[rows, h], device=device, contiguous=True)
    if splits < 1 or splits & (splits - 1) or splits > config.max_splits:
        fail("splits", f"a power of two <= {config.max_splits}", splits)
    if (k // splits) % config.sparse_block_n:
        fail("splits", f"a divisor of topk / {config.sparse_block_n}", splits)
    if splits > 1:
        if workspace is None:
            fail("workspace", "sparse_workspace(...) when splits > 1", None)
        po, pl, ns = workspace
        check_tensor("partial_o", po, dtype=F32, shape=[None, h, config.max_splits, lora])
        check_tensor("partial_lse", pl, dtype=F32, shape=[None, h, config.max_splits])
        check_tensor("num_splits", ns, dtype=I32, shape=[None], device=device)
        if min(po.shape[0], pl.shape[0], ns.shape[0]) < rows:
            fail("workspace", f">= {rows} rows", (po.shape[0], pl.shape[0], ns.shape[0]))
        ns[:rows].fill_(splits)
    else:
        po = pl = ns = None
    if rows == 0:
        return out
    lse_arg = lse if lse is not None else out
    lse_stride = lse.stride(0) if lse is not None else 0
    po_strides = po.stride()[:3] if po is not None else (0, 0, 0)
    pl_strides = pl.stride()[:2] if pl is not None else (0, 0)
    grid = (rows, triton.cdiv(h, config.sparse_block_h), splits)
    if config.sparse_gluon:
        _check_gluon(config)
    strides = (q_nope.stride(0), q_nope.stride(1), q_rope.stride(0), q_rope.stride(1))
    tail = (indices.stride(0), out.stride(0), out.stride(1), lse_stride, *po_strides, *pl_strides)
    if config.sparse_gluon:
        options = sparse_wg_options(config, splits=splits, write_lse=lse is not None)
        if config.fp8_cache:  # the rows as 32-bit words and as bf16 (the rope)
            raw = kv.view(torch.uint8)
            words, b16 = raw.view(I32), raw.view(torch.bfloat16)
            rows_args = (words, b16)
            row_strides = (words.stride(0), b16.stride(0))
        else:
            rows_args, row_strides = (kv,), (s_kv,)
        gluon_sparse_kernel(config)[grid](
            q_nope, q_rope, *rows_args, indices, ns, out, lse_arg, po, pl, sm_scale, *strides,
            *row_strides, *tail, **options,
        )  # fmt: skip
    else:
        options = sparse_options(config, splits=splits, write_lse=lse is not None)
        sparse_mla_kernel[grid](
            q_nope, q_rope, kv, kvf, kv16, indices, ns, out, lse_arg, po, pl, sm_scale,
            *strides, s_kv, s_kvf, s_kv16, *tail, **options,
        )  # fmt: skip
    if splits > 1:
        absorbed_combine_kernel[(rows, h)](
            po,
            pl,
            ns,
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
