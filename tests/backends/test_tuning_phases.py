"""Each lowering's ``tuning_phases`` (which phases' kernels read a tuning key) against what
its library compiles: validate() refuses a key that no generated phase reads, so a table
that leaves out a phase whose kernels do read the key would refuse a tuning that matters.

For every (family, backend) pair, a few variants of the repo's specs that target it are
lowered on sm90; for each phase the pair lowers, the library's ``compile_specs`` runs with
that phase alone, and each tuning key is moved to other allowed values: a phase whose
compiled kernels change must be among the key's declared phases. Keys only the host reads
(grid sizes) change no compile spec; the table's word stands for them.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from attngen import registry
from attngen.spec.enums import Arch, Phase
from attngen.spec.expand import expand
from attngen.spec.fields import Int
from attngen.spec.loader import load_spec
from attngen.testing.paths import REPO_ROOT

ARCH = Arch.SM90
VARIANTS_PER_PAIR = 6

registry.load()
PAIRS = sorted(registry.lowerings().items(), key=lambda kv: (kv[0][0].value, kv[0][1].value))


def other_values(value: int, kind: Int) -> list[int]:
    """Up to two allowed values other than ``value``."""
    if kind.choices:
        candidates = list(kind.choices)
    else:
        candidates = [value * 2, value // 2, kind.minimum, kind.maximum]
    allowed = [
        c
        for c in dict.fromkeys(candidates)
        if c != value
        and kind.minimum <= c <= kind.maximum
        and (not kind.power_of_two or c > 0 and c & (c - 1) == 0)
    ]
    return allowed[:2]


def described(specs: list) -> list[str]:
    """What a compile spec says, the jitted function by name."""
    return [
        (
            repr(sorted((k, getattr(v, "__name__", repr(v))) for k, v in vars(s).items()))
            if not dataclasses.is_dataclass(s)
            else repr(
                [
                    (f.name, getattr(getattr(s, f.name), "__name__", repr(getattr(s, f.name))))
                    for f in dataclasses.fields(s)
                ]
            )
        )
        for s in specs
    ]


def pair_variants(family, backend) -> list:
    """Variants of the repo's specs that ``backend`` lowers on sm90, most phases first."""
    lowering = registry.lowering(family, backend)
    found = []
    for path in sorted((REPO_ROOT / "specs" / family.value).glob("*.yaml")):
        spec = load_spec(path, REPO_ROOT)
        if not any(t.backend is backend and ARCH in t.archs for t in spec.targets):
            continue
        found += [(spec, v) for v in expand(spec) if lowering.supports(v, ARCH).ok]
    found.sort(key=lambda sv: -len(sv[1].phases))
    return found[:VARIANTS_PER_PAIR]


@pytest.mark.parametrize("pair", [p for p, _ in PAIRS], ids=lambda p: f"{p[0].value}-{p[1].value}")
def test_declared_phases_cover_what_the_kernels_read(pair) -> None:
    family, backend = pair
    lowering = registry.lowering(family, backend)
    assert set(lowering.tuning_phases) == set(lowering.tuning_keys)
    library = importlib.import_module(lowering.library_module)
    variants = pair_variants(family, backend)
    assert variants, f"no spec in specs/{family.value} targets {backend.value} {ARCH.value}"
    observed: dict[str, set[Phase]] = {}
    for spec, variant in variants:
        plan = lowering.lower(spec, (variant,), ARCH)
        config = plan.kernels[0].config
        for phase in Phase:
            if not lowering.supports(dataclasses.replace(variant, phases=(phase,)), ARCH).ok:
                continue
            traits = dataclasses.replace(lowering.traits(plan), phases=(phase.value,))
            try:
                base = described(library.compile_specs(config, traits=traits))
            except Exception:  # a phase this config's shape cannot run (e.g. no drafts)
                continue
            for key, kind in lowering.tuning_keys.items():
                for value in other_values(getattr(config, key), kind):
                    moved = dataclasses.replace(config, **{key: value})
                    try:
                        changed = described(library.compile_specs(moved, traits=traits)) != base
                    except Exception:  # a value this shape refuses counts as read
                        changed = True
                    if changed:
                        observed.setdefault(key, set()).add(phase)
    assert observed, "no tuning key changed a compile spec: the probe saw nothing"
    wrong = {
        key: sorted(p.value for p in phases - lowering.tuning_phases[key])
        for key, phases in observed.items()
        if phases - lowering.tuning_phases[key]
    }
    assert not wrong, f"keys read by phases their table leaves out: {wrong}"


def test_spec_tuning_a_phase_it_does_not_generate_is_refused(tmp_path: Path) -> None:
    """Every declared (key, phases) entry: a spec generating only a phase outside them is
    refused at that key; inside them, accepted (the table is what validate() asks)."""
    from attngen.spec.errors import SpecError
    from attngen.validate import validate

    lowering = registry.lowering(*next(p for p, _ in PAIRS if p[0].value == "mha"))
    key = next(
        k
        for k, ph in lowering.tuning_phases.items()
        if Phase.DECODE not in ph and Phase.EXTEND in ph
    )
    value = lowering.tuning_keys[key].minimum
    if lowering.tuning_keys[key].choices:
        value = lowering.tuning_keys[key].choices[0]
    for phases, refused in (("[decode]", True), ("[decode, extend]", False)):
        path = tmp_path / "s.yaml"
        path.write_text(
            "name: s\nfamily: mha\ndescription: d\nphases: " + phases + "\n"
            "heads: {head_dim: 128, gqa_group: 4}\nkv_cache: {page_size: 64}\n"
            f"targets: {{{lowering.backend.value}: [sm90]}}\n"
            f"tuning: {{{lowering.backend.value}: {{sm90: {{{key}: {value}}}}}}}\n"
        )
        spec = load_spec(path, tmp_path)
        if refused:
            with pytest.raises(SpecError, match=f"{key}: only the kernels of"):
                validate(spec)
        else:
            validate(spec)
