"""MLA on the GPU: the generated sm90 backends (bf16 activations) against the float64
oracle: absorbed decode over ragged lengths up to 16k at every generated head count and
page size (with LSE), fp8 latent (against the dequantized cache, and against bf16 with a
derived bound), absorbed extend, chunked-prefix ragged extend with merge, chain verify,
and CUDA-graph capture + replay of >= 20 batches for decode and verify.

Run: ``ATTNGEN_GPU=1 python -m pytest -q -n 8 tests/families/mla/gpu``.
"""

from __future__ import annotations

import dataclasses
import importlib
import random

import pytest
import torch

from attngen.families.mla import reference as ref
from attngen.families.mla.testing import check_close, check_lse, make_rig, oracle_cache, rig_batch
from attngen.runtime.batch import DraftExtendInfo, ForwardMode, VerifyInfo

BF16 = torch.bfloat16
SCALE = 192**-0.5
LONG = [1, 63, 1000, 4099, 16384]  # ragged decode lengths (16384: split-KV)
# fp8 e4m3 vs the bf16 cache it was quantized from (rows of rms 0.5, scale 0.25: codes of
# rms 2, normal e4m3 numbers): each element carries a relative rounding error of rms
# 2^-4 / sqrt(3) = 0.036; it reaches the output through V directly (0.036 rms(o)) and
# through the scores (s = q.k * 192^-0.5 over 576 elements has rms 0.87, so ds has rms
# 0.031, which moves the softmax-weighted output by about as much relative to rms(o)):
# ~0.048 rms(o) in rms, bounded at 0.15 (3x).
FP8_VS_BF16_RMS = 0.15


def backend(spec: str):
    return importlib.import_module(f"generated.sm90.triton.mla.{spec}.backend").Backend


def rig(spec, heads, page_size, kv=None, dtype=BF16, **kw):
    return make_rig(
        backend(spec),
        num_heads=heads,
        page_size=page_size,
        dtype=dtype,
        device="cuda",
        kv_cache_dtype=kv,
        max_context_len=16384 + 64,
        **kw,
    )


def oracle(r, rb, q, decode):
    cache, kv_scale = oracle_cache(r)
    if decode:
        lens = [p + e for p, e in zip(rb.prefix_lens, rb.extend_lens)]
        return ref.absorbed_decode(q, cache, rb.page_table, lens, SCALE, kv_scale=kv_scale)
    return ref.absorbed_extend(
        q, cache, rb.page_table, rb.prefix_lens, rb.extend_lens, SCALE, kv_scale=kv_scale
    )


def decode(r, rb, q):
    r.backend.init_forward_metadata(rb.batch)
    out, lse = r.backend.forward_decode(
        q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope, return_lse=True
    )
    return out.view(q.shape[0], -1, 512), lse


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 32, 64, 128])
@pytest.mark.parametrize("page_size", [1, 64, 128])
def test_decode(heads, page_size, evidence):
    torch.manual_seed(heads + page_size)
    _check_decode(rig("mla_deepseek_v3", heads, page_size), heads, evidence)


def _check_decode(r, heads, evidence):
    """Ragged decode lengths up to 16k with LSE, then 64 short rows with q in latent + rope
    parts, then decode under CUDA graphs: evidence "decode" and "cuda_graph"."""
    dt, uri = r.backend.dtype, r.backend.config.uri
    rb = rig_batch(r, [n - 1 for n in LONG], [1] * len(LONG), ForwardMode.DECODE)
    q = torch.randn(len(LONG), heads, 576, device="cuda").to(dt)
    out, lse = decode(r, rb, q)
    want, want_lse = oracle(r, rb, q, decode=True)
    check_close(out, want, dt, f"decode {uri}")
    check_lse(lse, want_lse, "decode lse")
    # a large batch of short rows (no splits), q given as latent + rope parts
    rng = random.Random(heads)
    lens = [rng.randint(1, 600) for _ in range(64)]
    rb = rig_batch(r, [n - 1 for n in lens], [1] * 64, ForwardMode.DECODE, seed=1)
    q = torch.randn(64, heads, 576, device="cuda").to(dt)
    r.backend.init_forward_metadata(rb.batch)
    out = r.backend.forward_decode(
        q[..., :512],
        rb.new_latent,
        None,
        r.absorbed_layer,
        rb.batch,
        q_rope=q[..., 512:],
        k_rope=rb.new_rope,
    )
    check_close(out.view(64, heads, 512), oracle(r, rb, q, True)[0], dt, "decode B64")
    evidence.record(r.backend.kernels, r.backend.config.uri, "decode")
    _decode_graphs(r, heads, evidence)


def _decode_graphs(r, heads: int, evidence) -> None:
    """Decode captured once at 8 rows and replayed over 24 batches (sizes 1..8, lengths up
    to 5000), each against the oracle: the matrix's CUDA graph (decode) column."""
    r.backend.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
    _graph_replays(r, heads, ForwardMode.DECODE, 1, 8)
    evidence.record(r.backend.kernels, r.backend.config.uri, "cuda_graph")


# kv: (spec, pool dtype, per-tensor / global scale, bound of the RMS error vs bf16)
QUANTIZED = {
    "fp8": ("mla_deepseek_v3_fp8", torch.float8_e4m3fn, 0.25, FP8_VS_BF16_RMS),
    # NVFP4 (e2m1 + an e4m3 scale per 16 values + this global scale: block scales of rows of
    # rms 0.5 stay inside e4m3's range): attngen/tests/families/mha's derivation gives ~0.13
    # for two error terms in quadrature, bounded at 0.25 (2x)
    "nvfp4": ("mla_deepseek_v3_nvfp4", "nvfp4", 2e-3, 0.25),
}


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["fp8", "nvfp4"])
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 64])
def test_decode_quantized(kv, heads, page_size, evidence):
    spec, dtype, scale, bound = QUANTIZED[kv]
    torch.manual_seed(7)
    r8 = rig(spec, heads, page_size, dtype, kv_scale=scale)
    rb = rig_batch(r8, [n - 1 for n in LONG], [1] * len(LONG), ForwardMode.DECODE)
    q = torch.randn(len(LONG), heads, 576, device="cuda").to(BF16)
    out, lse = decode(r8, rb, q)
    want, want_lse = oracle(r8, rb, q, decode=True)  # the dequantized cache
    check_close(out, want, BF16, f"{kv} decode h{heads} ps{page_size}")
    check_lse(lse, want_lse, f"{kv} decode lse")
    # against bf16: the same latent rows written to a bf16 pool
    rb16 = rig("mla_deepseek_v3", heads, 64 if page_size == 64 else 1)
    rbb = rig_batch(rb16, [n - 1 for n in LONG], [1] * len(LONG), ForwardMode.DECODE)
    bf16_rows = (torch.randn(sum(LONG), 576, device="cuda") * 0.5).to(BF16)
    slots8 = torch.cat([r8.req_pool.req_to_token[b + 1, :n].long() for b, n in enumerate(LONG)])
    slots16 = torch.cat([rb16.req_pool.req_to_token[b + 1, :n].long() for b, n in enumerate(LONG)])
    r8.kv_pool.set_mla_kv_buffer(r8.absorbed_layer, slots8, bf16_rows[:, :512], bf16_rows[:, 512:])
    rb16.kv_pool.set_mla_kv_buffer(
        rb16.absorbed_layer, slots16, bf16_rows[:, :512], bf16_rows[:, 512:]
    )
    r8.backend.init_forward_metadata(rb.batch)
    out8 = r8.backend.forward_decode(
        q, None, None, r8.absorbed_layer, rb.batch, save_kv_cache=False
    )
    want16, _ = oracle(rb16, rbb, q, decode=True)
    err = (out8.view_as(want16).double() - want16).pow(2).mean().sqrt()
    rms = want16.pow(2).mean().sqrt()
    assert not torch.isnan(out8).any() and err <= bound * rms, (err, rms)
    evidence.record(r8.backend.kernels, r8.backend.config.uri, "decode")
    evidence.record(
        r8.backend.kernels,
        r8.backend.config.uri,
        "quantized_vs_bf16",
        rms_error=round(float(err / rms), 4),
    )
    _decode_graphs(r8, heads, evidence)


def _absorbed_extend(r, heads, prefix, ext, what, **batch_kw):
    """Absorbed extend of ext new tokens over prefix cached ones per request, against the
    oracle on the cache as the pool holds it (dequantized; new tokens included)."""
    rb = rig_batch(r, prefix, ext, ForwardMode.EXTEND, **batch_kw)
    t, dt = sum(ext), r.backend.dtype
    q = torch.randn(t, heads, 576, device="cuda").to(dt)
    r.backend.init_forward_metadata(rb.batch)
    out = r.backend.forward_extend(
        q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope
    )
    check_close(out.view(t, heads, 512), oracle(r, rb, q, False)[0], dt, what)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 32, 64, 128])
@pytest.mark.parametrize("page_size", [1, 64, 128])
def test_extend(heads, page_size, evidence):
    torch.manual_seed(11)
    _check_extend(rig("mla_deepseek_v3", heads, page_size), heads, evidence)


def _check_extend(r, heads, evidence):
    """Absorbed extend (short extends over long prefixes), then the ragged path: causal new
    tokens plus the prefix in chunks of several sizes, merged: evidence "extend"."""
    _absorbed_extend(r, heads, [0, 100, 3000, 9000], [7, 1, 33, 5], "absorbed extend")
    for chunk in (100, 1000, 4096):
        _ragged_chunks(r, heads, prefix=[0, 130, 2000, 5000], ext=[50, 9, 300, 17], chunk=chunk)
    evidence.record(r.backend.kernels, r.backend.config.uri, "extend")


# The other specs' variants the tests above leave out: every variant of the end-to-end spec
# (pages 1 / 16 / 64, bf16 and fp16), and the draft-tree and draft-chain specs' decode and
# extend (their verify and draft extend have tests of their own), each through the main
# spec's checks
OTHER_VARIANTS = [
    *(("mla_e2e_deepseek_v3", 16, ps, dt) for dt in (BF16, torch.float16) for ps in (1, 16, 64)),
    ("mla_deepseek_v3_tree", 16, 1, BF16),
    ("mla_deepseek_v3_tree", 128, 1, BF16),
    *(("mla_deepseek_v3_mtp", h, ps, BF16) for h in (16, 128) for ps in (1, 64)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("spec, heads, page_size, dtype", OTHER_VARIANTS)
def test_other_variants_decode_extend(spec, heads, page_size, dtype, evidence):
    torch.manual_seed(heads + page_size + 5)
    r = rig(spec, heads, page_size, dtype=dtype)
    assert r.backend.config.dtype == str(dtype).removeprefix("torch.")
    _check_decode(r, heads, evidence)
    _check_extend(r, heads, evidence)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["fp8", "nvfp4"])
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 64])
def test_extend_quantized(kv, heads, page_size, evidence):
    """Absorbed extend over a quantized latent cache (the new tokens quantized by the
    backend's write) against the oracle on the dequantized cache, then the ragged path
    (caller-provided K/V: the cache's dtype does not enter) with a prefix chunk boundary
    inside a page. The error against bf16 rows is test_decode_quantized's."""
    spec, dtype, scale, _ = QUANTIZED[kv]
    torch.manual_seed(17)
    r = rig(spec, heads, page_size, dtype, kv_scale=scale)
    what = f"{kv} absorbed extend h{heads}"
    _absorbed_extend(r, heads, [0, 100, 3000, 9000], [7, 1, 33, 5], what)
    _ragged_chunks(r, heads, prefix=[0, 130, 2000], ext=[50, 9, 300], chunk=100)
    evidence.record(r.backend.kernels, r.backend.config.uri, "extend")


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 64])
def test_kimi_k2(page_size, evidence):
    """Kimi-K2's spec (64 heads): ragged decode up to 16k with LSE, absorbed extend, and the
    chunked-prefix ragged extend with merge."""
    torch.manual_seed(13 + page_size)
    r = rig("mla_kimi_k2", 64, page_size)
    rb = rig_batch(r, [n - 1 for n in LONG], [1] * len(LONG), ForwardMode.DECODE)
    q = torch.randn(len(LONG), 64, 576, device="cuda").to(BF16)
    out, lse = decode(r, rb, q)
    want, want_lse = oracle(r, rb, q, decode=True)
    check_close(out, want, BF16, f"kimi decode ps{page_size}")
    check_lse(lse, want_lse, "kimi decode lse")
    evidence.record(r.backend.kernels, r.backend.config.uri, "decode")
    _decode_graphs(r, 64, evidence)
    _absorbed_extend(r, 64, [0, 100, 3000], [7, 1, 33], "kimi absorbed extend", seed=2)
    _ragged_chunks(r, 64, prefix=[0, 130, 2000], ext=[50, 9, 300], chunk=1000)
    evidence.record(r.backend.kernels, r.backend.config.uri, "extend")


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_extend_new_tokens_on_prefill_kernels(heads, evidence):
    """The ragged path with ``prefill_kernels`` (the generated MHA CuTe DSL prefill of spec
    mha_mla_prefill, which returns the LSE): causal new tokens from one [T, H, 192] k (its
    halves rejoined without a copy) and from k_nope + a shared k_rope (joined by a copy),
    and the prefix chunks merged on (they stay on the MLA module's ragged kernel)."""
    try:
        prefill = importlib.import_module("generated.sm90.cute_dsl.mha.mha_mla_prefill.kernels")
    except ModuleNotFoundError:
        pytest.skip("no CuTe DSL package mha_mla_prefill for sm90")
    torch.manual_seed(19)
    r = rig("mla_deepseek_v3", heads, 64, prefill_kernels=prefill)
    assert r.backend.prefill_kernels is prefill
    for chunk in (100, 4096):
        _ragged_chunks(r, heads, prefix=[0, 130, 2000, 5000], ext=[50, 9, 300, 17], chunk=chunk)
    ext = [1, 700, 4099, 33]
    rb = rig_batch(r, [0] * len(ext), ext, ForwardMode.EXTEND, mha_return_lse=True, seed=5)
    t = sum(ext)
    cuda = dict(device="cuda")
    q = torch.randn(t, heads, 192, **cuda).to(BF16)
    k_nope = torch.randn(t, heads, 128, **cuda).to(BF16)
    k_rope = torch.randn(t, 1, 64, **cuda).to(BF16)
    v = torch.randn(t, heads, 128, **cuda).to(BF16)
    r.backend.init_forward_metadata(rb.batch)
    out, lse = r.backend.forward_extend(
        q, k_nope, v, r.ragged_layer, rb.batch, save_kv_cache=False, k_rope=k_rope
    )
    want, want_lse = ref.ragged_mha(q, k_nope, k_rope, v, ext, ext, SCALE, causal=True)
    check_close(out.view(t, heads, 128), want, BF16, "new tokens, shared k_rope")
    check_lse(lse, want_lse, "new tokens lse, shared k_rope")
    evidence.record(r.backend.kernels, r.backend.config.uri, "extend")


def _ragged_chunks(r, h, prefix, ext, chunk):
    dt = r.backend.dtype
    cuda = dict(device="cuda")
    nchunks = max(-(-p // chunk) for p in prefix)
    sizes = [[max(0, min(chunk, p - c * chunk)) for p in prefix] for c in range(nchunks)]
    cu = torch.tensor(
        [[0, *torch.tensor(s).cumsum(0).tolist()] for s in sizes], dtype=torch.int32, **cuda
    )
    rb = rig_batch(
        r,
        prefix,
        ext,
        ForwardMode.EXTEND,
        prefix_chunk_cu_seq_lens=cu,
        mha_return_lse=True,
        seed=chunk,
    )
    tq, tk = sum(ext), sum(prefix)
    q = torch.randn(tq, h, 192, **cuda).to(dt)
    k_new, v_new = torch.randn(tq, h, 192, **cuda).to(dt), torch.randn(tq, h, 128, **cuda).to(dt)
    k_nope, k_rope = torch.randn(tk, h, 128, **cuda).to(dt), torch.randn(tk, 1, 64, **cuda).to(dt)
    v_pre = torch.randn(tk, h, 128, **cuda).to(dt)
    b = rb.batch
    r.backend.init_forward_metadata(b)
    out, lse = r.backend.forward_extend(q, k_new, v_new, r.ragged_layer, b, save_kv_cache=False)
    # the new tokens alone (one stage, the plain bound)
    alone, alone_lse = ref.ragged_mha(
        q, k_new[..., :128], k_new[..., 128:], v_new, ext, ext, SCALE, causal=True
    )
    check_close(out.view(tq, h, 128), alone, dt, "ragged new tokens")
    check_lse(lse, alone_lse, "ragged new tokens lse")
    starts = [sum(prefix[:i]) for i in range(len(prefix))]
    for c in range(nchunks):
        idx = torch.cat(
            [
                torch.arange(starts[i] + c * chunk, starts[i] + c * chunk + sizes[c][i])
                for i in range(len(prefix))
            ]
        ).cuda()
        fb = dataclasses.replace(b, attn_attend_prefix_cache=True, prefix_chunk_idx=c)
        o_c, lse_c = r.backend.forward_extend(
            q, k_nope[idx], v_pre[idx], r.ragged_layer, fb, save_kv_cache=False, k_rope=k_rope[idx]
        )
        out, lse = r.backend.merge_state(out, lse, o_c, lse_c)
    ks, vs, row = [], [], 0
    for i, (p, e) in enumerate(zip(prefix, ext)):
        pre = torch.arange(starts[i], starts[i] + p).cuda()
        ks.append(
            torch.cat(
                [torch.cat([k_nope[pre], k_rope[pre].expand(-1, h, -1)], -1), k_new[row : row + e]]
            )
        )
        vs.append(torch.cat([v_pre[pre], v_new[row : row + e]]))
        row += e
    k_all = torch.cat(ks)
    want, want_lse = ref.ragged_mha(
        q,
        k_all[..., :128],
        k_all[..., 128:],
        torch.cat(vs),
        ext,
        [p + e for p, e in zip(prefix, ext)],
        SCALE,
        causal=True,
    )
    check_close(out.view(tq, h, 128), want, dt, f"chunked prefix (chunk {chunk})", nchunks)
    check_lse(lse, want_lse, f"chunked prefix lse (chunk {chunk})")


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 64])
def test_verify_and_cuda_graphs(heads, page_size, evidence):
    """Chain verify eager, then decode and verify graphs captured once and replayed over 24
    batches each (sizes 1..max_bs, lengths up to 5000), against the oracle."""
    torch.manual_seed(13)
    r = rig("mla_deepseek_v3_mtp", heads, page_size)
    n = r.backend.config.num_draft_tokens
    rb = rig_batch(r, [40, 3000], [n, n], ForwardMode.TARGET_VERIFY, spec_info=VerifyInfo(n))
    q = torch.randn(2 * n, heads, 576, device="cuda").to(BF16)
    r.backend.init_forward_metadata(rb.batch)
    out = r.backend.forward_extend(
        q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope
    )
    check_close(out.view(2 * n, heads, 512), oracle(r, rb, q, False)[0], BF16, "verify")
    evidence.record(r.backend.kernels, r.backend.config.uri, "verify")
    # the spec's eager decode too (its graphs below)
    rb = rig_batch(r, [n - 1 for n in LONG], [1] * len(LONG), ForwardMode.DECODE, seed=5)
    q = torch.randn(len(LONG), heads, 576, device="cuda").to(BF16)
    out, _ = decode(r, rb, q)
    check_close(out, oracle(r, rb, q, decode=True)[0], BF16, f"mtp decode h{heads}")
    evidence.record(r.backend.kernels, r.backend.config.uri, "decode")
    max_bs = 8
    r.backend.init_cuda_graph_state(max_bs=max_bs, max_num_tokens=max_bs * n)
    for mode, per in ((ForwardMode.DECODE, 1), (ForwardMode.TARGET_VERIFY, n)):
        _graph_replays(r, heads, mode, per, max_bs)
        check = "cuda_graph" if per == 1 else "cuda_graph_verify"
        evidence.record(r.backend.kernels, r.backend.config.uri, check)


def _graph_replays(r, heads, mode, per, max_bs, replays=24):
    dt = r.backend.dtype
    info = VerifyInfo(per) if per > 1 else None
    rows = max_bs * per
    q_static = torch.zeros(rows, heads, 576, device="cuda", dtype=dt)
    lat_static = torch.zeros(rows, 1, 512, device="cuda", dtype=dt)
    rope_static = torch.zeros(rows, 1, 64, device="cuda", dtype=dt)
    rng = random.Random(per)
    forward = r.backend.forward_decode if per == 1 else r.backend.forward_extend

    def batch(seed, bs):
        prefix = [rng.randint(0, 5000) for _ in range(bs)]
        return rig_batch(r, prefix, [per] * bs, mode, spec_info=info, seed=seed)

    rb = batch(0, max_bs)
    b = rb.batch
    r.backend.init_forward_metadata_capture_cuda_graph(
        max_bs, rows, b.req_pool_indices, b.seq_lens, None, mode, info
    )
    loc_static = b.out_cache_loc.clone()
    fb_static = dataclasses.replace(b, out_cache_loc=loc_static)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) outside the graph
        forward(q_static, lat_static, None, r.absorbed_layer, fb_static, k_rope=rope_static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = forward(
            q_static, lat_static, None, r.absorbed_layer, fb_static, k_rope=rope_static
        )
    for i in range(replays):
        bs = 1 + i % max_bs
        rb = batch(i + 1, bs)
        b = rb.batch
        real = bs * per
        # pad to the captured batch: padding rows read request 0, write slot 0
        pad = max_bs - bs
        idx = torch.cat([b.req_pool_indices, torch.zeros(pad, dtype=torch.int32, device="cuda")])
        lens = torch.cat([b.seq_lens, torch.full((pad,), per, dtype=torch.int32, device="cuda")])
        loc_static.zero_()
        loc_static[:real].copy_(b.out_cache_loc)
        q = torch.randn(real, heads, 576, device="cuda").to(dt)
        q_static.zero_()
        q_static[:real].copy_(q)
        lat_static.zero_()
        rope_static.zero_()
        lat_static[:real].copy_(rb.new_latent)
        rope_static[:real].copy_(rb.new_rope)
        r.backend.init_forward_metadata_replay_cuda_graph(
            max_bs, idx, lens, int(lens.sum()), None, mode, info, seq_lens_cpu=lens.cpu()
        )
        graph.replay()
        got = out_static.view(rows, heads, 512)[:real]
        want, _ = oracle(r, rb, q, decode=per == 1)
        check_close(got, want, dt, f"{mode.name} replay {i} (bs {bs})")


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 64])
def test_draft_extend_and_cuda_graph(heads, page_size, evidence):
    """Draft extend (1..num_draft_tokens new tokens per request, causal, absorbed): eager,
    then one capture at max_bs replayed over 24 padded batches of ragged new-token counts;
    rows past the real ones must come back zero."""
    torch.manual_seed(19)
    r = rig("mla_deepseek_v3_mtp", heads, page_size)
    n, max_bs, mode = r.backend.config.num_draft_tokens, 8, ForwardMode.DRAFT_EXTEND
    rb = rig_batch(r, [40, 3000, 0], [n, 1, 2], mode)
    q = torch.randn(n + 3, heads, 576, device="cuda").to(BF16)
    r.backend.init_forward_metadata(rb.batch)
    out = r.backend.forward_extend(
        q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope
    )
    check_close(out.view(-1, heads, 512), oracle(r, rb, q, False)[0], BF16, "draft extend")
    evidence.record(r.backend.kernels, r.backend.config.uri, "draft_extend")
    r.backend.init_cuda_graph_state(max_bs=max_bs, max_num_tokens=max_bs * n)
    rows = max_bs * n
    q_static = torch.zeros(rows, heads, 576, device="cuda", dtype=BF16)
    lat_static = torch.zeros(rows, 1, 512, device="cuda", dtype=BF16)
    rope_static = torch.zeros(rows, 1, 64, device="cuda", dtype=BF16)
    ext_static = torch.full((max_bs,), n, dtype=torch.int32, device="cuda")
    info = DraftExtendInfo(ext_static)
    rng = random.Random(heads + page_size)

    def batch(seed, bs):
        ext = [rng.randint(1, n) for _ in range(bs)]
        prefix = [rng.randint(0, 5000) for _ in range(bs)]
        return rig_batch(r, prefix, ext, mode, seed=seed), ext

    rb, _ = batch(0, max_bs)
    b = rb.batch
    r.backend.init_forward_metadata_capture_cuda_graph(
        max_bs, rows, b.req_pool_indices, b.seq_lens, None, mode, info
    )
    loc_static = torch.zeros(rows, dtype=torch.int64, device="cuda")
    fb_static = dataclasses.replace(b, out_cache_loc=loc_static)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) outside the graph
        r.backend.forward_extend(
            q_static, lat_static, None, r.absorbed_layer, fb_static, k_rope=rope_static
        )
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = r.backend.forward_extend(
            q_static, lat_static, None, r.absorbed_layer, fb_static, k_rope=rope_static
        )
    for i in range(24):
        bs = 1 + i % max_bs
        rb, ext = batch(i + 1, bs)
        b = rb.batch
        real, pad = sum(ext), max_bs - bs
        # padding requests: request 0, one new token; their rows write slot 0
        idx = torch.cat([b.req_pool_indices, torch.zeros(pad, dtype=torch.int32, device="cuda")])
        lens = torch.cat([b.seq_lens, torch.ones(pad, dtype=torch.int32, device="cuda")])
        ext_static.copy_(torch.tensor(ext + [1] * pad, dtype=torch.int32))
        loc_static.zero_()
        loc_static[:real].copy_(b.out_cache_loc)
        q = torch.randn(real, heads, 576, device="cuda").to(BF16)
        for static, new in ((q_static, q), (lat_static, rb.new_latent), (rope_static, rb.new_rope)):
            static.zero_()
            static[:real].copy_(new)
        r.backend.init_forward_metadata_replay_cuda_graph(
            max_bs, idx, lens, int(lens.sum()), None, mode, info, seq_lens_cpu=lens.cpu()
        )
        graph.replay()
        got = out_static.view(rows, heads, 512)
        want, _ = oracle(r, rb, q, decode=False)
        check_close(got[:real], want, BF16, f"draft extend replay {i} (bs {bs})")
        # the padding requests' rows (one token each, seq_len 1) and the spare rows
        spare = got[real + pad :]
        assert not torch.isnan(got).any() and torch.equal(
            spare.float(), torch.zeros_like(spare.float())
        )
    evidence.record(r.backend.kernels, r.backend.config.uri, "cuda_graph_draft_extend")


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_tree_verify_and_cuda_graph(heads, evidence):
    """Draft trees (topk 4, 8 drafts, page 1): eager verify, then one capture replayed over
    24 padded batches with fresh masks, against the oracle."""
    from attngen.runtime.batch import pack_tree_masks

    torch.manual_seed(17)
    r = rig("mla_deepseek_v3_tree", heads, 1)
    n, max_bs, rows = r.backend.config.num_draft_tokens, 8, 8 * r.backend.config.num_draft_tokens
    rng = random.Random(heads)

    def tree_batch(bs, seed, pad_to=None):
        masks = [(torch.rand(n, n) < 0.5) | torch.eye(n, dtype=torch.bool) for _ in range(bs)]
        prefix = [rng.randint(0, 5000) for _ in range(bs)]
        packed, indptr = pack_tree_masks([m.cuda() for m in masks])
        rb = rig_batch(
            r,
            prefix,
            [n] * bs,
            ForwardMode.TARGET_VERIFY,
            spec_info=VerifyInfo(n, packed, indptr),
            seed=seed,
        )
        return rb, masks

    def want(rb, masks, q):
        return ref.absorbed_tree(
            q, r.kv_pool.get_key_buffer(0), rb.page_table, rb.prefix_lens, masks, SCALE
        )[0]

    rb, masks = tree_batch(3, 0)
    q = torch.randn(3 * n, heads, 576, device="cuda").to(BF16)
    r.backend.init_forward_metadata(rb.batch)
    out = r.backend.forward_extend(
        q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope
    )
    check_close(out.view(3 * n, heads, 512), want(rb, masks, q), BF16, "tree verify")
    evidence.record(r.backend.kernels, r.backend.config.uri, "verify")

    r.backend.init_cuda_graph_state(max_bs=max_bs, max_num_tokens=rows)
    mode = ForwardMode.TARGET_VERIFY
    rb, masks = tree_batch(max_bs, 1)
    b = rb.batch
    r.backend.init_forward_metadata_capture_cuda_graph(
        max_bs, rows, b.req_pool_indices, b.seq_lens, None, mode, b.spec_info
    )
    q_s = torch.zeros(rows, heads, 576, device="cuda", dtype=BF16)
    lat_s = torch.zeros(rows, 1, 512, device="cuda", dtype=BF16)
    rope_s = torch.zeros(rows, 1, 64, device="cuda", dtype=BF16)
    loc_s = b.out_cache_loc.clone()
    fb = dataclasses.replace(b, out_cache_loc=loc_s)

    def forward():
        return r.backend.forward_extend(q_s, lat_s, None, r.absorbed_layer, fb, k_rope=rope_s)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_s = forward()
    eye = torch.eye(n, dtype=torch.bool)
    for i in range(24):
        bs = 1 + i % max_bs
        rb, masks = tree_batch(bs, i + 2)
        real, pad = bs * n, max_bs - bs
        # padding requests: row 0, n keys (slot 0), an identity mask
        packed, indptr = pack_tree_masks([m.cuda() for m in masks] + [eye.cuda()] * pad)
        info = VerifyInfo(n, packed, indptr)
        idx = torch.cat(
            [rb.batch.req_pool_indices, torch.zeros(pad, dtype=torch.int32, device="cuda")]
        )
        lens = torch.cat(
            [rb.batch.seq_lens, torch.full((pad,), n, dtype=torch.int32, device="cuda")]
        )
        loc_s.zero_()
        loc_s[:real].copy_(rb.batch.out_cache_loc)
        q = torch.randn(real, heads, 576, device="cuda").to(BF16)
        for static, src in ((q_s, q), (lat_s, rb.new_latent), (rope_s, rb.new_rope)):
            static.zero_()
            static[:real].copy_(src)
        r.backend.init_forward_metadata_replay_cuda_graph(
            max_bs, idx, lens, int(lens.sum()), None, mode, info, seq_lens_cpu=lens.cpu()
        )
        graph.replay()
        got = out_s.view(rows, heads, 512)[:real]
        check_close(got, want(rb, masks, q), BF16, f"tree replay {i} (bs {bs})")
    evidence.record(r.backend.kernels, r.backend.config.uri, "cuda_graph_verify")
