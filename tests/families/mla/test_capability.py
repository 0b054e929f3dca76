"""What the MLA x Triton lowering claims, asked through the one supports() entry point."""

from __future__ import annotations

import dataclasses

from attngen.capabilities import supports
from attngen.probes import base_variant
from attngen.spec.enums import Arch, Backend, DType, Family, MaskKind, ScaleGranularity
from attngen.verdict import Status


def test_mla_lowered_on_triton_only():
    v = base_variant(Family.MLA)
    for arch in Arch:
        assert supports(v, Backend.TRITON, arch).ok, arch
    assert supports(v, Backend.CUTE_DSL, Arch.SM90).status is Status.NOT_LOWERED


def test_latent_dtypes():
    v = base_variant(Family.MLA)
    fp8 = dataclasses.replace(v, kv_dtype=DType.FP8_E4M3, kv_scale=ScaleGranularity.PER_TENSOR)
    assert supports(fp8, Backend.TRITON, Arch.SM90).ok
    assert supports(fp8, Backend.TRITON, Arch.SM80).status is Status.UNSUPPORTED  # no e4m3
    per_head = dataclasses.replace(fp8, kv_scale=ScaleGranularity.PER_HEAD)
    assert "per-tensor" in supports(per_head, Backend.TRITON, Arch.SM90).reason
    fp4 = dataclasses.replace(v, kv_dtype=DType.NVFP4, kv_scale=ScaleGranularity.PER_BLOCK)
    assert supports(fp4, Backend.TRITON, Arch.SM90).ok
    assert supports(fp4, Backend.TRITON, Arch.SM100).ok
    assert "sm90" in supports(fp4, Backend.TRITON, Arch.SM80).reason
    mx = dataclasses.replace(v, kv_dtype=DType.MXFP4, kv_scale=ScaleGranularity.PER_BLOCK)
    verdict = supports(mx, Backend.TRITON, Arch.SM90)
    assert verdict.status is Status.NOT_LOWERED and "mxfp4" in verdict.reason


def test_trees_at_page_1_and_other_dims():
    v = base_variant(Family.MLA)
    tree = dataclasses.replace(v, spec_topk=4, num_draft_tokens=8)
    assert "trees" in supports(tree, Backend.TRITON, Arch.SM90).reason  # page size 64
    custom = dataclasses.replace(tree.mask, kind=MaskKind.CUSTOM)
    page1 = dataclasses.replace(tree, page_size=1, mask=custom)
    assert supports(page1, Backend.TRITON, Arch.SM90).ok
    wide = dataclasses.replace(v, shape=dataclasses.replace(v.shape, kv_lora_rank=256))
    assert supports(wide, Backend.TRITON, Arch.SM90).status is Status.NOT_LOWERED
