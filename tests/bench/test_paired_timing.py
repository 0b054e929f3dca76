"""bench/paired_timing.py with a fake timer: rounds rotate who goes first, samples are per
call, and a drift that moves every kernel of a round alike cancels out of the ratio."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.paired_timing import paired_ms  # noqa: E402


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
