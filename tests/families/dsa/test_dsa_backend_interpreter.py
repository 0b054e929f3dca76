"""The DSA backend end to end in the interpreter: the generated sm90 package's runtime over
fp16 twins of its configs (the interpreter gets bf16 wrong), at 16 heads: decode with a
context past top-2048 (the selection runs) and below it (everything selected), causal
extend, chain verify, and the CUDA-graph metadata path (capture + replay rows filled on
CPU, then the same calls as in a graph, eagerly), against the float64 oracles."""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import pytest
import torch

from attngen.families.dsa import reference as ref
from attngen.families.dsa.runtime import DsaBackend
from attngen.families.dsa.testing import (
    check_scores,
    make_rig,
    oracle_rows,
    oracle_scores,
    rig_batch,
    topk_agreement,
)
from attngen.families.mla.testing import check_close, check_lse
from attngen.runtime.batch import ForwardMode, VerifyInfo
from attngen.runtime.checks import AttngenInputError

F16 = torch.float16
PKG = "generated.sm90.triton.dsa.{}"


def cpu_backend(spec: str) -> type:
    """The generated package's backend over fp16 twins of its configs (a spec that
    generates fp16 itself: its fp16 configs)."""
    gen = importlib.import_module(PKG.format(spec) + ".backend").Backend
    k = gen.kernels
    configs = {u: c for u, c in k.CONFIGS.items() if c.dtype == "float16"}
    for uri, c in k.CONFIGS.items() if not configs else ():
        kv = c.kv_dtype if c.fp8_cache else "float16"
        configs[uri] = dataclasses.replace(c, dtype="float16", kv_dtype=kv)
    names = ("indexer_logits", "topk", "sparse_mla", "sparse_workspace", "choose_splits")
    kernels = SimpleNamespace(CONFIGS=configs, PHASES=k.PHASES, **{n: getattr(k, n) for n in names})
    attrs = {a: getattr(gen, a) for a in ("graph", "spec_name", "arch", "backend", "num_sms")}
    return type("CpuDsaBackend", (DsaBackend,), dict(kernels=kernels, **attrs))


def rig(kv: str = "bf16", spec: str | None = None, context: int = 2304, **kw):
    spec = spec or ("dsa_deepseek_v32_fp8" if kv == "fp8" else "dsa_deepseek_v32")
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else None
    return make_rig(
        cpu_backend(spec),
        num_heads=16,
        dtype=F16,
        device="cpu",
        kv_cache_dtype=kv_dtype,
        max_reqs=8,
        max_context_len=context,
        num_pages=-(-context // 64) * 2 + 8,
        **kw,
    )


def run(r, db):
    be, fb = r.backend, db.batch
    topk = be.indexer(db.q_index, db.weights, r.layer, fb, index_k=db.new_index_k)
    call = be.forward_decode if fb.forward_mode is ForwardMode.DECODE else be.forward_extend
    return topk, call(
        db.q,
        db.new_latent,
        None,
        r.layer,
        fb,
        k_rope=db.new_rope,
        topk_indices=topk,
        return_lse=True,
    )


def check(r, db, topk, out, lse, what):
    meta, k = r.backend.forward_metadata, r.backend.config.index_topk
    for t, (b, n) in enumerate(db.rows_req):
        scores, bound = oracle_scores(r, db, t)
        check_scores(meta.logits[t, :n], scores, bound, f"{what} row {t}")
        got = topk[t][topk[t] >= 0].tolist()
        if n <= k:
            assert got == list(range(n)), f"{what} row {t}"
        assert len(got) == min(n, k), f"{what} row {t}"
        _, gap = topk_agreement(scores, bound, got, k)
        assert gap <= 1.0
        assert torch.equal(meta.topk_slots[t][: len(got)].long(), db.slots[b][got])
    want, want_lse = ref.sparse_mla(db.q, oracle_rows(r), meta.topk_slots.long(), 192**-0.5)
    check_close(out.view(-1, 16, 512), want, F16, what)
    check_lse(lse, want_lse, f"{what} lse")


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_decode_selects(kv):
    torch.manual_seed(0)
    r = rig(kv)
    db = rig_batch(r, [2099, 6], [1, 1], ForwardMode.DECODE)
    r.backend.init_forward_metadata(db.batch)
    topk, (out, lse) = run(r, db)
    check(r, db, topk, out, lse, f"decode {kv}")


@pytest.mark.parametrize("index_dtype", [torch.float32, F16, torch.float8_e4m3fn])
def test_index_dtypes_decode_and_extend(index_dtype):
    """The indexer scoring in fp32 (IEEE products), fp16 or fp8, picked by the index pool's
    dtype: scores within their bound, top-64 by the oracle's order up to ties at that
    bound, sparse MLA over the picks; the backend chose the config of the pool's dtype."""
    torch.manual_seed(3)
    r = rig(spec="dsa_e2e_deepseek_v32", context=512, index_dtype=index_dtype)
    want = str(index_dtype).removeprefix("torch.")
    assert r.backend.config.index_dtype == want
    db = rig_batch(r, [190, 3], [1, 1], ForwardMode.DECODE, seed=4)
    r.backend.init_forward_metadata(db.batch)
    topk, (out, lse) = run(r, db)
    check(r, db, topk, out, lse, f"decode {want}")
    db = rig_batch(r, [0, 100], [70, 2], ForwardMode.EXTEND, seed=5)
    r.backend.init_forward_metadata(db.batch)
    topk, (out, lse) = run(r, db)
    check(r, db, topk, out, lse, f"extend {want}")


def test_extend_verify_and_graph_rows():
    torch.manual_seed(1)
    r = rig()
    be = r.backend
    db = rig_batch(r, [0, 70], [3, 2], ForwardMode.EXTEND, seed=1)
    be.init_forward_metadata(db.batch)
    topk, (out, lse) = run(r, db)
    check(r, db, topk, out, lse, "extend")
    info = VerifyInfo(draft_token_num=2)
    db = rig_batch(r, [40, 129], [2, 2], ForwardMode.TARGET_VERIFY, seed=2, spec_info=info)
    be.init_forward_metadata(db.batch)
    topk, (out, lse) = run(r, db)
    check(r, db, topk, out, lse, "verify")
    # graph rows: capture at bs 3 (one padded request), the replay's rows as eager ones
    be.init_cuda_graph_state(3, 6)
    pad_req = torch.cat([db.batch.req_pool_indices, torch.zeros(1, dtype=torch.int32)])
    pad_len = torch.cat([db.batch.seq_lens, torch.ones(1, dtype=torch.int32)])
    be.init_forward_metadata_capture_cuda_graph(
        3, 6, pad_req, pad_len, None, ForwardMode.TARGET_VERIFY, info
    )
    meta = be.forward_metadata
    assert meta.num_rows == 6 and meta.out is not None
    assert meta.row_lens[:4].tolist() == [41, 42, 130, 131]
    fb = dataclasses.replace(
        db.batch,
        out_cache_loc=torch.cat([db.batch.out_cache_loc, torch.zeros(2, dtype=torch.int64)]),
    )
    pad = lambda x: torch.cat([x, x[:2]])  # noqa: E731
    topk = be.indexer(pad(db.q_index), pad(db.weights), r.layer, fb, index_k=pad(db.new_index_k))
    out = be.forward_extend(
        pad(db.q), pad(db.new_latent), None, r.layer, fb, k_rope=pad(db.new_rope), topk_indices=topk
    )
    be.init_forward_metadata(db.batch)
    want_topk, (want, _) = run(r, db)
    assert torch.equal(topk[:4], want_topk)
    check_close(out[:4].view(4, 16, 512), want.view(4, 16, 512).double(), F16, "graph rows")


def test_foreign_topk_positions_and_errors():
    torch.manual_seed(2)
    r = rig()
    be = r.backend
    db = rig_batch(r, [100, 7], [1, 1], ForwardMode.DECODE, seed=3)
    be.init_forward_metadata(db.batch)
    mine = be.indexer(db.q_index, db.weights, r.layer, db.batch, index_k=db.new_index_k)
    # positions from another indexer: mapped through the page table on device
    foreign = mine.clone()
    slots = be.positions_to_slots(foreign)
    assert torch.equal(slots, be.forward_metadata.topk_slots)
    with pytest.raises(AttngenInputError, match="topk_indices"):
        be.forward_decode(db.q, db.new_latent, None, r.layer, db.batch, k_rope=db.new_rope)
    with pytest.raises(AttngenInputError, match="index_pool"):
        from attngen.families.dsa.pool import IndexKeyPool

        type(be)(
            num_heads=16,
            dtype=F16,
            device="cpu",
            req_to_token_pool=r.req_pool,
            kv_pool=r.kv_pool,
            index_pool=IndexKeyPool(
                num_layers=1, num_pages=80, page_size=64, index_head_dim=64, device="cpu"
            ),
        )
