"""MHA Triton kernels (decode, extend) against the torch oracle, in Triton's interpreter.

fp16 only: the interpreter computes bf16 wrongly (see shared notes). Every run draws fresh
random data; outputs and split buffers start as NaN so an unwritten element shows, and
every cache slot that no request owns holds NaN so a stray read shows too. With a sliding
window, the slots left of every query's window hold NaN as well: those must not be read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
import torch

from attngen.families.mha.triton.lower import verify_tiles
from attngen.families.mha.reference import paged_decode_ref, paged_extend_ref
from attngen.runtime.checks import AttngenInputError
from attngen.families.mha.triton.config import MhaTritonConfig
from attngen.hooks import MaskHooks
from mha_modules import load_kernels_module

from attngen.testing.tolerance import assert_close

from attngen.families.mha.triton.host.options import extend_options

# the interpreter reads 0-d loop bounds through a numpy path that numpy 2.x deprecates
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

NUM_KV_HEADS = 2
MAX_SPLITS = 4


def make_config(
    page_size: int,
    gqa_group: int,
    head_dim: int = 64,
    block_n: int = 16,
    max_splits: int = 4,
    v_head_dim: int | None = None,
    kv_dtype: str = "float16",
    kv_scale: str = "none",
    spec_topk: int = 0,
    num_draft_tokens: int = 0,
) -> MhaTritonConfig:
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    v_part = "" if v_head_dim == head_dim else f"_v{v_head_dim}"
    return MhaTritonConfig(
        uri=f"mha_d{head_dim}{v_part}_g{gqa_group}_p{page_size}_n{block_n}_fp16",
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        gqa_group=gqa_group,
        page_size=page_size,
        dtype="float16",
        kv_dtype=kv_dtype,
        kv_scale=kv_scale,
        spec_topk=spec_topk,
        num_draft_tokens=num_draft_tokens,
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
        **verify_tiles(num_draft_tokens, gqa_group, block_n),
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


def make_paged_kv(
    lengths: list[int], config: MhaTritonConfig, views: bool, unread: list[int] | None = None
) -> PagedKV:
    """Pages dealt to the requests in shuffled order; unused slots (and pages) hold NaN.

    ``unread[b]``: request b's first ``unread[b]`` tokens hold NaN too (left of its window).
    """
    page_size, dim, v_dim = config.page_size, config.head_dim, config.v_head_dim
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
        if unread is not None:
            positions = positions[unread[b] :]
        owned[page_table[b, positions // page_size].long(), positions % page_size] = True
    shape = (num_pages, page_size, NUM_KV_HEADS)
    if views and is_padded(config):
        # rows inside NaN-filled power-of-two rows: a read of a padded lane shows
        k_cache, v_cache = nan_padded(shape, dim), nan_padded(shape, v_dim)
        k_cache.copy_(torch.randn_like(k_cache))
        v_cache.copy_(torch.randn_like(v_cache))
    elif views:  # K and V interleaved in one buffer: strided views, as engines lay them out
        kv = torch.randn(num_pages, page_size, 2, NUM_KV_HEADS, dim, dtype=torch.float16)
        k_cache, v_cache = kv[:, :, 0], kv[:, :, 1]
    else:
        k_cache = torch.randn(*shape, dim, dtype=torch.float16)
        v_cache = torch.randn(*shape, v_dim, dtype=torch.float16)
    k_cache[~owned] = float("nan")
    v_cache[~owned] = float("nan")
    return PagedKV(k_cache, v_cache, page_table)


def nan_like(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def is_padded(config: MhaTritonConfig) -> bool:
    """Head dims that the kernels pad to a power of two, or qk and v dims that differ."""
    dims = (config.head_dim, config.v_head_dim)
    return config.head_dim != config.v_head_dim or any(d & (d - 1) for d in dims)


def nan_padded(
    shape: tuple[int, ...], dim: int, dtype: torch.dtype = torch.float16
) -> torch.Tensor:
    """A NaN ``[*shape, dim]`` view into NaN rows of the next power of two (16 B aligned)."""
    width = 1 << (dim - 1).bit_length()
    return nan_like((*shape, width), dtype)[..., :dim]


def padding_of(view: torch.Tensor) -> torch.Tensor:
    """The lanes past ``view``'s last dim in the rows of the buffer it was cut from."""
    width = view.stride(-2) if view.dim() > 1 else view.shape[-1]
    base = torch.as_strided(view, (*view.shape[:-1], width), view.stride())
    return base[..., view.shape[-1] :]


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
    sinks: torch.Tensor | None = None

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
            sinks=self.sinks,
        )

    def expected(self, mask: MaskHooks | None = None) -> torch.Tensor:
        kv = self.kv
        return paged_decode_ref(
            self.q,
            kv.k_cache,
            kv.v_cache,
            kv.page_table,
            self.seq_lens,
            self.sm_scale,
            mask=mask,
            sinks=self.sinks,
        )


def make_decode_args(
    config: MhaTritonConfig,
    seq_lens: list[int],
    num_splits: list[int],
    views: bool = False,
    mask: MaskHooks | None = None,
) -> DecodeArgs:
    """Random decode inputs for ``mask``'s module: NaN left of windows, sinks if it has them."""
    batch, num_heads, dim = len(seq_lens), NUM_KV_HEADS * config.gqa_group, config.head_dim
    mask = MaskHooks() if mask is None else mask
    unread = None
    if mask.window_left is not None:  # the query sits at seq_len - 1
        unread = [max(n - 1 - mask.window_left, 0) for n in seq_lens]
    kv = make_paged_kv(seq_lens, config, views, unread)
    # one spare row each, holding values the kernels must ignore
    lens = torch.tensor(seq_lens + [10_000], dtype=torch.int32)
    splits = torch.tensor(num_splits + [MAX_SPLITS], dtype=torch.int32)
    v_dim, po_shape = config.v_head_dim, (batch + 1, num_heads, config.max_splits)
    if views and is_padded(config):  # rows inside NaN power-of-two rows (see padding_of)
        q = nan_padded((batch, num_heads), dim)
        q.copy_(torch.randn_like(q))
        out = nan_padded((batch, num_heads), v_dim)
        partial_o = nan_padded(po_shape, v_dim, torch.float32)
    else:
        q = torch.randn(batch, num_heads, dim, dtype=torch.float16)
        out = nan_like((batch, num_heads, v_dim), torch.float16)
        partial_o = nan_like((*po_shape, v_dim), torch.float32)
    return DecodeArgs(
        q=q,
        kv=kv,
        seq_lens=lens,
        num_splits=splits,
        out=out,
        partial_o=partial_o,
        partial_lse=nan_like((batch + 1, num_heads, config.max_splits), torch.float32),
        sm_scale=dim**-0.5,
        sinks=make_sinks(num_heads) if mask.sinks else None,
    )


def make_sinks(num_heads: int) -> torch.Tensor:
    """Sink logits around the scores' scale, one far above it (that head's output shrinks)."""
    sinks = torch.randn(num_heads) * 2.0
    sinks[0] = 6.0
    return sinks


@pytest.mark.parametrize("case", list(CASES))
def test_decode_matches_oracle(kernels, case):
    config = CASES[case]
    # empty request, one-token request, splits that end up empty, a whole-page request
    seq_lens, num_splits = [37, 0, 1, config.page_size * 2 + 3], [4, 2, 3, 1]
    args = make_decode_args(config, seq_lens, num_splits, views=case.startswith("p16"))
    args.run(kernels, config)
    assert_close(args.out, args.expected())
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


def run_extend(
    kernels,
    config,
    extend_lens,
    prefix_lens,
    mask: MaskHooks | None = None,
    views=False,
    q_scale: float = 1.0,
) -> torch.Tensor:
    """Run extend on random inputs for ``mask``'s module against the oracle: (out, kv)."""
    num_heads, dim = NUM_KV_HEADS * config.gqa_group, config.head_dim
    mask = MaskHooks() if mask is None else mask
    lengths = [p + e for p, e in zip(prefix_lens, extend_lens)]
    unread = None
    if mask.window_left is not None:  # left of the first new token's window
        unread = [max(p - mask.window_left, 0) for p in prefix_lens]
    kv = make_paged_kv(lengths, config, views, unread)
    qo_indptr = torch.tensor([0] + extend_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    total = int(qo_indptr[-1])
    if views and is_padded(config):  # rows inside NaN power-of-two rows (see padding_of)
        q = nan_padded((total, num_heads), dim)
        q.copy_(torch.randn(total, num_heads, dim) * q_scale)
        out = nan_padded((total, num_heads), config.v_head_dim)
    else:
        q = (torch.randn(total, num_heads, dim) * q_scale).half()
        out = nan_like((total, num_heads, config.v_head_dim), torch.float16)
    sinks = make_sinks(num_heads) if mask.sinks else None
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
        sinks=sinks,
    )
    expected = paged_extend_ref(
        q,
        kv.k_cache,
        kv.v_cache,
        kv.page_table,
        qo_indptr,
        prefix,
        sm_scale,
        mask=mask,
        sinks=sinks,
    )
    assert_close(out, expected)
    if views and is_padded(config):
        assert padding_of(out).isnan().all()  # nothing stored past v_head_dim
    return out, kv


@pytest.mark.parametrize("case", list(CASES))
def test_extend_matches_oracle(kernels, case):
    config = CASES[case]
    # prefix 0; prefixes that end mid-page and cross pages; a one-token request
    prefix_lens = [0, 17, config.page_size + 5]
    run_extend(kernels, config, [20, 1, 9], prefix_lens, views=case.startswith("p16"))


def test_extend_with_an_empty_request(kernels):
    run_extend(kernels, CASES["p16_g1_n16"], [5, 0, 18], [3, 30, 16])


def test_extend_noncausal(kernels_noncausal):
    assert kernels_noncausal.HOOKS.causal is False
    noncausal = MaskHooks(causal=False)
    run_extend(kernels_noncausal, CASES["p16_g4_n32"], [20, 1, 9], [0, 17, 33], noncausal)


# -- head dims that are not powers of two; v_head_dim != head_dim ----

# the kernels pad to BLOCK_D / BLOCK_DV; "views" cases put every row inside a NaN row of
# the padded width, so a read of a padded lane (or a store to one) shows
PAD_CASES = {
    "d80_p16_g1_views": make_config(16, 1, head_dim=80),
    "d80_p1_g4": make_config(1, 4, head_dim=80),
    "d96_p1_g2_views": make_config(1, 2, head_dim=96),
    "d96_p16_g2_n32": make_config(16, 2, head_dim=96, block_n=32),
    "d192_v128_p16_g2_views": make_config(16, 2, head_dim=192, v_head_dim=128),
    "d192_v128_p1_g1_views": make_config(1, 1, head_dim=192, v_head_dim=128),
    "d128_v80_p16_g1_views": make_config(16, 1, head_dim=128, v_head_dim=80),
    "d72_p16_g1_views": make_config(16, 1, head_dim=72),  # SigLIP so400m's vision tower
    "d32_p1_g2": make_config(1, 2, head_dim=32),  # MiniLM-style encoders
}
NONCAUSAL_PAD_CASES = ["d192_v128_p16_g2_views", "d80_p1_g4", "d72_p16_g1_views", "d32_p1_g2"]


@pytest.fixture(scope="module")
def padded_kernels(tmp_path_factory):
    configs = list(PAD_CASES.values())
    return load_kernels_module(configs, causal=True, tmp_dir=tmp_path_factory.mktemp("pad"))


@pytest.fixture(scope="module")
def padded_kernels_noncausal(tmp_path_factory):
    configs = [PAD_CASES[c] for c in NONCAUSAL_PAD_CASES]
    tmp = tmp_path_factory.mktemp("padnc")
    return load_kernels_module(configs, causal=False, tmp_dir=tmp)


def check_padded_decode(kernels, config, views: bool, mask: MaskHooks | None = None) -> None:
    # empty request, one-token request, splits that end up empty, a multi-page request
    seq_lens, num_splits = [37, 0, 1, config.page_size * 2 + 3], [4, 2, 3, 1]
    args = make_decode_args(config, seq_lens, num_splits, views=views, mask=mask)
    args.run(kernels, config)
    assert_close(args.out, args.expected(mask))
    assert torch.all(args.out[1] == 0)
    if views:  # nothing stored past v_head_dim
        assert padding_of(args.out).isnan().all()
        assert padding_of(args.partial_o).isnan().all()


@pytest.mark.parametrize("case", list(PAD_CASES))
def test_padded_decode_matches_oracle(padded_kernels, case):
    check_padded_decode(padded_kernels, PAD_CASES[case], views=case.endswith("views"))


@pytest.mark.parametrize("case", list(PAD_CASES))
def test_padded_extend_matches_oracle(padded_kernels, case):
    config = PAD_CASES[case]
    prefix_lens = [0, 17, config.page_size + 5]
    run_extend(padded_kernels, config, [20, 1, 9], prefix_lens, views=case.endswith("views"))


@pytest.mark.parametrize("case", NONCAUSAL_PAD_CASES)
def test_padded_noncausal(padded_kernels_noncausal, case):
    config, noncausal = PAD_CASES[case], MaskHooks(causal=False)
    views = case.endswith("views")
    check_padded_decode(padded_kernels_noncausal, config, views, noncausal)
    run_extend(padded_kernels_noncausal, config, [20, 1, 9], [0, 17, 33], noncausal, views)


def test_head_dim_checks(padded_kernels):
    config = PAD_CASES["d80_p1_g4"]
    args = make_decode_args(config, [20, 5], [2, 1])
    for field, value, match in [
        ("head_dim", 84, "^config.head_dim: expected a multiple of 8 in 16 .. 256"),
        ("head_dim", 8, "^config.head_dim: expected a multiple of 8"),
        ("head_dim", 264, "^config.head_dim: expected a multiple of 8"),
        ("v_head_dim", 100, "^config.v_head_dim: expected a multiple of 8"),
        ("decode_block_h", 24, "^config.decode_block_h: expected a power of two"),
    ]:
        bad = dataclasses.replace(config, **{field: value})
        with pytest.raises(AttngenInputError, match=match):
            args.run(padded_kernels, bad)
    # shapes follow the true dims: q and k_cache at head_dim, v_cache / out / partial_o at
    # v_head_dim
    wide_v = PAD_CASES["d192_v128_p1_g1_views"]
    args = make_decode_args(wide_v, [20, 5], [2, 1])
    for name, value, match in [
        ("q", args.q[..., :128].contiguous(), "^q: expected shape"),
        ("v_cache", args.kv.k_cache, "^v_cache: expected shape"),
        ("out", torch.zeros(2, 2, 192, dtype=torch.float16), "^out: expected shape"),
        ("partial_o", torch.zeros(3, 2, 4, 192), "^partial_o: expected shape"),
    ]:
        bad = dataclasses.replace(args, kv=dataclasses.replace(args.kv))
        setattr(bad, name, value) if hasattr(bad, name) else setattr(bad.kv, name, value)
        with pytest.raises(AttngenInputError, match=match):
            bad.run(padded_kernels, wide_v)


def test_padded_compile_specs(padded_kernels):
    specs = {s.name: s for s in padded_kernels.compile_specs(PAD_CASES["d192_v128_p1_g1_views"])}
    for spec in specs.values():
        assert set(spec.signature) | set(spec.constexprs) == set(spec.fn.arg_names)
    split, extend = specs["decode_split"].constexprs, specs["extend"].constexprs
    assert (split["HEAD_DIM"], split["V_HEAD_DIM"]) == (192, 128)
    assert (split["BLOCK_D"], split["BLOCK_DV"]) == (256, 128)
    assert (extend["BLOCK_D"], extend["BLOCK_DV"]) == (256, 128)
    assert specs["decode_combine"].constexprs["BLOCK_DV"] == 128
    d80 = {s.name: s.constexprs for s in padded_kernels.compile_specs(PAD_CASES["d80_p1_g4"])}
    assert (d80["extend"]["HEAD_DIM"], d80["extend"]["BLOCK_D"]) == (80, 128)
    assert d80["decode_combine"]["BLOCK_DV"] == 128


# -- masks: sliding window, logit softcap, sinks ----

WINDOW_CASES = ["p1_g4_n16", "p16_g1_n16", "p16_g4_n32"]
MASKS = {
    "window5": MaskHooks(window_left=5),  # smaller than every BLOCK_N and BLOCK_M
    "window40": MaskHooks(window_left=40),  # spans pages and blocks
    "window12_noncausal": MaskHooks(causal=False, window_left=12),
    "softcap5": MaskHooks(logit_softcap=5.0),
    "sinks": MaskHooks(sinks=True),
    "all": MaskHooks(window_left=21, logit_softcap=5.0, sinks=True),
}


@pytest.fixture(scope="module")
def masked_kernels(tmp_path_factory):
    """One rendered module per MASKS entry (over WINDOW_CASES), on first use."""
    modules = {}
    configs = [CASES[c] for c in WINDOW_CASES]

    def get(name: str):
        if name not in modules:
            tmp = tmp_path_factory.mktemp(name)
            modules[name] = load_kernels_module(configs, MASKS[name], tmp_dir=tmp)
        return modules[name]

    return get


def test_mask_module_constants(masked_kernels):
    kernels = masked_kernels("all")
    assert kernels.HOOKS == MASKS["all"] and kernels.TRAITS.mask == MASKS["all"]
    assert kernels.HOOKS.causal is True and kernels.TRAITS.phases == ("extend", "decode")
    options = extend_options(CASES["p16_g4_n32"], kernels.TRAITS)
    assert (options["CAUSAL"], options["WINDOW_LEFT"]) == (True, 21)
    assert (options["LOGIT_SOFTCAP"], options["HAS_SINKS"]) == (5.0, True)


@pytest.mark.parametrize("case", WINDOW_CASES)
@pytest.mark.parametrize("mask", ["window5", "window40"])
def test_decode_window(masked_kernels, mask, case):
    config = CASES[case]
    # windows reaching back to token 0, far from it, an empty request, a 1-token one
    seq_lens, num_splits = [70, 30, 0, 1, 45], [4, 3, 2, 1, 2]
    args = make_decode_args(config, seq_lens, num_splits, mask=MASKS[mask])
    args.run(masked_kernels(mask), config)
    assert_close(args.out, args.expected(MASKS[mask]))
    assert torch.all(args.out[2] == 0)


def test_decode_window_splits_cover_only_the_window(masked_kernels):
    config = CASES["p1_g4_n16"]
    # window 5 of 70 tokens: keys 64 .. 69 are one 16-token block, so split 0 has them all
    args = make_decode_args(config, [70], [4], mask=MASKS["window5"])
    args.run(masked_kernels("window5"), config)
    lse = args.partial_lse[0]
    assert torch.isfinite(lse[:, 0]).all() and torch.all(lse[:, 1:4] == float("-inf"))
    assert_close(args.out, args.expected(MASKS["window5"]))


@pytest.fixture
def k_block_loads(monkeypatch):
    """count(t): tile loads the interpreter ran from t's memory since the last count."""
    from triton.runtime.interpreter import InterpreterBuilder

    seen = []
    load = InterpreterBuilder.create_masked_load

    def spy(self, ptrs, *args, **kwargs):
        seen.append((int(ptrs.data.min()), ptrs.data.size))
        return load(self, ptrs, *args, **kwargs)

    monkeypatch.setattr(InterpreterBuilder, "create_masked_load", spy)

    def count(t: torch.Tensor) -> int:
        begin, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        n = sum(1 for low, size in seen if begin <= low < end and size > 1)
        seen.clear()
        return n

    return count


def test_window_blocks_left_of_it_are_not_read(masked_kernels, k_block_loads):
    config, mask = CASES["p1_g4_n16"], MASKS["window40"]  # BLOCK_M = BLOCK_N = 16
    kernels = masked_kernels("window40")
    # decode: the query at 199 sees keys 159 .. 199: blocks 144 .. 207, 4 per kv head
    args = make_decode_args(config, [200], [3], mask=mask)
    args.run(kernels, config)
    assert_close(args.out, args.expected(mask))
    assert k_block_loads(args.kv.k_cache) == 4 * NUM_KV_HEADS
    # extend: rows at 150 .. 169 in two tiles; tile 0 sees 110 .. 165 (blocks 96 .. 175: 5),
    # tile 1 (rows 166 ..) sees 126 .. 169 (blocks 112 .. 175: 4); for each query head
    _, kv = run_extend(kernels, config, [20], [150], mask)
    assert k_block_loads(kv.k_cache) == (5 + 4) * NUM_KV_HEADS * config.gqa_group


@pytest.mark.parametrize("case", WINDOW_CASES)
@pytest.mark.parametrize("mask", ["window5", "window40"])
def test_extend_window(masked_kernels, mask, case):
    # no prefix; tiles whose windows start mid-block; a request past several windows
    run_extend(masked_kernels(mask), CASES[case], [20, 1, 35], [0, 17, 50], MASKS[mask])


def test_extend_window_noncausal(masked_kernels):
    mask = "window12_noncausal"
    run_extend(masked_kernels(mask), CASES["p16_g4_n32"], [20, 1, 9], [0, 17, 33], MASKS[mask])


def test_decode_softcap(masked_kernels):
    config = CASES["p16_g4_n32"]
    args = make_decode_args(config, [70, 1, 33], [3, 1, 2])
    args.q = (args.q.float() * 6).half()  # scores ~ N(0, 36): the cap of 5 matters
    args.run(masked_kernels("softcap5"), config)
    expected = args.expected(MASKS["softcap5"])
    assert_close(args.out, expected)
    assert (expected - args.expected()).abs().max() > 0.1


def test_extend_softcap(masked_kernels):
    mask = MASKS["softcap5"]
    run_extend(masked_kernels("softcap5"), CASES["p1_g4_n16"], [20, 9], [0, 21], mask, q_scale=6.0)


@pytest.mark.parametrize("case", ["p1_g4_n16", "p16_g1_n16"])
def test_decode_sinks(masked_kernels, case):
    config = CASES[case]
    mask = MASKS["sinks"]
    args = make_decode_args(config, [70, 0, 5], [4, 2, 3], mask=mask)
    args.run(masked_kernels("sinks"), config)
    assert_close(args.out, args.expected(mask))
    assert torch.all(args.out[1] == 0)  # no keys: the sink alone gives zeros, not NaN


def test_extend_sinks(masked_kernels):
    run_extend(masked_kernels("sinks"), CASES["p16_g4_n32"], [20, 0, 9], [0, 5, 33], MASKS["sinks"])


@pytest.mark.parametrize("case", ["p1_g4_n16", "p16_g4_n32"])
def test_window_softcap_sinks_gqa4(masked_kernels, case):
    config, mask = CASES[case], MASKS["all"]
    args = make_decode_args(config, [70, 0, 22, 9], [4, 2, 3, 1], mask=mask)
    args.q = (args.q.float() * 4).half()
    args.run(masked_kernels("all"), config)
    assert_close(args.out, args.expected(mask))
    assert torch.all(args.out[1] == 0)
    run_extend(masked_kernels("all"), config, [37, 1, 0], [0, 40, 3], mask, q_scale=4.0)


def test_sinks_arguments(masked_kernels, kernels):
    config = CASES["p16_g4_n32"]
    with_sinks = masked_kernels("sinks")

    def expect(module, match: str, sinks) -> None:
        args = make_decode_args(config, [20, 5], [2, 1])
        args.sinks = sinks
        with pytest.raises(AttngenInputError, match=match):
            args.run(module, config)
        kv = args.kv
        with pytest.raises(AttngenInputError, match=match):
            module.extend(
                args.q,
                kv.k_cache,
                kv.v_cache,
                kv.page_table,
                torch.tensor([0, 1, 2], dtype=torch.int32),
                torch.tensor([19, 4], dtype=torch.int32),
                args.out,
                max_extend_len=1,
                config=config,
                sm_scale=0.125,
                sinks=sinks,
            )

    num_heads = NUM_KV_HEADS * config.gqa_group
    expect(with_sinks, "^sinks: expected a float32 tensor", None)
    expect(with_sinks, "^sinks: expected dtype torch.float32", torch.zeros(num_heads).half())
    expect(with_sinks, "^sinks: expected shape", torch.zeros(num_heads + 1))
    expect(with_sinks, "^sinks: expected 1 dims", torch.zeros(1, num_heads))
    expect(with_sinks, "^sinks: expected a contiguous", torch.zeros(2 * num_heads)[::2])
    expect(kernels, "^sinks: expected None", torch.zeros(num_heads))


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


def test_bound_module_holds_every_config(kernels):
    configs = list(CASES.values())
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
    assert specs["extend"].constexprs["SINKS"] is None  # launched as None: a constexpr
    assert specs["decode_combine"].constexprs["SINKS"] is None


def test_compile_specs_with_masks(masked_kernels):
    config = CASES["p16_g4_n32"]
    specs = {spec.name: spec for spec in masked_kernels("all").compile_specs(config)}
    for spec in specs.values():
        assert set(spec.signature) | set(spec.constexprs) == set(spec.fn.arg_names)
    assert specs["extend"].signature["SINKS"] == "*fp32"
    assert specs["decode_combine"].signature["SINKS"] == "*fp32"
    assert specs["extend"].constexprs["WINDOW_LEFT"] == 21
    assert specs["decode_split"].constexprs["LOGIT_SOFTCAP"] == 5.0
    assert specs["decode_combine"].constexprs["HAS_SINKS"] is True
