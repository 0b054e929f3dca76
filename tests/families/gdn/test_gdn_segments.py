"""Context parallelism of the CuTe DSL chunk kernel (attngen/families/gdn/cute_dsl/host/
segments.py) on the CPU: the schedule's two passes and the combine, with a float64 runner
that does what the kernel's ``modes`` form does with a run (its initial state I with
IDENTITY, else from its scratch row when its has-initial-state is set, else zero; v read as
0 without VALUES; its output rows written with OUT; its final state to its scratch row),
give the token-by-token recurrence's outputs and final states, reading no scratch row
before it is written; padding requests leave the pool alone; the estimate takes segments
only where SMs sit idle, with a longer first segment."""

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
            if mode & seg.IDENTITY:
                init = torch.eye(DIM, dtype=F64).expand(v.shape[1], DIM, DIM)
            assert init is None or not init.isnan().any(), f"row {slot} read before written"
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


@pytest.fixture
def nan_scratch(monkeypatch):
    """torch.empty's floating tensors filled with NaN (the scratch pool: a row read before
    it is written shows)."""
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(seg.torch, "empty", nan_empty)


# chunks per request [11, 3, 1, 5, 3]: the segments of each (chunk counts)
SPLITS = [
    ((11,), (3,), (1,), (5,), (3,)),
    ((6, 5), (3,), (1,), (2, 3), (1, 1, 1)),
    ((5, 3, 3), (2, 1), (1,), (2, 1, 1, 1), (3,)),
    ((1,) * 11, (1, 2), (1,), (1, 1, 1, 1, 1), (2, 1)),
    ((3, 2, 2, 2, 2), (3,), (1,), (3, 2), (1, 2)),
]


@pytest.mark.parametrize("splits", SPLITS, ids=[str(i) for i in range(len(SPLITS))])
@pytest.mark.parametrize("group", [1, 2])
def test_segments_give_the_recurrence(splits, group, nan_scratch) -> None:
    lens = [700, 129, 7, 320, 150]  # request 4 pads (slot 0), segmented or not
    heads = 2
    x = inputs(lens, heads, group, seed=sum(map(len, splits)) + 10 * group)
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
    sched = seg.schedule(lens, splits, CHUNK)
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

    def no_a(scratch, table):  # the A runs leave I behind
        runner(scratch, table)
        for slot in table.slots[table.mode == seg.IDENTITY].tolist():
            scratch[slot] = torch.eye(DIM, dtype=F64)

    dev = seg.device_schedule(seg.schedule(lens, ((4, 3, 3),), CHUNK), torch.device("cpu"))
    seg.run(dev, no_a, pool, torch.tensor([1]), torch.tensor([1]))
    assert float((pool[1] - want).abs().max()) > 1e-2 * float(want.abs().max())


def test_schedule_falls_on_chunk_bounds() -> None:
    sched = seg.schedule([1000, 100, 1], ((6, 4, 3, 3), (1, 1), (1,)), CHUNK)
    assert sched.counts == (4, 2, 1)
    starts = [0, 1000, 1100]
    for r in sched.first + sched.second:
        assert (r.start - starts[r.request]) % CHUNK == 0
    # pass 1: each request's first run and the A and B runs of the middles, longest first
    assert [(r.request, r.segment, r.init, r.rows) for r in sched.first] == [
        (0, 0, "request", 384), (0, 1, "zero", 256), (0, 1, "identity", 256),
        (0, 2, "zero", 192), (0, 2, "identity", 192), (1, 0, "request", 64),
        (2, 0, "request", 1),
    ]  # fmt: skip
    assert [(r.start, r.end) for r in sched.second if r.request == 0] == [
        (384, 640), (640, 832), (832, 1000),
    ]  # fmt: skip
    assert all(r.mode == seg.OUT | seg.VALUES for r in sched.second)
    modes = {r.init: r.mode for r in sched.first}
    assert modes == {"request": seg.OUT | seg.VALUES, "zero": seg.VALUES, "identity": seg.IDENTITY}
    assert seg.split(11, 5, 3) == (5, 3, 3) and seg.split(4, 5, 3) == (4,)


def test_combine_reads_rows_in_place() -> None:
    """The scratch layout: the combine's levels are row ranges, pass 2 runs on them."""
    sched = seg.schedule([1000, 100, 700], ((6, 4, 3, 3), (1, 1), (4, 3, 3, 1)), CHUNK)
    dev = seg.device_schedule(sched, torch.device("cpu"))
    # rows 1 .. 3: requests 0, 2 (4 segments each), 1; B_1, A_1, B_2, A_2 of requests 0, 2
    assert dev.order.tolist() == [0, 2, 1] and dev.rows == 3 + 8
    assert dev.levels == (seg.Level(4, 1, 6, 2), seg.Level(8, 4, 10, 2))
    rows = {(r.request, r.segment): s for r, s in zip(sched.second, dev.second.slots.tolist())}
    assert rows == {(0, 1): 1, (0, 2): 4, (0, 3): 8, (2, 1): 2, (2, 2): 5, (2, 3): 9, (1, 1): 3}
    assert dev.final_rows.tolist() == [8, 3, 9]


def estimate(lens, sms=132, heads=16, max_segments=8, overhead=128):
    return seg.segment_splits(
        lens, chunk=CHUNK, heads=heads, blocks=2, num_sms=sms, max_segments=max_segments,
        overhead_chunks=overhead,
    )  # fmt: skip


def test_segments_where_sms_sit_idle() -> None:
    # 1 x 32k, 16 heads: 32 CTAs a run. Five segments, the first of 168 chunks and four of
    # 86: pass 1 is segment 0 and six runs of 86 (224 CTAs: segment 0's 32 start first, the
    # others' second wave ends at 172 steps), pass 2 four runs (128 CTAs: 86); with the
    # combine's 128, 386 against 512 plain (equal segments of 103: 437)
    assert estimate([32768]) == ((168, 86, 86, 86, 86),)
    assert len(estimate([32768], max_segments=4)[0]) == 4
    assert len(estimate([32768], heads=8)[0]) == 8  # 16 CTAs a run
    # 64 CTAs a run: at best 256 + 128 steps, with the combine's 128 no better than 512
    assert estimate([32768], heads=32) == ((512,),)
    assert len(estimate([32768], heads=32, overhead=100)[0]) == 3
    # the SMs already busy: 4 x 8k at 16 heads is 128 CTAs
    assert estimate([8192] * 4) == ((128,),) * 4
    assert estimate([32768], max_segments=1) == ((512,),)
    # short requests fill idle SMs beside the long one's segments and are never split
    splits = estimate([32768, 1000, 64, 1])
    assert len(splits[0]) > 1 and splits[1:] == ((16,), (1,), (1,))
    # not worth the combine: 4 chunks; nor at 8k
    assert estimate([256]) == ((4,),)
    assert estimate([8192]) == ((128,),)
    assert len(estimate([8192], overhead=0)[0]) > 1  # what the charge keeps it from
    for lens, splits in (([32768, 1000],) * 2, ([5000, 3000],) * 2):
        for n, s in zip(lens, estimate(lens, heads=4)):
            assert sum(s) == -(-n // CHUNK)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: seg.schedule([10, 20], ((1,),), CHUNK), "2 requests"),
        (lambda: seg.schedule([10], ((0,),), CHUNK), "segment splits"),
        (lambda: seg.schedule([200], ((1, 1),), CHUNK), r"200 tokens \(4 chunks\)"),
        (lambda: estimate([0]), "lengths >= 1"),
        (lambda: estimate([10], sms=0), ">= 1 expected"),
    ],
)
def test_refuses_bad_input(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_identity_runs_need_square_states() -> None:
    dev = seg.device_schedule(seg.schedule([300], ((2, 2, 1),), CHUNK), torch.device("cpu"))
    pool = torch.zeros(2, 1, 16, 32)
    with pytest.raises(ValueError, match="V = K"):
        seg.run(dev, lambda s, t: None, pool, torch.tensor([1]), torch.tensor([0]))


def test_mode_bits_are_the_kernels() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.gdn.cute_dsl.kernels import chunk_sm90

    assert (seg.OUT, seg.VALUES, seg.IDENTITY) == (
        chunk_sm90.OUT, chunk_sm90.VALUES, chunk_sm90.IDENTITY
    )  # fmt: skip
