"""Context parallelism for the chunk kernel: a long request's chunks split into segments that
run side by side, for batches of few long requests (one request of 32k tokens and 16 value
heads gives the one-consumer kernel 32 CTAs for 132 SMs, each walking 512 chunks in order).

The state after a segment is affine in the state before it. With the kernel's transposed
state S^T [V, K], a segment maps S^T to S^T A + B, where B is the segment run from S^T = 0
with its values and A (K x K) the run from S^T = I (K rows as value rows) with the values
taken as 0. Both are runs of the chunk kernel's ``modes`` form (mode bits ``OUT`` and
``VALUES`` per run; no outputs written). A request of s segments then takes:

    pass 1   segment 0 from the request's own state (its outputs; its final state), and
             the A and B runs of segments 1 .. s - 2, in one launch with every other
             request of the batch (whole, one run each);
    combine  init[1] = final[0], init[i + 1] = init[i] A_i + B_i (fp32, batched over
             requests and heads, one product a segment level);
    pass 2   segments 1 .. s - 1 from init[i] (outputs; the last one's final state is the
             request's), one launch.

Each middle segment runs three times (B, A on K rows, its outputs), so the work grows while
the sequential depth falls from the longest request's chunks to about two segments' worth:
``segment_counts`` takes segments only where its estimate of the two passes (depth, and
work spread over the SMs) beats the plain launch's. Segment bounds fall on chunk bounds, so
the prepare kernel's chunks (its T, gates and norms) are those of the plain launch.

Every run reads and writes its state in a scratch pool (row 1 + run index): pass 1's runs
from the request's pool row (copied in), zero or I; pass 2's from the combine. The requests'
final states are copied to their pool rows at the end, and a padding request (slot <= 0)
runs from a zero state with its rows written and no pool row changed, as the plain launch
does. Planning is host work on the requests' lengths (``schedule``, once a batch); the
launches, the combine and the copies are device work with no sync (``run``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import torch

# the chunk kernel's mode bits (kernels/chunk_sm90.py: OUT writes the run's output rows,
# VALUES reads v, else v = 0); a request's run is OUT | VALUES
OUT, VALUES = 1, 2
REQUEST, ZERO, IDENTITY, COMBINED = "request", "zero", "identity", "combined"


@dataclass(frozen=True)
class Run:
    """One row of CTAs of a launch: tokens ``start .. end`` of request ``request`` (segment
    ``segment``), its mode bits and its initial state (``REQUEST``: the request's pool row
    when it has one, else 0; ``ZERO``; ``IDENTITY``; ``COMBINED``)."""

    request: int
    segment: int
    start: int
    end: int
    mode: int
    init: str


@dataclass(frozen=True)
class Schedule:
    """A batch's two passes: ``first`` begins with one run per request (its segment 0 or
    all of it) in request order, then the A and B runs; ``second`` the later segments."""

    counts: tuple[int, ...]  # segments per request
    first: tuple[Run, ...]
    second: tuple[Run, ...]

    @property
    def segmented(self) -> bool:
        return any(s > 1 for s in self.counts)


def _passes(chunks: list[int], depth: int) -> tuple[list[int], list[int], list[int]]:
    """Segments per request and the two passes' run depths (chunks) for segments of at most
    ``depth`` chunks."""
    counts = [-(-c // depth) for c in chunks]
    first = [min(c, depth) for c in chunks]
    second: list[int] = []
    for c, s in zip(chunks, counts):
        first += [depth] * 2 * max(s - 2, 0)
        second += [min(depth, c - i * depth) for i in range(1, s)]
    return counts, first, second


def _pass_time(depths: list[int], heads: int, blocks: int, num_sms: int) -> int:
    """A launch's time in chunk steps: its CTAs in the grid's order (value blocks, then runs,
    then heads), each to the SM that frees first (one CTA an SM)."""
    free = [0] * num_sms
    for _ in range(heads):
        for d in depths:
            for _ in range(blocks):
                heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def segment_counts(
    lens: list[int],
    *,
    chunk: int,
    heads: int,
    blocks: int,
    num_sms: int,
    max_segments: int,
    overhead_chunks: int,
) -> tuple[int, ...]:
    """Segments per request: the longest request in s = 1 .. ``max_segments`` segments of
    ``ceil(its chunks / s)`` chunks, every request in as many of that length as it needs,
    whichever s the estimate (pass 1 + pass 2 + ``overhead_chunks`` for the combine and the
    second launch, in chunk steps; a run is ``heads`` x ``blocks`` CTAs) puts first; ties go
    to fewer segments."""
    if not lens or min(lens) < 1:
        raise ValueError(f"segment_counts: lengths >= 1 expected, got {lens}")
    if min(heads, blocks, num_sms, max_segments) < 1 or overhead_chunks < 0:
        raise ValueError("segment_counts: heads, blocks, num_sms, max_segments >= 1 expected")

    def time(depths: list[int]) -> int:
        return _pass_time(depths, heads, blocks, num_sms) if depths else 0

    chunks = [-(-n // chunk) for n in lens]
    longest = max(chunks)
    best = (time(chunks), tuple([1] * len(lens)))
    for s in range(2, min(max_segments, longest) + 1):
        counts, first, second = _passes(chunks, -(-longest // s))
        cost = time(first) + time(second)
        if cost + overhead_chunks < best[0]:
            best = (cost + overhead_chunks, tuple(counts))
    return best[1]


def schedule(lens: list[int], counts: tuple[int, ...], chunk: int) -> Schedule:
    """The runs of requests of ``lens`` tokens (in order, rows packed) in ``counts``
    segments each, of equal chunk counts (the last one shorter)."""
    if len(counts) != len(lens) or min(counts, default=1) < 1:
        raise ValueError(f"schedule: {len(lens)} requests, segment counts {counts}")
    first: list[Run] = []
    middle: list[Run] = []
    second: list[Run] = []
    start = 0
    real: list[int] = []
    for b, (n, s) in enumerate(zip(lens, counts)):
        chunks = -(-n // chunk)
        per = -(-chunks // min(s, chunks)) * chunk
        bounds = [*range(start, start + n, per), start + n]
        real.append(len(bounds) - 1)
        seg = list(zip(bounds[:-1], bounds[1:]))
        first.append(Run(b, 0, *seg[0], OUT | VALUES, REQUEST))
        for i in range(1, len(seg) - 1):
            middle.append(Run(b, i, *seg[i], VALUES, ZERO))  # B_i
            middle.append(Run(b, i, *seg[i], 0, IDENTITY))  # A_i
        second.extend(Run(b, i, *seg[i], OUT | VALUES, COMBINED) for i in range(1, len(seg)))
        start += n
    return Schedule(tuple(real), tuple(first + middle), tuple(second))


@dataclass(frozen=True)
class RunTable:
    """One launch's per-run arrays (int32, on the device): scratch slot, has-initial-state,
    token rows [start, end), mode bits; the kernel's ``mSlots .. mMode``."""

    slots: torch.Tensor
    has_init: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    mode: torch.Tensor

    @property
    def runs(self) -> int:
        return int(self.slots.shape[0])


@dataclass(frozen=True)
class Level:
    """One step of the combine over every request that has it: scratch rows (int64)."""

    dst: torch.Tensor
    prev: torch.Tensor
    a: torch.Tensor | None  # None: the first level (init[1] = final[0])
    b: torch.Tensor | None


@dataclass(frozen=True)
class DeviceSchedule:
    """A schedule's tables on the device (``device_schedule``)."""

    schedule: Schedule
    first: RunTable
    second: RunTable
    identity_rows: torch.Tensor  # scratch rows that start as I (int64)
    levels: tuple[Level, ...]
    final_rows: torch.Tensor  # per request: the scratch row of its final state (int64)

    @property
    def scratch_rows(self) -> int:
        return 1 + self.first.runs + self.second.runs


def device_schedule(sched: Schedule, device: torch.device) -> DeviceSchedule:
    """The schedule's tables, copied to ``device`` in two non-blocking copies (no sync).
    Scratch row 1 + r is pass 1's run r, 1 + R1 + r pass 2's."""
    r1, r2 = len(sched.first), len(sched.second)
    runs = sched.first + sched.second
    rows = {(r.request, r.segment, r.init): 1 + i for i, r in enumerate(runs)}
    has_init = [int(r.init in (IDENTITY, COMBINED)) for r in runs]  # REQUEST's: at run time
    i32 = torch.tensor(
        [list(range(1, r1 + r2 + 1)), has_init]
        + [[getattr(r, f) for r in runs] for f in ("start", "end", "mode")],
        dtype=torch.int32,
    ).to(device, non_blocking=True)

    def table(cols: slice) -> RunTable:
        return RunTable(*(i32[i, cols] for i in range(5)))

    index: list[int] = []  # every int64 table, concatenated: (offset, length) below
    spans: dict[str, tuple[int, int]] = {}

    def put(name: str, values: list[int]) -> None:
        spans[name] = (len(index), len(values))
        index.extend(values)

    put("identity", [1 + i for i, r in enumerate(runs) if r.init == IDENTITY])
    depth = max(sched.counts, default=1)
    for i in range(1, depth):  # level i: init of segment i (pass 2 row) from segment i - 1
        who = [b for b, s in enumerate(sched.counts) if s > i]
        put(f"dst{i}", [rows[(b, i, COMBINED)] for b in who])
        put(f"prev{i}", [rows[(b, i - 1, REQUEST if i == 1 else COMBINED)] for b in who])
        if i > 1:
            put(f"a{i}", [rows[(b, i - 1, IDENTITY)] for b in who])
            put(f"b{i}", [rows[(b, i - 1, ZERO)] for b in who])
    finals = [rows[(b, s - 1, REQUEST if s == 1 else COMBINED)] for b, s in enumerate(sched.counts)]
    put("final", finals)
    i64 = torch.tensor(index, dtype=torch.int64).to(device, non_blocking=True)

    def get(name: str) -> torch.Tensor:
        offset, length = spans[name]
        return i64[offset : offset + length]

    levels = tuple(
        Level(
            get(f"dst{i}"),
            get(f"prev{i}"),
            get(f"a{i}") if i > 1 else None,
            get(f"b{i}") if i > 1 else None,
        )
        for i in range(1, depth)
    )
    return DeviceSchedule(
        sched,
        table(slice(0, r1)),
        table(slice(r1, r1 + r2)),
        get("identity"),
        levels,
        get("final"),
    )


Runner = Callable[[torch.Tensor, RunTable], None]


def run(
    dev: DeviceSchedule,
    runner: Runner,
    pool: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> None:
    """The two passes and the combine. ``runner(scratch, table)`` launches the chunk kernel
    over ``table``'s runs with ``scratch [rows, HV, V, K]`` as its pool (each run's initial
    state read from its row when its has-initial-state is set, its final state written
    there); ``pool [slots + 1, HV, V, K]``: the requests' states, in and out."""
    hv, vd, kd = pool.shape[1:]
    if dev.identity_rows.numel() and vd != kd:
        raise ValueError(f"segments need V = K (A runs hold K rows as value rows): {vd}, {kd}")
    bs = len(dev.schedule.counts)
    scratch = torch.empty((dev.scratch_rows, hv, vd, kd), dtype=pool.dtype, device=pool.device)
    slots = cache_indices[:bs].long()
    owned = slots > 0  # a padding request (slot <= 0): a zero state, no pool row changed
    own_rows = slots.clamp(min=0)
    scratch[1 : 1 + bs] = pool.index_select(0, own_rows)
    if dev.identity_rows.numel():
        eye = torch.eye(kd, dtype=pool.dtype, device=pool.device)
        scratch.index_copy_(0, dev.identity_rows, eye.expand(dev.identity_rows.numel(), hv, -1, -1))
    first = dev.first
    has_init = first.has_init.clone()
    has_init[:bs] = ((has_initial_state[:bs] != 0) & owned).to(torch.int32)
    runner(scratch, RunTable(first.slots, has_init, first.start, first.end, first.mode))
    for level in dev.levels:
        state = scratch.index_select(0, level.prev)
        if level.a is not None:
            n = level.dst.numel()
            a = scratch.index_select(0, level.a).view(n * hv, kd, kd)
            b = scratch.index_select(0, level.b).view(n * hv, vd, kd)
            # (in float64: immune to TF32 matmul settings, and small: K x K a head)
            state = torch.baddbmm(b.double(), state.view(n * hv, vd, kd).double(), a.double())
            state = state.to(pool.dtype).view(n, hv, vd, kd)
        scratch.index_copy_(0, level.dst, state)
    if dev.second.runs:
        runner(scratch, dev.second)
    finals = scratch.index_select(0, dev.final_rows)
    keep = pool.index_select(0, own_rows)
    pool.index_copy_(0, own_rows, torch.where(owned.view(-1, 1, 1, 1), finals, keep))
