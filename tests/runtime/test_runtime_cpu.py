"""CPU tests of the runtime layer: batch/pool types, the MHA backend base class, CUDA-graph
metadata buffers, and the random-batch builders.

The backend is driven through ``OracleKernels``: a stand-in for a generated kernels module
with the same API, whose ``decode`` / ``extend`` check the call contract (dtypes, shapes,
split counts) and compute with the torch oracle. That isolates what the runtime owns
(metadata, page tables, KV writes, graph buffers, input checks) from kernel numerics. One
test at the end runs a real generated kernels module through Triton's interpreter.

CUDA graphs are emulated: ``GraphEmulator`` records the kernel launches and KV writes of one
captured forward and re-runs them with the very same tensor objects, as a graph replays the
same addresses; a backend that reallocated or copied metadata would replay stale data.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from attngen.families.mha.reference import paged_decode_ref, paged_extend_ref
from attngen.runtime.batch import (
    AttentionLayer,
    ForwardBatch,
    ForwardMode,
    ReqToTokenPool,
    DraftExtendInfo,
    VerifyInfo,
    pack_tree_masks,
    tree_mask_bytes,
)
from attngen.runtime.pools import NvFp4KVPool, PagedKVPool
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.nvfp4 import dequantize_nvfp4
from attngen.families.mha.triton.config import MhaTritonConfig
from attngen.hooks import MaskHooks
from attngen.runtime.graph import DecodeMetadata, ExtendMetadata
from generated.sm90.triton.mha.mha_gqa_paged import graph as generated_graph
from attngen.families.mha.key import MhaKey
from attngen.testing.tolerance import ONE_ROUNDING, assert_close
from attngen.families.mha.triton import library
from attngen.families.mha.runtime import (
    PagedMhaBackend,
    decode_num_splits,
    WAVE_SLACK,
    decode_split_cap,
    select_config,
)
from attngen.families.mha.testing import oracle_output
from attngen.testing import (
    PADDING_PAGE,
    PADDING_REQ,
    PagedBatch,
    PagedBatchBuilder,
    make_pools,
    pad_decode_batch,
)

# the backends here run oracle kernels (Python, any dtype), not Triton's: construction's
# CPU check (tests/runtime/test_kernel_device.py) does not apply to them
pytestmark = pytest.mark.usefixtures("backends_take_cpu")

TILES = dict(
    decode_block_n=32,
    decode_block_h=16,
    decode_num_warps=4,
    decode_num_stages=2,
    max_splits=4,
    combine_num_warps=4,
    extend_block_m=32,
    extend_block_n=32,
    extend_num_warps=4,
    extend_num_stages=2,
)


def make_config(head_dim: int, v_head_dim: int, group: int, page_size: int, dtype: str):
    uri = f"d{head_dim}_v{v_head_dim}_g{group}_ps{page_size}_{dtype}"
    return MhaTritonConfig(
        uri, head_dim, v_head_dim, group, page_size, dtype, dtype, "none", 0, 0, **TILES
    )


CONFIGS = [
    make_config(32, 32, 2, 4, "float16"),
    make_config(32, 32, 2, 4, "bfloat16"),
    make_config(32, 16, 1, 1, "float16"),
    make_config(16, 16, 4, 8, "bfloat16"),
]


class OracleKernels:
    """A generated kernels module's API, computed by the oracle, checking its inputs."""

    HOOKS = MaskHooks()
    PHASES = ("extend", "decode")
    DECODE_RESIDENT_CTAS: dict[str, int] = {}  # Triton's: the TARGET_WAVES rule

    def __init__(self, configs: list[MhaTritonConfig]) -> None:
        self.CONFIGS = {c.uri: c for c in configs}
        self.calls: list[str] = []

    @staticmethod
    def decode_workspace(config, *, batch_size, num_q_heads, device):
        return library.decode_workspace(
            config, batch_size=batch_size, num_q_heads=num_q_heads, device=device
        )

    def decode(
        self,
        q,
        k_cache,
        v_cache,
        page_table,
        seq_lens,
        num_splits,
        out,
        partial_o,
        partial_lse,
        *,
        config,
        sm_scale,
        sinks=None,
        k_scale=None,
        v_scale=None,
        trusted_metadata=False,
    ) -> None:
        assert sinks is None and k_scale is None and v_scale is None  # no sinks, no fp8
        assert trusted_metadata  # the backend vouches for the metadata these asserts check
        bs, hq = q.shape[:2]
        _check_common(q, k_cache, v_cache, page_table, out, config, rows=bs)
        for t in (seq_lens, num_splits):
            assert t.dtype == torch.int32 and t.is_contiguous() and t.shape[0] >= bs
        assert 1 <= int(num_splits[:bs].min()) and int(num_splits[:bs].max()) <= config.max_splits
        assert partial_o.dtype == partial_lse.dtype == torch.float32
        assert partial_o.shape[1:] == (hq, config.max_splits, config.v_head_dim)
        assert partial_lse.shape[1:] == (hq, config.max_splits) and partial_o.shape[0] >= bs
        ref = paged_decode_ref(
            q, k_cache, v_cache, page_table[:bs], seq_lens[:bs], sm_scale, mask=self.HOOKS
        )
        out.copy_(ref)
        self.calls.append("decode")

    def extend(
        self,
        q,
        k_cache,
        v_cache,
        page_table,
        qo_indptr,
        prefix_lens,
        out,
        *,
        max_extend_len,
        config,
        sm_scale,
        sinks=None,
        k_scale=None,
        v_scale=None,
        trusted_metadata=False,
    ) -> None:
        assert sinks is None and k_scale is None and v_scale is None and trusted_metadata
        bs = qo_indptr.shape[0] - 1
        _check_common(q, k_cache, v_cache, page_table, out, config, rows=bs)
        assert qo_indptr.dtype == prefix_lens.dtype == torch.int32
        # a captured draft extend has room for more rows than a replay fills, and its
        # max_extend_len is the room per request
        assert prefix_lens.shape == (bs,) and int(qo_indptr[-1]) <= q.shape[0]
        assert isinstance(max_extend_len, int)
        assert max_extend_len >= int((qo_indptr[1:] - qo_indptr[:-1]).max())
        ref = paged_extend_ref(
            q, k_cache, v_cache, page_table, qo_indptr, prefix_lens, sm_scale, mask=self.HOOKS
        )
        out.copy_(ref)
        self.calls.append("extend")


def _check_common(q, k_cache, v_cache, page_table, out, config, *, rows: int) -> None:
    dtype = getattr(torch, config.dtype)
    assert q.dtype == k_cache.dtype == v_cache.dtype == out.dtype == dtype
    assert q.is_contiguous() and q.shape[2] == config.head_dim
    assert out.shape == (q.shape[0], q.shape[1], config.v_head_dim)
    assert k_cache.shape[1] == config.page_size
    assert page_table.dtype == torch.int32 and page_table.shape[0] >= rows
    assert page_table.stride(1) == 1


def backend_class(kernels: Any) -> type[PagedMhaBackend]:
    attrs = {
        "kernels": kernels,
        "graph": generated_graph,
        "spec_name": "oracle",
        "arch": "sm90",
        "backend": "triton",
        "num_sms": 132,
    }
    return type("OracleBackend", (PagedMhaBackend,), attrs)


@dataclass
class Rig:
    backend: PagedMhaBackend
    builder: PagedBatchBuilder
    layer: AttentionLayer
    kernels: Any

    @property
    def kv_pool(self) -> PagedKVPool:
        return self.backend.kv_pool


def make_rig(
    config: MhaTritonConfig,
    *,
    num_kv_heads: int = 2,
    max_context_len: int = 64,
    num_pages: int | None = None,
    max_reqs: int = 10,
    backend_cls: type[PagedMhaBackend] | None = None,
) -> Rig:
    """Pools, a builder and a backend for ``config`` (an ``OracleKernels`` one by default)."""
    if backend_cls is None:
        backend_cls = backend_class(
            OracleKernels(CONFIGS + [c for c in [config] if c not in CONFIGS])
        )
    dtype = getattr(torch, config.dtype)
    num_q_heads = num_kv_heads * config.gqa_group
    if num_pages is None:  # room for max_reqs - 1 requests of max_context_len tokens
        num_pages = max_reqs * -(-max_context_len // config.page_size)
    req_pool, kv_pool = make_pools(
        num_layers=2,
        max_reqs=max_reqs,
        max_context_len=max_context_len,
        num_pages=num_pages,
        page_size=config.page_size,
        num_kv_heads=num_kv_heads,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        dtype=dtype,
        device="cpu",
    )
    backend = backend_cls(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        page_size=config.page_size,
        dtype=dtype,
        device="cpu",
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
    )
    layer = AttentionLayer(
        layer_id=1,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        scaling=config.head_dim**-0.5,
    )
    return Rig(backend, PagedBatchBuilder(req_pool, kv_pool), layer, backend_cls.kernels)


def expected_after_write(rig: Rig, pb: PagedBatch, k: torch.Tensor, v: torch.Tensor):
    """The layer's caches as they must be after the forward: the old ones plus k/v at
    out_cache_loc (computed before the forward, independently of the backend)."""
    k_cache, v_cache = (t.clone() for t in rig.kv_pool.get_kv_buffer(rig.layer.layer_id))
    loc = pb.batch.out_cache_loc
    k_cache.view(-1, *k_cache.shape[2:])[loc] = k
    v_cache.view(-1, *v_cache.shape[2:])[loc] = v
    return k_cache, v_cache


def reference(rig: Rig, pb: PagedBatch, q: torch.Tensor, k_cache, v_cache) -> torch.Tensor:
    """Oracle output through the builder's own page table, ``[T, Hq*Dv]`` fp32."""
    return oracle_output(pb, q, k_cache, v_cache, rig.layer.scaling).flatten(1)


def run_forward(rig: Rig, pb: PagedBatch, q, k, v) -> torch.Tensor:
    rig.backend.init_forward_metadata(pb.batch)
    is_decode = pb.batch.forward_mode is ForwardMode.DECODE
    forward = rig.backend.forward_decode if is_decode else rig.backend.forward_extend
    return forward(q, k, v, rig.layer, pb.batch)


def assert_matches(got: torch.Tensor, want: torch.Tensor, seed: int) -> None:
    assert_close(got, want, ONE_ROUNDING, msg=f"seed {seed}")


class GraphEmulator:
    """Records the kernel launches and KV writes of one forward; replays them verbatim."""

    def __init__(self, kernels: Any, kv_pool: PagedKVPool) -> None:
        self.kernels, self.kv_pool = kernels, kv_pool
        self.ops: list[tuple[Callable[..., None], tuple, dict]] = []

    @contextmanager
    def capture(self) -> Iterator[None]:
        names = [n for n in ("decode", "extend", "verify") if hasattr(self.kernels, n)]
        targets = [(self.kernels, n) for n in names] + [(self.kv_pool, "set_kv_buffer")]
        originals = [(obj, name, getattr(obj, name)) for obj, name in targets]
        for obj, name, fn in originals:
            setattr(obj, name, self._recording(fn))
        try:
            yield
        finally:
            for obj, name, fn in originals:
                setattr(obj, name, fn)

    def _recording(self, fn: Callable[..., None]) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.ops.append((fn, args, kwargs))
            fn(*args, **kwargs)

        return record

    def replay(self) -> None:
        for fn, args, kwargs in self.ops:
            fn(*args, **kwargs)


def random_lens(rng: random.Random, count: int, low: int, high: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(count)]


# -- batch and pool types ----


def test_forward_mode_helpers() -> None:
    assert ForwardMode.DECODE.is_decode() and not ForwardMode.DECODE.is_extend()
    extend_like = {ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND}
    assert {m for m in ForwardMode if m.is_extend()} == extend_like
    assert ForwardMode.IDLE.is_idle() and not ForwardMode.IDLE.is_decode()
    assert ForwardMode.TARGET_VERIFY.is_target_verify()
    assert ForwardMode.DRAFT_EXTEND.is_draft_extend()


def test_req_to_token_write_and_bounds() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    pool.write(2, 3, torch.tensor([7, 8, 9]))
    assert pool.req_to_token[2].tolist() == [0, 0, 0, 7, 8, 9, 0, 0]
    assert pool.req_to_token.dtype == torch.int32
    with pytest.raises(AttngenInputError, match="out of the table"):
        pool.write(2, 6, torch.tensor([1, 2, 3]))
    with pytest.raises(AttngenInputError, match="out of the table"):
        pool.write(4, 0, torch.tensor([1]))


def kv_pool_4x2() -> PagedKVPool:
    _, pool = make_pools(
        num_layers=2,
        max_reqs=2,
        max_context_len=8,
        num_pages=4,
        page_size=4,
        num_kv_heads=2,
        head_dim=8,
        v_head_dim=4,
        dtype=torch.float16,
        device="cpu",
    )
    return pool


def test_set_kv_buffer_scatters_by_slot() -> None:
    pool = kv_pool_4x2()
    layer = AttentionLayer(1, 2, 2, 8, 4, 1.0)
    before = [t.clone() for t in pool.get_kv_buffer(1)]
    other_layer = [t.clone() for t in pool.get_kv_buffer(0)]
    loc = torch.tensor([5, 0, 15])
    k = torch.randn(3, 2, 8, dtype=torch.float16)
    v = torch.randn(3, 2, 4, dtype=torch.float16)
    pool.set_kv_buffer(layer, loc, k, v)
    k_cache, v_cache = pool.get_kv_buffer(1)
    for i, (page, offset) in enumerate([(1, 1), (0, 0), (3, 3)]):
        assert torch.equal(k_cache[page, offset], k[i]) and torch.equal(v_cache[page, offset], v[i])
        before[0][page, offset], before[1][page, offset] = k[i], v[i]
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
    assert all(torch.equal(a, b) for a, b in zip(pool.get_kv_buffer(0), other_layer))


def test_set_kv_buffer_rejects_bad_inputs() -> None:
    pool = kv_pool_4x2()
    layer = AttentionLayer(0, 2, 2, 8, 4, 1.0)
    loc = torch.tensor([1, 2])
    k = torch.randn(2, 2, 8, dtype=torch.float16)
    v = torch.randn(2, 2, 4, dtype=torch.float16)
    with pytest.raises(AttngenInputError, match=r"k: expected dtype torch.float16"):
        pool.set_kv_buffer(layer, loc, k.float(), v)
    with pytest.raises(AttngenInputError, match=r"v: expected shape \[2, 2, 4\]"):
        pool.set_kv_buffer(layer, loc, k, v[:, :1])
    with pytest.raises(AttngenInputError, match="loc: expected dtype"):
        pool.set_kv_buffer(layer, loc.float(), k, v)
    with pytest.raises(AttngenInputError, match=r"layer_id: expected 0..1, got 2"):
        pool.set_kv_buffer(AttentionLayer(2, 2, 2, 8, 4, 1.0), loc, k, v)


def test_forward_batch_check() -> None:
    rig = make_rig(CONFIGS[0])
    batch = rig.builder.extend([3, 0], [2, 5]).batch
    batch.check(device=torch.device("cpu"), max_context_len=64)
    with pytest.raises(AttngenInputError, match=r"seq_lens: expected <= 4 .*got 5"):
        batch.check(device=torch.device("cpu"), max_context_len=4)
    wrong_totals = ForwardBatch(**{**vars(batch), "extend_seq_lens_cpu": [2, 4]})
    with pytest.raises(AttngenInputError, match=r"seq_lens_cpu: expected prefix \+ extend"):
        wrong_totals.check(device=torch.device("cpu"), max_context_len=64)
    short_loc = ForwardBatch(**{**vars(batch), "out_cache_loc": batch.out_cache_loc[:-1]})
    with pytest.raises(AttngenInputError, match=r"out_cache_loc: expected shape \[7\]"):
        short_loc.check(device=torch.device("cpu"), max_context_len=64)
    missing = ForwardBatch(**{**vars(batch), "extend_prefix_lens_cpu": None})
    with pytest.raises(AttngenInputError, match="prefix_lens_cpu: expected a list of 2 .*NoneType"):
        missing.check(device=torch.device("cpu"), max_context_len=64)
    as_tensor = ForwardBatch(**{**vars(batch), "extend_seq_lens_cpu": torch.tensor([2, 5])})
    with pytest.raises(AttngenInputError, match="extend_seq_lens_cpu: expected a list of 2 Python"):
        as_tensor.check(device=torch.device("cpu"), max_context_len=64)
    # a bare int (no len()): the same error, not a TypeError from the length check
    bare = ForwardBatch(**{**vars(batch), "extend_seq_lens_cpu": 7})
    with pytest.raises(AttngenInputError, match="extend_seq_lens_cpu: expected a list of 2 .*int"):
        bare.check(device=torch.device("cpu"), max_context_len=64)
    short = ForwardBatch(**{**vars(batch), "extend_seq_lens_cpu": [7]})
    with pytest.raises(AttngenInputError, match="seq_lens_cpu: expected a list of 2 .*got 1"):
        short.check(device=torch.device("cpu"), max_context_len=64)
    floats = ForwardBatch(**{**vars(batch), "extend_prefix_lens_cpu": [3.0, 0]})
    with pytest.raises(AttngenInputError, match="prefix_lens_cpu: expected Python ints.*float"):
        floats.check(device=torch.device("cpu"), max_context_len=64)
    decode = rig.builder.decode([4, 6]).batch
    for lens in ([0, 6], [-3, 6], [-1, -2]):  # a decode row counts its new token: >= 1
        bad = torch.tensor(lens, dtype=torch.int32)
        empty = ForwardBatch(**{**vars(decode), "seq_lens": bad, "seq_lens_cpu": bad})
        with pytest.raises(AttngenInputError, match="seq_lens_cpu: expected lengths >= 1 in DEC"):
            empty.check(device=torch.device("cpu"), max_context_len=64)


def test_eager_metadata_compares_device_and_host_extend_lengths() -> None:
    """Row offsets come from the device lengths, row counts from the host lists: eager
    metadata refuses a batch where they disagree (rows would go to the wrong request, or
    stay unwritten), naming the first request that differs."""
    rig = make_rig(CONFIGS[0])
    batch = rig.builder.extend([0, 4], [3, 2]).batch
    i32 = dict(dtype=torch.int32)
    for field, lens, want in (
        ("extend_prefix_lens", [0, 3], r"extend_prefix_lens\[1\]: expected .*\[1\] = 4 .*got 3"),
        ("extend_seq_lens", [2, 3], r"extend_seq_lens\[0\]: expected .*\[0\] = 3 .*got 2"),
        ("extend_seq_lens", [1, 2], r"extend_seq_lens\[0\]: expected"),
    ):
        bad = ForwardBatch(**{**vars(batch), field: torch.tensor(lens, **i32)})
        with pytest.raises(AttngenInputError, match=want):
            rig.backend.init_forward_metadata(bad)
    rig.backend.init_forward_metadata(batch)


def test_forward_refuses_a_batch_its_metadata_was_not_built_from() -> None:
    """Eager metadata serves its own batch only: a forward given another batch of the same
    size (which would run on the old rows) is refused, a copy with other fields changed
    passes, and a batch init_forward_metadata refused leaves no metadata behind."""
    rig = make_rig(CONFIGS[0])
    first, second = rig.builder.decode([5, 9]), rig.builder.decode([7, 3])
    q, k, v = rig.builder.qkv(2, rig.layer)
    rig.backend.init_forward_metadata(first.batch)
    with pytest.raises(AttngenInputError, match="forward_decode: forward_batch is not the batch"):
        rig.backend.forward_decode(q, k, v, rig.layer, second.batch)
    same = ForwardBatch(**vars(first.batch))  # the same tensors: the same batch
    got = rig.backend.forward_decode(q, k, v, rig.layer, same)
    assert torch.equal(got, rig.backend.forward_decode(q, k, v, rig.layer, first.batch))
    bad = ForwardBatch(**{**vars(second.batch), "seq_lens_cpu": torch.tensor([0, 3])})
    with pytest.raises(AttngenInputError):
        rig.backend.init_forward_metadata(bad)
    with pytest.raises(AttngenInputError, match="needs DecodeMetadata .* found none"):
        rig.backend.forward_decode(q, k, v, rig.layer, first.batch)


def test_decode_reads_strided_seq_lens() -> None:
    """An int32 ``seq_lens`` view with a stride (``.to(torch.int32)`` keeps it) is read
    as its values, not as packed memory."""
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.decode([5, 9, 13])
    q, k, v = rig.builder.qkv(3, rig.layer)
    want = reference(rig, pb, q, *expected_after_write(rig, pb, k, v))
    lens = pb.batch.seq_lens.to(torch.int32)
    strided = torch.stack([lens, torch.ones_like(lens)], dim=1)[:, 0]
    assert strided.stride() == (2,)
    batch = ForwardBatch(**{**vars(pb.batch), "seq_lens": strided})
    rig.backend.init_forward_metadata(batch)
    got = rig.backend.forward_decode(q, k, v, rig.layer, batch)
    assert_matches(got, want, 0)


def test_layer_scaling_is_a_finite_number() -> None:
    base = dict(layer_id=0, num_q_heads=4, num_kv_heads=2, head_dim=32, v_head_dim=32)
    for bad, want in ((float("nan"), "finite"), (float("inf"), "finite"), (None, "real number")):
        with pytest.raises(AttngenInputError, match=f"layer.scaling: expected a {want}"):
            AttentionLayer(**base, scaling=bad)
    AttentionLayer(**base, scaling=-0.5)  # legal: a model may negate its scores


# -- random batch builders ----


@pytest.mark.parametrize("page_size", [1, 4])
def test_builder_layout(page_size: int) -> None:
    rig = make_rig(make_config(32, 32, 2, page_size, "float16"), num_pages=160)
    prefix, ext = [0, 17, 30, 5], [9, 1, 20, 3]
    pb = rig.builder.extend(prefix, ext)
    batch, table = pb.batch, pb.page_table
    rows = batch.req_pool_indices.tolist()
    assert len(set(rows)) == len(rows) and PADDING_REQ not in rows
    pages = [p for b, n in enumerate(pb.seq_lens) for p in table[b, : -(-n // page_size)].tolist()]
    assert len(set(pages)) == len(pages) and PADDING_PAGE not in pages
    assert pages != sorted(pages), f"seed {rig.builder.seed}: pages not shuffled"
    req_to_token = rig.backend.req_to_token_pool.req_to_token
    new_slots = []
    for b, (row, n) in enumerate(zip(rows, pb.seq_lens)):
        pos = torch.arange(n)
        slots = table[b, pos // page_size].long() * page_size + pos % page_size
        assert torch.equal(req_to_token[row, :n].long(), slots)
        new_slots.append(slots[prefix[b] :])
    assert torch.equal(batch.out_cache_loc, torch.cat(new_slots))
    assert batch.seq_lens.tolist() == batch.seq_lens_cpu.tolist() == pb.seq_lens
    assert pb.qo_indptr.tolist() == [0, 9, 10, 30, 33]
    for buf in rig.kv_pool.k_buffer + rig.kv_pool.v_buffer:
        assert (buf != 0).float().mean() > 0.99  # random, not zeros


def test_builder_decode_and_padding() -> None:
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.decode([1, 9, 4])
    assert pb.prefix_lens == [0, 8, 3] and pb.extend_lens == [1, 1, 1]
    assert pb.batch.extend_seq_lens is None and pb.batch.out_cache_loc.shape == (3,)
    padded = pad_decode_batch(pb.batch, 5, seq_len_fill_value=1)
    assert padded.batch_size == 5
    assert padded.req_pool_indices.tolist()[3:] == [PADDING_REQ] * 2
    assert padded.seq_lens.tolist() == pb.seq_lens + [1, 1]
    assert padded.out_cache_loc.tolist()[:3] == pb.batch.out_cache_loc.tolist()
    with pytest.raises(AttngenInputError, match="DECODE batch of 1..2 rows"):
        pad_decode_batch(pb.batch, 2, 1)


def test_builder_rejects_what_does_not_fit() -> None:
    rig = make_rig(CONFIGS[0], num_pages=8)
    with pytest.raises(AttngenInputError, match="needing 9 pages does not fit"):
        rig.builder.decode([20, 16])
    with pytest.raises(AttngenInputError, match="extend_lens >= 1"):
        rig.builder.extend([1], [0])


# -- config selection and construction ----


def key(**kw: object) -> MhaKey:
    """A wanted key: dtypes as torch names; kv_dtype the activations' by default."""
    kw.setdefault("kv_dtype", kw["dtype"])
    return MhaKey(**{"kv_scale": None, "spec_topk": None, **kw})  # type: ignore[arg-type]


def test_select_config() -> None:
    configs = {c.uri: c for c in CONFIGS}
    want = key(head_dim=32, v_head_dim=16, gqa_group=1, page_size=1, dtype="float16")
    assert select_config(configs, want) is CONFIGS[2]
    with pytest.raises(AttngenInputError) as info:
        select_config(
            configs, key(head_dim=32, v_head_dim=32, gqa_group=2, page_size=8, dtype="float16")
        )
    message = str(info.value)
    assert "no generated config for head_dim=32 v_head_dim=32 gqa_group=2 page_size=8" in message
    assert "head_dim=16 v_head_dim=16 gqa_group=4 page_size=8 dtype=bfloat16" in message
    twice = {"a": CONFIGS[0], "b": CONFIGS[0]}
    with pytest.raises(AttngenInputError, match="several generated configs"):
        select_config(
            twice, key(head_dim=32, v_head_dim=32, gqa_group=2, page_size=4, dtype="float16")
        )


def test_backend_construction_errors() -> None:
    rig = make_rig(CONFIGS[0])
    req_pool, kv_pool = rig.backend.req_to_token_pool, rig.kv_pool
    args = dict(
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=32,
        page_size=4,
        dtype=torch.float16,
        device="cpu",
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
    )
    cls = backend_class(rig.kernels)
    assert cls(**args).config is CONFIGS[0]
    with pytest.raises(TypeError, match="has no kernels module"):
        PagedMhaBackend(**args)
    with pytest.raises(AttngenInputError, match="num_q_heads: expected a multiple of"):
        cls(**{**args, "num_q_heads": 5})
    with pytest.raises(AttngenInputError, match="no generated config"):
        cls(**{**args, "num_q_heads": 6})
    with pytest.raises(AttngenInputError, match=r"kv_pool.dtype: expected torch.bfloat16"):
        cls(**{**args, "dtype": torch.bfloat16})
    with pytest.raises(AttngenInputError, match=r"kv_pool.num_kv_heads: expected 1"):
        cls(**{**args, "num_q_heads": 2, "num_kv_heads": 1})


# -- split-KV heuristic and metadata ----


def test_decode_split_heuristic() -> None:
    assert decode_split_cap(programs_per_split=8, num_sms=132, max_splits=16) == 16
    assert decode_split_cap(programs_per_split=100, num_sms=132, max_splits=16) == 6
    assert decode_split_cap(programs_per_split=528, num_sms=132, max_splits=16) == 1
    assert decode_split_cap(programs_per_split=5000, num_sms=132, max_splits=16) == 1
    # with the kernel's resident CTAs an SM: whole waves, the fewest splits within WAVE_SLACK
    # of the fewest waves per unit of work
    cap = functools.partial(decode_split_cap, num_sms=132, max_splits=16)
    assert cap(programs_per_split=64, resident_ctas=2) == 4  # 256 CTAs: one wave of 264
    assert cap(programs_per_split=64, resident_ctas=1) == 2  # 128 CTAs: one wave of 132
    assert cap(programs_per_split=8, resident_ctas=2) == 16  # 128 CTAs: max_splits binds
    # 192 programs over 264 slots: 4 splits are 3 waves (0.75 a split; 1-3 splits: 1.0), 11
    # are 8 (0.727): 4 is within WAVE_SLACK; over 132 slots, 2 splits 1.5 (11: 1.45)
    assert cap(programs_per_split=192, resident_ctas=2) == 4
    assert cap(programs_per_split=192, resident_ctas=1) == 2
    assert cap(programs_per_split=512, resident_ctas=2) == 1  # every count: 2 waves a split
    assert cap(programs_per_split=5000, resident_ctas=2) == 1
    assert cap(programs_per_split=100, resident_ctas=2) == 5  # 2 waves: 0.4; 13 (5 waves):
    # 0.385, within WAVE_SLACK of it
    for programs in range(1, 700):
        for resident in (1, 2, 3):
            n = cap(programs_per_split=programs, resident_ctas=resident)
            waves = [-(-k * programs // (132 * resident)) / k for k in range(1, 17)]
            assert 1 <= n <= 16 and waves[n - 1] <= min(waves) * (1 + WAVE_SLACK)
            assert all(w > min(waves) * (1 + WAVE_SLACK) for w in waves[: n - 1])
    seq_lens = torch.tensor([0, 1, 256, 257, 1000, 100000], dtype=torch.int32)
    got = decode_num_splits(seq_lens, cap=4, min_split_tokens=256)
    assert got.dtype == torch.int32 and got.tolist() == [1, 1, 1, 2, 4, 4]


def test_decode_metadata() -> None:
    config = CONFIGS[0]
    rig = make_rig(config, max_context_len=4096, num_pages=2048)
    pb = rig.builder.decode([4096, 300, 1, 77])
    rig.backend.init_forward_metadata(pb.batch)
    meta = rig.backend.forward_metadata
    assert isinstance(meta, DecodeMetadata) and meta.batch_size == 4 and meta.out is None
    assert meta.page_table.dtype == meta.seq_lens.dtype == meta.num_splits.dtype == torch.int32
    assert torch.equal(meta.page_table, pb.page_table)
    assert meta.seq_lens.tolist() == pb.seq_lens
    # 4 requests x 2 kv heads leave the GPU idle: long requests split up to max_splits (4),
    # each split keeps >= 256 tokens, short requests stay whole
    assert meta.num_splits.tolist() == [4, 2, 1, 1]
    partial_o, partial_lse = meta.workspace  # the kernels' decode_workspace layout
    assert partial_o.shape == (4, 4, config.max_splits, 32)
    assert partial_lse.shape == (4, 4, config.max_splits)


def test_extend_metadata() -> None:
    rig = make_rig(CONFIGS[3])  # page_size 8
    pb = rig.builder.extend([0, 13, 40], [5, 1, 24])
    rig.backend.init_forward_metadata(pb.batch)
    meta = rig.backend.forward_metadata
    assert isinstance(meta, ExtendMetadata)
    assert meta.num_tokens == 30 and meta.max_extend_len == 24 and meta.batch_size == 3
    assert torch.equal(meta.page_table, pb.page_table)  # 64 tokens -> 8 pages
    assert meta.qo_indptr.dtype == meta.prefix_lens.dtype == torch.int32
    assert meta.qo_indptr.tolist() == [0, 5, 6, 30] and meta.prefix_lens.tolist() == [0, 13, 40]


# -- forward: KV writes and outputs ----


def check_forward(rig: Rig, pb: PagedBatch, *, flat: bool) -> torch.Tensor:
    """Run one forward; check the KV write and the output against the oracle."""
    q, k, v = rig.builder.qkv(pb.batch.num_new_tokens, rig.layer)
    k_want, v_want = expected_after_write(rig, pb, k, v)
    want = reference(rig, pb, q, k_want, v_want)
    if flat:
        q, k, v = (t.flatten(1) for t in (q, k, v))
    out = run_forward(rig, pb, q, k, v)
    k_cache, v_cache = rig.kv_pool.get_kv_buffer(rig.layer.layer_id)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
    assert out.shape == (pb.batch.num_new_tokens, rig.layer.num_q_heads * rig.layer.v_head_dim)
    assert_matches(out, want, rig.builder.seed)
    return out


@pytest.mark.parametrize("flat", [False, True], ids=["heads", "flat"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.uri)
def test_forward_extend(config: MhaTritonConfig, flat: bool) -> None:
    rig = make_rig(config)
    rng = random.Random(rig.builder.seed)
    for _ in range(3):
        count = rng.randint(1, 5)
        ext = random_lens(rng, count, 1, 24)
        prefix = [rng.choice([0, rng.randint(1, 64 - e)]) for e in ext]
        check_forward(rig, rig.builder.extend(prefix, ext), flat=flat)
    assert rig.kernels.calls == ["extend"] * 3


@pytest.mark.parametrize("flat", [False, True], ids=["heads", "flat"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.uri)
def test_forward_decode(config: MhaTritonConfig, flat: bool) -> None:
    rig = make_rig(config)
    rng = random.Random(rig.builder.seed)
    for _ in range(3):
        lens = random_lens(rng, rng.randint(1, 6), 1, 64)
        check_forward(rig, rig.builder.decode(lens), flat=flat)
    assert rig.kernels.calls == ["decode"] * 3


def test_layers_share_metadata_and_keep_their_caches() -> None:
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.decode([5, 33])
    rig.backend.init_forward_metadata(pb.batch)
    for layer_id in (0, 1):
        layer = AttentionLayer(**{**vars(rig.layer), "layer_id": layer_id})
        rig_layer = Rig(rig.backend, rig.builder, layer, rig.kernels)
        q, k, v = rig.builder.qkv(2, layer)
        k_want, v_want = expected_after_write(rig_layer, pb, k, v)
        other = [t.clone() for t in rig.kv_pool.get_kv_buffer(1 - layer_id)]
        out = rig.backend.forward_decode(q, k, v, layer, pb.batch)
        assert_matches(out, reference(rig_layer, pb, q, k_want, v_want), rig.builder.seed)
        assert all(
            torch.equal(a, b) for a, b in zip(rig.kv_pool.get_kv_buffer(1 - layer_id), other)
        )


def test_forward_without_saving_kv() -> None:
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.extend([7], [4])
    before = [t.clone() for t in rig.kv_pool.get_kv_buffer(rig.layer.layer_id)]
    q, _, _ = rig.builder.qkv(4, rig.layer)
    rig.backend.init_forward_metadata(pb.batch)
    out = rig.backend.forward_extend(q, None, None, rig.layer, pb.batch, save_kv_cache=False)
    caches = rig.kv_pool.get_kv_buffer(rig.layer.layer_id)
    assert all(torch.equal(a, b) for a, b in zip(caches, before))
    assert_matches(out, reference(rig, pb, q, *before), rig.builder.seed)


def test_forward_input_errors() -> None:
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.decode([5, 9])
    q, k, v = rig.builder.qkv(2, rig.layer)
    fwd = rig.backend.forward_decode
    with pytest.raises(AttngenInputError, match="forward_decode: needs DecodeMetadata .* none"):
        fwd(q, k, v, rig.layer, pb.batch)
    rig.backend.init_forward_metadata(pb.batch)
    with pytest.raises(AttngenInputError, match="forward_extend: needs ExtendMetadata"):
        rig.backend.forward_extend(q, k, v, rig.layer, pb.batch)
    with pytest.raises(AttngenInputError, match="q: expected dtype torch.float16"):
        fwd(q.float(), k, v, rig.layer, pb.batch)
    with pytest.raises(AttngenInputError, match=r"q: expected shape \[2, 4, 32\]"):
        fwd(q[:, :2], k, v, rig.layer, pb.batch)
    with pytest.raises(AttngenInputError, match=r"q: expected shape \[2, 128\]"):
        fwd(q.flatten(1)[:, :96], k, v, rig.layer, pb.batch)
    with pytest.raises(AttngenInputError, match=r"k: expected 3 dims \[2, 2, 32\]"):
        fwd(q, k[None], v, rig.layer, pb.batch)
    with pytest.raises(AttngenInputError, match="v: expected a torch.Tensor"):
        fwd(q, k, None, rig.layer, pb.batch)
    bad_layer = AttentionLayer(**{**vars(rig.layer), "num_kv_heads": 4})
    with pytest.raises(AttngenInputError, match=r"layer 1 .* expected \(4, 2, 32, 32\)"):
        fwd(q, k, v, bad_layer, pb.batch)
    assert rig.kernels.calls == []


def test_forward_modes() -> None:
    rig = make_rig(CONFIGS[0])
    batch = rig.builder.extend([2], [3]).batch
    verify = ForwardBatch(**{**vars(batch), "forward_mode": ForwardMode.TARGET_VERIFY})
    with pytest.raises(AttngenInputError, match="generates phases extend, decode; TARGET_VERIFY"):
        rig.backend.init_forward_metadata(verify)
    # a draft model's extend runs the extend kernel
    draft = ForwardBatch(**{**vars(batch), "forward_mode": ForwardMode.DRAFT_EXTEND})
    rig.backend.init_forward_metadata(draft)
    rig.backend.init_forward_metadata(batch)
    rig.backend.init_forward_metadata(
        ForwardBatch(**{**vars(batch), "forward_mode": ForwardMode.IDLE})
    )
    assert rig.backend.forward_metadata is None


# -- CUDA graphs (emulated) ----


def metadata_addresses(meta: DecodeMetadata) -> dict[str, int]:
    names = ("page_table", "seq_lens", "num_splits", "out")
    found = {name: getattr(meta, name).data_ptr() for name in names}
    return found | {f"workspace{i}": w.data_ptr() for i, w in enumerate(meta.workspace)}


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[2], CONFIGS[3]], ids=lambda c: c.uri)
def test_cuda_graph_replay_matches_eager(config: MhaTritonConfig) -> None:
    max_bs, max_context_len = 6, 96
    rig = make_rig(config, max_context_len=max_context_len, num_pages=1024)
    backend, layer, fill = rig.backend, rig.layer, rig.backend.get_cuda_graph_seq_len_fill_value()
    backend.init_cuda_graph_state(max_bs, max_bs)
    # -- capture once, at max_bs, on static inputs (as a graph runner does) ----
    q_s, k_s, v_s = rig.builder.qkv(max_bs, layer)
    req_s = torch.zeros(max_bs, dtype=torch.int64)
    seq_s = torch.full((max_bs,), fill, dtype=torch.int32)
    loc_s = torch.zeros(max_bs, dtype=torch.int64)
    static = ForwardBatch(max_bs, ForwardMode.DECODE, req_s, seq_s, seq_s.clone(), loc_s)
    backend.init_forward_metadata_capture_cuda_graph(
        max_bs, max_bs, req_s, seq_s, None, ForwardMode.DECODE, None
    )
    addresses = metadata_addresses(backend.forward_metadata)
    graph = GraphEmulator(rig.kernels, rig.kv_pool)
    with graph.capture():
        out_s = backend.forward_decode(q_s, k_s, v_s, layer, static)
    # -- replay many batches: fewer rows, new lengths, up to the table's width ----
    rng = random.Random(rig.builder.seed)
    for step in range(24):
        n = max_bs if step % 5 == 0 else rng.randint(1, max_bs)
        lens = random_lens(rng, n, 1, max_context_len if step % 2 else 16)
        lens[0] = max_context_len if step % 3 == 0 else lens[0]
        pb = rig.builder.decode(lens)
        q, k, v = rig.builder.qkv(n, layer)
        eager = run_forward(rig, pb, q, k, v).clone()
        padded = pad_decode_batch(pb.batch, max_bs, fill)
        for buf, new in ((q_s, q), (k_s, k), (v_s, v)):
            buf[:n] = new
        for buf, new in (
            (req_s, padded.req_pool_indices),
            (seq_s, padded.seq_lens),
            (loc_s, padded.out_cache_loc),
        ):
            buf.copy_(new)
        seq_lens_cpu = padded.seq_lens_cpu if step % 2 else None  # both copy-in paths
        backend.init_forward_metadata_replay_cuda_graph(
            max_bs,
            req_s,
            seq_s,
            sum(padded.seq_lens_cpu.tolist()),
            None,
            ForwardMode.DECODE,
            None,
            seq_lens_cpu,
        )
        assert metadata_addresses(backend.forward_metadata) == addresses, f"step {step}"
        graph.replay()
        msg = f"seed {rig.builder.seed}, step {step}, lens {lens}"
        assert torch.equal(out_s[:n], eager), msg
    assert len(graph.ops) == 2  # one KV write, one decode launch


def test_cuda_graph_errors() -> None:
    rig = make_rig(CONFIGS[0])
    backend, decode = rig.backend, ForwardMode.DECODE
    req, seq = torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int32)
    with pytest.raises(AttngenInputError, match="call init_cuda_graph_state first"):
        backend.init_forward_metadata_capture_cuda_graph(4, 4, req, seq, None, decode, None)
    backend.init_cuda_graph_state(4, 4)
    # a second call would swap the buffers graphs captured so far read
    with pytest.raises(AttngenInputError, match="init_cuda_graph_state: already called"):
        backend.init_cuda_graph_state(8, 8)
    capture = backend.init_forward_metadata_capture_cuda_graph
    for bs, want in ((4.0, "bs: expected an integer, got float 4.0"), (True, "got bool True")):
        with pytest.raises(AttngenInputError, match=want):
            capture(bs, 4, req, seq, None, decode, None)
    with pytest.raises(AttngenInputError, match="forward_mode: expected a ForwardMode, got str"):
        capture(4, 4, req, seq, None, "DECODE", None)
    with pytest.raises(
        AttngenInputError,
        match="EXTEND is not graph-capturable; DECODE, TARGET_VERIFY and DRAFT_EXTEND are",
    ):
        capture(4, 4, req, seq, None, ForwardMode.EXTEND, None)
    with pytest.raises(AttngenInputError, match=r"bs: expected 1..4 .*got 5"):
        capture(5, 5, torch.zeros(5, dtype=torch.int64), seq, None, decode, None)
    with pytest.raises(AttngenInputError, match=r"num_tokens: expected bs \* 1 = 4 \(DECODE\)"):
        capture(4, 8, req, seq, None, decode, None)
    with pytest.raises(AttngenInputError, match="encoder_lens: expected None"):
        capture(4, 4, req, seq, seq, decode, None)
    with pytest.raises(AttngenInputError, match=r"seq_lens: expected >= bs=4 rows"):
        capture(4, 4, req, seq[:3], None, decode, None)
    replay = backend.init_forward_metadata_replay_cuda_graph
    # no graph of that size: the engine pads a batch up to a captured size
    with pytest.raises(AttngenInputError, match="bs 4 was not captured in DECODE"):
        replay(4, req, seq, 4, None, decode, None, seq)
    capture(4, 4, req, seq, None, decode, None)
    replay(4, req, seq, 4, None, decode, None, seq)
    with pytest.raises(AttngenInputError, match="bs 2 was not captured in DECODE"):
        replay(2, req, seq, 2, None, decode, None, seq)
    too_long = torch.tensor([1, 65, 1, 1], dtype=torch.int32)
    with pytest.raises(AttngenInputError, match=r"seq_lens: expected <= 64"):
        backend.init_forward_metadata_replay_cuda_graph(
            4, req, too_long, 68, None, decode, None, too_long
        )


def test_cuda_graph_replay_checks_the_host_lengths() -> None:
    """seq_lens_cpu sizes the page-table copy of a replay: fewer rows than bs (the longest
    request left out: its columns past the copy stay stale), another shape, or a length
    below 1 is refused by name, not replayed on a short or stale page table."""
    rig = make_rig(CONFIGS[0], max_context_len=64, num_pages=1024)
    backend, decode = rig.backend, ForwardMode.DECODE
    backend.init_cuda_graph_state(4, 4)
    req = torch.zeros(4, dtype=torch.int64)
    seq = torch.tensor([3, 60, 1, 1], dtype=torch.int32)
    backend.init_forward_metadata_capture_cuda_graph(4, 4, req, seq, None, decode, None)
    replay = backend.init_forward_metadata_replay_cuda_graph
    with pytest.raises(AttngenInputError, match=r"seq_lens_cpu: expected >= bs=4 rows, got 1"):
        replay(4, req, seq, 65, None, decode, None, seq[:1].clone())
    with pytest.raises(AttngenInputError, match=r"seq_lens_cpu: expected 1 dims"):
        replay(4, req, seq, 65, None, decode, None, seq.view(2, 2).clone())
    for bad in ([0, 60, 1, 1], [3, -1, 1, 1]):
        with pytest.raises(AttngenInputError, match=r"seq_lens_cpu: expected lengths >= 1"):
            replay(4, req, seq, 65, None, decode, None, torch.tensor(bad, dtype=torch.int32))
    replay(4, req, seq, 65, None, decode, None, seq.clone())


# -- a real generated kernels module, through Triton's interpreter ----


def test_generated_backend_in_interpreter() -> None:
    try:
        module = importlib.import_module("generated.sm90.triton.mha.mha_gqa_paged.backend")
    except ImportError as exc:
        pytest.skip(f"no generated sm90 mha_gqa_paged backend: {exc}")
    configs = [
        c
        for c in module.Backend.kernels.CONFIGS.values()
        if c.dtype == "float16" and c.page_size == 16 and c.gqa_group == 4 and c.head_dim == 64
    ]
    if not configs:
        pytest.skip("no fp16 d64 g4 ps16 config")
    rig = make_rig(configs[0], num_kv_heads=1, max_context_len=48, backend_cls=module.Backend)
    check_forward(rig, rig.builder.extend([0, 21], [5, 11]), flat=True)
    check_forward(rig, rig.builder.decode([1, 48]), flat=False)


def test_backend_serves_only_the_generated_phases() -> None:
    kernels = OracleKernels(CONFIGS)
    kernels.PHASES = ("extend",)  # an extend-only spec (e.g. bidirectional encoders)
    rig = make_rig(CONFIGS[0], backend_cls=backend_class(kernels))
    pb = rig.builder.decode([5, 9])
    with pytest.raises(AttngenInputError, match="generates phases extend; DECODE needs decode"):
        rig.backend.init_forward_metadata(pb.batch)
    assert kernels.calls == []


# -- run-time checks of token slots, quantized pools and verify inputs ----


def test_slots_out_of_the_pool_fail_before_any_launch() -> None:
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.decode([5, 9])
    row = int(pb.batch.req_pool_indices[1])
    table = rig.backend.req_to_token_pool.req_to_token
    saved = table[row, 3].item()
    table[row, 3] = rig.kv_pool.num_slots + 7  # a page the pool does not have
    with pytest.raises(
        AttngenInputError, match=rf"req_to_token\[{row}, 3\] .*got {rig.kv_pool.num_slots + 7}"
    ):
        rig.backend.init_forward_metadata(pb.batch)
    table[row, 3] = saved
    bad_loc = pb.batch.out_cache_loc.clone()
    bad_loc[0] = -1
    with pytest.raises(AttngenInputError, match=r"out_cache_loc\[0\]: expected a slot in 0\.\."):
        rig.backend.init_forward_metadata(
            ForwardBatch(**{**vars(pb.batch), "out_cache_loc": bad_loc})
        )
    bad_rows = pb.batch.req_pool_indices.clone()
    bad_rows[1] = 99
    with pytest.raises(AttngenInputError, match=r"req_pool_indices\[1\]: expected a row"):
        rig.backend.init_forward_metadata(
            ForwardBatch(**{**vars(pb.batch), "req_pool_indices": bad_rows})
        )
    assert rig.kernels.calls == []


def test_fp8_pool_quantizes_with_the_layer_scales() -> None:
    pool = PagedKVPool(
        num_layers=1,
        num_pages=4,
        page_size=2,
        num_kv_heads=2,
        head_dim=16,
        dtype=torch.float8_e4m3fn,
        device="cpu",
    )
    layer = AttentionLayer(0, 4, 2, 16, 16, 0.25)
    k, v = torch.randn(3, 2, 16, dtype=torch.bfloat16), torch.randn(3, 2, 16, dtype=torch.bfloat16)
    loc = torch.tensor([1, 4, 6])
    with pytest.raises(AttngenInputError, match="layer.k_scale: expected a float32 tensor"):
        pool.set_kv_buffer(layer, loc, k, v)
    scale = torch.tensor([0.01, 0.02])  # per kv head
    layer = AttentionLayer(0, 4, 2, 16, 16, 0.25, k_scale=scale, v_scale=scale)
    pool.set_kv_buffer(layer, loc, 1000 * k, v)  # 1000 * k saturates at 448 * scale
    k_cache, v_cache = pool.get_kv_buffer(0)
    stored = k_cache.view(-1, 2, 16)[loc].float() * scale.view(1, 2, 1)
    want = (1000 * k.float()).clamp(-448 * scale.view(1, 2, 1), 448 * scale.view(1, 2, 1))
    assert not stored.isnan().any()
    torch.testing.assert_close(stored, want, rtol=2**-3, atol=1e-3)
    deq_v = v_cache.view(-1, 2, 16)[loc].float() * scale.view(1, 2, 1)
    torch.testing.assert_close(deq_v, v.float(), rtol=2**-3, atol=scale.max().item())


def test_nvfp4_pool_round_trips_through_its_layout() -> None:
    pool = NvFp4KVPool(
        num_layers=1, num_pages=3, page_size=4, num_kv_heads=2, head_dim=32, device="cpu"
    )
    gs = torch.tensor([0.01])
    layer = AttentionLayer(0, 2, 2, 32, 32, 0.2, k_scale=gs, v_scale=gs)
    k = torch.randn(5, 2, 32)
    loc = torch.tensor([0, 3, 5, 8, 11])
    pool.set_kv_buffer(layer, loc, k, k)
    codes, _ = pool.get_kv_buffer(0)
    scales, _ = pool.get_kv_block_scales(0)
    assert codes.dtype == torch.uint8 and codes.shape == (3, 4, 2, 16)
    back = dequantize_nvfp4(codes.view(-1, 2, 16)[loc], scales.view(-1, 2, 2)[loc], gs)
    assert (back - k).abs().max() <= 0.25 * k.abs().amax()  # e2m1: within a block's half step
    with pytest.raises(AttngenInputError, match=r"layer.k_scale: expected shape \[1\]"):
        bad = AttentionLayer(0, 2, 2, 32, 32, 0.2, k_scale=torch.ones(2), v_scale=gs)
        pool.set_kv_buffer(bad, loc, k, k)


def test_verify_batches_are_checked() -> None:
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.extend([3, 4], [2, 2])
    verify = ForwardBatch(**{**vars(pb.batch), "forward_mode": ForwardMode.TARGET_VERIFY})
    with pytest.raises(AttngenInputError, match="spec_info: expected a VerifyInfo"):
        verify.check(device=rig.backend.device, max_context_len=64)
    three = ForwardBatch(**{**vars(verify), "spec_info": VerifyInfo(3)})
    with pytest.raises(
        AttngenInputError, match=r"extend_seq_lens_cpu: expected spec_info.draft_token_num=3"
    ):
        three.check(device=rig.backend.device, max_context_len=64)


def test_device_lengths_that_disagree_with_the_host_fail_before_any_launch() -> None:
    """seq_lens on the device larger than seq_lens_cpu would read past the page table the
    host sized: eager metadata compares them in its one sync."""
    rig = make_rig(CONFIGS[0])
    pb = rig.builder.decode([5, 9])
    longer = pb.batch.seq_lens.clone()
    longer[1] += 8
    with pytest.raises(
        AttngenInputError, match=r"seq_lens\[1\]: expected seq_lens_cpu\[1\] = 9 .*got 17"
    ):
        rig.backend.init_forward_metadata(ForwardBatch(**{**vars(pb.batch), "seq_lens": longer}))
    assert rig.kernels.calls == []


TREE = dataclasses.replace(CONFIGS[0], uri="tree_d32", spec_topk=2, num_draft_tokens=3)


def test_tree_masks_of_the_wrong_size_or_offsets_fail_in_eager_mode() -> None:
    class TreeKernels(OracleKernels):
        PHASES = ("extend", "decode", "verify")

    rig = make_rig(TREE, backend_cls=backend_class(TreeKernels([TREE])))
    pb = rig.builder.extend([3, 4], [3, 3])
    masks = [torch.tril(torch.ones(3, 3, dtype=torch.bool)) for _ in range(2)]
    packed, indptr = pack_tree_masks(masks)  # 2 bytes per request

    def verify(mask: torch.Tensor, offsets: torch.Tensor) -> ForwardBatch:
        info = VerifyInfo(3, tree_mask=mask, tree_mask_indptr=offsets)
        fields = {**vars(pb.batch), "forward_mode": ForwardMode.TARGET_VERIFY, "spec_info": info}
        return ForwardBatch(**fields)

    rig.backend.init_forward_metadata(verify(packed, indptr))  # the right mask passes
    for wrong in (packed[:-1], torch.cat([packed, packed[:1]])):
        with pytest.raises(AttngenInputError, match=r"tree_mask: expected 4 bytes .*got \d bytes"):
            rig.backend.init_forward_metadata(verify(wrong, indptr))
    shifted = indptr.clone()
    shifted[1] = 1
    with pytest.raises(AttngenInputError, match=r"tree_mask_indptr\[1\]: expected 2 .*got 1"):
        rig.backend.init_forward_metadata(verify(packed, shifted))
    with pytest.raises(AttngenInputError, match=r"tree_mask_indptr: expected shape"):
        rig.backend.init_forward_metadata(verify(packed, indptr[:-1]))
    with pytest.raises(
        AttngenInputError, match=r"tree_mask: expected a torch.Tensor, got NoneType"
    ):
        rig.backend.init_forward_metadata(verify(None, indptr))


def test_a_tree_mask_is_checked_once_per_eager_forward_with_or_without_slot_checks(
    monkeypatch,
) -> None:
    class TreeKernels(OracleKernels):
        PHASES = ("extend", "decode", "verify")

    rig = make_rig(TREE, backend_cls=backend_class(TreeKernels([TREE])))
    pb = rig.builder.extend([3, 4], [3, 3])
    packed, indptr = pack_tree_masks([torch.ones(3, 3, dtype=torch.bool).tril()] * 2)
    info = VerifyInfo(3, tree_mask=packed, tree_mask_indptr=indptr)
    fb = ForwardBatch(
        **{**vars(pb.batch), "forward_mode": ForwardMode.TARGET_VERIFY, "spec_info": info}
    )
    calls = []
    original = type(rig.backend)._check_tree_mask
    monkeypatch.setattr(
        type(rig.backend),
        "_check_tree_mask",
        lambda self, *a: (calls.append(1), original(self, *a))[1],
    )
    for validate in (True, False):
        calls.clear()
        monkeypatch.setattr(rig.backend, "validate_slots", validate)
        rig.backend.init_forward_metadata(fb)
        assert len(calls) == 1, (validate, len(calls))
        with pytest.raises(AttngenInputError, match=r"tree_mask: expected 4 bytes"):
            bad = VerifyInfo(3, tree_mask=packed[:-1], tree_mask_indptr=indptr)
            rig.backend.init_forward_metadata(ForwardBatch(**{**vars(fb), "spec_info": bad}))


# -- CUDA-graph replay of the speculative phases (verify chains and trees, draft extend) ----


def unpack_tree_masks(packed: torch.Tensor, indptr: torch.Tensor, n: int, bs: int):
    """The inverse of pack_tree_masks for ``bs`` requests of ``n`` drafts."""
    bits = ((packed[:, None].long() >> torch.arange(8)) & 1).flatten().bool()
    return [
        bits[int(indptr[b]) * 8 : int(indptr[b]) * 8 + n * n].view(n, n).clone() for b in range(bs)
    ]


class SpeculativeOracleKernels(OracleKernels):
    PHASES = ("extend", "decode", "verify", "draft_extend")

    def verify(
        self,
        q,
        k_cache,
        v_cache,
        page_table,
        qo_indptr,
        prefix_lens,
        out,
        *,
        config,
        sm_scale,
        tree_mask=None,
        tree_mask_indptr=None,
        sinks=None,
        k_scale=None,
        v_scale=None,
        trusted_metadata=False,
    ) -> None:
        assert sinks is None and k_scale is None and v_scale is None and trusted_metadata
        n = config.num_draft_tokens
        bs = int(prefix_lens.shape[0])
        _check_common(q, k_cache, v_cache, page_table, out, config, rows=bs)
        assert torch.equal(qo_indptr[: bs + 1].cpu(), torch.arange(bs + 1, dtype=torch.int32) * n)
        masks = None
        if config.spec_topk > 1:
            masks = unpack_tree_masks(tree_mask, tree_mask_indptr, n, bs)
        ref = paged_extend_ref(
            q,
            k_cache,
            v_cache,
            page_table[:bs],
            qo_indptr[: bs + 1],
            prefix_lens,
            sm_scale,
            mask=self.HOOKS,
            tree_masks=masks,
        )
        out.copy_(ref)
        self.calls.append("verify")


CHAIN = dataclasses.replace(CONFIGS[0], uri="chain_d32", spec_topk=1, num_draft_tokens=3)
TREE4 = dataclasses.replace(CONFIGS[2], uri="tree_d32_ps1", spec_topk=2, num_draft_tokens=4)


@pytest.mark.parametrize(
    "config, mode",
    [
        (CHAIN, ForwardMode.TARGET_VERIFY),
        (TREE4, ForwardMode.TARGET_VERIFY),
        (CHAIN, ForwardMode.DRAFT_EXTEND),
    ],
    ids=["verify-chain", "verify-tree", "draft-extend"],
)
def test_speculative_graph_replay_matches_eager(config: MhaTritonConfig, mode: ForwardMode):
    """Capture once at max_bs requests x n rows, replay 24 batches of fewer requests, new
    prefixes (and accepted counts), through the graph buffers only: the outputs equal the
    eager forward's, the metadata never moves, and nothing else is launched."""
    max_bs, max_context_len, n = 4, 64, config.num_draft_tokens
    rig = make_rig(
        config,
        max_context_len=max_context_len,
        num_pages=1024,
        backend_cls=backend_class(SpeculativeOracleKernels([config])),
    )
    backend, layer = rig.backend, rig.layer
    fill = backend.get_cuda_graph_seq_len_fill_value()
    verify = mode is ForwardMode.TARGET_VERIFY
    tree = config.spec_topk > 1
    backend.init_cuda_graph_state(max_bs, max_bs * n)
    q_s, k_s, v_s = rig.builder.qkv(max_bs * n, layer)
    loc_s = torch.zeros(max_bs * n, dtype=torch.int64)
    rows_s = torch.zeros(max_bs, dtype=torch.int64)
    lens_s = torch.full((max_bs,), fill, dtype=torch.int32)
    extend_lens_s = torch.ones(max_bs, dtype=torch.int32)
    mask_bytes = tree_mask_bytes(n)

    def infos(pb, real: int):
        if not verify:
            return DraftExtendInfo(extend_lens_s)
        info = pb.batch.spec_info
        if not tree:
            return info
        pad = torch.full(((max_bs - real) * mask_bytes,), 255, dtype=torch.uint8)
        return VerifyInfo(n, torch.cat([info.tree_mask, pad]), info.tree_mask_indptr)

    def batch_for(prefix: list[int], accepted: list[int]):
        if verify:
            return rig.builder.verify(prefix, n, tree=tree)
        return rig.builder.draft_extend(prefix, accepted)

    first = batch_for([max_context_len - n] * max_bs, [n] * max_bs)
    static = dataclasses.replace(first.batch, out_cache_loc=loc_s)
    backend.init_forward_metadata_capture_cuda_graph(
        max_bs, max_bs * n, rows_s, lens_s, None, mode, infos(first, max_bs)
    )
    addresses = {k: v for k, v in vars(backend.forward_metadata).items() if torch.is_tensor(v)}
    addresses = {k: v.data_ptr() for k, v in addresses.items()}
    graph = GraphEmulator(rig.kernels, rig.kv_pool)
    with graph.capture():
        out_s = backend.forward_extend(q_s, k_s, v_s, layer, static)
    rng = random.Random(rig.builder.seed)
    for step in range(24):
        real = max_bs if step % 5 == 0 else rng.randint(1, max_bs - 1)
        prefix = [rng.choice([0, rng.randint(1, max_context_len - n)]) for _ in range(real)]
        accepted = [rng.randint(1, n) for _ in range(real)] if not verify else [n] * real
        pb = batch_for(prefix, accepted)
        tokens = sum(accepted)
        q, k, v = rig.builder.qkv(tokens, layer)
        eager = run_forward(rig, pb, q, k, v).clone()
        q_s[:tokens], k_s[:tokens], v_s[:tokens] = q, k, v
        loc_s.zero_()
        loc_s[:tokens] = pb.batch.out_cache_loc
        rows_s.zero_()
        rows_s[:real] = pb.batch.req_pool_indices
        lens_s.fill_(fill)
        lens_s[:real] = pb.batch.seq_lens
        extend_lens_s.fill_(1)
        extend_lens_s[:real] = torch.tensor(accepted, dtype=torch.int32)
        out_s.fill_(float("nan"))
        backend.init_forward_metadata_replay_cuda_graph(
            max_bs, rows_s, lens_s, int(lens_s.sum()), None, mode, infos(pb, real), lens_s.clone()
        )
        now = {
            k: v.data_ptr() for k, v in vars(backend.forward_metadata).items() if torch.is_tensor(v)
        }
        assert now == addresses, f"step {step}: metadata moved"
        graph.replay()
        msg = f"seed {rig.builder.seed}, step {step}, prefix {prefix}, accepted {accepted}"
        assert torch.equal(out_s[:tokens], eager), msg
    kernel = "verify" if verify else "extend"
    assert [op[0].__name__ for op in graph.ops] == ["set_kv_buffer", kernel]


def test_a_graph_tree_mask_on_another_device_is_refused() -> None:
    """The verify buffers copy the tree mask in place: one on another device (a host mask
    on a CUDA backend: a copy inside capture) is refused by name, not left to the copy."""
    rig = make_rig(
        TREE4,
        max_context_len=64,
        num_pages=1024,
        backend_cls=backend_class(SpeculativeOracleKernels([TREE4])),
    )
    backend, n, verify = rig.backend, TREE4.num_draft_tokens, ForwardMode.TARGET_VERIFY
    backend.init_cuda_graph_state(2, 2 * n)
    pb = rig.builder.verify([5, 6], n, tree=True)
    info, req, seq = pb.batch.spec_info, pb.batch.req_pool_indices, pb.batch.seq_lens
    elsewhere = dataclasses.replace(info, tree_mask=info.tree_mask.to("meta"))
    with pytest.raises(AttngenInputError, match=r"spec_info.tree_mask: expected device cpu"):
        backend.init_forward_metadata_capture_cuda_graph(
            2, 2 * n, req, seq, None, verify, elsewhere
        )
    backend.init_forward_metadata_capture_cuda_graph(2, 2 * n, req, seq, None, verify, info)
