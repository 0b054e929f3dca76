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
from attngen.verdict import Status, Verdict

SPEC = Path(__file__).resolve().parents[3] / "specs" / "dsa" / "deepseek_v32_fp8.yaml"


def test_dsa_lowered_on_triton_sm90_sm100():
    v = base_variant(Family.DSA)
    assert v.page_size == 64
    for arch in (Arch.SM90, Arch.SM100):
        assert supports(v, Backend.TRITON, arch).ok, arch
    assert supports(v, Backend.TRITON, Arch.SM80).status is Status.UNSUPPORTED  # fp8 indexer
    assert supports(v, Backend.CUTE_DSL, Arch.SM90).status is Status.NOT_LOWERED


def test_only_an_fp8_indexer_is_a_hardware_limit_on_sm80():
    v = base_variant(Family.DSA)
    assert v.shape.index_dtype is DType.FP8_E4M3
    fp8 = supports(v, Backend.TRITON, Arch.SM80)
    assert fp8 == Verdict(
        Status.UNSUPPORTED, "DSA's lightning indexer scores keys in fp8 e4m3, which sm80 lacks"
    )
    for index_dtype in (DType.BF16, DType.FP16, DType.FP32):
        plain = dataclasses.replace(v, shape=dataclasses.replace(v.shape, index_dtype=index_dtype))
        verdict = supports(plain, Backend.TRITON, Arch.SM80)
        assert verdict == Verdict(
            Status.NOT_LOWERED,
            f"dsa.index_dtype {index_dtype.value} needs no fp8, but DSA is not lowered for sm80 "
            "yet (its Triton kernels are tiled and compile-checked for sm90 and sm100 only)",
        ), index_dtype
        assert supports(plain, Backend.TRITON, Arch.SM90).ok
        # no indexer makes an fp8 latent cache possible on sm80: that is the KV dtype's limit
        fp8_rows = dataclasses.replace(
            plain, kv_dtype=DType.FP8_E4M3, kv_scale=ScaleGranularity.PER_BLOCK
        )
        verdict = supports(fp8_rows, Backend.TRITON, Arch.SM80)
        assert verdict.status is Status.UNSUPPORTED and "e4m3" in verdict.reason


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
