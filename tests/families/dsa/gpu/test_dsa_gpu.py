"""DSA on the GPU: the generated sm90 backends (bf16 activations; bf16 and 656-byte fp8
latent caches) against the float64 oracles, end to end through the backend:

- the indexer's scores over the paged index-key pool, per query row, against float64 on
  the same fp8 inputs; the top-k sets against the oracle's with the tie rule (overlap
  reported; a disagreement must be a tie at fp32 resolution); a row with <= 2048 visible
  keys selects exactly those;
- sparse MLA over the selected slots against float64 on the same slots (out and LSE), at
  h_q 16 / 64 / 128, decode over contexts up to 64k, causal extend, chain verify (MTP);
- fp8 vs bf16 latent within a derived bound; the ragged indexer (prefill keys);
- CUDA-graph capture once, replay of 20+ batches for decode and for verify.

Run: ``ATTNGEN_GPU=1 python -m pytest -q -n 8 tests/families/dsa/gpu``.
"""

from __future__ import annotations

import dataclasses
import importlib
import random

import pytest
import torch

from attngen.families.dsa import reference as ref
from attngen.families.dsa.testing import (
    SCORE_ABS_FACTOR,
    check_scores,
    make_rig,
    oracle_rows,
    oracle_scores,
    rig_batch,
    topk_agreement,
)
from attngen.families.mla.testing import check_close, check_lse
from attngen.runtime.batch import ForwardMode, VerifyInfo

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
SCALE = 192**-0.5
TOPK = 2048
SPECS = {"bf16": ("dsa_deepseek_v32", None), "fp8": ("dsa_deepseek_v32_fp8", FP8)}
# fp8 latent vs the bf16 rows it was quantized from: e4m3 with a scale per 128 values of
# amax / 448 gives each element a relative error of rms ~2^-4 / sqrt(3) = 0.036 of its
# block's typical value; through V directly and through the scores (as MLA's derivation,
# tests/families/mla/gpu): ~0.05 rms(o), bounded at 0.15 (3x). The bf16 rope is exact.
FP8_VS_BF16_RMS = 0.15
REPLAYS = 20  # CUDA-graph replays per captured graph (decode, verify)


def backend(spec: str):
    return importlib.import_module(f"generated.sm90.triton.dsa.{spec}.backend").Backend


def rig(kv: str, heads: int, max_context_len: int = 4096, **kw):
    spec, kv_dtype = SPECS[kv]
    return make_rig(
        backend(spec),
        num_heads=heads,
        dtype=BF16,
        device="cuda",
        kv_cache_dtype=kv_dtype,
        max_context_len=max_context_len,
        **kw,
    )


def run(r, db, *, graph_meta=False, return_lse=True):
    """Indexer (writing the new index keys) then sparse attention (writing the new latent)."""
    be, fb = r.backend, db.batch
    if not graph_meta:
        be.init_forward_metadata(fb)
    topk = be.indexer(db.q_index, db.weights, r.layer, fb, index_k=db.new_index_k)
    call = be.forward_decode if fb.forward_mode is ForwardMode.DECODE else be.forward_extend
    res = call(
        db.q,
        db.new_latent,
        None,
        r.layer,
        fb,
        k_rope=db.new_rope,
        topk_indices=topk,
        return_lse=return_lse,
    )
    return topk, res


def check_rows(r, db, topk, out, lse, what, score_rows=None):
    """Every query row: top-k vs the oracle (overlap), sparse out/LSE vs the oracle on the
    kernel's own selection. Returns the smallest overlap and the worst score error over
    its bound."""
    be = r.backend
    rows_req = db.rows_req
    meta, k = be.forward_metadata, be.config.index_topk
    worst_overlap, worst_score = 1.0, 0.0
    for t in score_rows if score_rows is not None else range(len(rows_req)):
        b, n = rows_req[t]
        scores, bound = oracle_scores(r, db, t)
        worst_score = max(worst_score, check_scores(meta.logits[t, :n], scores, bound, what))
        got = topk[t][topk[t] >= 0].tolist()
        if n <= k:
            assert got == list(range(n)), f"{what} row {t}: {n} keys must all be selected"
        assert len(got) == min(n, k), f"{what} row {t}: {len(got)} picks"
        overlap, gap = topk_agreement(scores, bound, got, k)
        assert gap <= 1.0, f"{what} row {t}: a pick {gap:.2g} x the bounds below the k-th"
        worst_overlap = min(worst_overlap, overlap)
        assert (topk[t][len(got) :] == -1).all()
        slots = meta.topk_slots[t][: len(got)].long()
        assert torch.equal(slots, db.slots[b][got]), f"{what} row {t}: slots"
    rows = oracle_rows(r)
    want, want_lse = ref.sparse_mla(db.q, rows, meta.topk_slots.long(), SCALE)
    h = be.num_heads
    check_close(out.view(-1, h, 512), want, be.dtype, what)
    check_lse(lse, want_lse, f"{what} lse")
    return worst_overlap, worst_score


DECODE_LENS = [1, 700, 2048, 2049, 5000, 65536]


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_decode(kv, heads, evidence):
    torch.manual_seed(heads)
    r = rig(kv, heads, max_context_len=65536 + 64, num_pages=1200)
    db = rig_batch(r, [n - 1 for n in DECODE_LENS], [1] * len(DECODE_LENS), ForwardMode.DECODE)
    topk, (out, lse) = run(r, db)
    overlap, score = check_rows(r, db, topk, out, lse, f"decode {kv} h{heads}")
    # a large batch of short and medium rows (no splits at 128 heads)
    rng = random.Random(heads)
    lens = [rng.randint(1, 1500) for _ in range(48)]
    db = rig_batch(r, [n - 1 for n in lens], [1] * 48, ForwardMode.DECODE, seed=1)
    topk, (out, lse) = run(r, db)
    overlap2, score2 = check_rows(r, db, topk, out, lse, "decode B48", score_rows=[0, 7])
    evidence.record(
        r.backend.kernels,
        r.backend.config.uri,
        "decode",
        topk_overlap=min(overlap, overlap2),
        score_err_over_bound=round(max(score, score2), 3),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("index_dtype", [torch.float32, BF16, torch.float16, FP8])
def test_index_dtypes(index_dtype, dtype, evidence):
    """The small-model spec's variants, both activation dtypes and every indexer (fp8, or
    unquantized bf16 / fp16 / fp32 scores, the latter IEEE products) at top-64: decode over
    contexts past and below 64 keys, and extend with and without a prefix; scores within
    their bound (2^-16 of the sum of |terms| unquantized), picks by the oracle's order up
    to ties at it; then decode under CUDA graphs."""
    torch.manual_seed(7)
    r = make_rig(
        backend("dsa_e2e_deepseek_v32"),
        num_heads=16,
        dtype=dtype,
        device="cuda",
        index_dtype=index_dtype,
        max_context_len=8192,  # pages for the graph replays' 8 requests of up to 3000 keys
        max_reqs=40,
    )
    name = str(index_dtype).removeprefix("torch.")
    assert r.backend.config.index_dtype == name
    assert r.backend.config.dtype == str(dtype).removeprefix("torch.")
    lens = [1, 63, 64, 65, 300, 3000]
    for check, mode, prefix, new, seed in (
        ("decode", ForwardMode.DECODE, [n - 1 for n in lens], [1] * len(lens), 8),
        ("extend", ForwardMode.EXTEND, [0, 500], [200, 90], 9),
    ):
        db = rig_batch(r, prefix, new, mode, seed=seed)
        topk, (out, lse) = run(r, db)
        overlap, score = check_rows(r, db, topk, out, lse, f"{check} index {name}")
        evidence.record(
            r.backend.kernels,
            r.backend.config.uri,
            check,
            topk_overlap=overlap,
            score_err_over_bound=round(score, 3),
        )
    replays = graph_replays(r, 16, (ForwardMode.DECODE,))
    evidence.record(
        r.backend.kernels, r.backend.config.uri, "cuda_graph", replays=replays["decode"]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_extend(kv, heads, evidence):
    torch.manual_seed(heads + 1)
    r = rig(kv, heads, max_context_len=8192)
    db = rig_batch(r, [0, 1500, 4000], [150, 300, 40], ForwardMode.EXTEND, seed=2)
    topk, (out, lse) = run(r, db)
    rows = list(range(0, 490, 23))
    overlap, score = check_rows(r, db, topk, out, lse, f"extend {kv} h{heads}", score_rows=rows)
    evidence.record(
        r.backend.kernels,
        r.backend.config.uri,
        "extend",
        topk_overlap=overlap,
        score_err_over_bound=round(score, 3),
    )


def verify_batch(r, prefix_lens, seed):
    n = r.backend.config.num_draft_tokens
    info = VerifyInfo(draft_token_num=n)
    return rig_batch(
        r, prefix_lens, [n] * len(prefix_lens), ForwardMode.TARGET_VERIFY, seed=seed, spec_info=info
    )


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_verify_and_graphs(kv, heads, evidence):
    """Chain verify eagerly, then CUDA graphs: capture decode and verify once at bs 8,
    replay 20 batches each against the eager results of the same batches."""
    torch.manual_seed(heads + 2)
    r = rig(kv, heads, max_context_len=8192, max_reqs=40)
    be = r.backend
    db = verify_batch(r, [5, 2046, 3000, 7000], seed=3)
    topk, (out, lse) = run(r, db)
    check_rows(r, db, topk, out, lse, f"verify {kv} h{heads}")
    evidence.record(be.kernels, be.config.uri, "verify")
    replays = graph_replays(r, heads, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY))
    evidence.record(be.kernels, be.config.uri, "cuda_graph", replays=replays["decode"])
    evidence.record(be.kernels, be.config.uri, "cuda_graph_verify", replays=replays["verify"])


def graph_replays(r, heads: int, modes) -> dict[str, int]:
    """Each mode captured once at bs 8 and replayed over REPLAYS batches (requests from
    row 20 of the request pool), each against the eager result of the same batch: the
    replays run per mode ("decode", "verify")."""
    be = r.backend
    max_bs, n = 8, max(1, be.config.num_draft_tokens)
    be.init_cuda_graph_state(max_bs, max_bs * n)
    replays = {"decode": 0, "verify": 0}
    for mode in modes:
        per = n if mode is ForwardMode.TARGET_VERIFY else 1
        rng = random.Random(heads + per)

        def make(seed, bs):
            prefix = [rng.randint(1, 3000) for _ in range(bs)]
            if mode is ForwardMode.DECODE:
                return rig_batch(r, prefix, [1] * bs, mode, seed=seed, first_row=20)
            info = VerifyInfo(draft_token_num=n)
            return rig_batch(r, prefix, [n] * bs, mode, seed=seed, spec_info=info, first_row=20)

        cap = make(100, max_bs)
        q_s = cap.q.clone()
        qi_s, w_s = cap.q_index.clone(), cap.weights.clone()
        lat_s, rope_s, ik_s = cap.new_latent.clone(), cap.new_rope.clone(), cap.new_index_k.clone()
        loc_s = cap.batch.out_cache_loc.clone()
        req_s = torch.zeros(max_bs, dtype=torch.int32, device="cuda")
        lens_s = torch.ones(max_bs, dtype=torch.int32, device="cuda")
        req_s.copy_(cap.batch.req_pool_indices)
        lens_s.copy_(cap.batch.seq_lens)
        be.init_forward_metadata_capture_cuda_graph(
            max_bs, max_bs * per, req_s, lens_s, None, mode, cap.batch.spec_info
        )
        fb_static = dataclasses.replace(cap.batch, out_cache_loc=loc_s)

        def body():
            topk = be.indexer(qi_s, w_s, r.layer, fb_static, index_k=ik_s)
            call = be.forward_decode if mode is ForwardMode.DECODE else be.forward_extend
            out = call(q_s, lat_s, None, r.layer, fb_static, k_rope=rope_s, topk_indices=topk)
            return topk, out

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            body()  # warm-up (compiles)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_topk, g_out = body()
        for i in range(REPLAYS):
            bs = rng.randint(1, max_bs)
            db = make(200 + i, bs)
            rows = bs * per
            for static, new in (
                (q_s, db.q),
                (qi_s, db.q_index),
                (w_s, db.weights),
                (lat_s, db.new_latent),
                (rope_s, db.new_rope),
                (ik_s, db.new_index_k),
                (loc_s, db.batch.out_cache_loc),
            ):
                static[:rows].copy_(new)
            loc_s[rows:].fill_(0)  # padded rows write to slot 0 (page 0: never a request's)
            req_s.fill_(0)
            lens_s.fill_(be.get_cuda_graph_seq_len_fill_value())
            req_s[:bs].copy_(db.batch.req_pool_indices)
            lens_s[:bs].copy_(db.batch.seq_lens)
            pad = torch.ones(max_bs - bs, dtype=torch.int32)
            be.init_forward_metadata_replay_cuda_graph(
                max_bs,
                req_s,
                lens_s,
                0,
                None,
                mode,
                db.batch.spec_info,
                seq_lens_cpu=torch.cat([db.batch.seq_lens_cpu, pad]),
            )
            graph.replay()
            torch.cuda.synchronize()
            got_topk, got = g_topk[:rows].clone(), g_out[:rows].clone()
            # eager on the same batch (it writes the same new rows again)
            topk, want = run(r, db, return_lse=False)
            assert torch.equal(got_topk, topk), f"graph {mode.name} replay {i}: top-k differs"
            # the same kernels, perhaps split differently (splits follow the row count)
            check_close(
                got.view(rows, heads, 512),
                want.view(rows, heads, 512).double(),
                be.dtype,
                f"graph {mode.name} replay {i}",
            )
            replays["decode" if per == 1 else "verify"] += 1
    assert all(replays["decode" if m is ForwardMode.DECODE else "verify"] >= REPLAYS for m in modes)
    return replays


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_fp8_vs_bf16(heads, evidence):
    """The same tokens in a bf16 pool and an fp8 pool, attended over the same selected
    slots: the fp8 output within FP8_VS_BF16_RMS of the bf16 one (RMS relative to it)."""
    torch.manual_seed(heads + 3)
    r16, r8 = rig("bf16", heads), rig("fp8", heads)
    lens = [300, 2500, 4000]
    outs = []
    for r in (r16, r8):
        db = rig_batch(r, [n - 1 for n in lens], [1] * 3, ForwardMode.DECODE, seed=9)
        topk, out = run(r, db, return_lse=False)
        outs.append((topk.clone(), out.float()))
    assert torch.equal(outs[0][0], outs[1][0])  # same index keys: same selections
    rel = (outs[1][1] - outs[0][1]).pow(2).mean().sqrt() / outs[0][1].pow(2).mean().sqrt()
    assert rel.item() <= FP8_VS_BF16_RMS, f"fp8 vs bf16 RMS error {rel.item():.3f}"
    evidence.record(
        r8.backend.kernels,
        r8.backend.config.uri,
        "quantized_vs_bf16",
        rms_vs_bf16=round(rel.item(), 4),
    )


@pytest.mark.gpu
def test_ragged_indexer_and_sparse_kernel():
    """The ragged (prefill) indexer against float64 and its top-k; the sparse kernel
    directly with NaN-poisoned outputs, -1 holes and an empty row, both layouts."""
    from attngen.families.dsa.pool import latent_pool, unpack_latent_656
    from attngen.runtime.batch import AttentionLayer

    kernels = importlib.import_module("generated.sm90.triton.dsa.dsa_deepseek_v32.kernels")
    cfg = next(c for c in kernels.CONFIGS.values() if c.num_heads == 64)
    torch.manual_seed(5)
    s, starts, lens = 9000, [0, 100, 3000, 8999], [1, 2049, 6000, 1]
    k = (torch.randn(s, 128, device="cuda") * 4).to(FP8)
    ks = torch.rand(s, device="cuda") + 0.1
    q = (torch.randn(4, 64, 128, device="cuda") * 3).to(FP8)
    w = torch.randn(4, 64, device="cuda") * 0.1
    logits = torch.full((4, 6016), float("nan"), device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    kernels.indexer_logits_ragged(
        q, w, k, ks, torch.tensor(starts, **i32), torch.tensor(lens, **i32), logits, config=cfg
    )
    pos = torch.full((4, TOPK), -7, **i32)
    kernels.topk(logits, torch.tensor(lens, **i32), pos, config=cfg)
    for t, (st, n) in enumerate(zip(starts, lens)):
        want = ref.indexer_logits(
            q[t : t + 1].float(), w[t : t + 1], k[st : st + n].float(), ks[st : st + n]
        )[0]
        args = (q[t : t + 1].float(), w[t : t + 1], k[st : st + n].float(), ks[st : st + n])
        bound = SCORE_ABS_FACTOR * ref.indexer_abs_sum(*args)[0]
        check_scores(logits[t, :n], want, bound, f"ragged row {t}")
        got = pos[t][pos[t] >= 0].tolist()
        if n <= TOPK:
            assert got == list(range(n))
        overlap, gap = topk_agreement(want, bound, got, TOPK)
        assert gap <= 1.0
    # the Triton kernel's small tile on both layouts, and the generated tile (sm90: the
    # Gluon kernel, 16-bit rows only)
    small = {"sparse_block_n": 16, "sparse_gluon": 0}
    for kv, tile in (("bfloat16", small), ("float8_e4m3fn", small), ("bfloat16", {})):
        c = dataclasses.replace(cfg, kv_dtype=kv, **tile)
        pool = latent_pool(
            num_layers=1, num_pages=40, page_size=64, dtype=getattr(torch, kv), device="cuda"
        )
        slots = torch.arange(pool.num_slots, device="cuda")
        pool.set_mla_kv_buffer(
            AttentionLayer(0, 64, 1, 576, 512, 1.0),
            slots,
            torch.randn(len(slots), 512, device="cuda").to(BF16),
            torch.randn(len(slots), 64, device="cuda").to(BF16),
        )
        buf = pool.kv_buffer[0]
        rows = (
            unpack_latent_656(buf.view(pool.num_slots, -1))
            if kv != "bfloat16"
            else buf.view(pool.num_slots, -1).float()
        )
        idx = torch.randint(0, pool.num_slots, (5, TOPK), **i32)
        idx[1, ::3] = -1
        idx[2] = -1
        idx[3, 100:] = -1
        qq = torch.randn(5, 64, 576, device="cuda").to(BF16)
        for splits in (1, 4):
            out = torch.full((5, 64, 512), float("nan"), dtype=BF16, device="cuda")
            lse = torch.full((5, 64), float("nan"), device="cuda")
            ws = kernels.sparse_workspace(c, rows=5, device="cuda")
            kernels.sparse_mla(
                qq,
                None,
                buf,
                idx,
                out,
                config=c,
                sm_scale=SCALE,
                lse=lse,
                workspace=ws,
                splits=splits,
            )
            want, want_lse = ref.sparse_mla(qq, rows, idx, SCALE)
            check_close(out, want, BF16, f"sparse {kv} {tile or 'generated'} splits {splits}")
            check_lse(lse, want_lse, "sparse lse")
            assert (out[2] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("rows", [64, 128])
def test_sparse_splits(kv, heads, rows):
    """The sparse kernel at every split count the launcher accepts (1 to max_splits), with
    as many query rows as a decode batch (bench/dsa.py's shape: 2048 distinct slots of 8k
    per row, over a pool of rows x 8k tokens), against the float64 oracle on every split
    count's output; no element may stay unwritten (NaN-poisoned)."""
    spec, kv_dtype = SPECS[kv]
    mod = importlib.import_module(f"generated.sm90.triton.dsa.{spec}.kernels")
    cfg = next(c for c in mod.CONFIGS.values() if c.num_heads == heads)
    from attngen.families.dsa.pool import latent_pool, unpack_latent_656
    from attngen.runtime.batch import AttentionLayer

    torch.manual_seed(rows + heads)
    ctx = 8192
    pool = latent_pool(
        num_layers=1, num_pages=rows * ctx // 64, page_size=64,
        dtype=kv_dtype or BF16, device="cuda",
    )  # fmt: skip
    slots = torch.arange(pool.num_slots, device="cuda")
    layer = AttentionLayer(0, heads, 1, 576, 512, SCALE)
    latent = torch.randn(len(slots), 512, device="cuda").to(BF16)
    rope = torch.randn(len(slots), 64, device="cuda").to(BF16)
    pool.set_mla_kv_buffer(layer, slots, latent, rope)
    cache = pool.kv_buffer[0]
    flat = cache.view(len(slots), -1)
    values = unpack_latent_656(flat) if kv == "fp8" else flat.float()
    base = torch.arange(rows, device="cuda")[:, None] * ctx
    idx = (base + torch.rand(rows, ctx, device="cuda").argsort(dim=1)[:, :TOPK]).int()
    q = torch.randn(rows, heads, 576, device="cuda").to(BF16)
    check = list(range(0, rows, 16)) + [rows - 1]  # the oracle on every 16th row and the last
    want, want_lse = ref.sparse_mla(q[check], values, idx[check].long(), SCALE)
    ws = mod.sparse_workspace(cfg, rows=rows, device="cuda")
    splits = 1
    while splits <= cfg.max_splits:
        out = torch.full((rows, heads, 512), float("nan"), dtype=BF16, device="cuda")
        lse = torch.full((rows, heads), float("nan"), device="cuda")
        mod.sparse_mla(
            q, None, cache, idx, out, config=cfg, sm_scale=SCALE, lse=lse, workspace=ws,
            splits=splits,
        )  # fmt: skip
        torch.cuda.synchronize()
        what = f"sparse {kv} h{heads} rows {rows} splits {splits}"
        assert not out.isnan().any() and not lse.isnan().any(), f"{what}: unwritten elements"
        check_close(out[check], want, BF16, what)
        check_lse(lse[check], want_lse, f"{what} lse")
        splits *= 2
