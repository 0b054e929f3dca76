"""Test and bench helpers of the DSA family: a backend with its three pools, batches laid
out in them with random caches, float64 oracle inputs and the top-k comparison (CPU
interpreter tests, GPU tests and benches share them)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from attngen.families.dsa import reference as ref
from attngen.families.dsa.pool import IndexKeyPool, latent_pool, unpack_latent_656

FP8 = torch.float8_e4m3fn
# Indexer scores: the fp8 products are exact, but Hopper's fp8 tensor cores accumulate a
# 128-long dot in about 14 significant bits (DeepSeek-V3's report; DeepGEMM's indexer
# kernels do the same), once per 32-product k-step: <= 4 x 2^-14 = 2^-12 of the sum of
# |terms| (``reference.indexer_abs_sum``), then fp32 over heads: the bound. On the H200
# (commit 0445985) the worst error was 0.015 of 2^-10 of the sum, 1/16 of this bound; the
# interpreter (fp32 throughout) is far inside it.
SCORE_ABS_FACTOR = 2.0**-12
# An unquantized indexer (bf16 / fp16 products exact in fp32, or IEEE fp32 products) sums
# 128 products and then 64 heads in fp32: (128 + 64 + 1) x 2^-24 < 2^-16 of the sum of
# |terms| (the kernel's own inputs, so the rounding of q and k to the index dtype is not in
# it: that is the model's arithmetic, not the kernel's).
SCORE_ABS_FACTOR_UNSCALED = 2.0**-16


def score_abs_factor(index_pool: IndexKeyPool) -> float:
    return SCORE_ABS_FACTOR if index_pool.scaled else SCORE_ABS_FACTOR_UNSCALED


@dataclass
class DsaRig:
    backend: object
    req_pool: object
    kv_pool: object
    index_pool: object
    layer: object  # AttentionLayer of the absorbed path (576 / 512)


def make_rig(
    backend_cls: type,
    *,
    num_heads: int,
    dtype: torch.dtype,
    device: str | torch.device,
    kv_cache_dtype: torch.dtype | None = None,
    index_dtype: torch.dtype = FP8,
    max_reqs: int = 64,
    max_context_len: int = 4096,
    num_pages: int | None = None,
) -> DsaRig:
    from attngen.runtime.batch import AttentionLayer, ReqToTokenPool

    ps = 64
    num_pages = num_pages or -(-4 * max_context_len // ps) + 1
    req_pool = ReqToTokenPool(max_reqs, max_context_len, device)
    kv_dtype = dtype if kv_cache_dtype is None else kv_cache_dtype
    kv_pool = latent_pool(
        num_layers=1, num_pages=num_pages, page_size=ps, dtype=kv_dtype, device=device
    )
    index_pool = IndexKeyPool(
        num_layers=1, num_pages=num_pages, page_size=ps, dtype=index_dtype, device=device
    )
    # fresh random bytes everywhere: a kernel reading an unwritten slot sees garbage, not 0
    buf = kv_pool.kv_buffer[0]
    if kv_dtype == FP8:  # random finite rows, quantized through the pool
        slots = torch.arange(kv_pool.num_slots, device=device)
        kv_pool.set_mla_kv_buffer(
            AttentionLayer(0, num_heads, 1, 576, 512, 1.0),
            slots,
            torch.randn(len(slots), 512, device=device),
            torch.randn(len(slots), 64, device=device),
        )
    else:
        buf.copy_(torch.randn(buf.shape, device=device))
    backend = backend_cls(
        num_heads=num_heads,
        dtype=dtype,
        device=device,
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
        index_pool=index_pool,
        kv_cache_dtype=kv_cache_dtype,
    )
    layer = AttentionLayer(0, num_heads, 1, 576, 512, 192**-0.5)
    return DsaRig(backend, req_pool, kv_pool, index_pool, layer)


@dataclass
class DsaBatch:
    batch: object  # ForwardBatch
    prefix_lens: list[int]
    extend_lens: list[int]
    slots: list[torch.Tensor]  # per request: token slots of all its tokens, in order
    new_latent: torch.Tensor  # [T, 1, 512]
    new_rope: torch.Tensor  # [T, 1, 64]
    new_index_k: torch.Tensor  # [T, 128]
    q: torch.Tensor  # [T, H, 576]
    q_index: torch.Tensor  # [T, 64, 128] in the index dtype (e4m3 by default)
    weights: torch.Tensor  # [T, 64] fp32

    @property
    def rows_req(self) -> list[tuple[int, int]]:
        """(request, visible keys) of every query row in order (causal)."""
        out = []
        for b, (p, e) in enumerate(zip(self.prefix_lens, self.extend_lens)):
            out += [(b, p + i + 1) for i in range(e)]
        return out


def rig_batch(
    rig: DsaRig,
    prefix_lens: list[int],
    extend_lens: list[int],
    mode,
    *,
    seed: int = 0,
    spec_info=None,
    first_row: int = 1,
) -> DsaBatch:
    """Requests on req_to_token rows ``first_row``.., on shuffled pages 1.. (row 0 and page 0
    stay for graph padding); prefix latent rows and indexer keys written through the pools."""
    from attngen.runtime.batch import ForwardBatch, ForwardMode

    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    ps, device = 64, rig.kv_pool.device
    dtype, heads = rig.backend.dtype, rig.backend.num_heads
    pages = list(range(1, rig.kv_pool.num_pages))
    rng.shuffle(pages)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    all_slots, new_slots, prefix_slots = [], [], []
    for b, n in enumerate(seq_lens):
        mine = [pages.pop() for _ in range(-(-n // ps))]
        pos = torch.arange(n)
        slots = torch.tensor(mine, dtype=torch.int64)[pos // ps] * ps + pos % ps
        rig.req_pool.write(first_row + b, 0, slots)
        all_slots.append(slots.to(device))
        prefix_slots.append(slots[: prefix_lens[b]])
        new_slots.append(slots[prefix_lens[b] :])
    pre = torch.cat(prefix_slots).to(device)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    if pre.numel():
        rig.kv_pool.set_mla_kv_buffer(
            rig.layer, pre, randn(len(pre), 512).to(dtype), randn(len(pre), 64).to(dtype)
        )
        rig.index_pool.set_index_k(0, pre, randn(len(pre), 128).to(dtype))
    rows = sum(extend_lens)
    i32 = dict(dtype=torch.int32, device=device)
    extend = mode is not ForwardMode.DECODE
    batch = ForwardBatch(
        batch_size=len(seq_lens),
        forward_mode=mode,
        req_pool_indices=torch.arange(first_row, first_row + len(seq_lens), **i32),
        seq_lens=torch.tensor(seq_lens, **i32),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        out_cache_loc=torch.cat(new_slots).to(device),
        extend_prefix_lens=torch.tensor(prefix_lens, **i32) if extend else None,
        extend_seq_lens=torch.tensor(extend_lens, **i32) if extend else None,
        extend_prefix_lens_cpu=list(prefix_lens) if extend else None,
        extend_seq_lens_cpu=list(extend_lens) if extend else None,
        spec_info=spec_info,
    )
    return DsaBatch(
        batch,
        list(prefix_lens),
        list(extend_lens),
        all_slots,
        randn(rows, 1, 512).to(dtype),
        randn(rows, 1, 64).to(dtype),
        randn(rows, 128).to(dtype),
        randn(rows, heads, 576).to(dtype),
        randn(rows, 64, 128, scale=3.0).to(rig.index_pool.dtype),
        randn(rows, 64, scale=0.1).float(),
    )


def oracle_rows(rig: DsaRig) -> torch.Tensor:
    """Every latent row of the pool as the oracle reads it: float ``[slots, 576]``
    (the 656-byte rows dequantized)."""
    buf = rig.kv_pool.get_key_buffer(0)
    rows = buf.view(rig.kv_pool.num_slots, -1)
    return unpack_latent_656(rows) if buf.dtype == FP8 else rows.float()


def oracle_scores(rig: DsaRig, db: DsaBatch, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 indexer scores of query row ``row`` over its visible keys, and the largest
    error allowed on each (``score_abs_factor`` x the sum of |terms|)."""
    b, n = db.rows_req[row]
    k8, ks = rig.index_pool.gather(0, db.slots[b][:n])
    args = (db.q_index[row : row + 1].float(), db.weights[row : row + 1], k8.float(), ks)
    factor = score_abs_factor(rig.index_pool)
    return ref.indexer_logits(*args)[0], factor * ref.indexer_abs_sum(*args)[0]


def check_scores(got: torch.Tensor, scores: torch.Tensor, bound: torch.Tensor, what: str) -> float:
    """Every score within its bound; returns the worst error / bound."""
    got = got.double().to(scores.device)
    assert not torch.isnan(got).any(), f"{what}: unwritten scores"
    ratio = ((got - scores).abs() / bound.clamp_min(1e-300)).max().item()
    assert ratio <= 1.0, f"{what}: score error {ratio:.3g} x its bound"
    return ratio


def topk_agreement(
    scores: torch.Tensor, bound: torch.Tensor, got: list[int], k: int
) -> tuple[float, float]:
    """Overlap of the kernel's positions with the oracle's top-k (1.0: equal sets), and the
    worst disagreement: for each pick outside the oracle's set, how far its oracle score
    lies below the oracle's k-th score, over the two scores' error bounds (<= 1: a tie at
    the kernel's resolution; 0.0 when the sets are equal)."""
    want = ref.topk_positions(scores, scores.shape[0], k)
    if got == want:
        return 1.0, 0.0
    n = len(want)
    overlap = len(set(got) & set(want)) / max(n, 1)
    kth_pos = min(want, key=lambda j: (scores[j].item(), -j))
    kth = scores[kth_pos].item()
    extra = [j for j in got if j not in set(want)]
    worst = max(
        ((kth - scores[j].item()) / (bound[j] + bound[kth_pos]).item() for j in extra),
        default=0.0,
    )
    return overlap, worst
