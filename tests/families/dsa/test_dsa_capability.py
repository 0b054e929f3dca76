"""What the DSA x Triton lowering claims, asked through the one supports() entry point, and
the spec checks of DSA (64-token pages, the fp8 layout's per-block scales)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from attngen.capabilities import supports
from attngen.probes import base_variant
from attngen.spec.enums import Arch, Backend, DType, Family, MaskKind, ScaleGranularity
from attngen.spec.errors import SpecError
from attngen.spec.loader import load_spec
from attngen.verdict import Status

SPEC = Path(__file__).resolve().parents[3] / "specs" / "dsa" / "deepseek_v32_fp8.yaml"


def test_dsa_lowered_on_triton_sm90_sm100():
    v = base_variant(Family.DSA)
    assert v.page_size == 64
    for arch in (Arch.SM90, Arch.SM100):
        assert supports(v, Backend.TRITON, arch).ok, arch
    assert supports(v, Backend.TRITON, Arch.SM80).status is Status.UNSUPPORTED  # fp8 indexer
    assert supports(v, Backend.CUTE_DSL, Arch.SM90).status is Status.NOT_LOWERED


def test_latent_layouts_and_limits():
    v = base_variant(Family.DSA)
    fp8 = dataclasses.replace(v, kv_dtype=DType.FP8_E4M3, kv_scale=ScaleGranularity.PER_BLOCK)
    assert supports(fp8, Backend.TRITON, Arch.SM90).ok
    per_tensor = dataclasses.replace(fp8, kv_scale=ScaleGranularity.PER_TENSOR)
    assert "per 128 values" in supports(per_tensor, Backend.TRITON, Arch.SM90).reason
    fp4 = dataclasses.replace(v, kv_dtype=DType.NVFP4, kv_scale=ScaleGranularity.PER_BLOCK)
    assert "656-byte" in supports(fp4, Backend.TRITON, Arch.SM90).reason
    page1 = dataclasses.replace(v, page_size=1)
    assert "64-token pages" in supports(page1, Backend.TRITON, Arch.SM90).reason
    tree = dataclasses.replace(
        v, spec_topk=4, num_draft_tokens=4, mask=dataclasses.replace(v.mask, kind=MaskKind.CUSTOM)
    )
    assert "chains" in supports(tree, Backend.TRITON, Arch.SM90).reason
    many = dataclasses.replace(v, shape=dataclasses.replace(v.shape, index_heads=32))
    assert "indexer dims" in supports(many, Backend.TRITON, Arch.SM90).reason


def test_page_size_must_be_64(tmp_path):
    text = SPEC.read_text().replace("page_size: 64", "page_size: [16, 64]")
    path = tmp_path / "dsa.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="dsa needs 64-token pages, not 16"):
        load_spec(path)
