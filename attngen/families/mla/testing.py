"""Test and bench helpers of the MLA family: random paged latent caches and the derived
error bound (CPU interpreter tests, GPU tests and benches share them)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from attngen.testing.tolerance import KERNEL, row_rms_error

# -- error bounds ----
# A kernel output in dtype vs the float64 oracle on the same (dtype-rounded) inputs, per
# element i of a query row r: the output's own rounding costs <= eps/2 * |o_i| (half an ulp);
# rounding the softmax weights P to dtype before the P.V product costs about
# eps / (2 sqrt 3) * rms(o_r) (<= 1.5 eps * rms(o_r) at 5 sigma), fp32 accumulation and exp2
# far less: 2 eps * rms(o_r), quadrupled for margin. The RMS is the row's, not the batch's:
# a batch mixes short rows (outputs ~ one value vector) with long ones (averages of thousands,
# ~50x smaller), so a batch-wide RMS is no scale for either. (The first version used the
# batch RMS and assumed |o| <= 4 rms; on the H200 at b343cf7 verify batches with prefixes
# from 0 to 4k broke that assumption by 2-9% at 128 heads.)
OUT_RMS_FACTOR = 8.0
# A result composed of partial attentions merged by LSE (chunked prefix: the new tokens and
# each prefix chunk give a dtype output, and each merge_state rounds the running output to
# dtype again): every merge adds one more stage (P rounding, 1.5 eps * rms at 5 sigma) and
# two more output roundings (2 x 2 eps * rms): 5.5 eps * rms, doubled for margin.
MERGE_RMS_FACTOR = 11.0
EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def error_bound(expected: torch.Tensor, dtype: torch.dtype, merges: int = 0) -> torch.Tensor:
    """The largest absolute error allowed on each element of a kernel output of ``dtype``
    (rows: the first dim; ``merges``: how many merge_state calls composed it)."""
    exp = expected.double()
    rows = exp.reshape(exp.shape[0], -1)
    row_rms = rows.pow(2).mean(dim=1).sqrt().view(-1, *([1] * (exp.dim() - 1)))
    factor = OUT_RMS_FACTOR + MERGE_RMS_FACTOR * merges
    return EPS[dtype] / 2 * exp.abs() * (1 + merges) + factor * EPS[dtype] * row_rms


def check_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype,
    what: str,
    merges: int = 0,
):
    """Every element written (no NaN left from the poisoned output) and within the bound;
    returns (max error, bound)."""
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    assert not torch.isnan(actual).any(), f"{what}: unwritten (NaN) elements remain"
    diff = (actual - expected).abs()
    bounds = error_bound(expected, dtype, merges)
    ratio = diff / bounds.clamp_min(1e-300)
    worst = int(ratio.argmax())
    err, bound = diff.flatten()[worst].item(), bounds.flatten()[worst].item()
    assert err <= bound, f"{what}: error {err:.3e} > bound {bound:.3e} (element {worst})"
    # per query row, relative to that row's output (attngen.testing.tolerance: a skipped
    # page or a 1% scale error shows there); a composed result rounds 3 more times per merge
    # (a stage's P and output, the merge's output) than the 2 of one kernel, in quadrature
    rel = row_rms_error(actual, expected)
    row_bound = KERNEL[dtype]["rms"] * math.sqrt((3 * merges + 2) / 2)
    worst = int(rel.argmax())
    assert float(rel[worst]) <= row_bound, (
        f"{what}: row {worst} has an RMS error of {float(rel[worst]):.3g} of its output's RMS "
        f"(bound {row_bound:.3g})"
    )
    return err, bound


def check_lse(actual: torch.Tensor, expected: torch.Tensor, what: str, atol: float = 1e-3):
    """LSE (fp32 throughout, natural log): -inf exactly where the oracle's is, else within
    ``atol`` (fp32 scores of |s| <~ 30 and the exp2/log2 approximations: ~1e-5)."""
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    assert not torch.isnan(actual).any(), f"{what}: NaN LSE"
    inf_a, inf_e = torch.isinf(actual), torch.isinf(expected)
    assert torch.equal(inf_a, inf_e), f"{what}: -inf LSE where the oracle differs"
    err = (actual[~inf_e] - expected[~inf_e]).abs().max().item() if (~inf_e).any() else 0.0
    assert err <= atol, f"{what}: LSE error {err:.3e} > {atol}"
    return err


@dataclass
class LatentBatch:
    """A random paged latent cache and the requests laid out in it."""

    cache: torch.Tensor  # [pages, page_size, 1, width], fresh randn (never zeros)
    page_table: torch.Tensor  # [B, max pages] int32
    seq_lens: list[int]
    slots: list[torch.Tensor]  # per request: token slots of its tokens, in order


def latent_batch(
    seq_lens: list[int],
    *,
    page_size: int,
    width: int = 576,
    dtype: torch.dtype,
    device: str | torch.device,
    spare_pages: int = 2,
    seed: int = 0,
) -> LatentBatch:
    """Requests of ``seq_lens`` tokens on shuffled physical pages (page 0 reserved)."""
    rng = random.Random(seed)
    pages_per = [-(-n // page_size) for n in seq_lens]
    num_pages = 1 + sum(pages_per) + spare_pages
    order = list(range(1, num_pages))
    rng.shuffle(order)
    cache = torch.randn(num_pages, page_size, 1, width, device=device).to(dtype)
    width_pt = max(1, max(pages_per, default=1))
    page_table = torch.zeros(len(seq_lens), width_pt, dtype=torch.int32)
    slots, used = [], 0
    for b, (n, np_) in enumerate(zip(seq_lens, pages_per)):
        pages = order[used : used + np_]
        used += np_
        page_table[b, :np_] = torch.tensor(pages, dtype=torch.int32)
        pos = torch.arange(n)
        slots.append(
            torch.tensor(pages, dtype=torch.int64)[pos // page_size] * page_size + pos % page_size
        )
    return LatentBatch(cache, page_table.to(device), list(seq_lens), slots)


# -- backends end to end ----


@dataclass
class MlaRig:
    """A backend with its pools and the two layer descriptions (absorbed, ragged)."""

    backend: object
    req_pool: object
    kv_pool: object
    absorbed_layer: object
    ragged_layer: object
    kv_scale: float


def make_rig(
    backend_cls: type,
    *,
    num_heads: int,
    page_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
    kv_cache_dtype: torch.dtype | str | None = None,
    max_reqs: int = 128,
    max_context_len: int = 1024,
    num_pages: int | None = None,
    spec_topk: int | None = None,
    kv_scale: float = 0.5,
    **backend_kwargs: object,
) -> MlaRig:
    from attngen.families.mla.pool import MlaLatentPool
    from attngen.runtime.batch import AttentionLayer, ReqToTokenPool

    kv_dtype = dtype if kv_cache_dtype is None else kv_cache_dtype
    num_pages = num_pages or -(-4 * max_context_len // page_size) + 1  # room for 4 requests
    req_pool = ReqToTokenPool(max_reqs, max_context_len, device)
    kv_pool = MlaLatentPool(
        num_layers=1, num_pages=num_pages, page_size=page_size, dtype=kv_dtype, device=device
    )
    # fresh random rows everywhere: a kernel reading an unwritten slot sees garbage, not 0
    kv_pool.kv_buffer[0].copy_(torch.randn(kv_pool.kv_buffer[0].shape, device=device))
    backend = backend_cls(
        num_heads=num_heads,
        page_size=page_size,
        dtype=dtype,
        device=device,
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
        kv_cache_dtype=kv_cache_dtype,
        spec_topk=spec_topk,
        **backend_kwargs,
    )
    quant = kv_dtype in (torch.float8_e4m3fn, "nvfp4")
    scale = torch.tensor([kv_scale], dtype=torch.float32, device=device) if quant else None
    absorbed = AttentionLayer(0, num_heads, 1, 576, 512, 192**-0.5, k_scale=scale)
    ragged = AttentionLayer(0, num_heads, num_heads, 192, 128, 192**-0.5)
    return MlaRig(backend, req_pool, kv_pool, absorbed, ragged, kv_scale if quant else 1.0)


@dataclass
class RigBatch:
    batch: object  # ForwardBatch (MlaForwardBatch)
    page_table: torch.Tensor  # [B, pages] int32, as allocated
    prefix_lens: list[int]
    extend_lens: list[int]
    new_latent: torch.Tensor  # [T, 1, 512] the new tokens' latent rows
    new_rope: torch.Tensor  # [T, 1, 64]


def rig_batch(
    rig: MlaRig,
    prefix_lens: list[int],
    extend_lens: list[int],
    mode,
    *,
    seed: int = 0,
    spec_info=None,
    **extra,
) -> RigBatch:
    """Requests on rows 1.. of req_to_token, on shuffled pages 1.. of the pool (row 0 and
    page 0 stay for graph padding); the prefix rows written through set_mla_kv_buffer."""
    from attngen.families.mla.runtime import MlaForwardBatch
    from attngen.runtime.batch import ForwardMode

    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    ps, device = rig.kv_pool.page_size, rig.kv_pool.device
    dtype = rig.backend.dtype
    pages = list(range(1, rig.kv_pool.num_pages))
    rng.shuffle(pages)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    width = max(1, max(-(-n // ps) for n in seq_lens))
    page_table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    new_slots, prefix_slots = [], []
    for b, n in enumerate(seq_lens):
        mine = [pages.pop() for _ in range(-(-n // ps))]
        page_table[b, : len(mine)] = torch.tensor(mine, dtype=torch.int32)
        pos = torch.arange(n)
        slots = torch.tensor(mine, dtype=torch.int64)[pos // ps] * ps + pos % ps
        rig.req_pool.write(b + 1, 0, slots)
        prefix_slots.append(slots[: prefix_lens[b]])
        new_slots.append(slots[prefix_lens[b] :])
    pre = torch.cat(prefix_slots).to(device)
    if pre.numel():
        lat = torch.randn(pre.shape[0], 512, generator=gen).to(dtype).to(device)
        rope = torch.randn(pre.shape[0], 64, generator=gen).to(dtype).to(device)
        rig.kv_pool.set_mla_kv_buffer(rig.absorbed_layer, pre, lat, rope)
    rows = sum(extend_lens)
    i32 = dict(dtype=torch.int32, device=device)
    extend = mode is not ForwardMode.DECODE
    batch = MlaForwardBatch(
        batch_size=len(seq_lens),
        forward_mode=mode,
        req_pool_indices=torch.arange(1, len(seq_lens) + 1, **i32),
        seq_lens=torch.tensor(seq_lens, **i32),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        out_cache_loc=torch.cat(new_slots).to(device),
        extend_prefix_lens=torch.tensor(prefix_lens, **i32) if extend else None,
        extend_seq_lens=torch.tensor(extend_lens, **i32) if extend else None,
        extend_prefix_lens_cpu=list(prefix_lens) if extend else None,
        extend_seq_lens_cpu=list(extend_lens) if extend else None,
        spec_info=spec_info,
        **extra,
    )
    return RigBatch(
        batch,
        page_table.to(device),
        list(prefix_lens),
        list(extend_lens),
        torch.randn(rows, 1, 512, generator=gen).to(dtype).to(device),
        torch.randn(rows, 1, 64, generator=gen).to(dtype).to(device),
    )


def oracle_cache(rig: MlaRig) -> tuple[torch.Tensor, float]:
    """The rig's latent cache as the oracle reads it, and the scale to apply: NVFP4 pools
    are dequantized here (their global scale included), fp8 ones read with their scale."""
    cache = rig.kv_pool.get_key_buffer(0)
    if getattr(rig.kv_pool, "fp4", False):
        from attngen.runtime.nvfp4 import dequantize_nvfp4

        scales = rig.kv_pool.get_block_scales(0)
        return dequantize_nvfp4(cache, scales, rig.absorbed_layer.k_scale), 1.0
    return cache, rig.kv_scale
