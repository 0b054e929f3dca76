"""MHA Triton kernels (decode, extend) against the torch oracle, in Triton's interpreter.

fp16 only: the interpreter computes bf16 wrongly (see shared notes). Every run draws fresh
random data; outputs and split buffers start as NaN so an unwritten element shows, and
every cache slot that no request owns holds NaN so a stray read shows too.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

import black
import pytest
import torch

from attngen.reference.mha import paged_decode_ref, paged_extend_ref
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.configs import MhaTritonConfig
from mha_modules import BLACK_MODE, load_kernels_module, render_kernels

# the interpreter reads 0-d loop bounds through a numpy path that numpy 2.x deprecates
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

ATOL = {torch.float16: 1e-2}
RTOL = {torch.float16: 1e-2}
NUM_KV_HEADS = 2
MAX_SPLITS = 4


def make_config(
    page_size: int, gqa_group: int, head_dim: int = 64, block_n: int = 16, max_splits: int = 4
) -> MhaTritonConfig:
    return MhaTritonConfig(
        uri=f"mha_d{head_dim}_g{gqa_group}_p{page_size}_n{block_n}_fp16",
        head_dim=head_dim,
        v_head_dim=head_dim,
        gqa_group=gqa_group,
        page_size=page_size,
        dtype="float16",
        decode_block_n=block_n,
        decode_block_h=16,
        decode_num_warps=4,
        decode_num_stages=2,
        max_splits=max_splits,
        combine_num_warps=4,
        extend_block_m=16,
        extend_block_n=block_n,
        extend_num_warps=4,
        extend_num_stages=2,
    )


# (page_size, gqa_group, head_dim, block_n): block_n below, equal to and above page_size
CASES = {
    "p1_g4_n16": make_config(1, 4),
    "p16_g1_n16": make_config(16, 1),
    "p16_g4_n32": make_config(16, 4, block_n=32),
    "p64_g4_n16": make_config(64, 4),
    "p16_g2_d128": make_config(16, 2, head_dim=128),
}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return load_kernels_module(
        list(CASES.values()), causal=True, tmp_dir=tmp_path_factory.mktemp("k")
    )


@pytest.fixture(scope="module")
def kernels_noncausal(tmp_path_factory):
    configs = [CASES["p16_g4_n32"]]
    return load_kernels_module(configs, causal=False, tmp_dir=tmp_path_factory.mktemp("nc"))


# -- random paged caches ----


@dataclass
class PagedKV:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_table: torch.Tensor  # [B + 1, max_pages]: one spare row, spare columns


def make_paged_kv(lengths: list[int], config: MhaTritonConfig, views: bool) -> PagedKV:
    """Pages dealt to the requests in shuffled order; unused slots (and pages) hold NaN."""
    page_size, dim = config.page_size, config.head_dim
    pages_per_request = [math.ceil(n / page_size) for n in lengths]
    num_pages = sum(pages_per_request) + 3
    order = torch.randperm(num_pages)
    max_pages = max(pages_per_request) + 2
    # entries no request owns point at random real pages: a stray read lands on NaN or on
    # another request's keys, and the comparison catches it
    page_table = torch.randint(0, num_pages, (len(lengths) + 1, max_pages), dtype=torch.int32)
    owned = torch.zeros(num_pages, page_size, dtype=torch.bool)
    cursor = 0
    for b, (length, count) in enumerate(zip(lengths, pages_per_request)):
        page_table[b, :count] = order[cursor : cursor + count].int()
        cursor += count
        positions = torch.arange(length)
        owned[page_table[b, positions // page_size].long(), positions % page_size] = True
    if views:  # K and V interleaved in one buffer: strided views, as engines lay them out
        kv = torch.randn(num_pages, page_size, 2, NUM_KV_HEADS, dim, dtype=torch.float16)
        k_cache, v_cache = kv[:, :, 0], kv[:, :, 1]
    else:
        k_cache = torch.randn(num_pages, page_size, NUM_KV_HEADS, dim, dtype=torch.float16)
        v_cache = torch.randn(num_pages, page_size, NUM_KV_HEADS, dim, dtype=torch.float16)
    k_cache[~owned] = float("nan")
    v_cache[~owned] = float("nan")
    return PagedKV(k_cache, v_cache, page_table)


def nan_like(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(
        actual.float(), expected, atol=ATOL[actual.dtype], rtol=RTOL[actual.dtype]
    )


# -- decode ----


@dataclass
class DecodeArgs:
    q: torch.Tensor
    kv: PagedKV
    seq_lens: torch.Tensor
    num_splits: torch.Tensor
    out: torch.Tensor
    partial_o: torch.Tensor
    partial_lse: torch.Tensor
    sm_scale: float

    def run(self, kernels, config: MhaTritonConfig) -> None:
        kernels.decode(
            self.q,
            self.kv.k_cache,
            self.kv.v_cache,
            self.kv.page_table,
            self.seq_lens,
            self.num_splits,
            self.out,
            self.partial_o,
            self.partial_lse,
            config=config,
            sm_scale=self.sm_scale,
        )


def make_decode_args(
    config: MhaTritonConfig, seq_lens: list[int], num_splits: list[int], views: bool = False
) -> DecodeArgs:
    batch, num_heads, dim = len(seq_lens), NUM_KV_HEADS * config.gqa_group, config.head_dim
    kv = make_paged_kv(seq_lens, config, views)
    # one spare row each, holding values the kernels must ignore
    lens = torch.tensor(seq_lens + [10_000], dtype=torch.int32)
    splits = torch.tensor(num_splits + [MAX_SPLITS], dtype=torch.int32)
    return DecodeArgs(
        q=torch.randn(batch, num_heads, dim, dtype=torch.float16),
        kv=kv,
        seq_lens=lens,
        num_splits=splits,
        out=nan_like((batch, num_heads, config.v_head_dim), torch.float16),
        partial_o=nan_like(
            (batch + 1, num_heads, config.max_splits, config.v_head_dim), torch.float32
        ),
        partial_lse=nan_like((batch + 1, num_heads, config.max_splits), torch.float32),
        sm_scale=dim**-0.5,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_decode_matches_oracle(kernels, case):
    config = CASES[case]
    # empty request, one-token request, splits that end up empty, a whole-page request
    seq_lens, num_splits = [37, 0, 1, config.page_size * 2 + 3], [4, 2, 3, 1]
    args = make_decode_args(config, seq_lens, num_splits, views=case.startswith("p16"))
    args.run(kernels, config)
    kv = args.kv
    expected = paged_decode_ref(
        args.q, kv.k_cache, kv.v_cache, kv.page_table, args.seq_lens, args.sm_scale
    )
    assert_close(args.out, expected)
    assert torch.all(args.out[1] == 0)  # seq_len 0: zeros, not NaN


def test_decode_empty_splits_write_minus_inf(kernels):
    config = CASES["p16_g4_n32"]
    seq_lens, num_splits = [40, 1, 0], [4, 2, 3]  # 40 tokens in 32-token blocks: 2 live splits
    args = make_decode_args(config, seq_lens, num_splits)
    args.run(kernels, config)
    lse = args.partial_lse
    assert torch.isfinite(lse[0, :, :2]).all() and torch.all(lse[0, :, 2:] == float("-inf"))
    assert torch.isfinite(lse[1, :, 0]).all() and torch.all(lse[1, :, 1:] == float("-inf"))
    assert torch.all(lse[2] == float("-inf"))
    assert not args.partial_o[:3].isnan().any()


def test_decode_split_count_does_not_change_the_result(kernels):
    config = CASES["p1_g4_n16"]
    args = make_decode_args(config, [45, 45], [1, 4])
    args.q[1] = args.q[0]
    args.kv.page_table[1] = args.kv.page_table[0]
    args.run(kernels, config)
    assert_close(args.out[1], args.out[0].float())


# -- extend ----


def run_extend(kernels, config, extend_lens, prefix_lens, causal=True, views=False):
    num_heads, dim = NUM_KV_HEADS * config.gqa_group, config.head_dim
    kv = make_paged_kv([p + e for p, e in zip(prefix_lens, extend_lens)], config, views)
    qo_indptr = torch.tensor([0] + extend_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    total = int(qo_indptr[-1])
    q = torch.randn(total, num_heads, dim, dtype=torch.float16)
    out = nan_like((total, num_heads, config.v_head_dim), torch.float16)
    sm_scale = dim**-0.5
    kernels.extend(
        q,
        kv.k_cache,
        kv.v_cache,
        kv.page_table,
        qo_indptr,
        prefix,
        out,
        max_extend_len=max(extend_lens),
        config=config,
        sm_scale=sm_scale,
    )
    expected = paged_extend_ref(
        q, kv.k_cache, kv.v_cache, kv.page_table, qo_indptr, prefix, sm_scale, causal=causal
    )
    assert_close(out, expected)


@pytest.mark.parametrize("case", list(CASES))
def test_extend_matches_oracle(kernels, case):
    config = CASES[case]
    # prefix 0; prefixes that end mid-page and cross pages; a one-token request
    prefix_lens = [0, 17, config.page_size + 5]
    run_extend(kernels, config, [20, 1, 9], prefix_lens, views=case.startswith("p16"))


def test_extend_with_an_empty_request(kernels):
    run_extend(kernels, CASES["p16_g1_n16"], [5, 0, 18], [3, 30, 16])


def test_extend_noncausal(kernels_noncausal):
    assert kernels_noncausal.CAUSAL is False
    run_extend(kernels_noncausal, CASES["p16_g4_n32"], [20, 1, 9], [0, 17, 33], causal=False)


# -- argument checks ----


def test_decode_rejects_bad_arguments(kernels):
    config = CASES["p16_g4_n32"]

    def expect(match: str, **replace) -> None:
        args = make_decode_args(config, [20, 5], [2, 1])
        for name, value in replace.items():
            setattr(args, name, value) if hasattr(args, name) else setattr(args.kv, name, value)
        with pytest.raises(AttngenInputError, match=match):
            args.run(kernels, config)

    good = make_decode_args(config, [20, 5], [2, 1])
    k = good.kv.k_cache
    expect("^q: expected dtype", q=good.q.float())
    expect("^k_cache: expected shape", k_cache=k[:, :8])
    strided = torch.randn(*k.shape[:-1], 2 * k.shape[-1], dtype=k.dtype)[..., ::2]
    expect("^k_cache: expected stride 1 in the last dim", k_cache=strided)
    expect("^v_cache: expected dtype", v_cache=good.kv.v_cache.float())
    expect("^seq_lens: expected dtype", seq_lens=good.seq_lens.long())
    expect("^num_splits rows: expected >= 2", num_splits=good.num_splits[:1])
    expect("^page_table rows: expected >= 2", page_table=good.kv.page_table[:1])
    expect("^partial_o: expected shape", partial_o=good.partial_o[:, :, :2])
    expect("^partial_lse: expected dtype", partial_lse=good.partial_lse.half())
    expect("^out: expected shape", out=good.out[:1])
    expect("^q: expected a head count divisible", q=good.q[:, :6])
    misaligned = torch.empty(k.numel() + 1, dtype=k.dtype)[1:].view(k.shape)
    expect("^k_cache: expected a 16-byte aligned", k_cache=misaligned)


def test_extend_rejects_bad_arguments(kernels):
    config = CASES["p16_g1_n16"]
    kv = make_paged_kv([10], config, views=False)
    q = torch.randn(6, NUM_KV_HEADS, 64, dtype=torch.float16)
    args = dict(
        q=q,
        k_cache=kv.k_cache,
        v_cache=kv.v_cache,
        page_table=kv.page_table,
        qo_indptr=torch.tensor([0, 6], dtype=torch.int32),
        prefix_lens=torch.tensor([4], dtype=torch.int32),
        out=torch.empty_like(q),
    )

    def expect(match: str, max_extend_len=6, **replace) -> None:
        with pytest.raises(AttngenInputError, match=match):
            kernels.extend(
                **{**args, **replace},
                max_extend_len=max_extend_len,
                config=config,
                sm_scale=0.125,
            )

    expect("^qo_indptr: expected dtype", qo_indptr=args["qo_indptr"].long())
    expect("^prefix_lens rows: expected >= 1", prefix_lens=args["prefix_lens"][:0])
    expect("^q: expected 3 dims", q=q[0])
    expect("^out: expected shape", out=q[:5])
    expect("^max_extend_len: expected a Python int", max_extend_len=6.0)


# -- the generated module itself ----


def test_rendered_module_is_formatted_and_complete(kernels):
    configs = list(CASES.values())
    source = render_kernels(configs, formatted=False)
    ast.parse(source)
    assert black.format_str(source, mode=BLACK_MODE) == source  # the template writes black style
    assert kernels.CONFIGS == {c.uri: c for c in configs}


def test_compile_specs_cover_every_runtime_argument(kernels):
    config = CASES["p16_g4_n32"]
    specs = {spec.name: spec for spec in kernels.compile_specs(config)}
    assert sorted(specs) == ["decode_combine", "decode_split", "extend"]
    for spec in specs.values():
        assert set(spec.signature) | set(spec.constexprs) == set(spec.fn.arg_names)
        assert not set(spec.signature) & set(spec.constexprs)
    assert specs["decode_split"].signature["K_CACHE"] == "*fp16"
    assert specs["decode_split"].constexprs["BLOCK_N"] == 32
    assert specs["extend"].constexprs["CAUSAL"] is True
    assert specs["extend"].signature["stride_kp"] == "i32"
