"""Spec-level capability check: every target must be able to run every variant."""

from __future__ import annotations

from attngen import registry
from attngen.capabilities import Status, alternatives, supports
from attngen.ir import PlanError
from attngen.lower import lower_module
from attngen.spec.errors import SpecError
from attngen.spec.expand import expand
from attngen.spec.enums import Phase
from attngen.spec.model import Spec, Tuning
from attngen.spec.variant import Variant


def validate(spec: Spec) -> tuple[Variant, ...]:
    """Expand ``spec``; reject targets that cannot run one of its variants (UNSUPPORTED),
    variants that no lowered target of the spec lowers (a lowering exists for the family
    and backend, and it says why not), and a spec of which no target lowers anything (it
    would generate nothing). A target with no lowering of the family yet, next to one that
    lowers it, is documented as such, not refused."""
    variants = expand(spec)
    _check_unique(spec, variants)
    _check_hardware(spec, variants)
    for variant in variants:
        _check_lowered_somewhere(spec, variant)
    _check_lowers_something(spec, variants)
    _check_tuning_applies(spec, variants)
    return variants


def _check_unique(spec: Spec, variants: tuple[Variant, ...]) -> None:
    """Two axis values that name one variant (kv_cache.dtype ``auto`` next to the activation
    dtype, a v_head_dim equal to the head_dim) would generate it twice."""
    seen: set[str] = set()
    for v in variants:
        if v.uri in seen:
            where = spec.kv_cache.location if spec.kv_cache is not None else spec.location
            raise SpecError(
                where,
                "axes",
                f"two axis values give the same variant {v.uri} (e.g. kv_cache.dtype auto "
                "next to the activation dtype): list each variant once",
            )
        seen.add(v.uri)


def _check_hardware(spec: Spec, variants: tuple[Variant, ...]) -> None:
    for target in spec.targets:
        for arch in target.archs:
            for variant in variants:
                verdict = supports(variant, target.backend, arch)
                if verdict.status is Status.UNSUPPORTED:
                    can = (
                        ", ".join(f"{b.value} {a.value}" for b, a in alternatives(variant))
                        or "none"
                    )
                    raise SpecError(
                        target.location,
                        f"targets.{target.backend.value}",
                        f"{arch.value} cannot run variant {variant.uri}: {verdict.reason}"
                        f" (possible on: {can})",
                    )


def _check_lowered_somewhere(spec: Spec, variant: Variant) -> None:
    lowered = [t for t in spec.targets if registry.lowering(spec.family, t.backend) is not None]
    verdicts = [(t, a, supports(variant, t.backend, a)) for t in lowered for a in t.archs]
    if not verdicts or any(v.ok for _, _, v in verdicts):
        return
    target, arch, verdict = verdicts[0]
    where = [f"{b.value} {a.value}" for b, a in alternatives(variant) if supports(variant, b, a).ok]
    location, field = target.location, f"targets.{target.backend.value}"
    about = verdict.field
    written = spec.field_at(about) if about else None
    if about and written is not None:  # the refusal names a field the spec writes: point there
        location, field = written, about
    raise SpecError(
        location,
        field,
        f"no target lowers variant {variant.uri}: {verdict.reason} ({target.backend.value} "
        f"{arch.value}; lowered on: {', '.join(where) or 'none yet'})",
    )


def _check_lowers_something(spec: Spec, variants: tuple[Variant, ...]) -> None:
    """After _check_lowered_somewhere passed for every variant, only a spec none of whose
    targets has a lowering of its family generates nothing."""
    if any(registry.lowering(spec.family, t.backend) is not None for t in spec.targets):
        return
    raise SpecError(
        spec.targets[0].location,
        "targets",
        f"no target lowers any variant of this spec: {'; '.join(not_lowered(spec, variants))}",
    )


def _check_tuning_applies(spec: Spec, variants: tuple[Variant, ...]) -> None:
    """A tuning entry for a target that lowers none of the spec's variants (another target
    lowers them) would tune nothing: refused, not silently dropped."""
    for tuning in spec.tuning:
        verdicts = [supports(v, tuning.backend, tuning.arch) for v in variants]
        if not any(v.ok for v in verdicts):
            target = f"{tuning.backend.value} {tuning.arch.value}"
            raise SpecError(
                tuning.location,
                f"tuning.{tuning.backend.value}.{tuning.arch.value}",
                f"{target} lowers no variant of this spec (e.g. {variants[0].uri}: "
                f"{verdicts[0].reason}), so this tuning would apply to nothing: remove it",
            )
        _check_tuned_phases(spec, tuning)


def _check_tuned_phases(spec: Spec, tuning: Tuning) -> None:
    """A tuning key that only kernels of phases the spec does not generate read (an extend
    tile in a decode-only spec) would tune nothing: refused, not silently dropped. Which
    phases read a key is its lowering's knowledge (``tuning_phases``)."""
    lowering = registry.lowering(spec.family, tuning.backend)
    assert lowering is not None, "the loader refuses tuning for a pair with no lowering"
    generated = set(spec.phases)
    for key, _ in tuning.values:
        readers = lowering.tuning_phases[key]
        if not readers & generated:
            names = ", ".join(p.value for p in Phase if p in readers)
            have = ", ".join(p.value for p in spec.phases)
            phase, add = ("phases", "one of phases") if len(readers) > 1 else ("phase",) * 2
            raise SpecError(
                tuning.location,
                f"tuning.{tuning.backend.value}.{tuning.arch.value}.{key}",
                f"only the kernels of {phase} {names} read it, and this spec generates "
                f"{have}: it would tune nothing; remove it (or add {add} {names})",
            )


def check_plans(spec: Spec, variants: tuple[Variant, ...]) -> None:
    """What generate would still refuse once validate() passed: each target's plan, lowered
    and checked by its lowering (tile limits, tuning values that do not go together),
    raised as a SpecError at the spec's tuning for that target, else at the target."""
    for target in spec.targets:
        for arch in target.archs:
            try:
                lower_module(spec, variants, target.backend, arch)
            except PlanError as err:
                key = (target.backend, arch)
                tuning = next((t for t in spec.tuning if (t.backend, t.arch) == key), None)
                where, field = (
                    (tuning.location, f"tuning.{target.backend.value}.{arch.value}")
                    if tuning is not None
                    else (target.location, f"targets.{target.backend.value}")
                )
                message = str(err).removeprefix(f"{spec.path} ({arch.value}): ")
                raise SpecError(where, field, message) from err


def not_lowered(spec: Spec, variants: tuple[Variant, ...]) -> list[str]:
    """One line per target x arch of the spec that skips some of its variants (another
    target lowers them, or validate() would have refused the spec): how many, the first,
    and supports()'s reason. Nothing is refused here; the lines tell the author where a
    listed target generates less than the spec names."""
    lines = []
    for target in spec.targets:
        for arch in target.archs:
            skipped = [
                (v, verdict)
                for v in variants
                if not (verdict := supports(v, target.backend, arch)).ok
            ]
            if skipped:
                first, verdict = skipped[0]
                lines.append(
                    f"{target.backend.value} {arch.value} skips {len(skipped)} of "
                    f"{len(variants)} variants (e.g. {first.uri}: {verdict.reason})"
                )
    return lines
