"""Automatic backend selection: which attngen backend serves a variant on an arch.

The counterpart of SGLang's automatic ``--attention-backend`` choice, for attngen's own
backends (:class:`~attngen.spec.enums.Backend`). Each arch has an ordered preference
(:data:`PREFERENCE`); :func:`select_backend` walks it and takes the first backend whose
``supports()`` verdict for the variant, narrowed to one phase, is SUPPORTED (and that the
variant's spec targets, when it names targets). Given recorded evidence, a supported
backend with verified GPU evidence for that phase wins over an earlier unverified one.
Given measured speed (:mod:`attngen.speed`, distilled from benchmark runs), the backend
measured faster than every other eligible one (the verified ones, when some are) on that
arch and phase wins; where the benchmarks do not decide, the preference order does.

Nothing here is typed twice: the docs' "Backend selection" section is rendered from
:data:`PREFERENCE` and :func:`select_backend`, and every skipped backend carries the
capability model's own reason, so a selection can always say why.

Pure: no torch, no files, no device. The runtime side (importing a generated backend for
an arch and spec name, detecting the arch of a device) is ``attngen.runtime.select``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from attngen import registry
from attngen.arch import facts
from attngen.capabilities import Status, Verdict, supports
from attngen.spec.enums import Arch, Backend, Phase
from attngen.speed import PairSpeed, SpeedEvidence
from attngen.spec.variant import Variant


def _preference() -> dict[Arch, tuple[Backend, ...]]:
    """Per arch, the registered backends that can exist there, by their ``rank`` (a DSL
    built on the arch's own tensor cores before the portable one)."""
    infos = sorted(registry.backends().values(), key=lambda b: (b.rank, b.backend.value))
    return {
        arch: tuple(b.backend for b in infos if b.arch_limit(facts(arch)) is None) for arch in Arch
    }


PREFERENCE: dict[Arch, tuple[Backend, ...]] = _preference()

# Phases a serving engine runs through a backend, in the order the docs list them.
SELECTION_PHASES: tuple[Phase, ...] = (Phase.EXTEND, Phase.DECODE)


class EvidenceLookup(Protocol):
    """Answers: did ``variant``'s ``phase`` pass numerical GPU tests on ``backend``/``arch``?"""

    def verified(self, variant: Variant, backend: Backend, arch: Arch, phase: Phase) -> bool: ...


@dataclass(frozen=True)
class VerifiedSet:
    """An :class:`EvidenceLookup` over explicit ``(backend, arch, qualified_uri, phase)`` keys.

    ``qualified_uri`` is ``Variant.qualified_uri`` (``spec_name/variant_uri``).
    """

    keys: frozenset[tuple[Backend, Arch, str, Phase]]

    def verified(self, variant: Variant, backend: Backend, arch: Arch, phase: Phase) -> bool:
        return (backend, arch, variant.qualified_uri, phase) in self.keys


@dataclass(frozen=True)
class Skip:
    """A backend that was passed over, and why."""

    backend: Backend
    status: Status  # the capability verdict (SUPPORTED when skipped for evidence or targets)
    reason: str

    def __str__(self) -> str:
        return f"{self.backend.value}: {self.reason}"


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select_backend`.

    ``backend`` is ``None`` when no backend can serve the phase; ``status`` is then the
    best verdict among the skipped ones (NOT_LOWERED: possible but not lowered yet;
    UNSUPPORTED: no backend can), and ``reason`` lists every skipped backend's reason.
    ``verified`` is ``None`` when no evidence was consulted. ``reason`` does not repeat the
    arch and phase (the docs share one note between archs); ``str()`` adds them.
    """

    backend: Backend | None
    status: Status
    reason: str
    arch: Arch
    phase: Phase
    skipped: tuple[Skip, ...] = ()
    verified: bool | None = None

    @property
    def ok(self) -> bool:
        return self.backend is not None

    def __str__(self) -> str:
        chosen = self.backend.value if self.backend is not None else "none"
        return f"{self.arch.value} {self.phase.value}: {chosen} ({self.reason})"


def preference(arch: Arch | str) -> tuple[Backend, ...]:
    """The arch's backends, best first."""
    return PREFERENCE[Arch(arch)]


def for_phase(variant: Variant, phase: Phase | str) -> Variant:
    """``variant`` narrowed to one phase, so ``supports()`` judges only it."""
    phase = Phase(phase)
    if phase not in variant.phases:
        declared = ", ".join(p.value for p in variant.phases)
        raise ValueError(
            f"{variant.qualified_uri}: phase {phase.value} is not one of the spec's phases "
            f"({declared})"
        )
    return dataclasses.replace(variant, phases=(phase,))


def select_backend(
    variant: Variant,
    arch: Arch | str,
    phase: Phase | str,
    evidence: EvidenceLookup | None = None,
    speed: SpeedEvidence | None = None,
) -> Selection:
    """Pick the backend that serves ``variant``'s ``phase`` on ``arch``; see the module doc.

    Raises ``ValueError`` when ``phase`` is not one of the variant's phases.
    """
    arch, phase = Arch(arch), Phase(phase)
    probe = for_phase(variant, phase)
    order = preference(arch)
    order_text = f"the preference order ({', '.join(b.value for b in order)})"
    candidates: list[Backend] = []
    skipped: list[Skip] = []
    for backend in order:
        verdict = supports(probe, backend, arch)
        if not verdict.ok:
            skipped.append(Skip(backend, verdict.status, _verdict_reason(verdict)))
        elif not _targeted(variant, backend, arch):
            why = f"supported, but spec {variant.spec_name} does not target it on this arch"
            skipped.append(Skip(backend, Status.SUPPORTED, why))
        else:
            candidates.append(backend)

    if not candidates:
        status = _best_status(s.status for s in skipped)
        reasons = "; ".join(str(s) for s in skipped)
        reason = f"no backend available: {reasons}"
        return Selection(None, status, reason, arch, phase, tuple(skipped))

    verified, how = None, "first supported backend"
    eligible = candidates
    if evidence is not None:
        proven = [b for b in candidates if evidence.verified(variant, b, arch, phase)]
        verified = bool(proven)
        if proven:
            how = f"first supported backend with verified GPU {phase.value}"
            eligible = proven
            # earlier supported backends lose to the verified one; say so
            for b in candidates[: candidates.index(proven[0])]:
                why = f"supported, but no verified GPU {phase.value} evidence"
                skipped.append(Skip(b, Status.SUPPORTED, why))
        else:
            how += f" (no backend has verified GPU {phase.value} evidence)"
    chosen, pairs = fastest_or_first(eligible, arch, phase, speed)
    if pairs:
        among = "verified supported backends" if verified else "supported backends"
        how = f"fastest measured of the {among} ({'; '.join(p.describe() for p in pairs)})"
        for pair in pairs:  # backends before it in the preference order, passed over
            if eligible.index(pair.slower) < eligible.index(chosen):
                skipped.append(
                    Skip(pair.slower, Status.SUPPORTED, "supported, but measured slower")
                )
    skipped.sort(key=lambda s: order.index(s.backend))
    reason = f"{chosen.value} is the {how} in {order_text}"
    if skipped:
        reason += "; skipped " + "; ".join(str(s) for s in skipped)
    return Selection(chosen, Status.SUPPORTED, reason, arch, phase, tuple(skipped), verified)


def fastest_or_first(
    candidates: Sequence[Backend], arch: Arch, phase: Phase, speed: SpeedEvidence | None
) -> tuple[Backend, tuple[PairSpeed, ...]]:
    """The backend chosen among ``candidates`` (eligible ones, in preference order, at least
    one): the one ``speed`` measured faster than each other candidate on ``arch``/``phase``,
    with those comparisons; else (no evidence, or it does not decide) the first, with none.

    The last step of :func:`select_backend` and of the runtime's choice among generated
    backends (``attngen.runtime.select.choose_backend``)."""
    measured = speed.fastest(candidates, arch, phase) if speed is not None else None
    return measured if measured is not None else (candidates[0], ())


def _verdict_reason(verdict: Verdict) -> str:
    return verdict.reason or verdict.status.value.replace("_", " ")


def _targeted(variant: Variant, backend: Backend, arch: Arch) -> bool:
    """A spec that names targets is generated only for them; a probe (no targets) for all."""
    targets = variant.spec.targets if variant.spec is not None else ()
    if not targets:
        return True
    return any(t.backend is backend and arch in t.archs for t in targets)


def _best_status(statuses: object) -> Status:
    """NOT_LOWERED (some backend could, once lowered) beats UNSUPPORTED."""
    found = set(statuses)  # type: ignore[call-overload]
    return Status.NOT_LOWERED if Status.NOT_LOWERED in found else Status.UNSUPPORTED
