"""GPU numerics and CUDA-graph tests of every generated MHA backend, against the oracle.

Discovery: every ``generated/<ARCH>/<backend>/mha/<spec>/backend.py`` (``ARCH`` = sm90 unless
``ATTNGEN_GPU_ARCH`` says otherwise; every backend: Triton, CuTe DSL) and every config of its
kernels module. A test skips the phases a spec does not generate. Each config
gets, through its backend (KV writes, metadata, kernels):

- ``decode`` and ``extend``: short random ragged batches; and, for one config per
  (spec, head_dim, page_size, dtype) -- the widest GQA group -- a long batch too: decode
  lengths up to 8k, extend prefixes up to 4k over 2k new tokens.
- ``cuda_graph``: decode captured once at ``MAX_BS``, then replayed on 24 different batches
  (fewer real rows than captured, padded as an engine pads them; new lengths up to the
  table's width), each matched against the same batch run eagerly and against the oracle.

Inputs are fresh random every run (the seed is in every failure message); pages are
shuffled. The graph's static output and split scratch are poisoned with NaN before every
replay, so an element the kernels fail to write shows.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from attngen.runtime.batch import (
    DraftExtendInfo,
    AttentionLayer,
    ForwardBatch,
    ForwardMode,
    VerifyInfo,
    pack_tree_masks,
)
from attngen.runtime.pools import FP8_DTYPES, NvFp4KVPool
from attngen.families.mha.reference import prefill_ref, visible_keys
from attngen.families.mla.testing import check_lse
from attngen.families.mha.runtime import PagedMhaBackend
from attngen.families.mha.testing import oracle_output
from attngen.testing import (
    PagedBatch,
    PagedBatchBuilder,
    make_pools,
    pad_decode_batch,
)
from attngen.testing.batches import LONG_DECODE, LONG_EXTEND
from attngen.testing.paths import REPO_ROOT
from attngen.testing.tolerance import KERNEL, assert_close

ARCH = os.environ.get("ATTNGEN_GPU_ARCH", "sm90")
NUM_KV_HEADS = 2
MAX_BS = 8  # the graph test's captured batch size
GRAPH_TABLE_WIDTH = 2048  # tokens per request row in the graph test (req_to_token width)
REPLAYS = 24


# -- discovery ----


def discover_backends() -> list[tuple[str, type[PagedMhaBackend]]]:
    """(backend dir, Backend class) of every generated MHA package of ARCH."""
    root = REPO_ROOT / "generated" / ARCH
    found = []
    for path in sorted(root.glob("*/mha/*/backend.py")):
        backend_dir, spec = path.parent.parent.parent.name, path.parent.name
        module = importlib.import_module(f"generated.{ARCH}.{backend_dir}.mha.{spec}.backend")
        found.append((backend_dir, module.Backend))
    return found


def long_case_uris(backend: type[PagedMhaBackend]) -> set[str]:
    """Per (head_dim, page_size, dtype): the config with the widest GQA group."""
    best: dict[tuple, Any] = {}
    for config in backend.kernels.CONFIGS.values():
        key = (config.head_dim, config.page_size, config.dtype)
        if key not in best or (config.gqa_group, config.uri) > (best[key].gqa_group, best[key].uri):
            best[key] = config
    return {c.uri for c in best.values()}


@dataclass(frozen=True)
class Case:
    backend: type[PagedMhaBackend]
    config: Any
    long: bool


def cases() -> list:
    params = []
    for backend_dir, backend in discover_backends():
        longs = long_case_uris(backend)
        for uri in sorted(backend.kernels.CONFIGS):
            case = Case(backend, backend.kernels.CONFIGS[uri], uri in longs)
            params.append(pytest.param(case, id=f"{backend_dir}-{backend.spec_name}-{uri}"))
    return params or [pytest.param(None, id="no-generated-backends")]


CASES = cases()


# -- rig: pools, a batch builder and a backend for one config ----


@dataclass
class Rig:
    backend: PagedMhaBackend
    builder: PagedBatchBuilder
    layer: AttentionLayer
    dtype: torch.dtype
    sinks: torch.Tensor | None  # [Hq] fp32 sink logits when the spec has sinks

    def qkv(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.builder.qkv(num_tokens, self.layer, self.dtype)

    @property
    def mask(self):
        return self.backend.kernels.HOOKS

    def oracle(self, pb: PagedBatch, q: torch.Tensor) -> torch.Tensor:
        """The oracle's ``[T, Hq*Dv]`` output for ``pb`` (caches already hold its K/V)."""
        pool = self.backend.kv_pool
        k_cache, v_cache = pool.get_kv_buffer(self.layer.layer_id)
        k_bs, v_bs = (None, None)
        if isinstance(pool, NvFp4KVPool):
            k_bs, v_bs = pool.get_kv_block_scales(self.layer.layer_id)
        q3 = q.view(q.shape[0], self.layer.num_q_heads, self.layer.head_dim)
        scale = self.layer.scaling
        return oracle_output(
            pb,
            q3,
            k_cache,
            v_cache,
            scale,
            mask=self.mask,
            sinks=self.sinks,
            k_scale=self.layer.k_scale,
            v_scale=self.layer.v_scale,
            k_block_scales=k_bs,
            v_block_scales=v_bs,
        ).flatten(1)

    def check(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        assert_close(got, want, KERNEL, f"seed {self.builder.seed}, {what}", dtype=self.dtype)


def require(case: Case | None, phase: str) -> Case:
    if case is None:
        pytest.skip(f"no generated backends under generated/{ARCH}/*/mha")
    if phase not in case.backend.kernels.PHASES:
        pytest.skip(f"{case.backend.spec_name} does not generate phase {phase}")
    return case


def make_rig(
    case: Case, *, max_context_len: int, max_reqs: int, num_pages: int, num_kv_heads: int = 0
) -> Rig:
    """Pools, builder, backend and layer for ``case`` (NUM_KV_HEADS kv heads unless given)."""
    num_kv_heads = num_kv_heads or NUM_KV_HEADS
    config, device = case.config, torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, config.dtype)
    kv_dtype = "nvfp4" if config.kv_dtype == "nvfp4" else getattr(torch, config.kv_dtype)
    num_q_heads = num_kv_heads * config.gqa_group
    req_pool, kv_pool = make_pools(
        num_layers=1,
        max_reqs=max_reqs,
        max_context_len=max_context_len,
        num_pages=num_pages,
        page_size=config.page_size,
        num_kv_heads=num_kv_heads,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        dtype=kv_dtype,
        device=device,
    )
    backend = case.backend(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        page_size=config.page_size,
        dtype=dtype,
        device=device,
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
        kv_cache_dtype=kv_dtype,
    )
    assert backend.config == config
    k_scale, v_scale = fp8_scales(config, kv_dtype, device, num_kv_heads)
    layer = AttentionLayer(
        0,
        num_q_heads,
        num_kv_heads,
        config.head_dim,
        config.v_head_dim,
        config.head_dim**-0.5,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    sinks = None
    if case.backend.kernels.HOOKS.sinks:  # logits of the same scale as the scores
        sinks = torch.randn(num_q_heads, dtype=torch.float32, device=device) + 1.0
    return Rig(backend, PagedBatchBuilder(req_pool, kv_pool), layer, dtype, sinks)


def fp8_scales(config: Any, kv_dtype: torch.dtype | str, device: torch.device, num_kv_heads: int):
    """Dequant scales for random-normal K/V: |x| <= ~5 maps inside the fp8 range, scales
    differ per head (per_head) so a kernel reading the wrong head's scale shows. NVFP4: a
    global scale that keeps unit-normal blocks' scales (amax / 6 / global) normal in e4m3."""
    if config.kv_scale == "none":
        return None, None
    rows = num_kv_heads if config.kv_scale == "per_head" else 1
    base = 0.25 if kv_dtype == "nvfp4" else 6.0 / torch.finfo(kv_dtype).max
    scales = [base * (1.0 + torch.rand(rows, device=device)) for _ in range(2)]
    return scales[0].float(), scales[1].float()


def pages_for(lens: list[int], page_size: int) -> int:
    """Pool pages for one batch of ``lens`` (plus the reserved page)."""
    return sum(-(-n // page_size) for n in lens) + 1


def run_eager(rig: Rig, pb: PagedBatch, *, flat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(backend output, oracle output), both ``[T, Hq*Dv]``."""
    q, k, v = rig.qkv(pb.batch.num_new_tokens)
    if flat:
        q, k, v = (t.flatten(1) for t in (q, k, v))
    backend = rig.backend
    backend.init_forward_metadata(pb.batch)
    is_decode = pb.batch.forward_mode is ForwardMode.DECODE
    forward = backend.forward_decode if is_decode else backend.forward_extend
    out = forward(q, k, v, rig.layer, pb.batch, sinks=rig.sinks)
    return out, rig.oracle(pb, q)


# -- eager numerics ----


def short_extend(rng: random.Random) -> tuple[list[int], list[int]]:
    count = rng.randint(1, 4)
    prefix = [rng.choice([0, rng.randint(1, 300)]) for _ in range(count)]
    ext = [rng.choice([1, rng.randint(1, 300)]) for _ in range(count)]
    return prefix, ext


def short_decode(rng: random.Random) -> list[int]:
    return [rng.choice([1, rng.randint(1, 700)]) for _ in range(rng.randint(1, MAX_BS))]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_extend(case: Case | None, evidence) -> None:
    case, rng = require(case, "extend"), random.Random()
    batches = [short_extend(rng) for _ in range(3)] + ([LONG_EXTEND] if case.long else [])
    longest = max(max(p + e for p, e in zip(*b)) for b in batches)
    most_pages = max(pages_for([p + e for p, e in zip(*b)], case.config.page_size) for b in batches)
    rig = make_rig(case, max_context_len=longest, max_reqs=8, num_pages=most_pages)
    for i, (prefix, ext) in enumerate(batches):
        out, want = run_eager(rig, rig.builder.extend(prefix, ext), flat=i % 2 == 1)
        rig.check(out, want, f"extend prefix_lens={prefix} extend_lens={ext}")
    evidence.record(case.backend.kernels, case.config.uri, "extend")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_decode(case: Case | None, evidence) -> None:
    case, rng = require(case, "decode"), random.Random()
    batches = [short_decode(rng) for _ in range(3)] + ([LONG_DECODE] if case.long else [])
    longest = max(max(b) for b in batches)
    most_pages = max(pages_for(b, case.config.page_size) for b in batches)
    rig = make_rig(case, max_context_len=longest, max_reqs=MAX_BS + 1, num_pages=most_pages)
    for i, lens in enumerate(batches):
        out, want = run_eager(rig, rig.builder.decode(lens), flat=i % 2 == 1)
        rig.check(out, want, f"decode seq_lens={lens}")
    evidence.record(case.backend.kernels, case.config.uri, "decode")


# -- CUDA graph: capture once, replay many batches ----


@dataclass
class StaticInputs:
    """What a graph runner keeps at fixed addresses: q/k/v rows and the batch indices."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    batch: ForwardBatch

    def load(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padded: ForwardBatch):
        n = q.shape[0]
        self.q[:n], self.k[:n], self.v[:n] = q, k, v
        self.batch.req_pool_indices.copy_(padded.req_pool_indices)
        self.batch.seq_lens.copy_(padded.seq_lens)
        self.batch.out_cache_loc.copy_(padded.out_cache_loc)


def static_inputs(rig: Rig) -> StaticInputs:
    q, k, v = rig.qkv(MAX_BS)
    fill, dev = rig.backend.get_cuda_graph_seq_len_fill_value(), rig.backend.device
    seq_lens = torch.full((MAX_BS,), fill, dtype=torch.int32, device=dev)
    batch = ForwardBatch(
        batch_size=MAX_BS,
        forward_mode=ForwardMode.DECODE,
        req_pool_indices=torch.zeros(MAX_BS, dtype=torch.int64, device=dev),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(),
        out_cache_loc=torch.zeros(MAX_BS, dtype=torch.int64, device=dev),
    )
    return StaticInputs(q, k, v, batch)


def capture_decode(rig: Rig, static: StaticInputs) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    backend, b = rig.backend, static.batch
    backend.init_cuda_graph_state(MAX_BS, MAX_BS)
    backend.init_forward_metadata_capture_cuda_graph(
        MAX_BS, MAX_BS, b.req_pool_indices, b.seq_lens, None, ForwardMode.DECODE, None
    )
    backend.forward_decode(static.q, static.k, static.v, rig.layer, b, sinks=rig.sinks)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward_decode(static.q, static.k, static.v, rig.layer, b, sinks=rig.sinks)
    return graph, out


def replay_lens(rng: random.Random, step: int) -> list[int]:
    """Fewer rows than captured (mostly), short and long lengths, the table's width often."""
    n = MAX_BS if step % 6 == 0 else rng.randint(1, MAX_BS - 1)
    high = GRAPH_TABLE_WIDTH if step % 2 else 64
    lens = [rng.randint(1, high) for _ in range(n)]
    if step % 3 == 0:
        lens[rng.randrange(n)] = GRAPH_TABLE_WIDTH
    return lens


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_cuda_graph(case: Case | None, evidence) -> None:
    case = require(case, "decode")
    pages = pages_for([GRAPH_TABLE_WIDTH] * MAX_BS, case.config.page_size)
    rig = make_rig(case, max_context_len=GRAPH_TABLE_WIDTH, max_reqs=MAX_BS + 1, num_pages=pages)
    static = static_inputs(rig)
    graph, out_static = capture_decode(rig, static)
    bufs = rig.backend._graph_buffers["decode"]
    rng = random.Random(rig.builder.seed)
    for step in range(REPLAYS):
        lens = replay_lens(rng, step)
        pb = rig.builder.decode(lens)
        q, k, v = rig.qkv(len(lens))
        rig.backend.init_forward_metadata(pb.batch)
        eager = rig.backend.forward_decode(q, k, v, rig.layer, pb.batch, sinks=rig.sinks).clone()
        padded = pad_decode_batch(pb.batch, MAX_BS, rig.backend.get_cuda_graph_seq_len_fill_value())
        static.load(q, k, v, padded)
        for scratch in (bufs.out, *bufs.workspace):
            scratch.fill_(float("nan"))
        rig.backend.init_forward_metadata_replay_cuda_graph(
            MAX_BS,
            static.batch.req_pool_indices,
            static.batch.seq_lens,
            int(padded.seq_lens_cpu.sum()),
            None,
            ForwardMode.DECODE,
            None,
            padded.seq_lens_cpu,
        )
        graph.replay()
        want = rig.oracle(pb, q)
        got = out_static[: len(lens)]
        rig.check(got, eager, f"replay {step}, seq_lens={lens}: graph vs eager")
        rig.check(got, want, f"replay {step}, seq_lens={lens}: graph vs oracle")
    evidence.record(case.backend.kernels, case.config.uri, "cuda_graph")


# -- cache-free prefill, draft extend, speculative verify ----


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_prefill(case: Case | None, evidence) -> None:
    """No cached prefix: the backend runs the prefill kernel on q/k/v directly."""
    case, rng = require(case, "prefill"), random.Random()
    batches = [[rng.randint(1, 1200) for _ in range(rng.randint(1, 6))] for _ in range(3)]
    batches.append([4096, 1, 577])  # one long image / sequence
    most_pages = max(pages_for(b, case.config.page_size) for b in batches)
    longest = max(max(b) for b in batches)
    rig = make_rig(case, max_context_len=longest, max_reqs=8, num_pages=most_pages)
    for lens in batches:
        pb = rig.builder.extend([0] * len(lens), lens)
        q, k, v = rig.qkv(sum(lens))
        rig.backend.init_forward_metadata(pb.batch)
        out = rig.backend.forward_extend(q, k, v, rig.layer, pb.batch, sinks=rig.sinks)
        want = prefill_ref(
            q, k, v, pb.qo_indptr, rig.layer.scaling, mask=rig.mask, sinks=rig.sinks
        ).flatten(1)
        rig.check(out, want, f"prefill lens={lens}")
        check_prefill_lse(rig, q, k, v, pb.qo_indptr, max(lens), f"prefill lens={lens}")
    evidence.record(case.backend.kernels, case.config.uri, "prefill")


def lse_ref(q, k, cu_seqlens, sm_scale, mask, sinks) -> torch.Tensor:
    """The float64 natural-log LSE [T, Hq] of the cache-free prefill: log of each row's
    softmax denominator (its visible keys' exp(scaled, capped score), plus exp(sink))."""
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64, device=q.device)
    group = q.shape[1] // k.shape[1]
    for b in range(cu_seqlens.shape[0] - 1):
        start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        if end == start:
            continue
        kk = k[start:end].double().repeat_interleave(group, dim=1)
        s = torch.einsum("mhd,nhd->hmn", q[start:end].double(), kk) * sm_scale
        if mask.logit_softcap:
            s = mask.logit_softcap * torch.tanh(s / mask.logit_softcap)
        visible = visible_keys(torch.arange(end - start, device=q.device), end - start, mask)
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.double()[:, None, None].expand(-1, s.shape[1], 1)], -1)
        lse[start:end] = torch.logsumexp(s, dim=-1).T
    return lse


def check_prefill_lse(rig: Rig, q, k, v, cu_seqlens, max_len: int, what: str) -> None:
    """Where the module's cache-free prefill can return the LSE (``lse=``): the kernel's
    output and LSE, NaN-poisoned first, against the float64 oracle."""
    kernels = rig.backend.kernels
    if "lse" not in inspect.signature(kernels.prefill).parameters:
        return
    layer = rig.layer
    q3 = q.view(q.shape[0], layer.num_q_heads, layer.head_dim)
    k3 = k.view(k.shape[0], -1, layer.head_dim)
    v3 = v.view(v.shape[0], -1, layer.v_head_dim)
    out = torch.full((q.shape[0], layer.num_q_heads, layer.v_head_dim), float("nan"),
                     dtype=q.dtype, device=q.device)  # fmt: skip
    lse = torch.full(q.shape[:1] + (layer.num_q_heads,), float("nan"), device=q.device)
    kernels.prefill(q3, k3, v3, cu_seqlens, out, max_seq_len=max_len, config=rig.backend.config,
                    sm_scale=layer.scaling, sinks=rig.sinks, lse=lse)  # fmt: skip
    want = prefill_ref(q3, k3, v3, cu_seqlens, layer.scaling, mask=rig.mask, sinks=rig.sinks)
    rig.check(out.flatten(1), want.flatten(1), f"{what}, with lse")
    want_lse = lse_ref(q3, k3, cu_seqlens, layer.scaling, rig.mask, rig.sinks)
    check_lse(lse, want_lse, f"seed {rig.builder.seed}, {what}: lse")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_draft_extend(case: Case | None, evidence) -> None:
    case, rng = require(case, "draft_extend"), random.Random()
    batches = [[rng.randint(0, 900) for _ in range(6)] for _ in range(3)]
    n = case.config.num_draft_tokens
    most_pages = max(pages_for([p + n for p in b], case.config.page_size) for b in batches)
    rig = make_rig(case, max_context_len=900 + n, max_reqs=8, num_pages=most_pages)
    for prefix in batches:
        accepted = [rng.randint(1, n) for _ in prefix]  # accepted drafts + the bonus token
        out, want = run_eager(rig, rig.builder.draft_extend(prefix, accepted), flat=False)
        rig.check(out, want, f"draft_extend prefix_lens={prefix} extend_lens={accepted}")
    evidence.record(case.backend.kernels, case.config.uri, "draft_extend")


def is_tree(case: Case) -> bool:
    return case.config.spec_topk > 1


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_verify(case: Case | None, evidence) -> None:
    """Drafts over prefixes from 0 (drafts only) to 4k, chains or random trees."""
    case, rng = require(case, "verify"), random.Random()
    batches = [[rng.choice([0, rng.randint(1, 700)]) for _ in range(MAX_BS)] for _ in range(3)]
    batches.append([4096, 0, 1, 2047])
    n = case.config.num_draft_tokens
    most_pages = max(pages_for([p + n for p in b], case.config.page_size) for b in batches)
    longest = max(max(b) for b in batches) + n
    rig = make_rig(case, max_context_len=longest, max_reqs=MAX_BS + 1, num_pages=most_pages)
    for prefix in batches:
        pb = rig.builder.verify(prefix, n, tree=is_tree(case))
        out, want = run_eager(rig, pb, flat=False)
        rig.check(out, want, f"verify prefix_lens={prefix} tree={is_tree(case)}")
    evidence.record(case.backend.kernels, case.config.uri, "verify")


def pad_verify(pb, bs: int, n: int, fill: int) -> tuple[torch.Tensor, torch.Tensor, VerifyInfo]:
    """Padded (req_pool_indices, seq_lens, spec_info) of a verify batch, as a graph runner
    pads it: request row 0, seq_len ``fill``, an all-visible tree for padded rows."""
    real = pb.batch.batch_size
    dev = pb.batch.seq_lens.device
    rows = torch.cat(
        [pb.batch.req_pool_indices, torch.zeros(bs - real, dtype=torch.int64, device=dev)]
    )
    lens = torch.cat(
        [pb.batch.seq_lens, torch.full((bs - real,), fill, dtype=torch.int32, device=dev)]
    )
    info = pb.batch.spec_info
    if info.tree_mask is None:
        return rows, lens, info
    pad_bytes = (bs - real) * (-(-n * n // 8))
    mask = torch.cat([info.tree_mask, torch.full((pad_bytes,), 255, dtype=torch.uint8, device=dev)])
    return rows, lens, VerifyInfo(n, mask, info.tree_mask_indptr)


def capture_extend_graph(
    rig: Rig, mode: ForwardMode, batch: ForwardBatch, qkv, rows, lens, info, n: int
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Capture forward_extend for MAX_BS requests x n rows (TARGET_VERIFY / DRAFT_EXTEND)."""
    backend = rig.backend
    backend.init_cuda_graph_state(MAX_BS, MAX_BS * n)
    backend.init_forward_metadata_capture_cuda_graph(
        MAX_BS, MAX_BS * n, rows, lens, None, mode, info
    )
    backend.forward_extend(*qkv, rig.layer, batch, sinks=rig.sinks)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward_extend(*qkv, rig.layer, batch, sinks=rig.sinks)
    return graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_cuda_graph_verify(case: Case | None, evidence) -> None:
    """Verify captured once at MAX_BS requests x n drafts, replayed on REPLAYS batches."""
    case = require(case, "verify")
    n, ps = case.config.num_draft_tokens, case.config.page_size
    pages = pages_for([GRAPH_TABLE_WIDTH] * MAX_BS, ps)
    rig = make_rig(case, max_context_len=GRAPH_TABLE_WIDTH, max_reqs=MAX_BS + 1, num_pages=pages)
    backend, fill = rig.backend, rig.backend.get_cuda_graph_seq_len_fill_value()
    q, k, v = rig.qkv(MAX_BS * n)
    loc = torch.zeros(MAX_BS * n, dtype=torch.int64, device=backend.device)
    first = rig.builder.verify([GRAPH_TABLE_WIDTH - n] * MAX_BS, n, tree=is_tree(case))
    rows, lens, info = pad_verify(first, MAX_BS, n, fill)
    static_batch = dataclasses.replace(first.batch, out_cache_loc=loc)
    mode = ForwardMode.TARGET_VERIFY
    graph, out_static = capture_extend_graph(
        rig, mode, static_batch, (q, k, v), rows, lens, info, n
    )
    rng = random.Random(rig.builder.seed)
    bufs = backend._graph_buffers["verify"]
    for step in range(REPLAYS):
        real = MAX_BS if step % 4 == 0 else rng.randint(1, MAX_BS - 1)
        prefix = [rng.choice([0, rng.randint(1, GRAPH_TABLE_WIDTH - n)]) for _ in range(real)]
        pb = rig.builder.verify(prefix, n, tree=is_tree(case))
        qn, kn, vn = rig.qkv(real * n)
        backend.init_forward_metadata(pb.batch)
        eager = backend.forward_extend(qn, kn, vn, rig.layer, pb.batch, sinks=rig.sinks).clone()
        rows, lens, info = pad_verify(pb, MAX_BS, n, fill)
        q[: real * n], k[: real * n], v[: real * n] = qn, kn, vn
        loc.zero_()
        loc[: real * n] = pb.batch.out_cache_loc
        bufs.out.fill_(float("nan"))
        backend.init_forward_metadata_replay_cuda_graph(
            MAX_BS, rows, lens, int(lens.sum()), None, ForwardMode.TARGET_VERIFY, info, lens.cpu()
        )
        graph.replay()
        got = out_static[: real * n]
        what = f"verify replay {step}, prefix_lens={prefix}"
        rig.check(got, eager, f"{what}: graph vs eager")
        rig.check(got, rig.oracle(pb, qn), f"{what}: graph vs oracle")
    evidence.record(case.backend.kernels, case.config.uri, "cuda_graph_verify")


# -- fp8 / NVFP4 KV cache against bf16 attention ----

# Relative RMS error bound of fp8 attention vs attention on the unquantized K/V, for unit
# normal q/k/v quantized with scales that keep |x| <= ~5 in range. Rounding to a format with
# m mantissa bits makes a relative element error uniform in +-2^-(m+1), RMS 2^-(m+1)/sqrt(3):
# 0.036 for e4m3 (m=3), 0.072 for e5m2 (m=2). V's error reaches the output scaled like the
# output itself (sum p_j dv_j vs sum p_j v_j); K's perturbs scores by at most that relative
# amount (|s| ~ 1), so p by about as much again. Two such terms in quadrature (~1.4x), then
# 2x margin. (H200, fab5f20: measured 0.035 for e4m3 and 0.070 for e5m2.)
# NVFP4 (e2m1, block scale s = amax/6 per 16 values): for 16 unit normals amax ~ 1.8, so
# x/s ~ N(0, 3.3^2) over the grid 0, .5, 1, 1.5, 2, 3, 4, 6: half-gaps 0.25 / 0.5 / 1 for
# |x/s| < 2 / < 4 / < 6 (weights ~0.45 / 0.32 / 0.16 after the zero bin) give an RMS error
# ~0.3 s ~ 0.09 of the values' RMS; two terms in quadrature (~0.13), 2x margin.
QUANT_RMS_BOUND = {torch.float8_e4m3fn: 0.10, torch.float8_e5m2: 0.20, "nvfp4": 0.25}


def quantized_rig(case: Case) -> tuple[Rig, list[int]]:
    """A rig for four requests of 100..1500 tokens (random lengths) and those lengths."""
    rng = random.Random()
    lens = [rng.randint(100, 1500) for _ in range(4)]
    rig = make_rig(
        case,
        max_context_len=max(lens),
        max_reqs=8,
        num_pages=pages_for(lens, case.config.page_size),
    )
    return rig, lens


def check_quantized(case: Case, rig: Rig, pb: PagedBatch, q, out, want, kv_dtype, evidence):
    """``out`` (the backend over the quantized cache) within the kv dtype's relative RMS
    bound of ``want`` (the oracle on the unquantized K/V), and within the kernel tolerance
    of the oracle on the dequantized cache; recorded as quantized_vs_bf16."""
    rel_rms = ((out - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
    bound = QUANT_RMS_BOUND[kv_dtype]
    assert rel_rms <= bound, f"seed {rig.builder.seed}: relative RMS error {rel_rms:.4f} > {bound}"
    phase = pb.batch.forward_mode.name.lower()
    rig.check(out, rig.oracle(pb, q), f"quantized {phase} vs oracle on dequantized values")
    evidence.record(
        case.backend.kernels, case.config.uri, "quantized_vs_bf16", rel_rms=round(rel_rms, 4)
    )


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_quantized_vs_bf16(case: Case | None, evidence) -> None:
    """All K/V go through the backend's quantizing writes (an extend with no prefix);
    outputs are compared with the oracle on the original (unquantized) K/V."""
    case = require(case, "extend")
    fp4 = case.config.kv_dtype == "nvfp4"
    kv_dtype = "nvfp4" if fp4 else getattr(torch, case.config.kv_dtype)
    if not fp4 and kv_dtype not in FP8_DTYPES:
        pytest.skip("not a quantized KV cache")
    rig, lens = quantized_rig(case)
    pb = rig.builder.extend([0] * len(lens), lens)
    q, k, v = rig.qkv(sum(lens))
    rig.backend.init_forward_metadata(pb.batch)
    out = rig.backend.forward_extend(q, k, v, rig.layer, pb.batch, sinks=rig.sinks).float()
    want = prefill_ref(q, k, v, pb.qo_indptr, rig.layer.scaling, mask=rig.mask, sinks=rig.sinks)
    check_quantized(case, rig, pb, q, out, want.flatten(1), kv_dtype, evidence)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_quantized_decode_vs_bf16(case: Case | None, evidence) -> None:
    """Specs that generate decode without extend (the quantized check above needs extend):
    every cached K/V goes through the pool's quantizing write, the new token's through the
    backend's; outputs are compared with the oracle on the original (unquantized) K/V
    (bf16 copies of the caches), and with the oracle on the dequantized cache."""
    case = require(case, "decode")
    if "extend" in case.backend.kernels.PHASES:
        pytest.skip("checked through extend (test_quantized_vs_bf16)")
    kv_dtype = getattr(torch, case.config.kv_dtype, None)
    if kv_dtype not in FP8_DTYPES:
        pytest.skip("not an fp8 KV cache")
    rig, lens = quantized_rig(case)
    pb = rig.builder.decode(lens)
    pool, layer, dev = rig.backend.kv_pool, rig.layer, rig.backend.device
    rows = pb.batch.req_pool_indices.tolist()
    table = rig.builder.req_to_token_pool.req_to_token
    cached = torch.cat([table[r, : n - 1] for r, n in zip(rows, lens)]).to(dev, torch.int64)
    _, k_old, v_old = rig.qkv(cached.shape[0])
    pool.set_kv_buffer(layer, cached, k_old, v_old)  # quantizing writes
    q, k, v = rig.qkv(len(lens))
    rig.backend.init_forward_metadata(pb.batch)
    out = rig.backend.forward_decode(q, k, v, layer, pb.batch, sinks=rig.sinks).float()
    # the same K/V unquantized: bf16 caches holding the prefix and the new tokens
    k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)
    k16 = torch.zeros(k_cache.shape, dtype=rig.dtype, device=dev)
    v16 = torch.zeros(v_cache.shape, dtype=rig.dtype, device=dev)
    for cache, old, new in ((k16, k_old, k), (v16, v_old, v)):
        flat = cache.view(-1, *cache.shape[2:])
        flat[cached] = old
        flat[pb.batch.out_cache_loc.to(torch.int64)] = new
    q3 = q.view(q.shape[0], layer.num_q_heads, layer.head_dim)
    want = oracle_output(pb, q3, k16, v16, layer.scaling, mask=rig.mask, sinks=rig.sinks)
    check_quantized(case, rig, pb, q, out, want.flatten(1), kv_dtype, evidence)


# -- MQA: one kv head for all query heads ----


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_mqa(case: Case | None, evidence) -> None:
    """The same kernels with a single kv head (Hq = gqa_group): every phase it generates."""
    if case is None:
        pytest.skip(f"no generated backends under generated/{ARCH}/*/mha")
    phases = set(case.backend.kernels.PHASES)
    if not phases & {"decode", "extend", "prefill"}:
        pytest.skip("no decode, extend or prefill phase")
    rng = random.Random()
    lens = [rng.randint(1, 600) for _ in range(4)]
    pages = 2 * pages_for(lens, case.config.page_size)
    rig = make_rig(case, max_context_len=max(lens), max_reqs=8, num_pages=pages, num_kv_heads=1)
    if "decode" in phases:
        out, want = run_eager(rig, rig.builder.decode(lens), flat=False)
        rig.check(out, want, f"mqa decode seq_lens={lens}")
    if phases & {"extend", "prefill"}:
        prefix = [0] * len(lens) if "extend" not in phases else [n // 2 for n in lens]
        ext = [n - p for n, p in zip(lens, prefix)]
        out, want = run_eager(rig, rig.builder.extend(prefix, ext), flat=True)
        rig.check(out, want, f"mqa extend prefix_lens={prefix} extend_lens={ext}")
    evidence.record(case.backend.kernels, case.config.uri, "mqa")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_cuda_graph_draft_extend(case: Case | None, evidence) -> None:
    """Draft extend captured once at MAX_BS requests x n rows of room, replayed on REPLAYS
    batches of 1 .. n accepted tokens per request (rows back to back, padded at the end)."""
    case = require(case, "draft_extend")
    n, ps = case.config.num_draft_tokens, case.config.page_size
    pages = pages_for([GRAPH_TABLE_WIDTH] * MAX_BS, ps)
    rig = make_rig(case, max_context_len=GRAPH_TABLE_WIDTH, max_reqs=MAX_BS + 1, num_pages=pages)
    backend, fill = rig.backend, rig.backend.get_cuda_graph_seq_len_fill_value()
    dev = backend.device
    q, k, v = rig.qkv(MAX_BS * n)
    loc = torch.zeros(MAX_BS * n, dtype=torch.int64, device=dev)
    rows = torch.zeros(MAX_BS, dtype=torch.int64, device=dev)
    lens = torch.full((MAX_BS,), fill, dtype=torch.int32, device=dev)
    extend_lens = torch.ones(MAX_BS, dtype=torch.int32, device=dev)
    first = rig.builder.draft_extend([GRAPH_TABLE_WIDTH - n] * MAX_BS, [n] * MAX_BS)
    static_batch = dataclasses.replace(first.batch, out_cache_loc=loc)
    info = DraftExtendInfo(extend_lens)
    mode = ForwardMode.DRAFT_EXTEND
    graph, out_static = capture_extend_graph(
        rig, mode, static_batch, (q, k, v), rows, lens, info, n
    )
    rng = random.Random(rig.builder.seed)
    for step in range(REPLAYS):
        real = MAX_BS if step % 4 == 0 else rng.randint(1, MAX_BS - 1)
        prefix = [rng.choice([0, rng.randint(1, GRAPH_TABLE_WIDTH - n)]) for _ in range(real)]
        accepted = [rng.randint(1, n) for _ in range(real)]
        pb = rig.builder.draft_extend(prefix, accepted)
        tokens = sum(accepted)
        qn, kn, vn = rig.qkv(tokens)
        backend.init_forward_metadata(pb.batch)
        eager = backend.forward_extend(qn, kn, vn, rig.layer, pb.batch, sinks=rig.sinks).clone()
        q[:tokens], k[:tokens], v[:tokens] = qn, kn, vn
        loc.zero_()
        loc[:tokens] = pb.batch.out_cache_loc
        rows.zero_()
        rows[:real] = pb.batch.req_pool_indices
        lens.fill_(fill)
        lens[:real] = pb.batch.seq_lens
        extend_lens.fill_(1)
        extend_lens[:real] = pb.batch.extend_seq_lens
        backend._graph_buffers["draft_extend"].out.fill_(float("nan"))
        backend.init_forward_metadata_replay_cuda_graph(
            MAX_BS, rows, lens, int(lens.sum()), None, ForwardMode.DRAFT_EXTEND, info, lens.cpu()
        )
        graph.replay()
        got = out_static[:tokens]
        what = f"draft extend replay {step}, prefix_lens={prefix} accepted={accepted}"
        rig.check(got, eager, f"{what}: graph vs eager")
        rig.check(got, rig.oracle(pb, qn), f"{what}: graph vs oracle")
    evidence.record(case.backend.kernels, case.config.uri, "cuda_graph_draft_extend")


# -- rows that see no key at all give zeros ----


def first_tree_case_per_backend() -> list:
    """One tree-verify config of each backend (the first in CASES' order)."""
    firsts: dict[str, Any] = {}
    for param in CASES:
        case = param.values[0]
        if case is not None and case.config.spec_topk > 1:
            firsts.setdefault(param.id.split("-")[0], param)
    return list(firsts.values()) or [pytest.param(None, id="no-tree-verify-spec")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", first_tree_case_per_backend())
def test_fully_masked_rows_give_zeros(case: Case | None) -> None:
    """Kernel level, on the H200, per backend: a tree-verify row whose mask is empty (no
    prefix, no draft) and a decode request of length 0 produce exact zeros; nothing is
    NaN."""
    if case is None:
        pytest.skip("no tree-verify spec generated")
    kernels, config = case.backend.kernels, case.config
    dev, dtype = torch.device("cuda"), getattr(torch, config.dtype)
    n, ps, hkv = config.num_draft_tokens, config.page_size, NUM_KV_HEADS
    hq, d = hkv * config.gqa_group, config.head_dim
    pages = 2 * (-(-n // ps)) + 1
    k_cache = torch.randn(pages, ps, hkv, d, dtype=dtype, device=dev)
    v_cache = torch.randn(pages, ps, hkv, d, dtype=dtype, device=dev)
    table = torch.arange(1, pages, dtype=torch.int32, device=dev).view(2, -1)
    q = torch.randn(2 * n, hq, d, dtype=dtype, device=dev)
    out = torch.full((2 * n, hq, d), float("nan"), dtype=dtype, device=dev)
    masks = [torch.tril(torch.ones(n, n, dtype=torch.bool)) for _ in range(2)]
    masks[0][1] = False  # request 0, draft 1 sees nothing (prefix 0)
    packed, indptr = pack_tree_masks([m.to(dev) for m in masks])
    qo = torch.tensor([0, n, 2 * n], dtype=torch.int32, device=dev)
    prefix = torch.zeros(2, dtype=torch.int32, device=dev)
    kernels.verify(
        q,
        k_cache,
        v_cache,
        table,
        qo,
        prefix,
        out,
        config=config,
        sm_scale=0.1,
        tree_mask=packed,
        tree_mask_indptr=indptr,
    )
    assert not out.isnan().any() and torch.all(out[1] == 0)
    assert out[0].abs().sum() > 0  # the others attend
    seq_lens = torch.tensor([0, n], dtype=torch.int32, device=dev)
    splits = torch.tensor([2, 1], dtype=torch.int32, device=dev)
    dq = torch.randn(2, hq, d, dtype=dtype, device=dev)
    dout = torch.full((2, hq, d), float("nan"), dtype=dtype, device=dev)
    po = torch.empty(2, hq, config.max_splits, d, device=dev)
    pl = torch.empty(2, hq, config.max_splits, device=dev)
    kernels.decode(
        dq, k_cache, v_cache, table, seq_lens, splits, dout, po, pl, config=config, sm_scale=0.1
    )
    assert not dout.isnan().any() and torch.all(dout[0] == 0) and dout[1].abs().sum() > 0
