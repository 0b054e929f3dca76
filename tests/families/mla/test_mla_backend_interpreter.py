"""The MLA backend end to end on CPU: PagedMlaBackend with the real Triton kernels in the
interpreter, against the float64 oracle: absorbed decode and extend (eager and through the
CUDA-graph buffers), chain verify, the ragged path with chunked prefix and merge, the fp8
latent pool, and bad inputs.

fp16 (the interpreter's bf16 is wrong): the backend class binds the library with fp16
configs built from a generated bf16 config; the generated packages' own bf16 configs run
in the GPU suite.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from attngen.families.mla import reference as ref
from attngen.families.mla.runtime import PagedMlaBackend
from attngen.families.mla.testing import check_close, check_lse, make_rig, oracle_cache, rig_batch
from attngen.families.mla.triton import library
from attngen.runtime.batch import ForwardMode, VerifyInfo
from attngen.runtime.checks import AttngenInputError
from generated.sm90.triton.mla.mla_deepseek_v3_mtp import graph as generated_graph
from generated.sm90.triton.mla.mla_deepseek_v3_mtp import kernels as generated

F16 = torch.float16


def backend_class(page_size: int, kv_dtype: str = "float16", drafts: int = 3) -> type:
    """A backend over fp16 versions of the generated h16 config (small interpreter tiles)."""
    base = generated.CONFIGS["r512_rope64_h16_ps64_bf16_causal_topk1"]
    config = dataclasses.replace(
        base,
        uri="test",
        page_size=page_size,
        dtype="float16",
        kv_dtype=kv_dtype,
        num_draft_tokens=drafts,
        decode_block_n=16,
        decode_gluon=0,  # the generated sm90 tile is a Gluon kernel's (no interpreter)
        decode_keys_major=0,
        ragged_block_m=16,
        ragged_block_n=16,
    )
    kernels = types.SimpleNamespace(
        PHASES=("extend", "decode", "verify", "draft_extend"),
        CONFIGS={"test": config},
        absorbed=library.absorbed,
        absorbed_workspace=library.absorbed_workspace,
        ragged=library.ragged,
        merge_state=library.merge_state,
    )
    attrs = dict(
        kernels=kernels, graph=generated_graph, spec_name="test", arch="sm90", backend="triton"
    )
    return type("TestMlaBackend", (PagedMlaBackend,), dict(attrs, num_sms=4))


def rig(page_size=16, kv=None, **kw):
    names = {None: "float16", torch.float8_e4m3fn: "float8_e4m3fn", "nvfp4": "nvfp4"}
    cls = backend_class(page_size, names[kv])
    return make_rig(
        cls, num_heads=16, page_size=page_size, dtype=F16, device="cpu", kv_cache_dtype=kv, **kw
    )


def absorbed_oracle(r, rb, q, decode: bool):
    cache, kv_scale = oracle_cache(r)
    if decode:
        lens = [p + e for p, e in zip(rb.prefix_lens, rb.extend_lens)]
        return ref.absorbed_decode(q, cache, rb.page_table, lens, 192**-0.5, kv_scale=kv_scale)
    return ref.absorbed_extend(
        q, cache, rb.page_table, rb.prefix_lens, rb.extend_lens, 192**-0.5, kv_scale=kv_scale
    )


@pytest.mark.parametrize(
    "page_size,kv", [(1, None), (16, None), (16, torch.float8_e4m3fn), (16, "nvfp4")]
)
def test_decode(page_size, kv):
    torch.manual_seed(0)
    r = rig(page_size, kv)
    rb = rig_batch(r, [300, 7, 40], [1, 1, 1], ForwardMode.DECODE)  # 300: two splits
    q = torch.randn(3, 16, 576).to(F16)
    r.backend.init_forward_metadata(rb.batch)
    assert int(r.backend.forward_metadata.num_splits.max()) > 1
    out, lse = r.backend.forward_decode(
        q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope, return_lse=True
    )
    want, want_lse = absorbed_oracle(r, rb, q, decode=True)
    check_close(out.view(3, 16, 512), want, F16, "decode")
    check_lse(lse, want_lse, "decode lse")


def test_decode_writes_the_new_latent_quantized():
    r = rig(16, torch.float8_e4m3fn)
    rb = rig_batch(r, [5], [1], ForwardMode.DECODE)
    r.backend.init_forward_metadata(rb.batch)
    r.backend.forward_decode(
        torch.randn(1, 16, 576).to(F16),
        rb.new_latent,
        None,
        r.absorbed_layer,
        rb.batch,
        k_rope=rb.new_rope,
    )
    slot = int(rb.batch.out_cache_loc[0])
    row = r.kv_pool.get_key_buffer(0).view(-1, 576)[slot].double() * 0.5
    want = torch.cat([rb.new_latent[0, 0], rb.new_rope[0, 0]]).double()
    # e4m3 rounding: 2^-4 relative, below the subnormal range 2^-9 absolute (x scale)
    assert (row - want).abs().le(want.abs() * 2.0**-4 + 2.0**-10).all()


def test_absorbed_extend_and_verify_chain():
    torch.manual_seed(1)
    r = rig(16)
    for mode, prefix, ext in (
        (ForwardMode.EXTEND, [20, 0], [5, 3]),
        (ForwardMode.TARGET_VERIFY, [33, 2], [3, 3]),
    ):
        info = VerifyInfo(3) if mode is ForwardMode.TARGET_VERIFY else None
        rb = rig_batch(r, prefix, ext, mode, spec_info=info, seed=2)
        q = torch.randn(sum(ext), 16, 512).to(F16)
        q_rope = torch.randn(sum(ext), 16, 64).to(F16)
        r.backend.init_forward_metadata(rb.batch)
        out = r.backend.forward_extend(
            q, rb.new_latent, None, r.absorbed_layer, rb.batch, q_rope=q_rope, k_rope=rb.new_rope
        )
        want, _ = absorbed_oracle(r, rb, torch.cat([q, q_rope], -1), decode=False)
        check_close(out.view(-1, 16, 512), want, F16, mode.name)


def graph_replay(r, captured: set, mode, n: int, b, info, host_lens: bool = True) -> None:
    """Replay ``b`` (bs = its rows) into the static buffers. An engine replays only sizes it
    captured, and the backend refuses others: a size first seen here is captured first."""
    bs = b.req_pool_indices.shape[0]
    if (mode, bs) not in captured:
        r.backend.init_forward_metadata_capture_cuda_graph(
            bs, bs * n, b.req_pool_indices, b.seq_lens, None, mode, info
        )
        captured.add((mode, bs))
    host = dict(seq_lens_cpu=b.seq_lens_cpu) if host_lens else {}
    r.backend.init_forward_metadata_replay_cuda_graph(
        bs, b.req_pool_indices, b.seq_lens, b.seq_lens_sum, None, mode, info, **host
    )


def test_graph_buffers_decode_and_verify_replay():
    """Capture once (bs 2), replay smaller and larger batches (up to max_bs 3) in place."""
    torch.manual_seed(3)
    r = rig(16)
    r.backend.init_cuda_graph_state(max_bs=3, max_num_tokens=12)
    for mode, n in ((ForwardMode.DECODE, 1), (ForwardMode.TARGET_VERIFY, 3)):
        info = VerifyInfo(3) if n > 1 else None
        for seed, prefix in enumerate(([40, 290], [3], [17, 1, 64])):
            rb = rig_batch(r, prefix, [n] * len(prefix), mode, spec_info=info, seed=seed)
            bs = len(prefix)
            b = rb.batch
            if seed == 0:
                r.backend.init_forward_metadata_capture_cuda_graph(
                    bs, bs * n, b.req_pool_indices, b.seq_lens, None, mode, info
                )
                captured = {(mode, bs)}
            else:
                graph_replay(r, captured, mode, n, b, info)
            rows = bs * n
            q = torch.randn(rows, 16, 576).to(F16)
            forward = r.backend.forward_decode if n == 1 else r.backend.forward_extend
            out = forward(q, rb.new_latent, None, r.absorbed_layer, b, k_rope=rb.new_rope)
            want, _ = absorbed_oracle(r, rb, q, decode=n == 1)
            check_close(out.view(rows, 16, 512), want, F16, f"{mode.name} replay {seed}")


def test_draft_extend_eager_and_graph_buffers():
    """Draft extend (1..3 new tokens per request, causal): eager, then graph buffers captured
    at bs 3 and replayed at bs 2 and 3 with rows past the real ones left zero."""
    from attngen.runtime.batch import DraftExtendInfo

    torch.manual_seed(4)
    r = rig(16)
    n = 3
    rb = rig_batch(r, [30, 5], [2, 3], ForwardMode.DRAFT_EXTEND, seed=5)
    q = torch.randn(5, 16, 576).to(F16)
    r.backend.init_forward_metadata(rb.batch)
    out = r.backend.forward_extend(
        q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope
    )
    check_close(out.view(5, 16, 512), absorbed_oracle(r, rb, q, False)[0], F16, "draft extend")
    r.backend.init_cuda_graph_state(max_bs=3, max_num_tokens=3 * n)
    mode = ForwardMode.DRAFT_EXTEND
    for seed, (prefix, ext) in enumerate((([40, 290, 7], [1, 3, 2]), ([3, 60], [2, 1]))):
        rb = rig_batch(r, prefix, ext, mode, seed=seed + 6)
        b, bs = rb.batch, len(prefix)
        info = DraftExtendInfo(torch.tensor(ext, dtype=torch.int32))
        if seed == 0:
            r.backend.init_forward_metadata_capture_cuda_graph(
                bs, bs * n, b.req_pool_indices, b.seq_lens, None, mode, info
            )
            captured = {(mode, bs)}
        else:
            graph_replay(r, captured, mode, n, b, info, host_lens=False)
        real = sum(ext)
        q = torch.randn(bs * n, 16, 576).to(F16)
        lat = torch.cat([rb.new_latent, torch.zeros(bs * n - real, 1, 512, dtype=F16)])
        rope = torch.cat([rb.new_rope, torch.zeros(bs * n - real, 1, 64, dtype=F16)])
        fb = dataclasses.replace(
            b,
            out_cache_loc=torch.cat([b.out_cache_loc, torch.zeros(bs * n - real).long()]),
        )
        out = r.backend.forward_extend(q, lat, None, r.absorbed_layer, fb, k_rope=rope)
        out = out.view(bs * n, 16, 512)
        want, _ = absorbed_oracle(r, rb, q[:real], decode=False)
        check_close(out[:real], want, F16, f"draft extend replay {seed}")
        assert torch.equal(out[real:].float(), torch.zeros(bs * n - real, 16, 512))


def test_ragged_new_tokens_and_prefix_chunks_merge():
    """Causal new tokens, two prefix chunks (the first ending inside a page), merged by LSE
    = causal attention over prefix + new tokens."""
    torch.manual_seed(4)
    r = rig(16)
    prefix, ext, h = [21, 9], [6, 4], 16
    chunks = [[13, 5], [8, 4]]  # chunk sizes per request (13: a boundary inside a page)
    cu = torch.tensor([[0, 13, 18], [0, 8, 12]], dtype=torch.int32)
    rb = rig_batch(
        r, prefix, ext, ForwardMode.EXTEND, prefix_chunk_cu_seq_lens=cu, mha_return_lse=True
    )
    tq = sum(ext)
    q = torch.randn(tq, h, 192).to(F16)
    k_new, v_new = torch.randn(tq, h, 192).to(F16), torch.randn(tq, h, 128).to(F16)
    tk = sum(prefix)
    k_pre_nope, k_pre_rope = torch.randn(tk, h, 128).to(F16), torch.randn(tk, 1, 64).to(F16)
    v_pre = torch.randn(tk, h, 128).to(F16)
    b = rb.batch
    r.backend.init_forward_metadata(b)
    out, lse = r.backend.forward_extend(q, k_new, v_new, r.ragged_layer, b, save_kv_cache=False)
    # the prefix rows of chunk c: request 0's then request 1's
    starts = [0, prefix[0]]
    done = [0, 0]
    for c in range(2):
        idx = torch.cat(
            [
                torch.arange(starts[i] + done[i], starts[i] + done[i] + chunks[c][i])
                for i in range(2)
            ]
        )
        done = [done[i] + chunks[c][i] for i in range(2)]
        fb = dataclasses.replace(b, attn_attend_prefix_cache=True, prefix_chunk_idx=c)
        o_c, lse_c = r.backend.forward_extend(
            q,
            k_pre_nope[idx],
            v_pre[idx],
            r.ragged_layer,
            fb,
            save_kv_cache=False,
            k_rope=k_pre_rope[idx],
        )
        out, lse = r.backend.merge_state(out, lse, o_c, lse_c)
    # oracle: per request keys = prefix rows then new rows, causal aligned to the end
    ks, vs, qo, kv = [], [], [], []
    row = 0
    for i in range(2):
        pre = torch.arange(starts[i], starts[i] + prefix[i])
        new = torch.arange(row, row + ext[i])
        k_full = torch.cat(
            [torch.cat([k_pre_nope[pre], k_pre_rope[pre].expand(-1, h, -1)], -1), k_new[new]]
        )
        ks.append(k_full)
        vs.append(torch.cat([v_pre[pre], v_new[new]]))
        row += ext[i]
        qo.append(ext[i])
        kv.append(prefix[i] + ext[i])
    k_all = torch.cat(ks)
    want, want_lse = ref.ragged_mha(
        q, k_all[..., :128], k_all[..., 128:], torch.cat(vs), qo, kv, 192**-0.5, causal=True
    )
    check_close(out.view(tq, h, 128), want, F16, "chunked prefix", merges=2)
    check_lse(lse, want_lse, "chunked prefix lse")


def test_bad_inputs():
    r = rig(16)
    rb = rig_batch(r, [4], [2], ForwardMode.EXTEND)
    r.backend.init_forward_metadata(rb.batch)
    q = torch.randn(2, 16, 192).to(F16)
    k, v = torch.randn(2, 16, 192).to(F16), torch.randn(2, 16, 128).to(F16)
    with pytest.raises(AttngenInputError, match="writes no latent cache"):
        r.backend.forward_extend(q, k, v, r.ragged_layer, rb.batch)
    with pytest.raises(AttngenInputError, match="absorbed path"):
        bad = dataclasses.replace(r.absorbed_layer, num_q_heads=8)
        r.backend.forward_extend(q, k, v, bad, rb.batch)
    with pytest.raises(AttngenInputError, match="q: expected dtype"):
        r.backend.forward_extend(q.float(), k, v, r.ragged_layer, rb.batch, save_kv_cache=False)
    r8 = rig(16, torch.float8_e4m3fn)
    rb = rig_batch(r8, [4], [1], ForwardMode.DECODE)
    r8.backend.init_forward_metadata(rb.batch)
    no_scale = dataclasses.replace(r8.absorbed_layer, k_scale=None)
    with pytest.raises(AttngenInputError, match="k_scale"):
        r8.backend.forward_decode(
            torch.randn(1, 16, 576).to(F16),
            rb.new_latent,
            None,
            no_scale,
            rb.batch,
            k_rope=rb.new_rope,
        )
    with pytest.raises(AttngenInputError, match="tree_mask"):
        rb = rig_batch(
            r,
            [4],
            [3],
            ForwardMode.TARGET_VERIFY,
            spec_info=VerifyInfo(3, tree_mask=torch.zeros(2, dtype=torch.uint8)),
        )
        r.backend.init_forward_metadata(rb.batch)


def test_tree_verify_eager_and_graph_buffers():
    """Draft trees (topk 4, page 1): eager verify, then capture + replays through the static
    tree-mask buffers, each batch with fresh masks."""
    from attngen.runtime.batch import pack_tree_masks
    from generated.sm90.triton.mla.mla_deepseek_v3_tree import kernels as tree_kernels

    n = 8
    base = tree_kernels.CONFIGS["r512_rope64_h16_ps1_bf16_custom_topk4"]
    config = dataclasses.replace(
        base, uri="tree", dtype="float16", kv_dtype="float16", decode_block_n=16
    )
    kernels = types.SimpleNamespace(
        PHASES=("extend", "decode", "verify"),
        CONFIGS={"tree": config},
        absorbed=library.absorbed,
        absorbed_workspace=library.absorbed_workspace,
    )
    attrs = dict(
        kernels=kernels,
        graph=generated_graph,
        spec_name="t",
        arch="sm90",
        backend="triton",
        num_sms=4,
    )
    cls = type("TreeBackend", (PagedMlaBackend,), attrs)
    r = make_rig(cls, num_heads=16, page_size=1, dtype=F16, device="cpu")
    gen = torch.Generator().manual_seed(8)

    def tree_batch(prefix, seed):
        masks = [
            (torch.rand(n, n, generator=gen) < 0.5) | torch.eye(n, dtype=torch.bool) for _ in prefix
        ]
        packed, indptr = pack_tree_masks(masks)
        info = VerifyInfo(n, packed, indptr)
        rb = rig_batch(
            r, prefix, [n] * len(prefix), ForwardMode.TARGET_VERIFY, spec_info=info, seed=seed
        )
        return rb, masks

    def check(rb, masks, out, what):
        q = rb.q
        want, _ = ref.absorbed_tree(
            q, r.kv_pool.get_key_buffer(0), rb.page_table, rb.prefix_lens, masks, 192**-0.5
        )
        check_close(out.view(-1, 16, 512), want, F16, what)

    rb, masks = tree_batch([30, 3], 0)
    rb.q = torch.randn(2 * n, 16, 576).to(F16)
    r.backend.init_forward_metadata(rb.batch)
    out = r.backend.forward_extend(
        rb.q, rb.new_latent, None, r.absorbed_layer, rb.batch, k_rope=rb.new_rope
    )
    check(rb, masks, out, "tree verify eager")
    r.backend.init_cuda_graph_state(max_bs=3, max_num_tokens=3 * n)
    for i, prefix in enumerate(([5, 300, 1], [40], [17, 2, 9])):
        rb, masks = tree_batch(prefix, i + 1)
        rb.q = torch.randn(len(prefix) * n, 16, 576).to(F16)
        b, bs = rb.batch, len(prefix)
        mode, info = ForwardMode.TARGET_VERIFY, b.spec_info
        if i == 0:
            r.backend.init_forward_metadata_capture_cuda_graph(
                bs, bs * n, b.req_pool_indices, b.seq_lens, None, mode, info
            )
            captured = {(mode, bs)}
        else:
            graph_replay(r, captured, mode, n, b, info)
        out = r.backend.forward_extend(
            rb.q, rb.new_latent, None, r.absorbed_layer, b, k_rope=rb.new_rope
        )
        check(rb, masks, out, f"tree verify replay {i}")
