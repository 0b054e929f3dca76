"""Family rules that a spec loader cannot know and a kernel would silently ignore: MLA and
DSA have no softcap or sinks, speculative MHA needs an ordered (causal) base mask, tuned
MHA verify tiles replace the heuristic ones, and DSA's Gluon switch is checked where it
applies (the plan refuses it, not the GPU launch)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from attngen.families.dsa.triton import lower as dsa_lower
from attngen.families.dsa.triton import verify as dsa_verify
from attngen.families.mha.triton import lower as mha_lower
from attngen.probes import base_variant
from attngen.spec.enums import Arch, Family, Phase
from attngen.spec.errors import SpecError
from attngen.spec.loader import load_spec

MLA = """name: {name}
family: {family}
description: rule check
phases: [extend, decode]
dtype: bf16
mla:
  kv_lora_rank: 512
  qk_rope_head_dim: 64
  qk_nope_head_dim: 128
  v_head_dim: 128
  num_heads: 16
{extra}kv_cache:
  page_size: 64
mask:
  {mask}
targets:
  triton: [sm90]
"""
DSA_SECTION = "dsa:\n  index_heads: 64\n  index_head_dim: 128\n  index_topk: 2048\n"


def _load(tmp_path: Path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path, tmp_path)


@pytest.mark.parametrize("family, extra", [("mla", ""), ("dsa", DSA_SECTION)])
@pytest.mark.parametrize("mask", ["logit_softcap: 30.0", "sinks: true"])
def test_mla_and_dsa_refuse_softcap_and_sinks(tmp_path, family, extra, mask) -> None:
    text = MLA.format(name=f"{family}_rule", family=family, extra=extra, mask=mask)
    with pytest.raises(SpecError, match=f"mask.{mask.split(':')[0]}: {family} has no logit"):
        _load(tmp_path, text)
    ok = MLA.format(name=f"{family}_rule", family=family, extra=extra, mask="kind: causal")
    assert _load(tmp_path, ok).family is Family(family)


MHA_VERIFY = """name: mha_rule
family: mha
description: rule check
phases: [verify]
dtype: bf16
heads:
  head_dim: 128
  gqa_group: 4
kv_cache:
  page_size: 64
mask:
  kind: {kind}
speculative:
  topk: 1
  num_draft_tokens: 4
targets:
  triton: [sm90]
"""


def test_speculative_mha_needs_an_ordered_base_mask(tmp_path) -> None:
    with pytest.raises(SpecError, match="needs a causal .* base mask; mask.kind is none"):
        _load(tmp_path, MHA_VERIFY.format(kind="none"))
    assert _load(tmp_path, MHA_VERIFY.format(kind="causal")).speculative is not None


def test_tuned_verify_tiles_replace_the_heuristic_ones() -> None:
    v = base_variant(Family.MHA)
    v = dataclasses.replace(v, phases=(Phase.VERIFY,), spec_topk=1, num_draft_tokens=4)
    tuned = {"verify_block_m": 32, "verify_block_n": 32, "verify_num_warps": 8}
    c = mha_lower.kernel_config(v, Arch.SM90, tuned)
    assert (c.verify_block_m, c.verify_block_n, c.verify_num_warps) == (32, 32, 8)


def test_dsa_gluon_switch_is_checked_in_the_plan() -> None:
    v = base_variant(Family.DSA)
    c = dsa_lower.kernel_config(v, Arch.SM90, {"sparse_gluon": 0})
    assert not any("sparse_gluon" in p for p in dsa_verify.config_problems(c, "sm90"))
    on = dataclasses.replace(c, sparse_gluon=1)
    problems = dsa_verify.config_problems(on, "sm100")
    assert any("not sm100" in p for p in problems), problems
    if (c.sparse_block_h, c.sparse_block_n, c.sparse_num_warps) != (64, 64, 8):
        assert any("sparse_block_h 64" in p for p in problems), problems
    wide = dataclasses.replace(on, sparse_block_h=64, sparse_block_n=64, sparse_num_warps=8)
    assert not any("sparse_gluon" in p for p in dsa_verify.config_problems(wide, "sm90"))
    fp16_fp8 = dataclasses.replace(wide, kv_dtype="float8_e4m3fn", dtype="float16")
    assert any("bf16 activations" in p for p in dsa_verify.config_problems(fp16_fp8, "sm90"))
