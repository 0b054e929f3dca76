"""Auto-selection by measured speed (attngen.speed): pair ratios, the fastest candidate,
select_backend and make_backend preferring it, falling back to the preference order; the
distiller of bench results and the support matrix's table of it."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

import attngen.selection as selection
from attngen.capabilities import SUPPORTED
from attngen.probes import base_variant
from attngen.selection import VerifiedSet, select_backend
from attngen.spec.enums import Arch, Backend, Family, Phase
from attngen.speed import Comparison, SpeedEvidence, SpeedRecord, load_speed, parse_record
from attngen.testing.paths import REPO_ROOT

T, C = Backend.TRITON, Backend.CUTE_DSL
BENCH = REPO_ROOT / "bench/results/h200-20261130T2335Z-b343cf7.json"


def record(*cases: tuple[Phase, float, float], arch: Arch = Arch.SM90) -> SpeedRecord:
    """A speed record of (phase, triton ms, cute_dsl ms) cases (None ms: not run)."""
    comps = tuple(
        Comparison(phase, f"case {i}", {b: ms for b, ms in ((T, t), (C, c)) if ms is not None}, {})
        for i, (phase, t, c) in enumerate(cases)
    )
    return SpeedRecord("evidence/speed/x.json", arch, "GPU", "abc1234", "today", "bench", comps)


def evidence(*cases: tuple[Phase, float, float]) -> SpeedEvidence:
    return SpeedEvidence({Arch.SM90: record(*cases)})


def test_pair_is_the_geometric_mean_of_time_ratios() -> None:
    ev = evidence((Phase.EXTEND, 1.0, 2.0), (Phase.EXTEND, 1.0, 0.5), (Phase.EXTEND, 2.0, 4.0))
    pair = ev.pair(C, T, Arch.SM90, Phase.EXTEND)
    assert (pair.faster, pair.slower, pair.cases) == (T, C, 3)
    assert math.isclose(pair.ratio, 2 ** (-1 / 3))  # (2 * 0.5 * 2) ** (1/3) = 2 ** (1/3)
    assert ev.pair(T, C, Arch.SM90, Phase.EXTEND) == pair
    assert ev.pair(T, C, Arch.SM90, Phase.DECODE) is None  # never measured
    assert ev.pair(T, C, Arch.SM100, Phase.EXTEND) is None
    assert evidence((Phase.EXTEND, 1.0, 1.0)).pair(T, C, Arch.SM90, Phase.EXTEND) is None
    one_sided = evidence((Phase.EXTEND, 1.0, None))
    assert one_sided.fastest([T, C], Arch.SM90, Phase.EXTEND) is None
    best, pairs = ev.fastest([C, T], Arch.SM90, Phase.EXTEND)
    assert best is T and [p.slower for p in pairs] == [C]
    assert ev.fastest([C], Arch.SM90, Phase.EXTEND) is None  # nothing to choose between
    assert "triton measured faster than cute_dsl: 0.79x its time" in pairs[0].describe()


@pytest.fixture
def all_supported(monkeypatch):
    monkeypatch.setattr(selection, "supports", lambda variant, backend, arch: SUPPORTED)


def test_select_prefers_the_measured_faster_backend(all_supported) -> None:
    v = base_variant(Family.MHA)
    assert select_backend(v, Arch.SM90, Phase.EXTEND).backend is C  # rank
    triton_faster = evidence((Phase.EXTEND, 1.0, 1.5), (Phase.EXTEND, 2.0, 2.5))
    sel = select_backend(v, Arch.SM90, Phase.EXTEND, speed=triton_faster)
    assert sel.backend is T
    assert sel.reason.startswith("triton is the fastest measured of the supported backends")
    assert [str(s) for s in sel.skipped] == ["cute_dsl: supported, but measured slower"]
    # no comparison for decode, or on sm100: the preference order decides
    assert select_backend(v, Arch.SM90, Phase.DECODE, speed=triton_faster).backend is C
    assert select_backend(v, Arch.SM100, Phase.EXTEND, speed=triton_faster).backend is C
    # measured faster and first in the order: chosen, nothing skipped
    cute_faster = evidence((Phase.EXTEND, 2.0, 1.0))
    sel = select_backend(v, Arch.SM90, Phase.EXTEND, speed=cute_faster)
    assert sel.backend is C and sel.skipped == () and "cute_dsl measured faster" in sel.reason


def test_speed_never_beats_verified_evidence(all_supported) -> None:
    v = base_variant(Family.MHA)
    only_cute = VerifiedSet(frozenset({(C, Arch.SM90, v.qualified_uri, Phase.EXTEND)}))
    triton_faster = evidence((Phase.EXTEND, 1.0, 1.5))
    sel = select_backend(v, Arch.SM90, Phase.EXTEND, evidence=only_cute, speed=triton_faster)
    assert sel.backend is C and sel.verified is True  # the unverified one is not eligible
    both = VerifiedSet(only_cute.keys | {(T, Arch.SM90, v.qualified_uri, Phase.EXTEND)})
    sel = select_backend(v, Arch.SM90, Phase.EXTEND, evidence=both, speed=triton_faster)
    assert sel.backend is T and "fastest measured of the verified supported" in sel.reason


def test_selection_never_picks_an_unsupported_backend() -> None:
    """Pages of 3 tokens are not lowered in CuTe DSL: speed cannot bring it in."""
    cute_faster = evidence((Phase.EXTEND, 2.0, 1.0))
    odd_pages = dataclasses.replace(base_variant(Family.MHA), page_size=3)
    sel = select_backend(odd_pages, Arch.SM90, Phase.EXTEND, speed=cute_faster)
    assert sel.backend is T and sel.skipped[0].backend is C


def test_distill_the_checked_in_bench(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    import distill_speed

    data = distill_speed.distill(BENCH)
    assert (data["arch"], data["commit"], data["device"]) == ("sm90", "b343cf7", "NVIDIA H200")
    comps = data["comparisons"]
    assert len(comps) == 9 and {c["phase"] for c in comps} == {"extend"}
    assert all(set(c["ms"]) == {"triton", "cute_dsl"} for c in comps)
    rec = parse_record("x.json", data)
    assert rec.comparisons[0].variants[C].startswith("mha_gqa_prefill/")
    # a failed numerical check drops the backend from its case (and the case, left alone)
    bench = json.loads(BENCH.read_text())
    bench["prefill"][1]["results"]["attngen_cute"]["vs_ref"]["ok"] = False
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps(bench))
    assert len(distill_speed.distill(bad)["comparisons"]) == 8
    with pytest.raises(ValueError, match="x.json: not a speed evidence file"):
        parse_record("x.json", {**data, "arch": "sm70"})


def test_checked_in_speed_evidence_and_its_docs() -> None:
    speed = load_speed(REPO_ROOT)
    pair = speed.pair(T, C, Arch.SM90, Phase.EXTEND)
    assert pair is not None and pair.cases >= 1
    text = (REPO_ROOT / "generated/docs/support_matrix.md").read_text(encoding="utf-8")
    section = text.split("### Measured speed", 1)[1].split("### Hybrid", 1)[0]
    row = f"| sm90 | extend | `{pair.faster.value}` | `{pair.slower.value}` | {pair.ratio:.2f}x |"
    assert row in section
