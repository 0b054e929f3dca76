"""MLA Triton kernels in the interpreter against the float64 oracle, at small shapes:
absorbed decode (splits, page sizes, fp8 latent, LSE), absorbed extend (causal rows),
the ragged 192/128 path with LSE, and the merge of (out, lse) pairs.

fp16 only: the interpreter gets bf16 arithmetic wrong (see shared notes); bf16 runs on
the GPU suite. Outputs are NaN-poisoned before each call.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attngen.families.mla import reference as ref
from attngen.families.mla.testing import check_close, check_lse, latent_batch
from attngen.families.mla.triton.config import MlaTritonConfig
from attngen.families.mla.triton.host import launch
from attngen.runtime.checks import AttngenInputError

F16 = torch.float16
SM_SCALE = 192**-0.5


def config(num_heads=16, page_size=16, kv_dtype="float16", **tiles) -> MlaTritonConfig:
    base = MlaTritonConfig(
        uri="test",
        num_heads=num_heads,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        page_size=page_size,
        dtype="float16",
        kv_dtype=kv_dtype,
        spec_topk=0,
        num_draft_tokens=0,
        decode_block_h=16,
        decode_block_n=16,
        decode_num_warps=4,
        decode_num_stages=1,
        decode_lora_parts=1,
        decode_keys_major=0,
        decode_value_reload=0,
        decode_waves=4,
        max_splits=4,
        combine_num_warps=4,
        ragged_block_m=16,
        ragged_block_n=16,
        ragged_num_warps=4,
        ragged_num_stages=1,
    )
    return dataclasses.replace(base, **tiles)


def nan(*shape, dtype=F16):
    return torch.full(shape, float("nan"), dtype=dtype)


def run_absorbed(cfg, batch, q, q_rope, row_lens, num_splits, row_req=None, kv_scale=None):
    rows = row_lens.shape[0]
    out = nan(rows, cfg.num_heads, 512)
    lse = nan(rows, cfg.num_heads, dtype=torch.float32)
    po, pl = launch.absorbed_workspace(cfg, rows=rows, device="cpu")
    launch.absorbed(
        q,
        q_rope,
        batch.cache,
        batch.page_table,
        row_lens,
        num_splits,
        out,
        po,
        pl,
        config=cfg,
        sm_scale=SM_SCALE,
        row_req=row_req,
        lse=lse,
        kv_scale=kv_scale,
    )
    return out, lse


@pytest.mark.parametrize(
    "page_size,seq_lens,splits,heads,parts,keys_major",
    [
        (1, [5, 33], [1, 3], 16, 1, 0),
        (16, [40, 1, 17], [2, 1, 4], 16, 1, 0),
        (64, [70, 130], [1, 2], 32, 1, 0),  # two head blocks; keys span pages
        (16, [40, 1, 17], [2, 1, 1], 32, 2, 0),  # latent columns in two parts
        (16, [40, 1, 17], [2, 1, 1], 16, 1, 1),  # transposed products
        (64, [70, 130], [1, 2], 32, 2, 1),
    ],
)
def test_absorbed_decode(page_size, seq_lens, splits, heads, parts, keys_major):
    torch.manual_seed(0)
    cfg = config(
        num_heads=heads, page_size=page_size, decode_lora_parts=parts, decode_keys_major=keys_major
    )
    batch = latent_batch(seq_lens, page_size=page_size, dtype=F16, device="cpu")
    b = len(seq_lens)
    q = torch.randn(b, heads, 576).to(F16)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out, lse = run_absorbed(cfg, batch, q, None, lens, torch.tensor(splits, dtype=torch.int32))
    want, want_lse = ref.absorbed_decode(q, batch.cache, batch.page_table, seq_lens, SM_SCALE)
    check_close(out, want, F16, "decode out")
    check_lse(lse, want_lse, "decode lse")


def test_absorbed_decode_split_q_and_empty_row():
    """q as [B,H,512] + q_rope [B,H,64]; a request of zero keys gives zeros and -inf."""
    torch.manual_seed(1)
    cfg = config(page_size=16)
    seq_lens = [0, 23]
    batch = latent_batch(seq_lens, page_size=16, dtype=F16, device="cpu")
    q = torch.randn(2, 16, 576).to(F16)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    splits = torch.tensor([2, 2], dtype=torch.int32)
    out, lse = run_absorbed(cfg, batch, q[..., :512].clone(), q[..., 512:].clone(), lens, splits)
    want, want_lse = ref.absorbed_decode(q, batch.cache, batch.page_table, seq_lens, SM_SCALE)
    assert torch.equal(out[0].float(), torch.zeros(16, 512))
    check_close(out, want, F16, "decode out")
    check_lse(lse, want_lse, "decode lse")


@pytest.mark.parametrize("parts,keys_major,reload", [(1, 0, 0), (2, 0, 0), (1, 1, 0), (1, 0, 1)])
def test_absorbed_decode_fp8_latent(parts, keys_major, reload):
    """fp8 e4m3 cache with a per-tensor scale, against the dequantized cache."""
    torch.manual_seed(2)
    cfg = config(
        page_size=16,
        kv_dtype="float8_e4m3fn",
        decode_lora_parts=parts,
        decode_keys_major=keys_major,
        decode_value_reload=reload,
    )
    seq_lens = [30, 9]
    batch = latent_batch(seq_lens, page_size=16, dtype=torch.float8_e4m3fn, device="cpu")
    scale = torch.tensor([0.37], dtype=torch.float32)
    q = torch.randn(2, 16, 576).to(F16)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    splits = torch.tensor([2, 1], dtype=torch.int32)
    out, lse = run_absorbed(cfg, batch, q, None, lens, splits, kv_scale=scale)
    want, want_lse = ref.absorbed_decode(
        q, batch.cache, batch.page_table, seq_lens, SM_SCALE, kv_scale=0.37
    )
    check_close(out, want, F16, "fp8 decode out")
    check_lse(lse, want_lse, "fp8 decode lse")


def test_absorbed_extend_causal_rows():
    """Extend / chain verify: each new token sees the prefix and the new tokens up to itself."""
    torch.manual_seed(3)
    cfg = config(page_size=16)
    prefix, ext = [20, 0], [3, 2]
    totals = [p + e for p, e in zip(prefix, ext)]
    batch = latent_batch(totals, page_size=16, dtype=F16, device="cpu")
    rows = sum(ext)
    q = torch.randn(rows, 16, 576).to(F16)
    row_req = torch.tensor([0, 0, 0, 1, 1], dtype=torch.int32)
    row_lens = torch.tensor([21, 22, 23, 1, 2], dtype=torch.int32)
    splits = torch.tensor([2, 1, 1, 1, 2], dtype=torch.int32)
    out, lse = run_absorbed(cfg, batch, q, None, row_lens, splits, row_req=row_req)
    want, want_lse = ref.absorbed_extend(q, batch.cache, batch.page_table, prefix, ext, SM_SCALE)
    check_close(out, want, F16, "extend out")
    check_lse(lse, want_lse, "extend lse")


@pytest.mark.parametrize("causal", [True, False])
def test_ragged_with_lse(causal):
    torch.manual_seed(4)
    cfg = config(num_heads=2)
    qo, kv = ([5, 17], [5, 17]) if causal else ([5, 17], [33, 0])
    tq, tk, h = sum(qo), sum(kv), 2
    q = torch.randn(tq, h, 192).to(F16)
    k_nope = torch.randn(tk, h, 128).to(F16)
    k_rope = torch.randn(tk, 1, 64).to(F16)
    v = torch.randn(tk, h, 128).to(F16)
    qo_indptr = torch.tensor([0, qo[0], tq], dtype=torch.int32)
    kv_indptr = torch.tensor([0, kv[0], tk], dtype=torch.int32)
    out, lse = nan(tq, h, 128), nan(tq, h, dtype=torch.float32)
    launch.ragged(
        q,
        k_nope,
        k_rope,
        v,
        qo_indptr,
        kv_indptr,
        out,
        lse,
        max_q_len=max(qo),
        causal=causal,
        config=cfg,
        sm_scale=SM_SCALE,
    )
    want, want_lse = ref.ragged_mha(q, k_nope, k_rope, v, qo, kv, SM_SCALE, causal)
    check_close(out, want, F16, "ragged out")
    check_lse(lse, want_lse, "ragged lse")


def test_merge_state():
    torch.manual_seed(5)
    t, h = 6, 20
    o_a, o_b = torch.randn(t, h, 128).to(F16), torch.randn(t, h, 128).to(F16)
    lse_a, lse_b = torch.randn(t, h) * 3, torch.randn(t, h) * 3
    lse_a[0, :4] = float("-inf")  # one side empty
    lse_a[1, :2] = lse_b[1, :2] = float("-inf")  # both empty: zeros
    out, lse = nan(t, h, 128), nan(t, h, dtype=torch.float32)
    launch.merge_state(o_a, lse_a, o_b, lse_b, out, lse)
    want, want_lse = ref.merge_state(o_a, lse_a, o_b, lse_b)
    assert torch.equal(out[1, :2].float(), torch.zeros(2, 128))
    check_close(out, want, F16, "merge out")
    check_lse(lse, want_lse, "merge lse")


def test_bad_tensors_fail_before_launch():
    cfg = config()
    batch = latent_batch([4], page_size=16, dtype=F16, device="cpu")
    lens = torch.tensor([4], dtype=torch.int32)
    q = torch.randn(1, 8, 576).to(F16)  # 8 heads, config says 16
    with pytest.raises(AttngenInputError, match="q: expected shape"):
        run_absorbed(cfg, batch, q, None, lens, lens)


@pytest.mark.parametrize(
    "kv_dtype,tiles,why",
    [
        # keys-major Gluon: 16-bit latents 16 or 32 heads x 64 rows on 8 warps, fp8
        # latents 16 heads x 64 rows on 4 warps; both 2+ stages deep
        ("float8_e4m3fn", dict(decode_block_h=16, decode_block_n=64, decode_num_warps=8,
                               decode_num_stages=2, decode_keys_major=1), "16 heads x 64 rows on 4"),
        ("float8_e4m3fn", dict(decode_block_h=32, decode_block_n=64, decode_num_warps=4,
                               decode_num_stages=2, decode_keys_major=1), "16 heads x 64 rows on 4"),
        ("float8_e4m3fn", dict(decode_block_h=16, decode_block_n=64, decode_num_warps=4,
                               decode_num_stages=1, decode_keys_major=1), "2\\+ stages"),
        ("float16", dict(decode_block_h=16, decode_block_n=32, decode_num_warps=8,
                         decode_keys_major=1), "16 or 32 heads x 64 rows on 8 warps"),
        ("float16", dict(decode_block_h=16, decode_block_n=64, decode_num_warps=4,
                         decode_keys_major=1), "16 or 32 heads x 64 rows on 8 warps"),
        # head-major Gluon: 64 heads x 64 rows, 16-bit or fp8
        ("float16", dict(decode_block_h=32, decode_block_n=64, decode_num_warps=8),
         "64 heads x 64 rows on 8 warps"),

        # either Gluon kernel: under the interpreter, refused by name
        ("float16", dict(decode_block_h=16, decode_block_n=64, decode_num_warps=8,
                         decode_num_stages=2, decode_keys_major=1), "TRITON_INTERPRET"),
        ("float8_e4m3fn", dict(decode_block_h=16, decode_block_n=64, decode_num_warps=4,
                               decode_num_stages=2, decode_keys_major=1), "TRITON_INTERPRET"),
    ],
)  # fmt: skip
def test_gluon_tiles_are_checked_before_launch(kv_dtype, tiles, why):
    """A config that picks a Gluon absorbed kernel (decode_gluon) with a shape it does not
    have, or under the interpreter, is refused with the config field named."""
    cfg = config(num_heads=16, kv_dtype=kv_dtype, decode_gluon=1, **tiles)
    dtype = F16 if kv_dtype == "float16" else torch.float8_e4m3fn
    batch = latent_batch([4], page_size=16, dtype=dtype, device="cpu")
    lens = torch.tensor([4], dtype=torch.int32)
    q = torch.randn(1, 16, 576).to(F16)
    scale = torch.ones(1) if kv_dtype != "float16" else None
    with pytest.raises(AttngenInputError, match=f"config.decode_gluon.*{why}"):
        run_absorbed(cfg, batch, q, None, lens, lens, kv_scale=scale)


def test_no_gluon_kernel_takes_an_nvfp4_cache() -> None:
    """Keys-major Gluon at the fp8 kernel's tile with an NVFP4 cache: the launcher sent it to
    the fp8 kernel (e4m3 reads of e2m1 codes); the config's rule, which the launcher and the
    plan check share, refuses it, and head-major too."""
    from attngen.families.mla.triton.host.launch import _check_gluon

    tiles = dict(decode_block_h=16, decode_block_n=64, decode_num_warps=4, decode_num_stages=2)
    for keys_major, tile in ((1, tiles), (0, dict(tiles, decode_block_h=64, decode_num_warps=8))):
        cfg = config(num_heads=16, kv_dtype="nvfp4", decode_gluon=1, decode_keys_major=keys_major,
                     **tile)  # fmt: skip
        [problem] = cfg.gluon_shape_problems()
        assert "not the nvfp4 cache" in problem
        with pytest.raises(AttngenInputError, match="config.decode_gluon: .*not the nvfp4 cache"):
            _check_gluon(cfg)
    fp8 = config(num_heads=16, kv_dtype="float8_e4m3fn", decode_gluon=1, decode_keys_major=1,
                 **tiles)  # fmt: skip
    assert fp8.gluon_shape_problems() == []


def test_absorbed_verify_tree():
    """Draft trees: each draft sees the prefix and the drafts its mask row names (here a
    mask that hides whole 16-key blocks of drafts from some rows, and a row seeing no draft)."""
    from attngen.runtime.batch import pack_tree_masks

    torch.manual_seed(6)
    n = 20  # drafts: more than one 16-key block
    cfg = config(page_size=1, spec_topk=4, num_draft_tokens=n)
    prefix = [9, 0]
    batch = latent_batch([p + n for p in prefix], page_size=1, dtype=F16, device="cpu")
    masks = []
    for b in range(2):
        m = torch.rand(n, n) < 0.4
        m |= torch.eye(n, dtype=torch.bool)
        m[3, :] = False  # draft 3 sees no draft (request 1: no key at all -> zeros)
        masks.append(m)
    packed, indptr = pack_tree_masks(masks)
    q = torch.randn(2 * n, 16, 576).to(F16)
    row_req = torch.arange(2 * n, dtype=torch.int32) // n
    row_lens = torch.tensor([p + n for p in prefix], dtype=torch.int32)[row_req.long()]
    splits = torch.full((2 * n,), 2, dtype=torch.int32)
    out, lse = nan(2 * n, 16, 512), nan(2 * n, 16, dtype=torch.float32)
    po, pl = launch.absorbed_workspace(cfg, rows=2 * n, device="cpu")
    launch.absorbed(
        q,
        None,
        batch.cache,
        batch.page_table,
        row_lens,
        splits,
        out,
        po,
        pl,
        config=cfg,
        sm_scale=SM_SCALE,
        row_req=row_req,
        lse=lse,
        tree_mask=packed,
        tree_mask_indptr=indptr,
    )
    want, want_lse = ref.absorbed_tree(q, batch.cache, batch.page_table, prefix, masks, SM_SCALE)
    assert torch.equal(out[n + 3].float(), torch.zeros(16, 512))
    check_close(out, want, F16, "tree verify")
    check_lse(lse, want_lse, "tree verify lse")


@pytest.mark.parametrize("parts,reload", [(1, 0), (2, 0), (1, 1)])
def test_absorbed_decode_nvfp4_latent(parts, reload):
    """NVFP4 latent (e2m1 pairs + e4m3 block scales + a global scale), against the
    dequantized cache; extend rows too."""
    from attngen.runtime.nvfp4 import dequantize_nvfp4, nvfp4_global_scale, quantize_nvfp4

    torch.manual_seed(9)
    cfg = config(
        page_size=16, kv_dtype="nvfp4", decode_lora_parts=parts, decode_value_reload=reload
    )
    seq_lens = [37, 5]
    batch = latent_batch(seq_lens, page_size=16, dtype=torch.float32, device="cpu")
    rows = batch.cache
    global_scale = nvfp4_global_scale(rows)
    codes, scales = quantize_nvfp4(rows, global_scale)
    deq = dequantize_nvfp4(codes, scales, global_scale)
    q = torch.randn(2, 16, 576).to(F16)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out, lse = nan(2, 16, 512), nan(2, 16, dtype=torch.float32)
    po, pl = launch.absorbed_workspace(cfg, rows=2, device="cpu")
    launch.absorbed(
        q,
        None,
        codes,
        batch.page_table,
        lens,
        torch.tensor([2, 1], dtype=torch.int32),
        out,
        po,
        pl,
        config=cfg,
        sm_scale=SM_SCALE,
        lse=lse,
        kv_scale=global_scale,
        kv_block_scales=scales,
    )
    want, want_lse = ref.absorbed_decode(q, deq, batch.page_table, seq_lens, SM_SCALE)
    check_close(out, want, F16, "nvfp4 decode")
    check_lse(lse, want_lse, "nvfp4 decode lse")
