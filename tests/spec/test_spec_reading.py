"""How spec values are read (the spec language's rules, never YAML 1.1's) and what
`attngen validate` refuses about its paths. The bad_specs fixtures pin one case each; these
cover the spellings around them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attngen.cli import main
from attngen.generate import MANY_VARIANTS
from attngen.spec.errors import SpecError
from attngen.spec.loader import load_spec
from attngen.validate import validate
from attngen.testing.paths import REPO_ROOT as ROOT

SPEC = """name: reading
family: mha
description: DESCRIPTION
phases: [decode]
heads:
  head_dim: HEAD_DIM
mask:
  logit_softcap: SOFTCAP
  sinks: SINKS
targets:
  triton: [sm90]
"""
PLAIN = {"DESCRIPTION": "plain", "HEAD_DIM": "128", "SOFTCAP": "30", "SINKS": "false"}


def spec_text(name: str = "reading", **values: str) -> str:
    text = SPEC.replace("name: reading", f"name: {name}")
    for key, value in {**PLAIN, **values}.items():
        text = text.replace(key, value)
    return text


def read(tmp_path: Path, **values: str):
    path = tmp_path / "reading.yaml"
    path.write_text(spec_text(**values), encoding="utf-8")
    spec = load_spec(path, tmp_path)
    validate(spec)
    return spec


@pytest.mark.parametrize(
    "written, value",
    [("30", 30.0), ("30.5", 30.5), ("1e3", 1000.0), ("1.5e-2", 0.015), ("2E1", 20.0)],
)
def test_softcap_takes_decimal_numbers_and_exponents(tmp_path, written, value) -> None:
    assert read(tmp_path, SOFTCAP=written).mask.logit_softcap == value


@pytest.mark.parametrize(
    "written, value",
    [("--- hello", "--- hello"), ("'2001-02-30'", "2001-02-30"), ("a: b", None)],
)
def test_a_description_is_the_text_written(tmp_path, written, value) -> None:
    if value is None:  # `description: a: b` is not valid YAML
        with pytest.raises(SpecError, match="not valid YAML"):
            read(tmp_path, DESCRIPTION=written)
        return
    assert read(tmp_path, DESCRIPTION=written).description == value


@pytest.mark.parametrize(
    "field, written, message",
    [
        ("HEAD_DIM", "'128'", "heads.head_dim: expected an integer in 1..512, got '128'"),
        ("HEAD_DIM", "+128", "heads.head_dim: expected an integer in 1..512, got '+128'"),
        ("HEAD_DIM", "1_28", "heads.head_dim: expected an integer in 1..512, got '1_28'"),
        ("HEAD_DIM", "0b10000000", "expected an integer in 1..512, got '0b10000000'"),
        ("HEAD_DIM", "0200", "heads.head_dim: expected an integer in 1..512, got '0200'"),
        ("HEAD_DIM", "2001-13-45", "expected an integer in 1..512, got '2001-13-45'"),
        ("HEAD_DIM", "<<", "heads.head_dim: expected an integer in 1..512, got '<<'"),
        ("HEAD_DIM", "!!float 128", "heads.head_dim: YAML tags are not allowed, got !!float"),
        ("HEAD_DIM", "!!int 128", "heads.head_dim: YAML tags are not allowed, got !!int"),
        ("HEAD_DIM", "! 128", "heads.head_dim: YAML tags are not allowed, got !:"),
        ("HEAD_DIM", "1" + "0" * 5000, "head_dim: 1000000000000000000000000000000000000... is not"),
        ("SOFTCAP", "'30'", "mask.logit_softcap: expected a number from 1e-06 to 1e+06, got '30'"),
        ("SOFTCAP", ".5", "mask.logit_softcap: expected a number from 1e-06 to 1e+06, got '.5'"),
        ("SOFTCAP", "1e400", "mask.logit_softcap: 1e400 is not a finite number"),
        ("SOFTCAP", "-.inf", "mask.logit_softcap: -.inf is not a finite number"),
        ("SOFTCAP", "-2", "mask.logit_softcap: -2 is out of range: expected a number from 1e-06"),
        # fp32 reads 1e300 as inf and 1e-300 as 0 (cap * tanh(s / cap) is NaN either way)
        ("SOFTCAP", "1e300", "mask.logit_softcap: 1e300 is out of range: expected a number"),
        ("SOFTCAP", "1e-300", "mask.logit_softcap: 1e-300 is out of range: expected a number"),
        ("SOFTCAP", "0." + "0" * 400 + "1", "logit_softcap: 0.00000000000000000000000000000000"),
        ("SOFTCAP", "30.000000000000000000000001", "has more digits than a float64 holds"),
        ("DESCRIPTION", "x" * 301, "description: 301 characters: at most 300"),
        ("SINKS", "yes", "mask.sinks: expected true or false, got 'yes'"),
        ("SINKS", "'true'", "mask.sinks: expected true or false, got 'true'"),
        ("DESCRIPTION", "=", "description: expected a string, got '=' (quote it to make it text)"),
        ("DESCRIPTION", "2001-02-30", "description: expected a string, got '2001-02-30'"),
        ("DESCRIPTION", "!!str x", "description: YAML tags are not allowed, got !!str"),
    ],
)
def test_spellings_yaml_would_reread_are_refused(tmp_path, field, written, message) -> None:
    with pytest.raises(SpecError) as info:
        read(tmp_path, **{field: written})
    assert message in str(info.value)


def spec_file(folder: Path, name: str, text: str | None = None) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text or spec_text(name), encoding="utf-8")
    return path


def test_a_file_named_twice_is_validated_once(tmp_path, capsys) -> None:
    path = spec_file(tmp_path, "fz_twice")
    assert main(["validate", str(path), str(path), str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{path}: ok (1 variants)\n" and captured.err == ""


def test_a_file_named_alone_must_not_reuse_a_name_of_specs(tmp_path, capsys) -> None:
    """generate loads specs/ as a whole, so a new file's name must be free there too."""
    text = (ROOT / "specs" / "mha" / "gqa_paged.yaml").read_text()
    (tmp_path / "new.yaml").write_text(text)
    assert main(["validate", str(tmp_path / "new.yaml")]) == 1
    err = capsys.readouterr().err
    assert "new.yaml:3: name: 'mha_gqa_paged' is already used by " in err
    assert err.rstrip().endswith("specs/mha/gqa_paged.yaml")
    # the spec itself, and a folder holding the copy (as `generate --specs` would take it)
    assert main(["validate", str(ROOT / "specs" / "mha" / "gqa_paged.yaml")]) == 0
    assert main(["validate", str(tmp_path)]) == 0


@pytest.mark.parametrize(
    "path, message",
    [
        ("", "error: an empty path names no spec file or folder"),
        (os.devnull, f"error: {os.devnull}: not a regular file or a folder of spec files"),
        ("FIFO", "fifo.yaml: not a regular file or a folder of spec files"),
    ],
)
def test_paths_that_are_not_spec_files_are_refused(tmp_path, capsys, path, message) -> None:
    if path == "FIFO":
        path = str(tmp_path / "fifo.yaml")
        os.mkfifo(path)
    assert main(["validate", path]) == 1
    assert message in capsys.readouterr().err


def test_validate_warns_where_generate_does(tmp_path, capsys) -> None:
    """Above generate.MANY_VARIANTS variants both warn; the spec still validates."""
    groups = "[1, 2, 4, 8, 16, 32, 64]"
    text = (
        "name: fz_many\nfamily: mha\ndescription: many variants\nphases: [decode]\n"
        f"dtype: [bf16, fp16]\nheads: {{head_dim: [64, 128, 256], gqa_group: {groups}}}\n"
        "kv_cache: {page_size: [1, 2, 4, 8, 16, 32, 64, 128]}\ntargets: {triton: [sm90]}\n"
    )
    path = spec_file(tmp_path, "fz_many", text)
    assert main(["validate", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"{path}: ok (336 variants)" in captured.out
    assert f"336 variants (over {MANY_VARIANTS})" in captured.err


PHASES = ("prefill", "extend", "decode", "verify", "draft_extend")


@pytest.mark.parametrize(
    "word, choices, hint",
    [
        ("decod", PHASES, "; did you mean decode?"),
        ("Decode", PHASES, "; did you mean decode?"),  # case aside
        ("verfy", PHASES, "; did you mean verify?"),
        ("sm89", ("sm80", "sm90", "sm100"), ""),  # as close to sm80 as to sm90: no guess
        ("xyz", PHASES, ""),
        ("decode" * 10, PHASES, ""),  # too long to be a misspelling
    ],
)
def test_a_misspelling_gets_the_one_closest_spelling(word, choices, hint) -> None:
    from attngen.spec.fields import did_you_mean

    assert did_you_mean(word, choices) == hint


@pytest.mark.parametrize(
    "written, uri_part", [("30", "cap30"), ("0.5", "cap0.5"), ("30.00001", "cap30.00001")]
)
def test_a_softcap_is_spelled_exactly_in_the_uri(tmp_path, written, uri_part) -> None:
    """The uri is a variant's identity: 30.00001 is not named as 30 (``:g`` rounded it)."""
    spec = read(tmp_path, SOFTCAP=written)
    assert validate(spec)[0].uri == f"d128_g1_ps1_bf16_causal_{uri_part}"


def test_a_gdn_chunk_size_other_than_64_marks_the_uri(tmp_path) -> None:
    text = (ROOT / "specs" / "gdn" / "qwen3_next.yaml").read_text()
    uris = []
    for chunk in (64, 32):
        path = spec_file(tmp_path, "fz_gdn", text.replace("chunk_size: 64", f"chunk_size: {chunk}"))
        uris.append(validate(load_spec(path, tmp_path))[0].uri)
    assert uris == [
        "k128_v128_gv2_sfp32_bf16_causal_topk1",
        "k128_v128_gv2_sfp32_c32_bf16_causal_topk1",
    ]


def test_a_file_name_that_is_not_utf8_is_refused(tmp_path, capsys) -> None:
    """Generated files name their spec in UTF-8: a name with other bytes is refused by
    validate and generate alike (generate crashed encoding it)."""
    specs = tmp_path / "specs"
    specs.mkdir()
    with open(os.path.join(os.fsencode(specs), b"caf\xe9.yaml"), "wb") as f:
        f.write(spec_text("fz_latin1").encode())
    message = "caf\\xe9.yaml:1: the file name is not UTF-8 (generated files name their spec)"
    assert main(["validate", str(specs)]) == 1
    assert message in capsys.readouterr().err
    out = tmp_path / "out"
    assert main(["generate", "--specs", str(specs), "--out", str(out), "--arch", "sm90"]) == 1
    assert message in capsys.readouterr().err and not out.exists()


def test_spec_suffixes_count_in_any_case(tmp_path, capsys) -> None:
    """A spec saved as x.YAML is validated and generated, not silently passed over."""
    path = spec_file(tmp_path, "fz_upper")
    path.rename(tmp_path / "fz_upper.YAML")
    assert main(["validate", str(tmp_path)]) == 0
    assert "fz_upper.YAML: ok (1 variants)" in capsys.readouterr().out


def test_a_file_too_large_to_be_a_spec_is_refused_unread(tmp_path, capsys) -> None:
    """YAML composes about half a megabyte a second: a large file is refused by its size."""
    from attngen.spec.loader import MAX_SPEC_BYTES

    padding = "# " + "x" * 78 + "\n"
    text = spec_text("fz_large") + padding * (MAX_SPEC_BYTES // len(padding) + 1)
    path = spec_file(tmp_path, "fz_large", text)
    assert main(["validate", str(path)]) == 1
    assert f"fz_large.yaml:1: not a spec: over {MAX_SPEC_BYTES} bytes" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["x<img src=x onerror=alert(1)>", "x{y}", "a b", "x`y", "-lead", "caf\u00e9"]
)
def test_a_file_name_with_markup_characters_is_refused(tmp_path, capsys, name) -> None:
    """The support matrix prints a spec's path in a Markdown / MDX heading: a name with
    markup (HTML tags, JSX braces, backticks) would be markup there."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(spec_text("fz_markup"), encoding="utf-8")
    assert main(["validate", str(path)]) == 1
    assert (
        "the file name may hold letters, digits, '_', '-' and '.' only" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "line, hint",
    [
        ("page_size: 16", "it is written as kv_cache.page_size"),
        ("window_left: 64", "it is written as mask.window_left"),
        ("topk: 2", "it is written as speculative.topk"),
        ("chunk_size: 64", "it is written as gdn.chunk_size in gdn specs"),
        ("page_sizes: [16]", "did you mean kv_cache.page_size?"),
        ("phasess: [decode]", "did you mean phases?"),
    ],
)
def test_a_key_of_a_section_written_at_the_top_is_pointed_there(tmp_path, line, hint) -> None:
    path = spec_file(tmp_path, "fz_level", spec_text("fz_level") + line + "\n")
    with pytest.raises(SpecError) as info:
        load_spec(path, tmp_path)
    assert str(info.value).endswith(hint)


def test_a_kv_scale_applies_to_the_quantized_dtypes_of_a_mixed_list(tmp_path) -> None:
    """``dtype: [bf16, fp8_e4m3]`` with a scale: the bf16 cache variant has no scale (it was
    built as a scaled cache, wanting k/v scales a bf16 cache does not have)."""
    text = (ROOT / "specs" / "mha" / "fp8_kv.yaml").read_text()
    text = text.replace("dtype: [fp8_e4m3, fp8_e5m2]", "dtype: [bf16, fp8_e4m3]")
    path = spec_file(tmp_path, "fz_mixed_kv", text.replace("mha_fp8_kv", "fz_mixed_kv"))
    scales = {(v.kv_dtype.value, v.kv_scale and v.kv_scale.value)
              for v in validate(load_spec(path, tmp_path))}  # fmt: skip
    assert scales == {("bf16", None), ("fp8_e4m3", "per_tensor")}


@pytest.mark.parametrize(
    "tuning, where",
    [("tuning: {}", "tuning"), ("tuning:\n  triton: {}", "tuning.triton"),
     ("tuning:\n  triton:\n    sm90: {}", "tuning.triton.sm90")],
)  # fmt: skip
def test_an_empty_tuning_level_is_refused(tmp_path, tuning, where) -> None:
    """It tunes nothing: an author who meant to tune something hears so."""
    path = spec_file(tmp_path, "fz_tuning", spec_text("fz_tuning") + tuning + "\n")
    with pytest.raises(SpecError, match=f"{where}: empty: name"):
        load_spec(path, tmp_path)


def test_field_at_gives_a_written_fields_line_or_none() -> None:
    """Where validate points an error about a field (a verdict's ``field``): the key's own
    line when the spec writes it, None when it is left at its default."""
    spec = load_spec(ROOT / "specs/mha/spec_tree.yaml", ROOT)
    lines = (ROOT / "specs/mha/spec_tree.yaml").read_text().splitlines()
    for path, text in [
        ("phases", "phases:"),
        ("dtype", "dtype:"),
        ("heads.gqa_group", "  gqa_group:"),
        ("kv_cache.page_size", "  page_size:"),
        ("mask.kind", "  kind:"),
        ("speculative.topk", "  topk:"),
    ]:
        where = spec.field_at(path)
        assert where is not None and lines[where.line - 1].startswith(text), path
    for path in ("heads.v_head_dim", "kv_cache.dtype", "mask.window_left", "no_such.key"):
        assert spec.field_at(path) is None, path
