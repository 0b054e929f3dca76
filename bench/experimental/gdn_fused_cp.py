"""Context parallelism for the fused GDN kernel (experimental, 2026-12-06; the form the
generated backends run, with its CPU tests against the float64 recurrence, is
attngen/families/gdn/cute_dsl/host/segments.py; this one stays for the harness's
``--segments`` on its experimental forms): a long request's
chunks split into segments that run side by side, for batches of few long requests (1x32k
H16 gives the one-request-a-CTA kernel 32 CTAs for 132 SMs).

The state after a segment is affine in the state before it: with the kernel's transposed
state S^T [V, K], every chunk maps S^T to S^T A_c + B_c, so a segment maps it to
S^T A + B, where B is the segment run from S^T = 0 with its values, and A (K x K) the run
from S^T = I (V = K rows) with the values taken as 0. Both are runs of the fused kernel
(mode bits ``OUT`` and ``VALUES``, no outputs written). A request of s segments then takes:

    pass 1   segment 0 from the request's own state (outputs, its final state), and the
             A and B runs of segments 1 .. s - 2, all in one launch;
    combine  init[1] = final[0], init[i + 1] = init[i] A_i + B_i (fp32, batched over heads);
    pass 2   segments 1 .. s - 1 from init[i] (outputs; the last one's final state is the
             request's), one launch.

The work grows (each middle segment runs three times, once on K rows), the sequential depth
falls from the request's chunks to about two segments' worth. Segment bounds fall on chunk
bounds of the request, so the prepare kernel's chunks (and its T, gates and norms) are the
same as without segments. A padding request (slot <= 0) is one run in pass 1 from a zero state: its output rows
are written and no pool row is touched, as the kernel does for it.

``extend_cp`` takes the kernel as a ``runner(runs, inits) -> finals`` callable, so the same
plan and combine run on the GPU (``gdn_fused_check.fused_runner``) and, in
tests/bench/test_gdn_fused_cp.py, on the CPU with ``chunk_reference`` in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# the backend's run record and mode bits (the same strings for a run's initial state)
from attngen.families.gdn.cute_dsl.host.segments import OUT, VALUES, Run  # noqa: E402,F401


@dataclass(frozen=True)
class CpPlan:
    first: tuple[Run, ...]  # pass 1
    second: tuple[Run, ...]  # pass 2
    segments: tuple[int, ...]  # per request (0: padding)


def plan_segments(qsl: list[int], slots: list[int], segments: int, chunk: int = 64) -> CpPlan:
    """Requests ``qsl[b] .. qsl[b + 1]`` split into up to ``segments`` chunk-aligned
    segments of equal chunk counts (the last one shorter); ``segments`` = 1 is the plain
    kernel's plan."""
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    if len(qsl) != len(slots) + 1:
        raise ValueError(f"{len(slots)} slots for {len(qsl) - 1} requests")
    first, second, counts = [], [], []
    for b, slot in enumerate(slots):
        start, end = qsl[b], qsl[b + 1]
        if end < start:
            raise ValueError(f"request {b}: rows {start} .. {end}")
        if end == start:
            counts.append(0)
            continue
        if slot <= 0:  # padding: its rows from a zero state in one run, no pool row
            counts.append(0)
            first.append(Run(b, 0, start, end, OUT | VALUES, "zero"))
            continue
        chunks = -(-(end - start) // chunk)
        per = -(-chunks // min(segments, chunks))  # chunks a segment
        bounds = list(range(start, end, per * chunk)) + [end]
        s = len(bounds) - 1
        counts.append(s)
        seg = [(bounds[i], bounds[i + 1]) for i in range(s)]
        first.append(Run(b, 0, *seg[0], OUT | VALUES, "request"))
        for i in range(1, s - 1):
            first.append(Run(b, i, *seg[i], VALUES, "zero"))  # B_i
            first.append(Run(b, i, *seg[i], 0, "identity"))  # A_i
        second.extend(Run(b, i, *seg[i], OUT | VALUES, "combined") for i in range(1, s))
    return CpPlan(tuple(first), tuple(second), tuple(counts))


Runner = Callable[[tuple[Run, ...], torch.Tensor], torch.Tensor]


def extend_cp(
    runner: Runner,
    plan: CpPlan,
    pool: torch.Tensor,
    slots: list[int],
    has_init: list[int],
) -> None:
    """The plan's two passes and the combine. ``runner(runs, inits)`` runs ``runs`` from
    ``inits [R, HV, V, K]`` (writing the output rows of OUT runs) and returns their final
    states; ``pool [slots + 1, HV, V, K]``: requests' initial states in, final states out."""
    hv, vd, kd = pool.shape[1:]
    like = dict(dtype=pool.dtype, device=pool.device)
    if any(r.init == "identity" for r in plan.first) and vd != kd:
        raise ValueError(f"segments need V = K (the A run holds K rows as V rows): {vd}, {kd}")
    eye = torch.eye(kd, **like).expand(hv, kd, kd)

    def start_state(r: Run) -> torch.Tensor:
        if r.init == "identity":
            return eye
        if r.init == "request" and has_init[r.request]:
            return pool[slots[r.request]]
        return torch.zeros(hv, vd, kd, **like)

    if not plan.first:
        return
    finals1 = runner(plan.first, torch.stack([start_state(r) for r in plan.first]))
    where = {(r.request, r.segment, r.init): i for i, r in enumerate(plan.first)}
    inits2 = []
    for b, s in enumerate(plan.segments):
        if s == 0:
            continue
        state = finals1[where[(b, 0, "request")]]
        if s == 1:
            pool[slots[b]] = state
            continue
        inits2.append(state)
        for i in range(1, s - 1):
            a_i = finals1[where[(b, i, "identity")]]
            b_i = finals1[where[(b, i, "zero")]]
            state = torch.baddbmm(b_i, state, a_i)  # S^T A_i + B_i, per head
            inits2.append(state)
    if not plan.second:
        return
    finals2 = runner(plan.second, torch.stack(inits2))
    for i, r in enumerate(plan.second):
        if r.segment == plan.segments[r.request] - 1:
            pool[slots[r.request]] = finals2[i]
