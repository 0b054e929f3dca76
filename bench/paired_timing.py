"""Paired timing: several kernels timed in interleaved rounds, ratios taken within a round.

Two kernels timed one after the other (``do_bench`` on A, then on B) see different clocks,
temperatures and neighbours: on the H200 one FA4 prefill read 681 then 558 TFLOP/s in two
runs minutes apart (bench/README.md, "Consumer pingpong"), more than the gaps being
chased. Here every round times each kernel once, in a rotated order, as ``calls``
back-to-back calls between two events; a ratio is formed within each round, and the
report is the median over rounds, with the spread of the per-round ratios (their
interquartile range), so drift between rounds cancels and what remains is visible.

``paired_ms(fns, rounds=..., calls=..., timer=...)``: ``timer(fn, calls)`` returns the
milliseconds of ``calls`` calls; the default times with CUDA events (import-free otherwise,
so the CPU tests pass a fake timer). ``run_then_pair`` is what a bench row needs: each
kernel called once for its output (a failing one reported, not timed), then the rest timed
in paired rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

Timer = Callable[[Callable[[], object], int], float]


def cuda_timer(fn: Callable[[], object], calls: int) -> float:
    """Milliseconds of ``calls`` back-to-back calls of ``fn``, between two CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@dataclass(frozen=True)
class Paired:
    """Per-call milliseconds of each kernel, round by round (``rounds[name][i]``)."""

    rounds: dict[str, list[float]]

    def median_ms(self, name: str) -> float:
        return statistics.median(self.rounds[name])

    def ratio(self, num: str, den: str) -> tuple[float, float, float]:
        """median and interquartile range (q1, q3) over rounds of ``num``'s time / ``den``'s
        in the same round (> 1: ``den`` is faster)."""
        per_round = [a / b for a, b in zip(self.rounds[num], self.rounds[den])]
        if len(per_round) < 2:
            return per_round[0], per_round[0], per_round[0]
        q1, med, q3 = statistics.quantiles(per_round, n=4, method="inclusive")
        return med, q1, q3


def paired_ms(
    fns: dict[str, Callable[[], object]],
    rounds: int = 15,
    calls: int = 10,
    warmup_calls: int = 3,
    timer: Timer = cuda_timer,
) -> Paired:
    """Time every kernel of ``fns`` once per round, rotating who goes first; each sample is
    the mean of ``calls`` back-to-back calls. Every kernel first runs ``warmup_calls``
    untimed calls (compiles, caches, clocks)."""
    if not fns or rounds < 1 or calls < 1:
        raise ValueError(f"paired_ms: need kernels, rounds >= 1, calls >= 1 (got {len(fns)}, "
                         f"{rounds}, {calls})")  # fmt: skip
    names = list(fns)
    for name in names:
        timer(fns[name], warmup_calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            samples[name].append(timer(fns[name], calls) / calls)
    return Paired(samples)


def run_then_pair(
    fns: dict[str, Callable[[], object]],
    work: float,
    unit: str,
    *,
    rounds: int = 15,
    calls: int = 5,
    timer: Timer = cuda_timer,
    sync: Callable[[], object] = lambda: None,
) -> tuple[dict[str, dict], dict[str, object], Paired | None]:
    """Call each kernel once (``sync()`` after it), keeping its output, then time those that
    ran in paired rounds: ``({name: {"ms", unit} or {"error"}}, {name: output}, Paired)``,
    ``unit`` = ``work`` / seconds / 1e12, from the median per-call time."""
    results: dict[str, dict] = {}
    outputs: dict[str, object] = {}
    ran = {}
    for name, fn in fns.items():
        try:
            outputs[name] = fn()
            sync()
            ran[name] = fn
        except Exception as e:  # noqa: BLE001 (a bench row reports the failure and goes on)
            results[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    if not ran:
        return results, outputs, None
    paired = paired_ms(ran, rounds=rounds, calls=calls, timer=timer)
    for name in ran:
        ms = paired.median_ms(name)
        results[name] = {"ms": ms, unit: work / (ms * 1e-3) / 1e12}
    return results, outputs, paired
