"""A model of the persistent sm90 forward's barrier protocol (cute_sm90_persistent.patch's
``run_persistent``), run on CPU: one TMA producer and W consumer warpgroups, interleaved at
random, over a CTA's tiles (each with its number of key blocks).

Barriers are mbarriers reduced to what the protocol reads: an arrival count and a completed
phase count (a wait on parity p passes once the phase parity differs from p). Q has one
stage (its full and empty barriers); K and V have ``stages`` each. As in the kernel, Q's
pipeline reads its barriers by index from one flat array (Q full, Q empty, K full x S, K
empty x S, V ...), so a state with another pipeline's index reaches other barriers.

A run is "ok" when every wait returns the data of the tile and block it expects and all
agents finish, "WRONG" when a consumer reads another tile's or block's stage, "DEADLOCK"
when every live agent waits. "As it was" models the consumers' call before 2026-12-05:
the K/V state passed where the Q state goes, and a fresh K/V state every tile.

    python3 bench/experimental/persistent_barrier_model.py   # both wirings, 3000 schedules
"""

from __future__ import annotations

import random


class Barrier:
    def __init__(self, count: int) -> None:
        self.count, self.pending, self.phases, self.data = count, count, 0, None

    def arrive(self, data: object = None) -> None:
        if data is not None:
            self.data = data
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count"
        if self.pending == 0:
            self.phases += 1
            self.pending = self.count

    def passes(self, parity: int) -> bool:
        return self.phases % 2 != parity


class State:
    """A pipeline state: stage index and phase, as CUTLASS's PipelineState advances them."""

    def __init__(self, stages: int, phase: int) -> None:
        self.stages, self.index, self.phase = stages, 0, phase

    def advance(self) -> None:
        self.index += 1
        if self.index == self.stages:
            self.index, self.phase = 0, self.phase ^ 1

    def clone(self) -> State:
        copy = State(self.stages, self.phase)
        copy.index = self.index
        return copy


def run(tiles: list[int], stages: int, warpgroups: int, bug: bool, seed: int) -> str:
    rnd = random.Random(seed)
    k_full = [Barrier(1) for _ in range(stages)]
    k_empty = [Barrier(warpgroups) for _ in range(stages)]
    v_full = [Barrier(1) for _ in range(stages)]
    v_empty = [Barrier(warpgroups) for _ in range(stages)]
    flat = [Barrier(1), Barrier(warpgroups)] + k_full + k_empty + v_full + v_empty
    q_full, q_empty = flat, flat[1:]  # Q's barrier i: flat[i] (full), flat[1 + i] (empty)

    def producer():
        q, kv = State(1, 1), State(stages, 1)
        for t, blocks in enumerate(tiles):
            yield ("wait", q_empty[q.index], q.phase)
            q_full[q.index].arrive(("Q", t))
            q.advance()
            for b in range(blocks):
                yield ("wait", k_empty[kv.index], kv.phase)
                k_full[kv.index].arrive(("K", t, b))
                yield ("wait", v_empty[kv.index], kv.phase)
                v_full[kv.index].arrive(("V", t, b))
                kv.advance()

    def consumer(w: int):
        q, kv = State(1, 0), State(stages, 0)
        for t, blocks in enumerate(tiles):
            qs, ks = (kv, State(stages, 0)) if bug else (q, kv)

            def wait(bars, s, what):
                yield ("wait", bars[s.index], s.phase)
                got = bars[s.index].data
                if got != what:
                    raise AssertionError(f"warpgroup {w} tile {t}: expected {what}, got {got}")

            yield from wait(q_full, qs, ("Q", t))
            yield from wait(k_full, ks, ("K", t, 0))
            k_empty[ks.index].arrive()
            vs = ks.clone()
            ks.advance()
            for b in range(1, blocks):  # the overlapped loop: K of b with V of b - 1
                yield from wait(k_full, ks, ("K", t, b))
                yield from wait(v_full, vs, ("V", t, b - 1))
                k_empty[ks.index].arrive()
                v_empty[vs.index].arrive()
                vs = ks.clone()
                ks.advance()
            yield from wait(v_full, vs, ("V", t, blocks - 1))
            v_empty[vs.index].arrive()
            q_empty[qs.index].arrive()
            qs.advance()
            if bug:  # what the call returned: (q_state, kv_state) = (the K/V object, fresh)
                q, kv = qs, ks
            yield ("epilogue",)

    agents = [producer()] + [consumer(w) for w in range(warpgroups)]
    current = [next(a) for a in agents]
    while True:
        live = [i for i, c in enumerate(current) if c is not None]
        if not live:
            return "ok"
        runnable = [
            i for i in live if current[i][0] != "wait" or current[i][1].passes(current[i][2])
        ]
        if not runnable:
            return "DEADLOCK"
        i = rnd.choice(runnable)
        try:
            current[i] = next(agents[i])
        except StopIteration:
            current[i] = None
        except AssertionError as e:
            return f"WRONG {e}"


def main() -> None:
    for bug in (True, False):
        counts: dict[str, int] = {}
        example: dict[str, tuple] = {}
        for seed in range(3000):
            rnd = random.Random(seed)
            tiles = [rnd.randint(1, 9) for _ in range(rnd.randint(1, 6))]
            stages, warpgroups = rnd.choice((1, 2, 3, 4)), rnd.choice((2, 3))
            result = run(tiles, stages, warpgroups, bug, seed)
            kind = result.split()[0]
            counts[kind] = counts.get(kind, 0) + 1
            example.setdefault(kind, (tiles, stages, warpgroups, result))
        print("as it was" if bug else "fixed", counts)
        for kind, case in example.items():
            if kind != "ok":
                print("  e.g. tiles, stages, warpgroups:", case)


if __name__ == "__main__":
    main()
