"""bench/paired_timing.py with a fake timer: rounds rotate who goes first, samples are per
call, and a drift that moves every kernel of a round alike cancels out of the ratio; a bench
row's kernels run once for their outputs, a failing one is reported and left out of the
timing, and bench/run.py's prefill ratios come from the rounds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.paired_timing import paired_ms, run_then_pair  # noqa: E402


class DriftingClock:
    """Kernel ``name`` costs ``cost[name]`` ms a call, times a clock factor that changes
    from round to round (a GPU whose clocks wander); records the order of the timings."""

    def __init__(self, cost: dict[str, float], factors: list[float]) -> None:
        self.cost, self.factors, self.order, self.timed = cost, factors, [], 0

    def __call__(self, fn, calls: int) -> float:
        name = fn()
        self.order.append((name, calls))
        factor = self.factors[min(self.timed // len(self.cost), len(self.factors) - 1)]
        if calls == 10:  # the warmup calls do not advance the rounds
            self.timed += 1
        return self.cost[name] * calls * factor


def test_drift_cancels_in_the_per_round_ratio() -> None:
    cost = {"ours": 1.0, "peer": 0.9}
    factors = [1.0, 1.4, 0.8, 1.2, 2.0, 1.0, 0.7]  # far more than the 10% gap
    clock = DriftingClock(cost, factors)
    fns = {name: (lambda n=name: n) for name in cost}
    got = paired_ms(fns, rounds=len(factors), calls=10, warmup_calls=3, timer=clock)
    med, q1, q3 = got.ratio("peer", "ours")
    assert med == pytest.approx(0.9) and q1 == pytest.approx(0.9) and q3 == pytest.approx(0.9)
    assert got.median_ms("ours") == pytest.approx(1.0)  # per call, at the median clock
    assert [c for _, c in clock.order[:2]] == [3, 3]  # warmup first, untimed
    firsts = [clock.order[2 + 2 * r][0] for r in range(len(factors))]
    assert firsts[:4] == ["ours", "peer", "ours", "peer"]  # who goes first rotates


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="rounds >= 1"):
        paired_ms({"a": lambda: None}, rounds=0, timer=lambda fn, calls: 1.0)
    with pytest.raises(ValueError, match="need kernels"):
        paired_ms({}, timer=lambda fn, calls: 1.0)


def test_a_row_runs_each_kernel_once_then_times_those_that_ran() -> None:
    calls = {"ours": 0, "peer": 0, "broken": 0}

    def kernel(name):
        def fn():
            calls[name] += 1
            if name == "broken":
                raise RuntimeError("no kernel image for this device")
            return f"out of {name}"

        fn.kernel = name
        return fn

    cost = {"ours": 2.0, "peer": 1.0}
    synced = []
    res, outs, paired = run_then_pair(
        {n: kernel(n) for n in calls}, work=4e9, unit="tflops", rounds=3, calls=2,
        timer=lambda fn, n: cost[fn.kernel] * n, sync=lambda: synced.append(1),
    )  # fmt: skip
    assert outs == {"ours": "out of ours", "peer": "out of peer"}
    assert res["broken"] == {"error": "RuntimeError: no kernel image for this device"}
    assert calls["broken"] == 1 and len(synced) == 2  # tried once, never timed
    assert res["ours"]["ms"] == pytest.approx(2.0) and res["peer"]["ms"] == pytest.approx(1.0)
    assert res["ours"]["tflops"] == pytest.approx(4e9 / 2e-3 / 1e12)
    assert sorted(paired.rounds) == ["ours", "peer"]
    assert paired.ratio("peer", "ours")[0] == pytest.approx(0.5)


def test_nothing_ran_nothing_timed() -> None:
    def broken():
        raise ValueError("bad shape")

    res, outs, paired = run_then_pair({"a": broken}, 1.0, "tflops", timer=lambda f, n: 1.0)
    assert paired is None and outs == {} and "ValueError: bad shape" in res["a"]["error"]


def test_bench_prefill_ratios_are_the_rounds_medians() -> None:
    run = pytest.importorskip("bench.run")
    from bench.paired_timing import Paired

    paired = Paired({"attngen_cute": [1.0, 1.0, 1.2], "fa4": [0.9, 1.0, 0.9], "fa2": [2.0] * 3})
    got = run.paired_ratios(paired)
    assert got["ratio"]["cute_fa4"] == pytest.approx(0.9)  # 0.9, 1.0, 0.75: median 0.9
    assert got["ratio"]["cute_fa2"] == pytest.approx(2.0)
    assert "fa4" not in got["ratio"] and "cute_cudnn" not in got["ratio"]  # not timed
    q1, q3 = got["ratio_iqr"]["cute_fa4"]
    assert q1 <= 0.9 <= q3
    assert run.paired_ratios(None) == {"ratio": {}, "ratio_iqr": {}}
