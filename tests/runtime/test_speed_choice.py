"""make_backend's per-phase choice among the backends that generate one spec: the phase's
serving backends, the measured-faster one on speed evidence, else the preference order."""

from __future__ import annotations

import pytest

import attngen.runtime.select as runtime_select
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.select import available_specs, choose_backend
from attngen.selection import preference
from attngen.spec.enums import Arch, Backend, Phase
from attngen.speed import NO_SPEED, Comparison, SpeedEvidence, SpeedRecord

BOTH = "mha_gqa_prefill"  # generated on sm90 by the CuTe DSL and Triton backends


def evidence(phase: Phase, ms: dict[Backend, float]) -> SpeedEvidence:
    record = SpeedRecord(
        path="evidence/speed/sm90.json",
        arch=Arch.SM90,
        device="test",
        commit="0",
        date="2026-12-01",
        source="test",
        comparisons=(Comparison(phase, "case", ms, {}),),
    )
    return SpeedEvidence({Arch.SM90: record})


def test_the_spec_is_generated_by_both_backends() -> None:
    backends = {b for b, _ in available_specs("sm90")[BOTH]}
    assert backends == {"cute_dsl", "triton"}


@pytest.mark.parametrize("faster", [Backend.TRITON, Backend.CUTE_DSL])
def test_measured_faster_backend_wins_its_phase(faster: Backend) -> None:
    slower = Backend.CUTE_DSL if faster is Backend.TRITON else Backend.TRITON
    speed = evidence(Phase.EXTEND, {faster: 1.0, slower: 1.25})
    assert choose_backend("sm90", BOTH, "extend", speed) == faster.value
    # evidence of another phase decides nothing for this one
    other = evidence(Phase.DECODE, {faster: 1.0, slower: 1.25})
    assert choose_backend("sm90", BOTH, "extend", other) == preference("sm90")[0].value


def test_without_evidence_the_preference_order_decides() -> None:
    assert choose_backend("sm90", BOTH, "extend", NO_SPEED) == preference("sm90")[0].value
    assert choose_backend("sm90", BOTH, None) == preference("sm90")[0].value


def test_only_backends_serving_the_phase_compete() -> None:
    # no backend generates decode for this prefill spec: the preference order, whatever
    # the (decode) evidence says; the chosen backend refuses decode itself
    speed = evidence(Phase.DECODE, {Backend.TRITON: 1.0, Backend.CUTE_DSL: 9.0})
    first = preference("sm90")[0].value
    assert choose_backend("sm90", BOTH, "decode", speed) == first


def test_a_spec_of_one_backend_needs_no_evidence() -> None:
    only = [s for s, where in available_specs("sm90").items() if len(where) == 1]
    spec = only[0]
    assert choose_backend("sm90", spec, "extend") == available_specs("sm90")[spec][0][0]


def test_unknown_spec_is_refused() -> None:
    with pytest.raises(AttngenInputError, match="no generated backend"):
        choose_backend("sm90", "no_such_spec", "extend")


def test_repository_speed_evidence_is_read_once(monkeypatch) -> None:
    reads = []

    def counting_load_speed(root):
        reads.append(root)
        return NO_SPEED

    monkeypatch.setattr(runtime_select, "load_speed", counting_load_speed)
    runtime_select._speed_at.cache_clear()
    try:
        for phase in ("extend", "extend", "decode"):
            choose_backend("sm90", BOTH, phase)
        runtime_select.load_backend_class("sm90", BOTH, phase="extend")
    finally:
        runtime_select._speed_at.cache_clear()  # later tests read the real evidence
    assert len(reads) == 1
