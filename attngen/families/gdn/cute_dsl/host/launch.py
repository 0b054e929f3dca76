"""Launching the CuTe DSL GDN kernels: chunked prefill / extend of ragged requests.

``extend`` takes the Triton GDN library's arguments (the generated backend calls either the
same way): q, k ``[N, H, K]``, v ``[N, HV, V]``, a, b ``[N, HV]`` (bf16, last dims
contiguous), A_log and dt_bias ``[HV]`` fp32, the pool ``ssm_states [slots + 1, HV, V, K]``
fp32, cache_indices, has_initial_state ``[B]`` and query_start_loc ``[B + 1]`` int32, the
output ``[N, HV, V]`` and the chunk plan of ``chunk_plan``. It runs two launches: the prepare
kernel (gates, norms, fp16 T a chunk and head) and the chunk kernel, whose form the batch's
(request, value head) count picks (``GdnCuteConfig.two_consumers_min_heads``); where the
one-consumer form would leave SMs idle behind a long request, the chunk kernel runs as two
launches of segments with a combine between (context parallelism, ``host/segments.py``;
``segments_max``; the plan of this module's ``chunk_plan`` carries the lengths it needs). A request
with ``has_initial_state[b] != 0`` starts from its pool row and every request's final state
is written there; a padding request (slot 0) runs from a zero state: its output rows are
written, no pool row is read or written (as the Triton library's extend).

``conv_prefill`` (the width-4 causal conv over the prefill's tokens) is the Triton GDN
library's, and ``chunk_plan`` its plan with the requests' lengths kept on the host, bound here
so a generated module offers what the backend calls.

What the launcher checks: shapes, dtypes, devices and strides of every tensor (host-side,
no sync); rows of q, k and v that are not 16-byte aligned are copied (the kernels' 16-byte
copies need it), an output that is not is refused. The kernels are called through TVM FFI
with the torch tensors as they are (about a microsecond an argument: the DLPack wrappers
the DSL's default calls build cost twenty), on torch's current stream. Device values (slots in range, the plan
consistent with query_start_loc) are the caller's promise, as for the Triton library.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from attngen.families.gdn.cute_dsl.config import GdnCuteConfig
from attngen.families.gdn.cute_dsl.host import segments
from attngen.families.gdn.cute_dsl.host.compile import (
    ChunkShape,
    PrepareShape,
    Shape,
    chunk_shape,
    compiled,
    segments_shape,
)
from attngen.families.gdn.triton.host import checks
from attngen.families.gdn.triton.host.launch import ChunkPlan, conv_prefill
from attngen.families.gdn.triton.host.launch import chunk_plan as _chunk_plan
from attngen.runtime.checks import fail

__all__ = ["ChunkPlan", "LengthsPlan", "chunk_plan", "conv_prefill", "extend", "prepare"]

ALIGN = 16  # bytes: the kernels' row copies
MAX_RUNS = 65535  # requests a chunk launch: the grid's slowest dimension


def _aligned(x: torch.Tensor) -> bool:
    size = x.element_size()
    return x.data_ptr() % ALIGN == 0 and all(s * size % ALIGN == 0 for s in x.stride()[:-1])


def _launch(arch: str, shape: Shape, *args: Any) -> None:
    """The compiled kernel of ``shape`` on torch tensors and Python scalars as they are (TVM
    FFI), on torch's current stream (or the CUDA graph being captured)."""
    import tvm_ffi

    with tvm_ffi.use_torch_stream():
        compiled(arch, shape)(*args)


@dataclass(frozen=True)
class LengthsPlan(ChunkPlan):
    """The Triton library's chunk plan with the requests' lengths on the host (what
    segments are planned from) and the device schedules planned from it, per (value heads,
    SMs), kept for the batch's layers."""

    lens: tuple[int, ...] = ()
    schedules: dict = field(default_factory=dict, compare=False, repr=False)


def chunk_plan(extend_lens: list[int], chunk_size: int, device: torch.device) -> LengthsPlan:
    """The chunk plan of requests with ``extend_lens`` new tokens each (host ints)."""
    base = _chunk_plan(extend_lens, chunk_size, device)
    parts = {f.name: getattr(base, f.name) for f in dataclasses.fields(ChunkPlan)}
    return LengthsPlan(**parts, lens=tuple(int(n) for n in extend_lens))


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _schedule(
    plan: ChunkPlan, config: GdnCuteConfig, hv: int, device: torch.device
) -> segments.DeviceSchedule | None:
    """The batch's segments on the device, or None where the plain launch is planned (the
    plan has no lengths, the config takes no segments, or the estimate keeps one)."""
    if not isinstance(plan, LengthsPlan) or segments_shape(config) is None:
        return None
    if chunk_shape(config, len(plan.lens) * hv).consumers != 1:
        return None
    sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    key = (hv, sms, config.chunk_size, config.segments_max, config.segments_overhead_chunks)
    if key not in plan.schedules:
        splits = segments.segment_splits(
            list(plan.lens),
            chunk=config.chunk_size,
            heads=hv,
            blocks=config.value_dim // ChunkShape.ROWS,
            num_sms=sms,
            max_segments=config.segments_max,
            overhead_chunks=config.segments_overhead_chunks,
        )
        sched = segments.schedule(list(plan.lens), splits, config.chunk_size)
        plan.schedules[key] = segments.device_schedule(sched, device) if sched.segmented else None
    return plan.schedules[key]


def prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    query_start_loc: torch.Tensor,
    plan: ChunkPlan,
    config: GdnCuteConfig,
    scale: float,
    hv: int,
) -> tuple[torch.Tensor, ...]:
    """The prepare kernel: (T fp16 ``[N, HV, C]``, G, beta, qs, kn ``[HV, N]`` fp32), the
    chunk kernel's inputs beside q, k and v (arguments checked by ``extend``)."""
    n = q.shape[0]
    f32 = dict(dtype=torch.float32, device=q.device)
    vecs = [torch.empty((hv, n), **f32) for _ in range(4)]
    t16 = torch.empty((n, hv, config.chunk_size), dtype=torch.float16, device=q.device)
    _launch(
        config.arch, PrepareShape(config.v_heads_per_k_head), q, k, a, b, A_log, dt_bias,
        plan.chunk_seq, plan.chunk_start, query_start_loc, *vecs, t16, float(scale),
    )  # fmt: skip
    return (t16, *vecs)


def extend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    plan: ChunkPlan,
    config: GdnCuteConfig,
    scale: float,
) -> torch.Tensor:
    """Chunked prefill / extend of ragged requests (see the module's docstring)."""
    n, h, hv = checks.check_qkvab(config, q, k, v, a, b, rows=plan.num_tokens)
    dev = q.device
    bs = int(cache_indices.shape[0]) if isinstance(cache_indices, torch.Tensor) else 0
    checks.check_gate_params(A_log, dt_bias, hv, dev)
    checks.check_state_pool(config, ssm_states, hv, dev)
    checks.check_index("cache_indices", cache_indices, bs, dev)
    checks.check_index("has_initial_state", has_initial_state, bs, dev)
    checks.check_index("query_start_loc", query_start_loc, bs + 1, dev)
    checks.check_out("out", out, [n, hv, config.value_dim], q.dtype, dev)
    if not _aligned(out):
        fail("out", "16-byte aligned rows (base and strides)", f"strides {out.stride()}")
    if bs > MAX_RUNS:
        fail("cache_indices", f"at most {MAX_RUNS} requests a launch (the chunk grid)", bs)
    if plan.seq_first_chunk.shape[0] != bs:
        fail("plan", f"a chunk plan of {bs} requests", int(plan.seq_first_chunk.shape[0]))
    if dev.type != "cuda":
        fail("q", "a CUDA tensor (CuTe DSL kernels have no CPU path)", dev)
    q, k, v = (x if _aligned(x) else x.contiguous() for x in (q, k, v))
    t16, g, beta, qs, kn = prepare(
        q, k, a, b, A_log, dt_bias, query_start_loc, plan, config, scale, hv
    )
    inputs = (q, k, v, t16, g, beta, qs, kn)
    sched = _schedule(plan, config, hv, dev)
    if sched is not None:
        shape = segments_shape(config)

        def runner(scratch: torch.Tensor, runs: segments.RunTable) -> None:
            tables = (runs.slots, runs.has_init, runs.start, runs.end, runs.mode)
            _launch(config.arch, shape, *inputs, scratch, *tables, out)

        segments.run(sched, runner, ssm_states, cache_indices, has_initial_state)
        return out
    starts, ends = query_start_loc[:-1], query_start_loc[1:]
    # (the mode bits are read only by context parallelism's form: cache_indices stands in)
    _launch(
        config.arch, chunk_shape(config, bs * hv), *inputs, ssm_states, cache_indices,
        has_initial_state, starts, ends, cache_indices, out,
    )  # fmt: skip
    return out
