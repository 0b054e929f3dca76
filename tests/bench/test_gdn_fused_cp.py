"""bench/experimental/gdn_fused_cp.py: a long request split into segments (pass 1: the first
segment and the middle segments' A and B runs; the combine; pass 2) gives the token-by-token
float64 recurrence's outputs and final states, with the fused kernel's arithmetic
(``chunk_reference``) as the runner; a padding request's rows come from a zero state and
the pool's other rows are left alone; the plan's segments fall on chunk bounds."""

from __future__ import annotations

import sys

import pytest
import torch

from attngen.families.gdn import reference
from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench.experimental import gdn_fused_cp as cp  # noqa: E402
from bench.experimental import gdn_fused_sm90 as fused  # noqa: E402

F64 = torch.float64
DIM = 32  # K = V (the A runs need it); the chunk arithmetic takes any width


def reference_runner(x: dict, out: torch.Tensor, group: int, scale: float):
    """Runs as the fused kernel would do them, in float64: VALUES off reads v as 0, OUT
    writes the run's output rows."""

    def run(runs, inits):
        finals = torch.empty_like(inits)
        for i, r in enumerate(runs):
            rows = slice(r.start, r.end)
            for h in range(inits.shape[1]):
                v = x["v"][rows, h]
                if not r.mode & cp.VALUES:
                    v = torch.zeros_like(v)
                o, st = fused.chunk_reference(
                    x["q"][rows, h // group], x["k"][rows, h // group], v, x["g"][rows, h],
                    x["beta"][rows, h], inits[i, h], scale=scale,
                )  # fmt: skip
                if r.mode & cp.OUT:
                    out[rows, h] = o
                finals[i, h] = st
        return finals

    return run


def inputs(lens, heads: int, group: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    q, k = (torch.randn(n, heads // group, DIM, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(n, heads, DIM, generator=gen, dtype=F64)
    a, b = (torch.randn(n, heads, generator=gen) for _ in range(2))
    g, beta = reference.gates(a, b, torch.full((heads,), 0.5), torch.full((heads,), 0.3))
    return dict(q=q, k=k, v=v, g=g.to(F64), beta=beta.to(F64))


@pytest.mark.parametrize("segments", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("group", [1, 2])
def test_segments_give_the_recurrence(segments, group):
    lens = [700, 129, 7, 320, 5]  # the last request pads (slot 0)
    heads = 2
    x = inputs(lens, heads, group, seed=segments + 10 * group)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    slots = [3, 1, 5, 2, 0]
    has_init = [1, 0, 1, 0, 1]
    gen = torch.Generator().manual_seed(7)
    pool0 = torch.randn(7, heads, DIM, DIM, generator=gen, dtype=F64) * 0.5
    pool = pool0.clone()
    out = torch.full((qsl[-1], heads, DIM), float("nan"), dtype=F64)
    scale = DIM**-0.5
    plan = cp.plan_segments(qsl, slots, segments)
    cp.extend_cp(reference_runner(x, out, group, scale), plan, pool, slots, has_init)
    for b, slot in enumerate(slots):
        rows = slice(qsl[b], qsl[b + 1])
        init = pool0[slot] if has_init[b] and slot > 0 else None
        want_out, want_state, _ = reference.gdn_sequence(
            x["q"][rows], x["k"][rows], x["v"][rows], x["g"][rows], x["beta"][rows], init,
            scale=scale, l2norm_qk=True, keep_steps=False,
        )  # fmt: skip
        assert float((out[rows] - want_out).abs().max()) < 1e-9 * float(want_out.abs().max())
        if slot <= 0:  # padding: its rows from a zero state, no pool row written
            continue
        err = float((pool[slot] - want_state).abs().max())
        assert err < 1e-9 * float(want_state.abs().max())
    untouched = [s for s in range(pool.shape[0]) if s not in slots or s == 0]
    assert torch.equal(pool[untouched], pool0[untouched])


def test_plan_falls_on_chunk_bounds():
    plan = cp.plan_segments([0, 1000, 1100, 1101], [1, 2, 3], segments=4)
    assert plan.segments == (4, 2, 1)
    runs = plan.first + plan.second
    for r in runs:
        assert (r.start - [0, 1000, 1100][r.request]) % 64 == 0
    # request 0: 16 chunks in 4 segments of 4; its middle segments run as A and B in pass 1
    firsts = [(r.segment, r.init) for r in plan.first if r.request == 0]
    assert firsts == [(0, "request"), (1, "zero"), (1, "identity"), (2, "zero"), (2, "identity")]
    assert [(r.start, r.end) for r in plan.second if r.request == 0] == [
        (256, 512), (512, 768), (768, 1000),
    ]  # fmt: skip
    assert all(r.mode == cp.OUT | cp.VALUES for r in plan.second)


@pytest.mark.parametrize(
    "args, match",
    [
        (([0, 10], [1], 0), "segments must be"),
        (([0, 10, 20], [1], 2), "slots for"),
        (([0, 10, 5], [1, 2], 2), "rows"),
    ],
)
def test_plan_refuses_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        cp.plan_segments(*args)


def test_identity_runs_need_square_states():
    plan = cp.plan_segments([0, 300], [1], segments=3)
    pool = torch.zeros(2, 1, 16, 32)
    with pytest.raises(ValueError, match="V = K"):
        cp.extend_cp(lambda runs, inits: inits, plan, pool, [1], [0])


def test_mode_bits_are_the_kernels():
    assert (cp.OUT, cp.VALUES) == (fused.OUT, fused.VALUES)
