"""supports() is the one answer; the docs and the lowering agree with it."""

from __future__ import annotations

import dataclasses

import pytest

from attngen.capabilities import Status, Verdict, alternatives, supports
from attngen.emit.docs import NOT_LOWERED, UNSUPPORTED
from attngen import registry
from attngen.probes import base_variant, family_features, probe_verdict
from attngen.generate import build
from attngen.spec.enums import Arch, Backend, DType, Family, ScaleGranularity
from attngen.testing.paths import REPO_ROOT as ROOT


def test_base_mha_is_lowered_for_triton_on_every_arch() -> None:
    v = base_variant(Family.MHA)
    for arch in Arch:
        assert supports(v, Backend.TRITON, arch).ok


def test_hardware_limits_are_unsupported_with_a_reason() -> None:
    v = base_variant(Family.MHA)
    verdict = supports(v, Backend.CUTE_DSL, Arch.SM80)
    assert verdict.status is Status.UNSUPPORTED and "sm80" in verdict.reason
    fp8 = dataclasses.replace(v, kv_dtype=DType.FP8_E4M3, kv_scale=ScaleGranularity.PER_TENSOR)
    assert supports(fp8, Backend.TRITON, Arch.SM80).status is Status.UNSUPPORTED
    assert supports(fp8, Backend.TRITON, Arch.SM90).ok
    fp4 = dataclasses.replace(v, kv_dtype=DType.NVFP4, kv_scale=ScaleGranularity.PER_BLOCK)
    assert supports(fp4, Backend.TRITON, Arch.SM80).ok  # block scales decoded from bytes
    mx = dataclasses.replace(v, kv_dtype=DType.MXFP4, kv_scale=ScaleGranularity.PER_BLOCK)
    assert supports(mx, Backend.TRITON, Arch.SM90).status is Status.NOT_LOWERED
    assert (Backend.TRITON, Arch.SM80) not in alternatives(fp8)
    # the loader takes per_block fp8 (DSA's 656-byte latent rows); MHA's kernels read one
    # scale per tensor or per head, so they refuse it instead of reading one scale for all
    blocks = dataclasses.replace(fp8, kv_scale=ScaleGranularity.PER_BLOCK)
    verdict = supports(blocks, Backend.TRITON, Arch.SM90)
    assert verdict.status is Status.NOT_LOWERED and "per_block" in verdict.reason
    assert (
        supports(base_variant(Family.DSA), Backend.TRITON, Arch.SM80).status is Status.UNSUPPORTED
    )


def test_dsa_is_lowered_in_triton_only() -> None:
    v = base_variant(Family.DSA)
    assert supports(v, Backend.TRITON, Arch.SM90).ok
    assert supports(v, Backend.CUTE_DSL, Arch.SM90).status is Status.NOT_LOWERED


def test_lowered_variants_are_exactly_the_supported_ones() -> None:
    result = build(ROOT, ROOT / "specs", verbose=False)
    for plan in result.plans:
        for kernel in plan.kernels:
            assert supports(kernel.variant, plan.backend, plan.arch).ok


def test_docs_cells_follow_the_probe_verdicts() -> None:
    text = (ROOT / "generated/docs/support_matrix.md").read_text(encoding="utf-8")
    sections = {chunk.split("\n", 1)[0]: chunk for chunk in text.split("\n## ")}
    titles = {
        Family.MHA: "MHA backends",
        Family.MLA: "MLA backends",
        Family.GDN: "GDN",
        Family.DSA: "DSA",
    }
    for family in Family:
        features = family_features(family)
        section = next(body for title, body in sections.items() if title.startswith(titles[family]))
        for backend in Backend:
            for arch in Arch:
                row = next(
                    l
                    for l in section.splitlines()
                    if l.startswith(f"| attngen {backend.value} {arch.value} |")
                    or l.startswith(f"| attngen {backend.value} {arch.value} (")
                )
                cells = [c.strip() for c in row.strip("|").split("|")][1:]
                for feature, cell in zip(features, cells, strict=True):
                    status = probe_verdict(feature, backend, arch).status
                    where = (family.value, feature.key, backend.value, arch.value, cell)
                    if status is Status.UNSUPPORTED and not cell.startswith(UNSUPPORTED):
                        # other variants of the feature run there: the cell cites the reason
                        assert cell.endswith(")") and not cell.startswith(NOT_LOWERED), where
                    else:
                        assert cell.startswith(UNSUPPORTED) == (status is Status.UNSUPPORTED), where
                    if status is Status.SUPPORTED:
                        assert not cell.startswith(NOT_LOWERED), where


def test_docs_example_of_accepted_values_is_lowered_and_generated_by_no_spec() -> None:
    """The matrix's prose names GQA 12 and 32 and page size 8 as values a lowering supports
    that no spec generates (so no test ran them): both halves hold."""
    text = (ROOT / "generated/docs/support_matrix.md").read_text(encoding="utf-8")
    assert "(say GQA 12 or 32, page size 8) are **accepted, not verified**" in text
    v = base_variant(Family.MHA)
    examples = [
        dataclasses.replace(v, shape=dataclasses.replace(v.shape, gqa_group=12)),
        dataclasses.replace(v, shape=dataclasses.replace(v.shape, gqa_group=32)),
        dataclasses.replace(v, page_size=8),
    ]
    for variant in examples:
        assert all(supports(variant, backend, Arch.SM90).ok for backend in Backend)
    generated = [
        k.variant
        for p in build(ROOT, ROOT / "specs", verbose=False).plans
        if p.family is Family.MHA
        for k in p.kernels
    ]
    assert not {12, 32} & {x.shape.gqa_group for x in generated}
    assert 8 not in {x.page_size for x in generated}


def test_a_pair_without_a_lowering_is_not_lowered_with_a_reason(monkeypatch) -> None:
    """The registry decides: take MHA x Triton's lowering away and the same variant is
    NOT_LOWERED, naming the pair; hardware limits still come first."""
    v = base_variant(Family.MHA)
    assert supports(v, Backend.TRITON, Arch.SM90).ok
    lowerings = dict(registry._LOWERINGS)
    del lowerings[(Family.MHA, Backend.TRITON)]
    monkeypatch.setattr(registry, "_LOWERINGS", lowerings)
    verdict = supports(v, Backend.TRITON, Arch.SM90)
    assert verdict.status is Status.NOT_LOWERED
    assert verdict.reason == "no Triton lowering for mha yet"
    assert supports(v, Backend.CUTE_DSL, Arch.SM80).status is Status.UNSUPPORTED


def test_every_family_and_backend_is_registered() -> None:
    for family in Family:
        assert registry.family(family).family is family
        assert registry.family(family).title
    for backend in Backend:
        assert registry.backend(backend).backend is backend
    assert {
        (Family.MHA, Backend.TRITON),
        (Family.MHA, Backend.CUTE_DSL),
        (Family.MLA, Backend.TRITON),
        (Family.GDN, Backend.TRITON),
    } <= set(registry.lowerings())


def test_a_verdict_that_refuses_must_say_why() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        Verdict(Status.NOT_LOWERED)


def _field_paths() -> set[str]:
    """Every ``section.key`` (and top-level key) a spec may write."""
    from attngen.spec.loader import SECTIONS, family_specs
    from attngen.spec.model import Spec

    paths = {f.key for f in Spec.FIELDS}
    owners = list(SECTIONS.items())
    owners += [item for fs in family_specs().values() for item in fs.sections.items()]
    paths |= {f"{name}.{f.key}" for name, cls in owners for f in cls.FIELDS}
    return paths


def test_refusals_name_fields_a_spec_writes() -> None:
    """A NOT_LOWERED verdict's field is a real spec key (validate points the error at its
    line): asked of every docs column's probe on every backend and arch."""
    paths, named = _field_paths(), 0
    for family in registry.families():
        for feature in family_features(family):
            for backend in Backend:
                for arch in Arch:
                    verdict = probe_verdict(feature, backend, arch)
                    if verdict.field is not None:
                        assert verdict.field in paths, (feature.label, verdict)
                        named += 1
    assert named >= 8  # the lowerings do name their fields (10 at this writing)
