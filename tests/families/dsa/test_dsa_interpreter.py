"""DSA Triton kernels in the interpreter against the float64 oracles, at small shapes:
indexer scores (paged pool and ragged keys), top-k sets with the tie rule and -1 padding
(slots through the page table), sparse MLA over both cache layouts (splits, LSE, rows
with no selected key), and the pools' quantizing writes.

fp16 activations only (the interpreter gets bf16 arithmetic wrong; the fp8 layout's bf16
rope is decoded from its bits in the kernel, so it runs here). Outputs NaN-poisoned.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attngen.families.dsa import reference as ref
from attngen.families.dsa.pool import IndexKeyPool, latent_pool, unpack_latent_656
from attngen.families.dsa.triton.config import DsaTritonConfig
from attngen.families.dsa.triton.host import launch
from attngen.families.mla.testing import check_close, check_lse
from attngen.runtime.batch import AttentionLayer
from attngen.runtime.checks import AttngenInputError

F16 = torch.float16
FP8 = torch.float8_e4m3fn
PAGE = 64


def config(num_heads=16, kv_dtype="float16", topk=64, **tiles) -> DsaTritonConfig:
    base = DsaTritonConfig(
        uri="test",
        num_heads=num_heads,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        index_heads=16,
        index_head_dim=32,
        index_topk=topk,
        index_dtype="float8_e4m3fn",
        page_size=PAGE,
        dtype="float16",
        kv_dtype=kv_dtype,
        spec_topk=0,
        num_draft_tokens=0,
        sparse_block_h=16,
        sparse_block_n=16,
        sparse_num_warps=4,
        sparse_num_stages=1,
        max_splits=4,
        combine_num_warps=4,
        indexer_block_n=32,
        indexer_block_s=64,
        indexer_num_warps=4,
        topk_block=64,
        topk_num_warps=4,
    )
    return dataclasses.replace(base, **tiles)


def paged_slots(lens: list[int], num_pages: int, seed: int) -> torch.Tensor:
    """A page table [B, max pages] of distinct shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)
    need = [-(-n // PAGE) for n in lens]
    table = torch.zeros((len(lens), max(need)), dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[at : at + n]
        at += n
    return table


def slots_of(table: torch.Tensor, b: int, n: int) -> torch.Tensor:
    j = torch.arange(n)
    return table[b, j // PAGE].long() * PAGE + j % PAGE


def test_index_pool_roundtrip():
    pool = IndexKeyPool(num_layers=2, num_pages=3, page_size=PAGE, index_head_dim=32, device="cpu")
    loc = torch.tensor([5, 70, 191, 64])
    k = torch.randn(4, 32) * torch.tensor([1.0, 10.0, 0.01, 3.0])[:, None]
    pool.set_index_k(1, loc, k.to(F16))
    codes, scale = pool.gather(1, loc)
    assert torch.equal(scale, k.to(F16).float().abs().amax(-1) / 448)
    back = codes.float() * scale[:, None]
    assert (back - k.to(F16).float()).abs().max() <= 0.07 * k.abs().amax()
    assert pool.buffer[0].count_nonzero() == 0  # other layer untouched


def test_index_pool_unscaled_roundtrip():
    """A bf16 / fp16 / fp32 index pool keeps each key as its dtype rounds it, no scale."""
    for dtype in (torch.float32, F16, torch.bfloat16):
        pool = IndexKeyPool(
            num_layers=2, num_pages=3, page_size=PAGE, index_head_dim=32, dtype=dtype, device="cpu"
        )
        assert pool.page_bytes == PAGE * 32 * dtype.itemsize
        loc = torch.tensor([5, 70, 191, 64])
        k = torch.randn(4, 32) * torch.tensor([1.0, 10.0, 0.01, 3.0])[:, None]
        pool.set_index_k(1, loc, k)
        keys, scale = pool.gather(1, loc)
        assert keys.dtype == dtype and torch.equal(keys, k.to(dtype))
        assert torch.equal(scale, torch.ones(4))
        assert pool.buffer[0].count_nonzero() == 0  # other layer untouched
    with pytest.raises(AttngenInputError, match="dtype"):
        IndexKeyPool(num_layers=1, num_pages=1, page_size=PAGE, dtype=torch.int8, device="cpu")


# index dtype -> (torch dtype, error allowed over the sum of |terms|): exact fp8 / fp16
# products or IEEE fp32 ones, fp32 sums of 32 products then 16 heads (the interpreter runs
# fp32 throughout): (32 + 16 + 1) x 2^-24 < 2^-18
INDEX_CASES = {
    "float8_e4m3fn": FP8,
    "float16": F16,
    "float32": torch.float32,
}


@pytest.mark.parametrize("index_dtype", sorted(INDEX_CASES))
@pytest.mark.parametrize("paged", [True, False])
def test_indexer_logits(paged, index_dtype):
    torch.manual_seed(1)
    cfg = config(index_dtype=index_dtype)
    dtype = INDEX_CASES[index_dtype]
    lens = [1, 63, 200]
    q = (torch.randn(len(lens), 16, 32) * 2).to(dtype)
    w = torch.randn(len(lens), 16)
    keys = torch.randn(sum(lens), 32)
    logits = torch.full((len(lens), 256), float("nan"))
    if paged:
        table = paged_slots(lens, 8, seed=2)
        pool = IndexKeyPool(
            num_layers=1, num_pages=8, page_size=PAGE, index_head_dim=32, dtype=dtype, device="cpu"
        )
        loc = torch.cat([slots_of(table, b, n) for b, n in enumerate(lens)])
        pool.set_index_k(0, loc, keys)
        launch.indexer_logits(
            q, w, pool.buffer[0], table, torch.tensor(lens, dtype=torch.int32), logits, config=cfg
        )
    elif dtype == FP8:
        pool = None
        k8, ks = (keys / 0.01).clamp(-448, 448).to(FP8), torch.full((sum(lens),), 0.01)
        starts = torch.tensor([0, 1, 64], dtype=torch.int32)
        launch.indexer_logits_ragged(
            q, w, k8, ks, starts, torch.tensor(lens, dtype=torch.int32), logits, config=cfg
        )
    else:
        pool = None
        k8, ks = keys.to(dtype), torch.ones(sum(lens))
        starts = torch.tensor([0, 1, 64], dtype=torch.int32)
        launch.indexer_logits_ragged(
            q, w, k8, None, starts, torch.tensor(lens, dtype=torch.int32), logits, config=cfg
        )
    at = 0
    for b, n in enumerate(lens):
        if paged:
            k8, ks = pool.gather(0, slots_of(table, b, n))
            want = ref.indexer_logits(q[b : b + 1].float(), w[b : b + 1], k8.float(), ks)[0]
        else:
            sl = slice(at, at + n)
            want = ref.indexer_logits(q[b : b + 1].float(), w[b : b + 1], k8[sl].float(), ks[sl])[0]
        at += n
        got = logits[b, :n].double()
        assert not torch.isnan(got).any()
        k_rows = pool.gather(0, slots_of(table, b, n)) if paged else (k8[sl], ks[sl])
        args = (q[b : b + 1].float(), w[b : b + 1], k_rows[0].float(), k_rows[1])
        bound = 2.0**-18 * ref.indexer_abs_sum(*args)[0]
        assert ((got - want).abs() <= bound).all(), f"row {b}"


def test_topk_tie_rule_and_padding():
    cfg = config(topk=64)
    lens = [10, 64, 65, 300]
    logits = torch.randn(len(lens), 320)
    logits[3, :200] = 0.5  # 200 equal scores: the tie rule decides
    logits[3, 250] = 2.0
    logits[2, 7] = float("-inf")
    table = paged_slots(lens, 12, seed=3)
    pos = torch.full((len(lens), 64), -7, dtype=torch.int32)
    slot = torch.full((len(lens), 64), -7, dtype=torch.int32)
    rl = torch.tensor(lens, dtype=torch.int32)
    launch.topk(logits, rl, pos, config=cfg, page_table=table, out_slot=slot)
    for b, n in enumerate(lens):
        want = ref.topk_positions(logits[b], n, 64)
        got = pos[b][pos[b] >= 0].tolist()
        assert got == want, f"row {b}"
        assert (pos[b, len(want) :] == -1).all()
        assert slot[b, : len(want)].tolist() == slots_of(table, b, n)[want].tolist()
        assert (slot[b, len(want) :] == -1).all()
    # row 3: the 2.0, the top of the rest (scores > 0.5 past 200), then ties lowest first
    assert 250 in pos[3].tolist()


@pytest.mark.parametrize("kv", ["float16", "float8_e4m3fn"])
@pytest.mark.parametrize("splits", [1, 2])
def test_sparse_mla(kv, splits):
    torch.manual_seed(4 + splits)
    cfg = config(num_heads=16, kv_dtype=kv)
    pages, t = 4, 3
    pool = latent_pool(
        num_layers=1, num_pages=pages, page_size=PAGE, dtype=getattr(torch, kv), device="cpu"
    )
    slots = torch.arange(pages * PAGE)
    latent = (torch.randn(len(slots), 512) * 0.5).to(F16)
    rope = (torch.randn(len(slots), 64) * 0.5).to(F16)
    pool.set_mla_kv_buffer(AttentionLayer(0, 16, 1, 576, 512, 576**-0.5), slots, latent, rope)
    cache = pool.kv_buffer[0]
    rows = cache.view(len(slots), -1)
    rows = unpack_latent_656(rows) if kv != "float16" else rows.float()
    idx = torch.full((t, 64), -1, dtype=torch.int32)
    idx[0] = torch.randperm(len(slots))[:64].int()
    idx[1, :5] = torch.tensor([3, 77, 200, 1, 130])
    # row 2: no key at all
    q = torch.randn(t, 16, 576).to(F16)
    out = torch.full((t, 16, 512), float("nan"), dtype=F16)
    lse = torch.full((t, 16), float("nan"))
    ws = launch.sparse_workspace(cfg, rows=t, device="cpu")
    launch.sparse_mla(
        q,
        None,
        cache,
        idx,
        out,
        config=cfg,
        sm_scale=576**-0.5,
        lse=lse,
        workspace=ws,
        splits=splits,
    )
    want, want_lse = ref.sparse_mla(q, rows, idx, 576**-0.5)
    check_close(out, want, F16, f"sparse {kv} splits {splits}")
    check_lse(lse, want_lse, "sparse lse")
    assert (out[2] == 0).all()


def test_sparse_rejects_bad_indices():
    cfg = config()
    with pytest.raises(AttngenInputError, match="indices"):
        launch.sparse_mla(
            torch.zeros(2, 16, 576, dtype=F16),
            None,
            torch.zeros(1, PAGE, 1, 576, dtype=F16),
            torch.zeros(2, 64, dtype=torch.int64),
            torch.zeros(2, 16, 512, dtype=F16),
            config=cfg,
            sm_scale=1.0,
        )


@pytest.mark.parametrize(
    "kv, tiles, why",
    [
        # the fp8 rows' Gluon kernel multiplies the cache's bf16 rope by q's: bf16 only
        ("float8_e4m3fn", dict(sparse_block_h=64, sparse_block_n=64, sparse_num_warps=8),
         "activations bf16"),
        ("float16", dict(sparse_block_h=64, sparse_block_n=32, sparse_num_warps=8),
         "64 heads x 64 slots on 8 warps"),
        # the right shape, under the interpreter: refused by name
        ("float16", dict(sparse_block_h=64, sparse_block_n=64, sparse_num_warps=8),
         "TRITON_INTERPRET"),
    ],
)  # fmt: skip
def test_gluon_sparse_checked_before_launch(kv, tiles, why):
    """A config that picks a Gluon sparse kernel (sparse_gluon) with a shape or activation
    dtype it lacks, or under the interpreter, is refused with the config field named."""
    cfg = config(num_heads=64, kv_dtype=kv, sparse_gluon=1, **tiles)
    dtype = F16 if kv == "float16" else FP8
    with pytest.raises(AttngenInputError, match=f"config.sparse_gluon.*{why}"):
        launch.sparse_mla(
            torch.zeros(1, 64, 576, dtype=F16),
            None,
            torch.zeros(1, PAGE, 1, cfg.kv_width, dtype=dtype),
            torch.zeros(1, 64, dtype=torch.int32),
            torch.zeros(1, 64, 512, dtype=F16),
            config=cfg,
            sm_scale=1.0,
        )
