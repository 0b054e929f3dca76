"""Context parallelism for the chunk kernel: a long request's chunks split into segments that
run side by side, for batches of few long requests (one request of 32k tokens and 16 value
heads gives the one-consumer kernel 32 CTAs for 132 SMs, each walking 512 chunks in order).

The state after a segment is affine in the state before it. With the kernel's transposed
state S^T [V, K], a segment maps S^T to S^T A + B, where B is the segment run from S^T = 0
with its values and A (K x K) the run from S^T = I (K rows as value rows) with the values
taken as 0. Both are runs of the chunk kernel's ``modes`` form (mode bits ``OUT``,
``VALUES`` and ``IDENTITY`` per run; no outputs written). A request of s segments then
takes:

    pass 1   segment 0 from the request's own state (its outputs; its final state), and
             the A and B runs of segments 1 .. s - 2, in one launch with every other
             request of the batch (whole, one run each);
    combine  init[1] = final[0], init[i + 1] = init[i] A_i + B_i (float64, batched over
             requests and heads, one product a segment level);
    pass 2   segments 1 .. s - 1 from init[i] (outputs; the last one's final state is the
             request's), one launch.

Each middle segment runs three times (B, A on K rows, its outputs), segment 0 once: so
segment 0 is made longer than the others (``RATIOS``), and a launch's runs go longest
first (the kernel's grid takes runs as its slowest dimension, so CTAs start in run order).
The work grows while the sequential depth falls from the longest request's chunks to about
two segments' worth: ``segment_splits`` takes segments only where its estimate of the two
passes (depth, and work spread over the SMs) beats the plain launch's. Segment bounds fall
on chunk bounds, so the prepare kernel's chunks (its T, gates and norms) are the plain
launch's.

Every run reads and writes its state in a scratch pool laid out so that the combine needs
no gathers: row 1 + p is request ``order[p]``'s (the requests by segment count, most first),
filled from its pool row (zero without an initial state) for segment 0, then pass 2's
segment 1 from there; per middle segment j, a group of B_j rows and one of A_j rows over
the requests that have it (a prefix of ``order``); init[j + 1] is formed in place of B_j
and pass 2's segment j + 1 runs on that row. The requests' final states are copied to their
pool rows at the end, and a padding request (slot <= 0) runs from a zero state with its
rows written and no pool row changed, as the plain launch does. Planning is host work on
the requests' lengths (``schedule``, once a batch); the launches, the combine and the
copies are device work with no sync (``run``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

import torch

# the chunk kernel's mode bits (kernels/chunk_sm90.py: OUT writes the run's output rows,
# VALUES reads v, else v = 0; IDENTITY starts from S^T = I); a request's run is OUT | VALUES
OUT, VALUES, IDENTITY = 1, 2, 4
REQUEST, ZERO, ONES, COMBINED = "request", "zero", "identity", "combined"
# segment 0's length over the others' that the estimate tries (it runs once, a middle one
# three times)
RATIOS = (1.0, 1.5, 2.0, 2.5, 3.0)


@dataclass(frozen=True)
class Run:
    """One row of CTAs of a launch: tokens ``start .. end`` of request ``request`` (segment
    ``segment``), its mode bits and its initial state (``REQUEST``: the request's pool row
    when it has one, else 0; ``ZERO``; ``ONES``: I; ``COMBINED``)."""

    request: int
    segment: int
    start: int
    end: int
    mode: int
    init: str

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Schedule:
    """A batch's two passes, each in launch order (longest run first): ``first`` has one
    run per request (its segment 0 or all of it) and the A and B runs; ``second`` the later
    segments. ``splits``: per request, its segments' chunk counts."""

    splits: tuple[tuple[int, ...], ...]
    first: tuple[Run, ...]
    second: tuple[Run, ...]

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(len(s) for s in self.splits)

    @property
    def segmented(self) -> bool:
        return any(s > 1 for s in self.counts)


def split(chunks: int, head: int, per: int) -> tuple[int, ...]:
    """A request of ``chunks`` chunks as a first segment of up to ``head`` chunks and the
    rest in segments of ``per`` (the last one shorter)."""
    first = min(chunks, head)
    rest = chunks - first
    return (first, *[min(per, rest - i) for i in range(0, rest, per)])


def _passes(splits: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """The two passes' run depths (chunks), longest first."""
    first = [s[0] for s in splits] + [d for s in splits for d in s[1:-1] for _ in range(2)]
    second = [d for s in splits for d in s[1:]]
    return sorted(first, reverse=True), sorted(second, reverse=True)


def _pass_time(depths: list[int], heads: int, blocks: int, num_sms: int) -> int:
    """A launch's time in chunk steps: its CTAs in the grid's order (value blocks, then
    heads, then runs), each to the SM that frees first (one CTA an SM). SMs that free at
    the same time are kept as one entry (time, count)."""
    free = [(0, num_sms)]
    for d in depths:
        need = heads * blocks
        while need:
            t, n = heapq.heappop(free)
            while free and free[0][0] == t:
                n += heapq.heappop(free)[1]
            take = min(n, need)
            heapq.heappush(free, (t + d, take))
            if n > take:
                heapq.heappush(free, (t, n - take))
            need -= take
    return max(t for t, _ in free)


def segment_splits(
    lens: list[int],
    *,
    chunk: int,
    heads: int,
    blocks: int,
    num_sms: int,
    max_segments: int,
    overhead_chunks: int,
) -> tuple[tuple[int, ...], ...]:
    """Segments per request (their chunk counts): the longest request in s = 2 ..
    ``max_segments`` segments, the first ``RATIOS`` times the others' length, every request
    split the same way (a first segment of up to that length, then segments of the others'),
    or none; whichever the estimate (pass 1 + pass 2 + ``overhead_chunks`` for the combine
    and the second launch, in chunk steps; a run is ``heads`` x ``blocks`` CTAs) puts
    first; ties go to fewer segments and a shorter first segment."""
    if not lens or min(lens) < 1:
        raise ValueError(f"segment_splits: lengths >= 1 expected, got {lens}")
    if min(heads, blocks, num_sms, max_segments) < 1 or overhead_chunks < 0:
        raise ValueError("segment_splits: heads, blocks, num_sms, max_segments >= 1 expected")

    def time(depths: list[int]) -> int:
        return _pass_time(depths, heads, blocks, num_sms) if depths else 0

    chunks = [-(-n // chunk) for n in lens]
    longest = max(chunks)
    best = (time(sorted(chunks, reverse=True)), tuple((c,) for c in chunks))
    for s in range(2, min(max_segments, longest) + 1):
        for ratio in RATIOS:
            per = max(1, math.ceil(longest / (s - 1 + ratio)))
            head = longest - (s - 1) * per
            if head < 1 or head + per + overhead_chunks >= best[0]:  # (the passes' depths)
                continue
            splits = [split(c, head, per) for c in chunks]
            first, second = _passes(splits)
            cost = time(first) + time(second) + overhead_chunks
            if cost < best[0]:
                best = (cost, tuple(splits))
    return best[1]


def schedule(lens: list[int], splits: tuple[tuple[int, ...], ...], chunk: int) -> Schedule:
    """The runs of requests of ``lens`` tokens (in order, rows packed) in segments of
    ``splits`` chunks each (summing to the request's chunks; the last one ends at the
    request's end)."""
    if len(splits) != len(lens) or any(not s or min(s) < 1 for s in splits):
        raise ValueError(f"schedule: {len(lens)} requests, segment splits {splits}")
    for n, s in zip(lens, splits):
        if sum(s) != -(-n // chunk):
            raise ValueError(f"schedule: {n} tokens ({-(-n // chunk)} chunks) as {s}")
    first: list[Run] = []
    middle: list[Run] = []
    second: list[Run] = []
    start = 0
    for b, (n, s) in enumerate(zip(lens, splits)):
        bounds = [start]
        for c in s[:-1]:
            bounds.append(bounds[-1] + c * chunk)
        bounds.append(start + n)
        seg = list(zip(bounds[:-1], bounds[1:]))
        first.append(Run(b, 0, *seg[0], OUT | VALUES, REQUEST))
        for i in range(1, len(seg) - 1):
            middle.append(Run(b, i, *seg[i], VALUES, ZERO))  # B_i
            middle.append(Run(b, i, *seg[i], IDENTITY, ONES))  # A_i
        second.extend(Run(b, i, *seg[i], OUT | VALUES, COMBINED) for i in range(1, len(seg)))
        start += n

    def longest_first(runs: list[Run]) -> tuple[Run, ...]:
        return tuple(sorted(runs, key=lambda r: -r.rows))  # (stable)

    return Schedule(tuple(tuple(s) for s in splits), longest_first(first + middle),
                    longest_first(second))  # fmt: skip


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
    """One step of the combine: ``count`` requests' B rows from ``b`` on become init rows
    (init[i] A + B) from the init rows at ``init`` and the A rows at ``a`` (scratch rows)."""

    b: int
    init: int
    a: int
    count: int


@dataclass(frozen=True)
class DeviceSchedule:
    """A schedule's tables on the device (``device_schedule``); scratch rows 1 .. ``rows``
    hold the runs' states (row 0 unused)."""

    schedule: Schedule
    first: RunTable
    second: RunTable
    order: torch.Tensor  # request of scratch row 1 + p (int64)
    levels: tuple[Level, ...]
    final_rows: torch.Tensor  # per request: the scratch row of its final state (int64)
    rows: int

    @property
    def scratch_rows(self) -> int:
        return 1 + self.rows


def device_schedule(sched: Schedule, device: torch.device) -> DeviceSchedule:
    """The schedule's scratch layout (the module's docstring) and tables, copied to
    ``device`` in two non-blocking copies (no sync)."""
    counts = sched.counts
    bs = len(counts)
    order = sorted(range(bs), key=lambda b: -counts[b])  # (stable)
    row = {(b, 0, REQUEST): 1 + p for p, b in enumerate(order)}
    groups: list[int] = []  # per middle segment j (from 1): its B group's first row
    top = 1 + bs
    for j in range(1, max(counts) - 1):
        who = [b for b in order if counts[b] > j + 1]  # a prefix of order
        groups.append(top)
        for p, b in enumerate(who):
            row[(b, j, ZERO)] = top + p
            row[(b, j, ONES)] = top + len(who) + p
        top += 2 * len(who)
    for b, s in enumerate(counts):
        for i in range(1, s):  # pass 2's segment i: on init[i]'s row
            row[(b, i, COMBINED)] = row[(b, 0, REQUEST)] if i == 1 else row[(b, i - 1, ZERO)]
    levels = []
    for i in range(2, max(counts)):  # init[i] = init[i - 1] A_{i - 1} + B_{i - 1}
        count = sum(1 for s in counts if s > i)
        b_rows = groups[i - 2]
        init = 1 if i == 2 else groups[i - 3]
        levels.append(Level(b_rows, init, b_rows + count, count))
    has_init = {REQUEST: 1, ZERO: 0, ONES: 0, COMBINED: 1}
    runs = sched.first + sched.second
    i32 = torch.tensor(
        [[row[(r.request, r.segment, r.init)] for r in runs], [has_init[r.init] for r in runs]]
        + [[getattr(r, f) for r in runs] for f in ("start", "end", "mode")],
        dtype=torch.int32,
    ).to(device, non_blocking=True)
    r1 = len(sched.first)

    def table(cols: slice) -> RunTable:
        return RunTable(*(i32[i, cols] for i in range(5)))

    last = [(b, s - 1, REQUEST if s == 1 else COMBINED) for b, s in enumerate(counts)]
    i64 = torch.tensor(order + [row[k] for k in last], dtype=torch.int64)
    i64 = i64.to(device, non_blocking=True)
    return DeviceSchedule(
        sched, table(slice(0, r1)), table(slice(r1, len(runs))), i64[:bs], tuple(levels),
        i64[bs:], top - 1,
    )  # fmt: skip


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
    state read from its row when its has-initial-state is set, I with IDENTITY, else 0; its
    final state written there); ``pool [slots + 1, HV, V, K]``: the requests' states, in
    and out."""
    hv, vd, kd = pool.shape[1:]
    if dev.levels and vd != kd:
        raise ValueError(f"segments need V = K (A runs hold K rows as value rows): {vd}, {kd}")
    bs = len(dev.schedule.counts)
    scratch = torch.empty((dev.scratch_rows, hv, vd, kd), dtype=pool.dtype, device=pool.device)
    slots = cache_indices[:bs].long()
    owned = slots > 0  # a padding request (slot <= 0): a zero state, no pool row changed
    own_rows = slots.clamp(min=0)
    take = (has_initial_state[:bs] != 0) & owned
    # (a Python zero: a CPU tensor there would be copied to the device with a stream sync)
    scratch[1 : 1 + bs] = torch.where(
        take.index_select(0, dev.order).view(-1, 1, 1, 1),
        pool.index_select(0, own_rows.index_select(0, dev.order)),
        0.0,
    )
    runner(scratch, dev.first)
    if dev.levels:
        # (in float64: immune to TF32 matmul settings, and small: K x K a head)
        lo = 1
        states = scratch[lo : 1 + dev.rows].double()
        for lv in dev.levels:

            def rows(at: int) -> torch.Tensor:
                return states[at - lo : at - lo + lv.count].view(lv.count * hv, vd, kd)

            rows(lv.b).baddbmm_(rows(lv.init), rows(lv.a))
        scratch[lo : 1 + dev.rows].copy_(states)
    if dev.second.runs:
        runner(scratch, dev.second)
    finals = scratch.index_select(0, dev.final_rows)
    keep = pool.index_select(0, own_rows)
    pool.index_copy_(0, own_rows, torch.where(owned.view(-1, 1, 1, 1), finals, keep))
