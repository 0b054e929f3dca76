"""Bad specs: each fixture in tests/spec/bad_specs/ fails with exactly this message (file:line)."""

from __future__ import annotations


import re
from pathlib import Path

import pytest

from attngen.generate import misplaced
from attngen.spec.enums import Family
from attngen.spec.errors import SpecError
from attngen.spec.loader import load_spec
from attngen.validate import check_plans, validate
from attngen.testing.paths import REPO_ROOT as ROOT

FIXTURES = ROOT / "tests" / "spec" / "bad_specs"

# The one list of known failures: fixture name -> the exact error text.
EXPECTED = {
    "bad_yaml": (
        "tests/spec/bad_specs/bad_yaml.yaml:4: not valid YAML: expected ',' or ']', but got '<stream end>'"
    ),
    "not_utf8": "tests/spec/bad_specs/not_utf8.yaml:2: not UTF-8 text (byte 15: 0xff)",
    "nested_too_deep": (
        "tests/spec/bad_specs/nested_too_deep.yaml:1: not a spec: YAML nested too deeply"
    ),
    "dsa_missing_mla": (
        "tests/spec/bad_specs/dsa_missing_mla.yaml:1: mla: required for family dsa"
    ),
    "dsa_sm80": (
        "tests/spec/bad_specs/dsa_sm80.yaml:14: targets.triton: sm80 cannot run variant r512_rope64_h16_ix64x128_top2048_ps64_bf16_causal: DSA's lightning indexer scores keys in fp8 e4m3, which sm80 lacks (possible on: triton sm90, triton sm100, cute_dsl sm90, cute_dsl sm100)"
    ),
    "dsa_sm80_bf16_index": (
        "tests/spec/bad_specs/dsa_sm80_bf16_index.yaml:15: targets.triton: no target lowers variant r512_rope64_h16_ix64x128bf16_top2048_ps64_bf16_causal: dsa.index_dtype bf16 needs no fp8, but DSA is not lowered for sm80 yet (its Triton kernels are tiled and compile-checked for sm90 and sm100 only) (triton sm80; lowered on: triton sm90, triton sm100)"
    ),
    "dsa_num_heads_top_level": (
        "tests/spec/bad_specs/dsa_num_heads_top_level.yaml:10: num_heads: unknown key (allowed: "
        "name, family, description, phases, dtype, heads, mla, gdn, dsa, kv_cache, mask, "
        "speculative, targets, tuning); it is written as mla.num_heads in mla and dsa specs"
    ),
    "dsa_topk": (
        "tests/spec/bad_specs/dsa_topk.yaml:10: dsa.index_topk: 3000 is not allowed: expected an integer in 64..8192 and a power of two"
    ),
    "gdn_chunk_size": (
        "tests/spec/bad_specs/gdn_chunk_size.yaml:9: gdn.chunk_size: 48 is not allowed: expected an integer in 16..128 and a power of two"
    ),
    "gdn_conv_kernel": (
        "tests/spec/bad_specs/gdn_conv_kernel.yaml:9: gdn.conv_kernel: 9 is not allowed: expected an integer in 2..8"
    ),
    "gdn_kv_cache": (
        "tests/spec/bad_specs/gdn_kv_cache.yaml:10: kv_cache: gdn keeps a recurrent state, not a KV cache"
    ),
    "gdn_sinks": (
        "tests/spec/bad_specs/gdn_sinks.yaml:10: mask: gdn is causal linear attention: no other mask kind, softcap or sinks"
    ),
    "mha_bad_name": (
        "tests/spec/bad_specs/mha_bad_name.yaml:1: name: 'Bad-Name' is not an identifier ([a-z][a-z0-9_]*)"
    ),
    "mha_cute_sm80": (
        "tests/spec/bad_specs/mha_cute_sm80.yaml:9: targets.cute_dsl: sm80 cannot run variant d128_g1_ps1_bf16_causal: attngen's CuTe DSL kernels are built on wgmma (sm90) and tcgen05 (sm100); sm80 has neither (possible on: triton sm80, triton sm90, triton sm100, cute_dsl sm90, cute_dsl sm100)"
    ),
    "mha_duplicate_axis_value": (
        "tests/spec/bad_specs/mha_duplicate_axis_value.yaml:6: heads.head_dim: 128 is listed twice"
    ),
    "mha_duplicate_key": ("tests/spec/bad_specs/mha_duplicate_key.yaml:5: phases: duplicate key"),
    "mha_fp8_e4m3_sm80": (
        "tests/spec/bad_specs/mha_fp8_e4m3_sm80.yaml:11: targets.triton: sm80 cannot run variant d128_g1_ps1_bf16_kvfp8_e4m3_causal: fp8 e4m3 conversion needs sm89+; sm80 has no e4m3 hardware type (possible on: triton sm90, triton sm100, cute_dsl sm90, cute_dsl sm100)"
    ),
    "mha_fp8_no_scale": (
        "tests/spec/bad_specs/mha_fp8_no_scale.yaml:9: kv_cache.scale: required when kv_cache.dtype includes fp8_e4m3"
    ),
    "mha_head_dim": (
        "tests/spec/bad_specs/mha_head_dim.yaml:6: heads.head_dim: no target lowers variant d100_g1_ps1_bf16_causal: head_dim 100 is not lowered yet (triton sm90; lowered on: none yet)"
    ),
    "mha_gqa_group_not_lowered": (
        "tests/spec/bad_specs/mha_gqa_group_not_lowered.yaml:7: heads.gqa_group: no target lowers variant d128_g100_ps1_bf16_causal: gqa_group 100 > 64 is not lowered (triton sm80; lowered on: none yet)"
    ),
    "mha_name_keyword": (
        "tests/spec/bad_specs/mha_name_keyword.yaml:1: name: 'class' is a Python keyword (the generated package name)"
    ),
    "mha_softcap_nan": (
        "tests/spec/bad_specs/mha_softcap_nan.yaml:8: mask.logit_softcap: .nan is not a finite number"
    ),
    "mha_description_two_lines": (
        "tests/spec/bad_specs/mha_description_two_lines.yaml:3: description: 'first line\\nsecond line': one line of printable text expected"
    ),
    "mha_kv_dtype_twice": (
        "tests/spec/bad_specs/mha_kv_dtype_twice.yaml:9: axes: two axis values give the same variant d128_g1_ps1_bf16_causal (e.g. kv_cache.dtype auto next to the activation dtype): list each variant once"
    ),
    "mha_misspelled_required_key": (
        "tests/spec/bad_specs/mha_misspelled_required_key.yaml:6: heads.head_dims: unknown key (allowed: head_dim, v_head_dim, gqa_group); did you mean head_dim?"
    ),
    "mha_merge_key": (
        "tests/spec/bad_specs/mha_merge_key.yaml:10: heads.<<: YAML merge keys are not supported: write the keys out"
    ),
    "mha_missing_targets": (
        "tests/spec/bad_specs/mha_missing_targets.yaml:1: targets: required field is missing"
    ),
    "mha_page_not_pow2": (
        "tests/spec/bad_specs/mha_page_not_pow2.yaml:8: kv_cache.page_size: 48 is not allowed: expected an integer in 1..128 and a power of two"
    ),
    "mha_spec_topk_gt_drafts": (
        "tests/spec/bad_specs/mha_spec_topk_gt_drafts.yaml:11: speculative.num_draft_tokens: must be >= topk"
    ),
    "mha_tuning_key": (
        "tests/spec/bad_specs/mha_tuning_key.yaml:12: tuning.triton.sm90.block_q: unknown tile key (allowed: decode_block_n, decode_num_warps, decode_num_stages, max_splits, combine_num_warps, extend_block_m, extend_block_n, extend_num_warps, extend_num_stages, verify_block_m, verify_block_n, verify_num_warps)"
    ),
    "mha_tuning_value": (
        "tests/spec/bad_specs/mha_tuning_value.yaml:13: tuning.triton.sm90.decode_num_warps: 32 is not allowed: expected one of 1, 2, 4, 8, 16"
    ),
    "mha_tuning_without_backend": (
        "tests/spec/bad_specs/mha_tuning_without_backend.yaml:10: tuning: unknown value 'sm90': expected one of triton, cute_dsl"
    ),
    "mha_unknown_key": (
        "tests/spec/bad_specs/mha_unknown_key.yaml:7: heads.gqa_groups: unknown key (allowed: head_dim, v_head_dim, gqa_group); did you mean gqa_group?"
    ),
    "mha_verify_without_speculative": (
        "tests/spec/bad_specs/mha_verify_without_speculative.yaml:1: speculative: required when phases include verify or draft_extend"
    ),
    "mha_window_without_size": (
        "tests/spec/bad_specs/mha_window_without_size.yaml:8: mask.window_left: required when mask.kind is sliding_window, and only then"
    ),
    "mha_wrong_type": (
        "tests/spec/bad_specs/mha_wrong_type.yaml:7: heads.gqa_group: expected an integer in 1..128, got 'four'"
    ),
    "mla_heads_section": (
        "tests/spec/bad_specs/mla_heads_section.yaml:7: heads: not used by family mla (it takes: mla)"
    ),
    "mla_latent_rank": (
        "tests/spec/bad_specs/mla_latent_rank.yaml:6: mla.kv_lora_rank: 500 is not allowed: expected an integer in 64..1024 and a power of two"
    ),
    "mla_missing_rank": (
        "tests/spec/bad_specs/mla_missing_rank.yaml:6: mla.kv_lora_rank: required field is missing"
    ),
    "gdn_empty_section": (
        "tests/spec/bad_specs/gdn_empty_section.yaml:5: gdn.key_dim: required field is missing"
    ),
    "mla_gluon_sm80": (
        "tests/spec/bad_specs/mla_gluon_sm80.yaml:11: tuning.triton.sm80: r512_rope64_h16_ps1_bf16_causal: decode_gluon=1 runs sm90 warpgroup MMA kernels, not sm80"
    ),
    "mla_gluon_tile": (
        "tests/spec/bad_specs/mla_gluon_tile.yaml:13: tuning.triton.sm90: r512_rope64_h16_ps64_bf16_causal: decode_gluon=1 takes 64 heads x 64 rows on 8 warps (a 16-bit or fp8 cache, head-major) in 1 part, not the bfloat16 cache at decode_block_h=16, decode_block_n=64, decode_num_warps=8, decode_num_stages=2, decode_lora_parts=1"
    ),
    "mla_max_registers_without_gluon": (
        "tests/spec/bad_specs/mla_max_registers_without_gluon.yaml:11: tuning.triton.sm100: decode_max_registers: no kernel of this spec on sm100 reads it: only the Gluon absorbed kernels (decode_gluon=1) take a register cap; it would tune nothing, remove it"
    ),
    "mla_value_reload_gluon": (
        "tests/spec/bad_specs/mla_value_reload_gluon.yaml:13: tuning.triton.sm90: decode_value_reload: no kernel of this spec on sm90 reads it: only the Triton absorbed kernel reads it (decode_gluon=0, or draft-tree verify); it would tune nothing, remove it"
    ),
    "mla_num_stages_gluon": (
        "tests/spec/bad_specs/mla_num_stages_gluon.yaml:11: tuning.triton.sm90: decode_num_stages: no kernel of this spec on sm90 reads it: the head-major Gluon kernel (decode_gluon=1, decode_keys_major=0) pipelines itself; it would tune nothing, remove it"
    ),
    # q (128 x 576 bf16) beside one 32-row latent tile; Triton 3.6 allocates 192512 B
    "mla_block_h_shared_memory": (
        "tests/spec/bad_specs/mla_block_h_shared_memory.yaml:11: tuning.triton.sm80: r512_rope64_h128_ps64_bf16_causal: decode_block_h=128 heads of q + decode_block_n=32 x decode_num_stages=2 latent rows (512 + 64 wide): at least 184320 B of shared memory, over sm80's 166912"
    ),
    "dsa_v_head_dim": (
        "tests/spec/bad_specs/dsa_v_head_dim.yaml:6: mla.v_head_dim: no target lowers variant r512_rope64_h16_ix64x128_top2048_ps64_bf16_causal: nope/v head dims (128, 256) are not lowered (DeepSeek's (128, 128) are; the sparse kernels run absorbed over the latent and never read them) (triton sm90; lowered on: none yet)"
    ),
    "dsa_num_stages_gluon": (
        "tests/spec/bad_specs/dsa_num_stages_gluon.yaml:17: tuning.triton.sm90: sparse_num_stages: no kernel of this spec on sm90 reads it: the Gluon sparse kernel (sparse_gluon=1) pipelines itself; it would tune nothing, remove it"
    ),
    "dsa_page_16": (
        "tests/spec/bad_specs/dsa_page_16.yaml:9: kv_cache.page_size: dsa needs 64-token pages, not 16: the indexer's key cache packs 64 keys per page, and sparse MLA reads the latent cache in the same pages"
    ),
    # scalars are read by the spec language's rules, never YAML 1.1's
    "mha_value_equals": (
        "tests/spec/bad_specs/mha_value_equals.yaml:6: heads.head_dim: expected an integer in 1..512, got '='"
    ),
    "mha_value_merge_marker": (
        "tests/spec/bad_specs/mha_value_merge_marker.yaml:7: heads.gqa_group: expected an integer in 1..128, got '<<'"
    ),
    "mha_value_timestamp": (
        "tests/spec/bad_specs/mha_value_timestamp.yaml:6: heads.head_dim: expected an integer in 1..512, got '2001-02-30'"
    ),
    "mha_value_document_marker": (
        "tests/spec/bad_specs/mha_value_document_marker.yaml:6: heads.head_dim: expected an integer in 1..512, got '--- !!foo x'"
    ),
    "mha_name_document_marker": (
        "tests/spec/bad_specs/mha_name_document_marker.yaml:1: name: '--- fz_other' is not an identifier ([a-z][a-z0-9_]*)"
    ),
    "mha_softcap_overflow": (
        "tests/spec/bad_specs/mha_softcap_overflow.yaml:8: mask.logit_softcap: 1000000000000000000000000000000000000... is not a finite number"
    ),
    "mha_tuning_no_value": (
        "tests/spec/bad_specs/mha_tuning_no_value.yaml:12: tuning.triton.sm90.decode_num_warps: no value: expected one of 1, 2, 4, 8, 16"
    ),
    "mha_tag_str": (
        "tests/spec/bad_specs/mha_tag_str.yaml:6: heads.head_dim: YAML tags are not allowed, got !!str: a spec is plain data (drop the tag)"
    ),
    "mha_tag_python": (
        "tests/spec/bad_specs/mha_tag_python.yaml:6: heads.head_dim: YAML tags are not allowed, got !!python/object:os.system: a spec is plain data (drop the tag)"
    ),
    "mha_tag_local": (
        "tests/spec/bad_specs/mha_tag_local.yaml:5: heads: YAML tags are not allowed, got !shape: a spec is plain data (drop the tag)"
    ),
    "mha_octal_window": (
        "tests/spec/bad_specs/mha_octal_window.yaml:9: mask.window_left: expected an integer in 1..1048576, got '0400'"
    ),
    "mha_octal_page": (
        "tests/spec/bad_specs/mha_octal_page.yaml:8: kv_cache.page_size: expected an integer in 1..128 and a power of two, got '010'"
    ),
    "mha_base60_head_dim": (
        "tests/spec/bad_specs/mha_base60_head_dim.yaml:6: heads.head_dim: expected an integer in 1..512, got '2:08'"
    ),
    "mha_base60_softcap": (
        "tests/spec/bad_specs/mha_base60_softcap.yaml:8: mask.logit_softcap: expected a number from 1e-06 to 1e+06, got '1:30.5'"
    ),
    "mha_hex_head_dim": (
        "tests/spec/bad_specs/mha_hex_head_dim.yaml:6: heads.head_dim: expected an integer in 1..512, got '0x80'"
    ),
    "mha_too_many_variants": (
        "tests/spec/bad_specs/mha_too_many_variants.yaml:1: axes: 8192 variants (heads.head_dim 64 x heads.v_head_dim 64 x heads.gqa_group 2): at most 4096 per spec; list fewer values per axis or split the spec"
    ),
    "mha_description_empty": (
        "tests/spec/bad_specs/mha_description_empty.yaml:3: description: expected one line of text, got ''"
    ),
    "mha_description_blank": (
        "tests/spec/bad_specs/mha_description_blank.yaml:3: description: expected one line of text, got '   '"
    ),
    "mha_targets_no_archs": (
        "tests/spec/bad_specs/mha_targets_no_archs.yaml:8: targets.triton: the arch list is missing: expected a list of sm80, sm90, sm100"
    ),
    "mha_complex_key": (
        "tests/spec/bad_specs/mha_complex_key.yaml:7: heads: keys must be plain names, got a list"
    ),
    "mha_two_documents": (
        "tests/spec/bad_specs/mha_two_documents.yaml:9: a spec file holds one YAML document: a second starts here"
    ),
    "mha_nul_byte": (
        "tests/spec/bad_specs/mha_nul_byte.yaml:4: not valid YAML: character #x0000: special characters are not allowed"
    ),
    # a value written where it is needed, misspellings named with the closest spelling
    "mha_arch_twice": (
        "tests/spec/bad_specs/mha_arch_twice.yaml:11: targets.triton: sm90 is listed twice"
    ),
    "mha_targets_no_value": (
        "tests/spec/bad_specs/mha_targets_no_value.yaml:7: targets: required field has no value"
    ),
    "mha_heads_no_value": (
        "tests/spec/bad_specs/mha_heads_no_value.yaml:5: heads: required for family mha, but has "
        "no value"
    ),
    "mla_num_heads_no_value": (
        "tests/spec/bad_specs/mla_num_heads_no_value.yaml:10: mla.num_heads: required field has "
        "no value"
    ),
    "mha_mask_kind_misspelled": (
        "tests/spec/bad_specs/mha_mask_kind_misspelled.yaml:8: mask.kind: unknown value "
        "'casual': expected one of causal, none, sliding_window, custom; did you mean causal?"
    ),
    "mha_tuning_key_misspelled": (
        "tests/spec/bad_specs/mha_tuning_key_misspelled.yaml:12: "
        "tuning.triton.sm90.decode_num_warp: unknown tile key (allowed: decode_block_n, "
        "decode_num_warps, decode_num_stages, max_splits, combine_num_warps, extend_block_m, "
        "extend_block_n, extend_num_warps, extend_num_stages, verify_block_m, verify_block_n, "
        "verify_num_warps); did you mean decode_num_warps?"
    ),
    "gdn_family_upper_case": (
        "tests/spec/bad_specs/gdn_family_upper_case.yaml:2: family: unknown value 'GDN': "
        "expected one of mha, mla, gdn, dsa; did you mean gdn?"
    ),
    "dsa_default_page_size": (
        "tests/spec/bad_specs/dsa_default_page_size.yaml:1: kv_cache.page_size: dsa needs "
        "64-token pages, not 1 (the default): the indexer's key cache packs 64 keys per page, "
        "and sparse MLA reads the latent cache in the same pages"
    ),
    "mha_tuning_phase_not_generated": (
        "tests/spec/bad_specs/mha_tuning_phase_not_generated.yaml:16: "
        "tuning.cute_dsl.sm90.fwd_num_stages: only the kernels of phases prefill, extend, "
        "verify, draft_extend read it, and this spec generates decode: it would tune nothing; "
        "remove it (or add one of phases prefill, extend, verify, draft_extend)"
    ),
    "mla_tuning_phase_not_generated": (
        "tests/spec/bad_specs/mla_tuning_phase_not_generated.yaml:18: "
        "tuning.triton.sm90.ragged_block_m: only the kernels of phase extend read it, and this "
        "spec generates decode: it would tune nothing; remove it (or add phase extend)"
    ),
    "mha_tuning_target_lowers_nothing": (
        "tests/spec/bad_specs/mha_tuning_target_lowers_nothing.yaml:17: tuning.cute_dsl.sm90: "
        "cute_dsl sm90 lowers no variant of this spec (e.g. d128_g4_ps16_bf16_kvnvfp4_causal: "
        "nvfp4 KV cache is not lowered in CuTe DSL yet (the activation dtype; fp8_e4m3 for "
        "decode)), so this tuning would apply to nothing: remove it"
    ),
    "mla_no_target_lowers": (
        "tests/spec/bad_specs/mla_no_target_lowers.yaml:12: targets: no target lowers any variant of this spec: cute_dsl sm90 skips 1 of 1 variants (e.g. r512_rope64_h16_ps1_bf16_causal: no CuTe DSL lowering for mla yet)"
    ),
    # a field no lowering takes: the error points at the field's line, not the target's
    "gdn_key_dim_not_lowered": (
        "tests/spec/bad_specs/gdn_key_dim_not_lowered.yaml:6: gdn.key_dim: no target lowers "
        "variant k256_v128_gv2_sfp32_bf16_causal: key_dim 256 is not lowered (64, 128) (triton "
        "sm90; lowered on: none yet)"
    ),
    "mla_nope_dim_not_lowered": (
        "tests/spec/bad_specs/mla_nope_dim_not_lowered.yaml:8: mla.qk_nope_head_dim: no target "
        "lowers variant r512_rope64_h16_ps1_bf16_causal: latent/rope/nope/v dims (512, 64, 64, "
        "128) are not lowered (DeepSeek's (512, 64, 128, 128) are) (triton sm90; lowered on: "
        "none yet)"
    ),
    "mha_cute_fp8_extend": (
        "tests/spec/bad_specs/mha_cute_fp8_extend.yaml:10: kv_cache.dtype: no target lowers "
        "variant d128_g4_ps16_bf16_kvfp8_e4m3_causal: fp8_e4m3 KV cache in CuTe DSL: decode "
        "only, on sm100, sm90, per-tensor scales, pages of [16, 32, 64, 128] tokens (got extend "
        "on sm90, per_tensor scales, page 16) (cute_dsl sm90; lowered on: triton sm90, triton "
        "sm100)"
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_spec_message(name: str) -> None:
    """As `attngen validate` reads the fixture: the spec's checks, then its targets' plans
    (tuning values the kernels cannot take)."""
    with pytest.raises(SpecError) as info:
        spec = load_spec(FIXTURES / f"{name}.yaml", ROOT)
        check_plans(spec, validate(spec))
    assert str(info.value) == EXPECTED[name]


def test_every_fixture_is_listed() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.yaml")) == sorted(EXPECTED)


def test_fixtures_cover_every_family() -> None:
    families = {name.split("_", 1)[0] for name in EXPECTED}
    assert {"mha", "mla", "gdn", "dsa"} <= families
    assert len(set(EXPECTED.values())) >= 12


def test_a_spec_in_another_familys_folder_loads_with_a_warning(tmp_path: Path) -> None:
    folder = tmp_path / "specs" / "mla"
    folder.mkdir(parents=True)
    text = (ROOT / "specs" / "mha" / "gqa_paged.yaml").read_text()
    (folder / "gqa_paged.yaml").write_text(text)
    spec = load_spec(folder / "gqa_paged.yaml", tmp_path)
    warning = misplaced(spec)
    assert warning is not None and "a mha spec in the folder of mla specs" in warning
    assert misplaced(load_spec(ROOT / "specs" / "mha" / "gqa_paged.yaml", ROOT)) is None


def test_the_spec_layer_names_no_family() -> None:
    """Family sections live in the family packages (their FamilySpec), not in attngen/spec;
    the one vocabulary table (enums.py) is where family names are listed."""
    names = {f.value for f in Family} | {"heads", "Mha", "Mla", "Gdn", "Dsa"}
    for path in sorted((ROOT / "attngen" / "spec").glob("*.py")):
        if path.name == "enums.py":
            continue
        code = "\n".join(
            line.split("#")[0] for line in path.read_text().splitlines() if '"""' not in line
        )
        words = set(re.findall(r"[A-Za-z_]+", code))
        hits = sorted(n for n in names if n in words or any(w.startswith(n) for w in words))
        assert not hits, f"{path.name} names {hits}"


def test_validate_notes_targets_that_skip_variants(tmp_path, capsys):
    """A spec whose listed target cannot lower some variants (another target does) passes,
    and `attngen validate` says which target skips how many and why."""
    from attngen.cli import main

    spec = tmp_path / "fp4_mixed.yaml"
    spec.write_text(
        "name: fp4_mixed\ndescription: nvfp4 cache on Triton sm90 and CuTe DSL sm90\n"
        "family: mha\nphases: [decode]\ndtype: bf16\nheads: {head_dim: 128, gqa_group: 4}\n"
        "kv_cache: {page_size: 16, dtype: nvfp4, scale: per_block}\n"
        "targets: {triton: [sm90], cute_dsl: [sm90]}\n"
    )
    assert main(["validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"{spec}: ok (1 variants)" in out
    assert (
        f"{spec}: note: cute_dsl sm90 skips 1 of 1 variants (e.g. "
        "d128_g4_ps16_bf16_kvnvfp4_causal: nvfp4 KV cache is not lowered in CuTe DSL yet" in out
    )
    assert "triton sm90 skips" not in out


def test_validate_refuses_what_generate_would_refuse_at_lowering(tmp_path, capsys):
    """A tuning value the lowering's plan check refuses (GQA packing of a group that does not
    divide the 128-row CuTe DSL tile) fails `attngen validate` at the tuning section, with
    the message `attngen generate` gives."""
    from attngen.cli import main

    spec = tmp_path / "pack7.yaml"
    spec.write_text(
        "name: pack7\ndescription: a group of 7 packed\nfamily: mha\nphases: [prefill]\n"
        "dtype: bf16\nheads: {head_dim: 128, gqa_group: 7}\nkv_cache: {page_size: 64}\n"
        "targets: {cute_dsl: [sm90]}\ntuning:\n  cute_dsl:\n    sm90: {fwd_pack_gqa: 1}\n"
    )
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    problem = "fwd_pack_gqa: sm90, and a GQA group (7) dividing fwd_tile_m=128"
    assert f"{spec}:11: tuning.cute_dsl.sm90: d128_g7_ps64_bf16_causal: {problem}" in err, err
    assert main(["generate", "--specs", str(tmp_path), "--out", str(tmp_path / "g"),
                 "--arch", "sm90"]) == 1  # fmt: skip
    assert problem in capsys.readouterr().err
