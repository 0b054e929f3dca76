"""The GPU suite's tolerance catches what a broken kernel would get wrong (CPU, no kernel).

At the GPU suite's long shapes (thousands of keys per query) attention outputs are small
(averages of many values), so an absolute bound would let a kernel skip a page, read a wrong
page or scale the scores by 1% and still pass. Here the oracle computes what such a kernel
would output (the mutation applied to the oracle itself, rounded to the dtype as a kernel's
output is) and ``assert_close`` with the GPU suite's table must refuse it, for every mask
the specs generate; the unmutated output rounded once must pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from attngen.families.mha import reference
from attngen.hooks import MaskHooks
from attngen.runtime.batch import AttentionLayer
from attngen.families.mha.testing import oracle_output
from attngen.testing import PagedBatchBuilder, make_pools
from attngen.testing.batches import LONG_DECODE, LONG_EXTEND
from attngen.testing.tolerance import KERNEL, assert_close, row_rms_error

MUTATED_KEYS = 64  # one 64-token page; with page 1 or 16, 64 consecutive slots
MASKS = {  # the masks and modifiers the MHA specs generate
    "causal": (MaskHooks(causal=True), False),
    "window": (MaskHooks(causal=True, window_left=4095), False),
    "softcap": (MaskHooks(causal=True, logit_softcap=50.0), False),
    "sinks": (MaskHooks(causal=True), True),
}


def mutated_block(length: int) -> slice | None:
    """The keys a mutated kernel gets wrong in a request of ``length`` keys: a page-aligned
    block in the middle (visible to the last query through every window above)."""
    if length < 2 * MUTATED_KEYS:
        return None
    start = (length // 2 // MUTATED_KEYS) * MUTATED_KEYS
    return slice(start, start + MUTATED_KEYS)


@contextmanager
def skip_a_page() -> Iterator[None]:
    original = reference.visible_keys

    def visible(query_pos: torch.Tensor, length: int, mask: MaskHooks) -> torch.Tensor:
        out = original(query_pos, length, mask)
        block = mutated_block(length)
        if block is not None:
            out[:, block] = False
        return out

    reference.visible_keys = visible
    try:
        yield
    finally:
        reference.visible_keys = original


@contextmanager
def read_a_wrong_page() -> Iterator[None]:
    original = reference.gather_kv

    def gather(cache: torch.Tensor, page_table_row: torch.Tensor, length: int) -> torch.Tensor:
        out = original(cache, page_table_row, length).clone()
        block = mutated_block(length)
        if block is not None:  # the block's keys/values come from the first page instead
            out[block] = out[:MUTATED_KEYS].clone()
        return out

    reference.gather_kv = gather
    try:
        yield
    finally:
        reference.gather_kv = original


@contextmanager
def nothing() -> Iterator[None]:
    yield


MUTATIONS: dict[str, tuple[Callable[[], object], float]] = {
    "skip_page": (skip_a_page, 1.0),
    "wrong_page": (read_a_wrong_page, 1.0),
    "scale_1.01": (nothing, 1.01),
}


def long_batch(dtype: torch.dtype, mode: str, group: int, seed: int):
    num_kv_heads, head_dim, page_size = 2, 128, 64
    lens = LONG_DECODE if mode == "decode" else [p + e for p, e in zip(*LONG_EXTEND)]
    req_pool, kv_pool = make_pools(
        num_layers=1,
        max_reqs=len(lens) + 1,
        max_context_len=max(lens),
        num_pages=sum(-(-n // page_size) for n in lens) + 1,
        page_size=page_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        dtype=dtype,
        device="cpu",
    )
    builder = PagedBatchBuilder(req_pool, kv_pool, seed=seed)
    pb = builder.decode(LONG_DECODE) if mode == "decode" else builder.extend(*LONG_EXTEND)
    layer = AttentionLayer(
        0, num_kv_heads * group, num_kv_heads, head_dim, head_dim, head_dim**-0.5
    )
    q, k, v = builder.qkv(pb.batch.num_new_tokens, layer)
    k_cache, v_cache = kv_pool.get_kv_buffer(0)
    flat_slots = pb.batch.out_cache_loc
    k_cache.view(-1, num_kv_heads, head_dim)[flat_slots] = k
    v_cache.view(-1, num_kv_heads, head_dim)[flat_slots] = v
    return pb, q, k_cache, v_cache, layer


def check_mutations(dtype: torch.dtype, mode: str, mask_name: str, group: int) -> None:
    mask, has_sinks = MASKS[mask_name]
    pb, q, k_cache, v_cache, layer = long_batch(dtype, mode, group, seed=1234)
    gen = torch.Generator().manual_seed(7)
    sinks = torch.randn(layer.num_q_heads, generator=gen) + 1.0 if has_sinks else None

    def run(scale: float) -> torch.Tensor:
        return oracle_output(
            pb, q, k_cache, v_cache, layer.scaling * scale, mask=mask, sinks=sinks
        ).flatten(1)

    want = run(1.0)
    assert want.abs().max() > 0
    # a correct kernel: the exact output rounded once to the dtype passes
    assert_close(want.to(dtype), want, KERNEL, dtype=dtype)
    for name, (context, scale) in MUTATIONS.items():
        with context():
            broken = run(scale).to(dtype)
        with pytest.raises(AssertionError):
            assert_close(broken, want, KERNEL, f"{mode} {mask_name} {name}", dtype=dtype)
        # the row RMS bound alone refuses it too, with room to spare
        worst = float(row_rms_error(broken, want).max())
        assert worst > 2 * KERNEL[dtype]["rms"], (name, worst)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_long_decode_mutations_fail_the_gpu_tolerance(dtype: torch.dtype, mask_name: str):
    check_mutations(dtype, "decode", mask_name, group=8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_long_extend_mutations_fail_the_gpu_tolerance(dtype: torch.dtype) -> None:
    check_mutations(dtype, "extend", "window", group=1)
