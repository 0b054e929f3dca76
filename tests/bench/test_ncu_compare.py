"""bench/experimental/ncu_sass_compare.py on the per-SASS counters kept from the H200 run of
2026-12-04: the differences it reported then come out of the stored files."""

from __future__ import annotations

import sys

from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench.experimental import ncu_sass_compare as cmp  # noqa: E402

RUN = REPO_ROOT / "bench" / "results" / "ncu-cute-prefill-20261204-aeb8bec"


def test_the_stored_comparison_reproduces() -> None:
    fa4 = cmp.load(RUN / "ncu-flash_fwd--noncausal-sass.csv.gz")
    ours = cmp.load(RUN / "ncu-MhaFwdSm90--noncausal-sass.csv.gz")
    a, b = cmp.by_opcode(fa4), cmp.by_opcode(ours)
    assert 0.05 < sum(b.values()) / sum(a.values()) - 1 < 0.06  # 5.7% more instructions
    assert b["FSETP"] - a["FSETP"] == 8_388_608  # the quad max's compare-and-select
    top = max(ours, key=lambda i: i.samples)
    assert top.source.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0")  # the wait for P V
    assert 0.12 < top.samples / sum(i.samples for i in ours) < 0.14
    text = cmp.report(fa4, ours, ("fa4", "attngen"), top=5)
    assert "(+5.7%)" in text and "WARPGROUP.DEPBAR.LE gsb0, 0x0" in text
