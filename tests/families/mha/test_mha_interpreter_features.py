"""fp8 KV loads, speculative verify (chains, trees) and cache-free prefill, in Triton's
interpreter, against the torch oracle (fp16 activations; see test_mha_interpreter.py for
the NaN-poisoning conventions reused here).

fp8 caches are compared with the oracle run on the same dequantized values (cache * scale),
so quantization error is not mistaken for kernel error.
"""

from __future__ import annotations

import pytest
import torch

from attngen.families.mha.reference import paged_decode_ref, paged_extend_ref, prefill_ref
from attngen.runtime.batch import pack_tree_masks
from attngen.runtime.checks import AttngenInputError
from attngen.hooks import MaskHooks
from attngen.runtime.nvfp4 import dequantize_nvfp4
from mha_modules import load_kernels_module
from attngen.testing.tolerance import assert_close
from test_mha_interpreter import (
    NUM_KV_HEADS,
    make_config,
    make_decode_args,
    make_paged_kv,
    nan_like,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

FP8 = {
    "e4m3_tensor": make_config(16, 4, kv_dtype="float8_e4m3fn", kv_scale="per_tensor"),
    "e5m2_head": make_config(1, 2, kv_dtype="float8_e5m2", kv_scale="per_head"),
}
CHAIN = make_config(16, 4, spec_topk=1, num_draft_tokens=4)
TREE = make_config(16, 2, spec_topk=4, num_draft_tokens=6)
PREFILL = make_config(1, 2, block_n=16)
PREFILL_D72 = make_config(1, 1, head_dim=72, block_n=16)  # SigLIP so400m: 16 heads of 72
ALL_PHASES = ("prefill", "extend", "decode", "verify", "draft_extend")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    configs = [*FP8.values(), CHAIN, TREE]
    return load_kernels_module(
        configs, causal=True, tmp_dir=tmp_path_factory.mktemp("feat"), phases=ALL_PHASES
    )


@pytest.fixture(scope="module")
def bidirectional(tmp_path_factory):
    return load_kernels_module(
        [PREFILL, PREFILL_D72],
        causal=False,
        tmp_dir=tmp_path_factory.mktemp("pf"),
        phases=("prefill",),
    )


# -- fp8 KV cache ----


def quantize_cache(cache: torch.Tensor, dtype: torch.dtype, per_head: bool):
    """(fp8 cache, fp32 scale, dequantized fp32 cache); NaN slots stay NaN."""
    finite = torch.nan_to_num(cache.float(), nan=0.0)
    dims = (0, 1, 3)
    amax = finite.abs().amax(dim=dims) if per_head else finite.abs().amax().reshape(1)
    scale = (amax / torch.finfo(dtype).max * 2).float()  # headroom: no saturation
    quant = (cache.float() / scale.view(1, 1, -1, 1)).to(dtype)
    return quant, scale, quant.float() * scale.view(1, 1, -1, 1)


@pytest.mark.parametrize("case", list(FP8))
def test_fp8_decode_matches_oracle_on_dequantized_values(kernels, case):
    config = FP8[case]
    dtype = getattr(torch, config.kv_dtype)
    per_head = config.kv_scale == "per_head"
    args = make_decode_args(config, [37, 0, 1, 35], [4, 2, 3, 1])
    k8, k_scale, k_deq = quantize_cache(args.kv.k_cache, dtype, per_head)
    v8, v_scale, v_deq = quantize_cache(args.kv.v_cache, dtype, per_head)
    kernels.decode(
        args.q,
        k8,
        v8,
        args.kv.page_table,
        args.seq_lens,
        args.num_splits,
        args.out,
        args.partial_o,
        args.partial_lse,
        config=config,
        sm_scale=args.sm_scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    expected = paged_decode_ref(
        args.q, k_deq, v_deq, args.kv.page_table, args.seq_lens, args.sm_scale
    )
    assert_close(args.out, expected)
    assert torch.all(args.out[1] == 0)


@pytest.mark.parametrize("case", list(FP8))
def test_fp8_extend_matches_oracle_on_dequantized_values(kernels, case):
    config = FP8[case]
    dtype = getattr(torch, config.kv_dtype)
    per_head = config.kv_scale == "per_head"
    extend_lens, prefix_lens = [20, 1, 9], [0, 17, 21]
    kv = make_paged_kv([p + e for p, e in zip(prefix_lens, extend_lens)], config, False)
    k8, k_scale, k_deq = quantize_cache(kv.k_cache, dtype, per_head)
    v8, v_scale, v_deq = quantize_cache(kv.v_cache, dtype, per_head)
    num_heads = NUM_KV_HEADS * config.gqa_group
    qo_indptr = torch.tensor([0] + extend_lens).cumsum(0).int()
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    q = torch.randn(30, num_heads, config.head_dim, dtype=torch.float16)
    out = nan_like((30, num_heads, config.v_head_dim), torch.float16)
    scale = config.head_dim**-0.5
    kernels.extend(
        q,
        k8,
        v8,
        kv.page_table,
        qo_indptr,
        prefix,
        out,
        max_extend_len=20,
        config=config,
        sm_scale=scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    assert_close(out, paged_extend_ref(q, k_deq, v_deq, kv.page_table, qo_indptr, prefix, scale))


def test_fp8_scales_are_required_and_checked(kernels):
    config = FP8["e5m2_head"]
    args = make_decode_args(config, [5], [1])
    k8 = args.kv.k_cache.to(torch.float8_e5m2)
    v8 = args.kv.v_cache.to(torch.float8_e5m2)
    call = dict(config=config, sm_scale=0.1)
    bufs = (args.kv.page_table, args.seq_lens, args.num_splits, args.out)
    bufs += (args.partial_o, args.partial_lse)
    with pytest.raises(AttngenInputError, match=r"k_scale: expected a float32 tensor \[2\]"):
        kernels.decode(args.q, k8, v8, *bufs, **call)
    one = torch.ones(1)
    with pytest.raises(AttngenInputError, match=r"k_scale: expected shape \[2\]"):
        kernels.decode(args.q, k8, v8, *bufs, k_scale=one, v_scale=one, **call)
    two = torch.ones(2)
    with pytest.raises(AttngenInputError, match="v_cache: expected dtype torch.float8_e5m2"):
        kernels.decode(args.q, k8, args.kv.v_cache, *bufs, k_scale=two, v_scale=two, **call)


# -- speculative verify ----


def random_tree_mask(n: int, gen: torch.Generator) -> torch.Tensor:
    """A random draft tree: each draft's parent is an earlier draft (or the root)."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        mask[i, i] = True
        if i:
            parent = int(torch.randint(-1, i, (1,), generator=gen))
            if parent >= 0:
                mask[i] |= mask[parent]
    return mask


def run_verify(kernels, config, prefix_lens, tree_masks=None):
    n = config.num_draft_tokens
    batch = len(prefix_lens)
    kv = make_paged_kv([p + n for p in prefix_lens], config, False)
    num_heads = NUM_KV_HEADS * config.gqa_group
    qo_indptr = (torch.arange(batch + 1) * n).int()
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    q = torch.randn(batch * n, num_heads, config.head_dim, dtype=torch.float16)
    out = nan_like((batch * n, num_heads, config.v_head_dim), torch.float16)
    scale = config.head_dim**-0.5
    packed, indptr = pack_tree_masks(tree_masks) if tree_masks else (None, None)
    kernels.verify(
        q,
        kv.k_cache,
        kv.v_cache,
        kv.page_table,
        qo_indptr,
        prefix,
        out,
        config=config,
        sm_scale=scale,
        tree_mask=packed,
        tree_mask_indptr=indptr,
    )
    expected = paged_extend_ref(
        q, kv.k_cache, kv.v_cache, kv.page_table, qo_indptr, prefix, scale, tree_masks=tree_masks
    )
    return out, expected


def test_chain_verify_is_causal_over_the_drafts(kernels):
    out, expected = run_verify(kernels, CHAIN, [0, 13, 31])
    assert_close(out, expected)


def test_tree_verify_matches_oracle(kernels):
    gen = torch.Generator().manual_seed(0)
    n = TREE.num_draft_tokens
    masks = [random_tree_mask(n, gen) for _ in range(3)]
    out, expected = run_verify(kernels, TREE, [5, 16, 40], masks)
    assert_close(out, expected)
    # the tree mask matters: the result differs from a causal chain
    chain = [torch.tril(torch.ones(n, n, dtype=torch.bool)) for _ in range(3)]
    assert not torch.allclose(out.float(), run_verify(kernels, TREE, [5, 16, 40], chain)[1].float())


def test_tree_row_that_sees_nothing_gives_zeros(kernels):
    n = TREE.num_draft_tokens
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    mask[2] = False  # no prefix (length 0) and no draft: a fully masked row
    out, expected = run_verify(kernels, TREE, [0], [mask])
    assert torch.all(out[2] == 0) and not out.isnan().any()
    assert_close(out, expected)


def test_tree_verify_needs_its_mask(kernels):
    config = TREE
    n = config.num_draft_tokens
    q = torch.randn(n, 4, 64, dtype=torch.float16)
    kv = make_paged_kv([n], config, False)
    with pytest.raises(AttngenInputError, match="tree_mask: expected a torch.Tensor"):
        kernels.verify(
            q,
            kv.k_cache,
            kv.v_cache,
            kv.page_table,
            torch.tensor([0, n], dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.empty_like(q),
            config=config,
            sm_scale=0.1,
        )


def test_pack_tree_masks_layout():
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[0, 0] = mask[1, 0] = mask[2, 2] = True  # bits 0, 3, 8
    packed, indptr = pack_tree_masks([mask, mask[:1, :1]])
    assert packed.tolist() == [0b1001, 0b1, 0b1] and indptr.tolist() == [0, 2, 3]


# -- cache-free prefill ----


@pytest.mark.parametrize(
    "causal, config",
    [(True, CHAIN), (False, PREFILL), (False, PREFILL_D72)],
    ids=["causal", "bidirectional", "bidirectional_d72"],
)
def test_prefill_matches_oracle(kernels, bidirectional, causal, config):
    module = kernels if causal else bidirectional
    lens = [21, 1, 40]
    cu = torch.tensor([0] + lens).cumsum(0).int()
    total, num_heads = sum(lens), NUM_KV_HEADS * config.gqa_group
    q = torch.randn(total, num_heads, config.head_dim, dtype=torch.float16)
    k = torch.randn(total, NUM_KV_HEADS, config.head_dim, dtype=torch.float16)
    v = torch.randn(total, NUM_KV_HEADS, config.v_head_dim, dtype=torch.float16)
    out = nan_like((total, num_heads, config.v_head_dim), torch.float16)
    scale = config.head_dim**-0.5
    module.prefill(q, k, v, cu, out, max_seq_len=40, config=config, sm_scale=scale)
    expected = prefill_ref(q, k, v, cu, scale, mask=MaskHooks(causal=causal))
    assert_close(out, expected)


# -- NVFP4 KV cache ----

FP4 = make_config(16, 2, kv_dtype="nvfp4", kv_scale="per_block")


@pytest.fixture(scope="module")
def fp4_kernels(tmp_path_factory):
    return load_kernels_module([FP4], causal=True, tmp_dir=tmp_path_factory.mktemp("fp4"))


def random_fp4_cache(num_pages: int, dim: int):
    """(codes uint8 [P, 16, Hkv, dim/2], e4m3 block scales, global [1]): random codes, block
    scales in [0.25, 2]."""
    shape = (num_pages, FP4.page_size, NUM_KV_HEADS)
    codes = torch.randint(0, 256, (*shape, dim // 2), dtype=torch.uint8)
    scales = torch.empty(*shape, dim // 16).uniform_(0.25, 2).to(torch.float8_e4m3fn)
    return codes, scales, torch.rand(1) * 0.5 + 0.1


def test_fp4_decode_and_extend_match_oracle_on_dequantized_values(fp4_kernels):
    config = FP4
    args = make_decode_args(config, [37, 0, 1, 35], [4, 2, 3, 1])
    pages = args.kv.k_cache.shape[0]
    k4, k_bs, k_gs = random_fp4_cache(pages, config.head_dim)
    v4, v_bs, v_gs = random_fp4_cache(pages, config.v_head_dim)
    k_deq = dequantize_nvfp4(k4, k_bs, k_gs)
    v_deq = dequantize_nvfp4(v4, v_bs, v_gs)
    scales = dict(k_scale=k_gs, v_scale=v_gs, k_block_scales=k_bs, v_block_scales=v_bs)
    kernels = fp4_kernels
    kernels.decode(
        args.q,
        k4,
        v4,
        args.kv.page_table,
        args.seq_lens,
        args.num_splits,
        args.out,
        args.partial_o,
        args.partial_lse,
        config=config,
        sm_scale=args.sm_scale,
        **scales,
    )
    expected = paged_decode_ref(
        args.q, k_deq, v_deq, args.kv.page_table, args.seq_lens, args.sm_scale
    )
    assert_close(args.out, expected)
    # extend over the same cache: requests 0 and 3 as 5 new tokens after their prefixes
    qo_indptr = torch.tensor([0, 5, 5, 6, 11], dtype=torch.int32)
    prefix = torch.tensor([32, 0, 0, 30], dtype=torch.int32)
    q = torch.randn(11, args.q.shape[1], config.head_dim, dtype=torch.float16)
    out = nan_like((11, args.q.shape[1], config.v_head_dim), torch.float16)
    table = args.kv.page_table
    kernels.extend(
        q,
        k4,
        v4,
        table,
        qo_indptr,
        prefix,
        out,
        max_extend_len=5,
        config=config,
        sm_scale=args.sm_scale,
        **scales,
    )
    want = paged_extend_ref(q, k_deq, v_deq, table, qo_indptr, prefix, args.sm_scale)
    assert_close(out, want)


def test_fp4_block_scales_are_required(fp4_kernels):
    args = make_decode_args(FP4, [5], [1])
    k4, k_bs, k_gs = random_fp4_cache(args.kv.k_cache.shape[0], FP4.head_dim)
    bufs = (args.kv.page_table, args.seq_lens, args.num_splits, args.out)
    bufs += (args.partial_o, args.partial_lse)
    with pytest.raises(AttngenInputError, match="k_block_scales: expected float8_e4m3fn"):
        fp4_kernels.decode(
            args.q, k4, k4, *bufs, config=FP4, sm_scale=0.1, k_scale=k_gs, v_scale=k_gs
        )


def test_chain_verify_with_window_softcap_and_sinks(tmp_path_factory):
    """Packed-GQA verify rows each carry their own head's sink and their own position."""
    mask = MaskHooks(causal=True, window_left=6, logit_softcap=5.0, sinks=True)
    config = make_config(16, 4, spec_topk=1, num_draft_tokens=5)
    module = load_kernels_module(
        [config], mask, tmp_dir=tmp_path_factory.mktemp("vw"), phases=ALL_PHASES
    )
    n, prefix_lens = config.num_draft_tokens, [0, 9, 30]
    kv = make_paged_kv([p + n for p in prefix_lens], config, False)
    num_heads = NUM_KV_HEADS * config.gqa_group
    qo_indptr = (torch.arange(4) * n).int()
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    q = torch.randn(3 * n, num_heads, config.head_dim, dtype=torch.float16)
    out = nan_like((3 * n, num_heads, config.v_head_dim), torch.float16)
    sinks = torch.randn(num_heads) * 2.0
    scale = config.head_dim**-0.5
    module.verify(
        q,
        kv.k_cache,
        kv.v_cache,
        kv.page_table,
        qo_indptr,
        prefix,
        out,
        config=config,
        sm_scale=scale,
        sinks=sinks,
    )
    want = paged_extend_ref(
        q, kv.k_cache, kv.v_cache, kv.page_table, qo_indptr, prefix, scale, mask=mask, sinks=sinks
    )
    assert_close(out, want)
