"""Context parallelism of the CuTe DSL chunk kernel (attngen/families/gdn/cute_dsl/host/
segments.py) on the CPU: the schedule's two passes and the combine, with a float64 runner
that does what the kernel's ``modes`` form does with a run (its initial state from its
scratch row when its has-initial-state is set, else zero; v read as 0 without VALUES; its
output rows written with OUT; its final state to its scratch row), give the token-by-token
recurrence's outputs and final states; padding requests leave the pool alone; the estimate
takes segments only where SMs sit idle."""

from __future__ import annotations

import pytest
import torch

from attngen.families.gdn import reference
from attngen.families.gdn.cute_dsl.host import segments as seg

F64 = torch.float64
DIM = 32  # K = V (the A runs need it)
CHUNK = 64


def reference_runner(x: dict, out: torch.Tensor, group: int, scale: float):
    def run(scratch: torch.Tensor, table: seg.RunTable) -> None:
        cols = [t.tolist() for t in (table.slots, table.has_init, table.start, table.end)]
        for slot, has_init, start, end, mode in zip(*cols, table.mode.tolist()):
            rows = slice(start, end)
            v = x["v"][rows] if mode & seg.VALUES else torch.zeros_like(x["v"][rows])
            init = scratch[slot] if has_init and slot > 0 else None
            o, final, _ = reference.gdn_sequence(
                x["q"][rows], x["k"][rows], v, x["g"][rows], x["beta"][rows], init,
                scale=scale, l2norm_qk=True, keep_steps=False,
            )  # fmt: skip
            if mode & seg.OUT:
                out[rows] = o
            if slot > 0:
                scratch[slot] = final

    return run


def inputs(lens: list[int], heads: int, group: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    q, k = (torch.randn(n, heads // group, DIM, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(n, heads, DIM, generator=gen, dtype=F64)
    a, b = (torch.randn(n, heads, generator=gen) for _ in range(2))
    # slow decays (about exp(-0.007) a token), so a segment's initial state still counts at
    # its end and the combine's A matters
    g, beta = reference.gates(a, b, torch.full((heads,), -3.0), torch.full((heads,), -2.0))
    return dict(q=q, k=k, v=v, g=g.to(F64), beta=beta.to(F64))


@pytest.mark.parametrize(
    "counts", [(1, 1, 1, 1, 1), (2, 1, 1, 2, 3), (3, 2, 1, 4, 1), (16, 3, 1, 5, 2)]
)
@pytest.mark.parametrize("group", [1, 2])
def test_segments_give_the_recurrence(counts, group) -> None:
    lens = [700, 129, 7, 320, 150]  # request 4 pads (slot 0), segmented or not
    heads = 2
    x = inputs(lens, heads, group, seed=sum(counts) + 10 * group)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    slots = torch.tensor([3, 1, 5, 2, 0], dtype=torch.int32)
    has_init = torch.tensor([1, 0, 1, 0, 1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(7)
    pool0 = torch.randn(7, heads, DIM, DIM, generator=gen, dtype=F64) * 0.5
    pool = pool0.clone()
    out = torch.full((qsl[-1], heads, DIM), float("nan"), dtype=F64)
    scale = DIM**-0.5
    sched = seg.schedule(lens, counts, CHUNK)
    dev = seg.device_schedule(sched, torch.device("cpu"))
    seg.run(dev, reference_runner(x, out, group, scale), pool, slots, has_init)
    for b, slot in enumerate(slots.tolist()):
        rows = slice(qsl[b], qsl[b + 1])
        init = pool0[slot] if has_init[b] and slot > 0 else None
        want_out, want_state, _ = reference.gdn_sequence(
            x["q"][rows], x["k"][rows], x["v"][rows], x["g"][rows], x["beta"][rows], init,
            scale=scale, l2norm_qk=True, keep_steps=False,
        )  # fmt: skip
        assert float((out[rows] - want_out).abs().max()) < 1e-9 * float(want_out.abs().max())
        if slot > 0:
            err = float((pool[slot] - want_state).abs().max())
            assert err < 1e-9 * float(want_state.abs().max()), (b, err)
    untouched = [s for s in range(pool.shape[0]) if s not in slots.tolist() or s == 0]
    assert torch.equal(pool[untouched], pool0[untouched])


def test_dropping_a_from_the_combine_is_caught() -> None:
    """The check above can fail: with A_i taken as I the states after three segments differ."""
    lens, heads = [640], 1
    x = inputs(lens, heads, 1, seed=3)
    pool = torch.randn(2, heads, DIM, DIM, dtype=F64)
    want = reference.gdn_sequence(
        x["q"], x["k"], x["v"], x["g"], x["beta"], pool[1], scale=DIM**-0.5, l2norm_qk=True,
        keep_steps=False,
    )[1]  # fmt: skip
    out = torch.empty(640, heads, DIM, dtype=F64)
    runner = reference_runner(x, out, 1, DIM**-0.5)

    def no_a(scratch, table):  # the A runs (mode 0) leave I behind
        runner(scratch, table)
        for slot in table.slots[table.mode == 0].tolist():
            scratch[slot] = torch.eye(DIM, dtype=F64)

    dev = seg.device_schedule(seg.schedule(lens, (3,), CHUNK), torch.device("cpu"))
    seg.run(dev, no_a, pool, torch.tensor([1]), torch.tensor([1]))
    assert float((pool[1] - want).abs().max()) > 1e-2 * float(want.abs().max())


def test_schedule_falls_on_chunk_bounds() -> None:
    sched = seg.schedule([1000, 100, 1], (4, 2, 1), CHUNK)
    assert sched.counts == (4, 2, 1)
    starts = [0, 1000, 1100]
    for r in sched.first + sched.second:
        assert (r.start - starts[r.request]) % CHUNK == 0
    # pass 1 begins with every request's first run, in order; then A and B of the middles
    assert [(r.request, r.segment, r.init) for r in sched.first] == [
        (0, 0, "request"), (1, 0, "request"), (2, 0, "request"),
        (0, 1, "zero"), (0, 1, "identity"), (0, 2, "zero"), (0, 2, "identity"),
    ]  # fmt: skip
    assert [(r.start, r.end) for r in sched.second if r.request == 0] == [
        (256, 512), (512, 768), (768, 1000),
    ]  # fmt: skip
    assert all(r.mode == seg.OUT | seg.VALUES for r in sched.second)
    # more segments than chunks: one a chunk
    assert seg.schedule([130], (8,), CHUNK).counts == (3,)


def estimate(lens, sms=132, heads=16, max_segments=8, overhead=128):
    return seg.segment_counts(
        lens, chunk=CHUNK, heads=heads, blocks=2, num_sms=sms, max_segments=max_segments,
        overhead_chunks=overhead,
    )  # fmt: skip


def test_segments_where_sms_sit_idle() -> None:
    # 1 x 32k, 16 heads: 32 CTAs a run. Five segments of 103 chunks: pass 1 is 7 runs (224
    # CTAs, two waves: 206 steps), pass 2 4 runs (128 CTAs: 103); with the combine's 128,
    # 437 against 512 plain, 470 at three segments (96 + 64 CTAs, 171 steps each)
    assert estimate([32768]) == (5,)
    assert estimate([32768], max_segments=4) == (3,)
    assert estimate([32768], heads=8) == (8,)  # 16 CTAs a run
    assert estimate([32768], heads=32) == (1,)  # 64: three runs would take two waves
    # the SMs already busy: 4 x 8k at 16 heads is 128 CTAs
    assert estimate([8192] * 4) == (1, 1, 1, 1)
    assert estimate([32768], max_segments=1) == (1,)
    # short requests fill idle SMs beside the long one's segments and are never split
    counts = estimate([32768, 1000, 64, 1])
    assert counts[0] > 1 and counts[1:] == (1, 1, 1)
    # not worth the combine: 4 chunks; nor at 8k and 16k (H200: 0.37 ms plain against 0.54
    # at three segments, 0.73 against 0.70)
    assert estimate([256]) == (1,)
    assert estimate([8192]) == (1,)
    assert estimate([16384]) == (1,)
    assert estimate([8192], overhead=0) == (5,)  # what the charge keeps it from


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: seg.schedule([10, 20], (1,), CHUNK), "2 requests"),
        (lambda: seg.schedule([10], (0,), CHUNK), "segment counts"),
        (lambda: estimate([0]), "lengths >= 1"),
        (lambda: estimate([10], sms=0), ">= 1 expected"),
    ],
)
def test_refuses_bad_input(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_identity_runs_need_square_states() -> None:
    dev = seg.device_schedule(seg.schedule([300], (3,), CHUNK), torch.device("cpu"))
    pool = torch.zeros(2, 1, 16, 32)
    with pytest.raises(ValueError, match="V = K"):
        seg.run(dev, lambda s, t: None, pool, torch.tensor([1]), torch.tensor([0]))


def test_mode_bits_are_the_kernels() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.gdn.cute_dsl.kernels import chunk_sm90

    assert (seg.OUT, seg.VALUES) == (chunk_sm90.OUT, chunk_sm90.VALUES)
