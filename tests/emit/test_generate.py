"""The generated tree: deterministic, parseable, headed, and equal to what is checked in."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attngen.emit.modules import sha256_text
from attngen.generate import build
from attngen.testing.paths import REPO_ROOT as ROOT

GENERATED = ROOT / "generated"


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return build(ROOT, ROOT / "specs", verbose=False).files


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attngen", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_build_is_deterministic(files: dict[str, str]) -> None:
    again = build(ROOT, ROOT / "specs", verbose=False).files
    assert again == files


def test_checked_in_tree_has_no_drift() -> None:
    result = run_cli("generate", "--arch", "all", "--check")
    assert result.returncode == 0, result.stderr


def test_generating_twice_gives_identical_trees(tmp_path: Path) -> None:
    for out in ("a", "b"):
        result = run_cli("generate", "--arch", "all", "--out", str(tmp_path / out))
        assert result.returncode == 0
        assert f"{tmp_path / out}/: " in result.stdout + result.stderr  # the tree it wrote
    a = {
        p.relative_to(tmp_path / "a"): p.read_bytes()
        for p in (tmp_path / "a").rglob("*")
        if p.is_file()
    }
    b = {
        p.relative_to(tmp_path / "b"): p.read_bytes()
        for p in (tmp_path / "b").rglob("*")
        if p.is_file()
    }
    assert a == b and a


def test_check_names_missing_changed_and_stale_files(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    shutil.copytree(GENERATED, out, ignore=shutil.ignore_patterns("__pycache__"))
    (out / "sm90/triton/mha/mha_gqa_paged/backend.py").unlink()
    with (out / "sm100/triton/mha/mha_gqa_paged/kernels.py").open("a") as f:
        f.write("# hand edit\n")
    (out / "sm80/leftover.py").write_text("x = 1\n")
    (out / "sm90/triton/mha/mha_empty_package").mkdir()
    (out / "sm90/triton/mha/mha_gqa_paged/graph.py").chmod(0o755)
    result = run_cli("generate", "--arch", "sm90", "--out", str(out), "--check")
    assert result.returncode == 1  # one arch asked for, every arch checked
    assert "missing: generated/sm90/triton/mha/mha_gqa_paged/backend.py" in result.stderr
    assert "changed: generated/sm100/triton/mha/mha_gqa_paged/kernels.py" in result.stderr
    assert "stale: generated/sm80/leftover.py" in result.stderr
    assert "stale folder: generated/sm90/triton/mha/mha_empty_package" in result.stderr
    assert "mode is not 644: generated/sm90/triton/mha/mha_gqa_paged/graph.py (755)" in (
        result.stderr
    )
    assert "--- diff of generated/sm100/triton/mha/mha_gqa_paged/kernels.py" in result.stderr
    assert "    -# hand edit" in result.stderr  # the diff shows the edit
    # the tree checked, and the command that regenerates it (make writes generated/ only)
    assert f"{out}/ is out of date: run `python -m attngen generate --arch all --out {out}`" in (
        result.stderr
    )
    assert run_cli("generate", "--arch", "all", "--out", str(out)).returncode == 0
    check = run_cli("generate", "--arch", "sm80", "--out", str(out), "--check")
    assert check.returncode == 0 and f"{out}/ is up to date" in check.stdout + check.stderr


def test_single_arch_generation_touches_only_its_subtree(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    shutil.copytree(GENERATED, out, ignore=shutil.ignore_patterns("__pycache__"))
    (out / "sm90/leftover.py").write_text("x = 1\n")
    (out / "sm100/triton/mha/mha_gqa_paged/graph.py").unlink()
    assert run_cli("generate", "--arch", "sm100", "--out", str(out)).returncode == 0
    assert (out / "sm100/triton/mha/mha_gqa_paged/graph.py").is_file()
    assert (out / "sm90/leftover.py").is_file()  # sm90 is not this run's to clean
    check = run_cli("generate", "--arch", "sm100", "--out", str(out), "--check")
    assert check.returncode == 1 and "stale: generated/sm90/leftover.py" in check.stderr


def test_generated_python_is_in_the_formatters_style(files: dict[str, str]) -> None:
    """Generation formats only files with long code lines (the formatter is 90% of its
    time): every template must emit the formatter's style itself. Checked on every file
    of three specs per family that generates and on the namespace packages."""
    import black

    from attngen.emit.python import MODE

    packages = sorted({rel.rsplit("/", 1)[0] for rel in files if rel.endswith("/kernels.py")})
    by_family: dict[str, list[str]] = {}
    for package in packages:
        by_family.setdefault(package.split("/")[2], []).append(package)
    chosen = {p for group in by_family.values() for p in group[:: max(1, len(group) // 3)]}
    sample = [
        rel
        for rel in files
        if rel.endswith(".py") and (rel.rsplit("/", 1)[0] in chosen or rel.count("/") < 3)
    ]
    assert sample
    unformatted = [rel for rel in sample if black.format_str(files[rel], mode=MODE) != files[rel]]
    assert not unformatted, f"not in the formatter's style: {unformatted[:5]}"


def test_every_python_file_parses_and_carries_the_header(files: dict[str, str]) -> None:
    for rel, text in files.items():
        if rel.endswith(".py"):
            ast.parse(text, filename=rel)
            assert text.startswith("# @generated by attngen from "), rel
            assert "DO NOT EDIT. Regenerate: make generate ARCH=" in text.splitlines()[1], rel
            assert text.splitlines()[2].startswith("# spec-hash: sha256:"), rel


def test_no_volatile_content(files: dict[str, str]) -> None:
    for rel, text in files.items():
        assert str(ROOT) not in text, f"{rel} holds an absolute path"


def test_manifest_lists_every_file_with_its_hash(files: dict[str, str]) -> None:
    manifest = json.loads(files["MANIFEST.json"])["files"]
    expected = {
        f"generated/{rel}": sha256_text(t) for rel, t in files.items() if rel != "MANIFEST.json"
    }
    assert manifest == expected


def test_schema_accepts_the_specs_and_rejects_a_typo(files: dict[str, str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = json.loads(files["schema/attngen-spec.schema.json"])
    for spec in sorted((ROOT / "specs").rglob("*.yaml")):
        jsonschema.validate(yaml.safe_load(spec.read_text()), schema)
    bad = yaml.safe_load((ROOT / "tests/spec/bad_specs/mha_unknown_key.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_two_plans_writing_one_path_fail_naming_both() -> None:
    from attngen.emit.writer import DuplicateWrite, write_once

    files: dict[str, str] = {}
    owners: dict[str, str] = {}
    write_once(files, owners, {"sm90/triton/mha/x/kernels.py": "a"}, "specs/a.yaml (triton sm90)")
    with pytest.raises(DuplicateWrite) as info:
        write_once(
            files, owners, {"sm90/triton/mha/x/kernels.py": "b"}, "specs/b.yaml (triton sm90)"
        )
    message = str(info.value)
    assert "generated/sm90/triton/mha/x/kernels.py" in message
    assert "specs/a.yaml (triton sm90)" in message and "specs/b.yaml (triton sm90)" in message
    assert files["sm90/triton/mha/x/kernels.py"] == "a"  # the first write stands


def test_generate_refuses_two_specs_that_would_write_one_package(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    text = (ROOT / "specs/mha/gqa_paged.yaml").read_text(encoding="utf-8")
    (specs / "a.yaml").write_text(text, encoding="utf-8")
    # a second plan for the same package path: the lowering emits it for every target, so
    # targeting the same backend and arch twice through two files must fail, not overwrite
    (specs / "b.yaml").write_text(text, encoding="utf-8")
    result = run_cli("generate", "--specs", str(specs), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "is already used by" in result.stderr  # caught at load, before any write
    assert not (tmp_path / "out").exists()


def test_generated_identities_match_the_imported_modules(files: dict[str, str]) -> None:
    """Evidence keys: the generator's kernel identity of every variant equals the one the
    GPU suite and the AOT check compute from the imported generated module."""
    import importlib

    from attngen.evidence import bound_library_sha256, module_identity
    from attngen.lower import plan_identities

    result = build(ROOT, ROOT / "specs", verbose=False)
    for plan in result.plans:
        module = importlib.import_module(plan.package.replace("/", ".") + ".kernels")
        ids = plan_identities(plan)
        assert module.LIBRARY_SHA256 == bound_library_sha256(module)
        for uri in module.CONFIGS:
            assert ids[uri] == module_identity(module, uri), (plan.package, uri)


def test_runtime_identities_match_the_packages_on_disk() -> None:
    """GPU evidence keys: the generator's runtime identity of every package equals the one
    the GPU recorder computes from the files on disk."""
    from attngen.evidence import package_runtime_identity
    from attngen.generate import plan_runtime_identity

    result = build(ROOT, ROOT / "specs", verbose=False)
    for plan in result.plans:
        want = package_runtime_identity(ROOT, ROOT / plan.package)
        assert plan_runtime_identity(ROOT, plan, result.files) == want, plan.package


def test_runtime_identity_follows_code_not_comments_or_docstrings(tmp_path: Path) -> None:
    from attngen.evidence import runtime_identity

    base = 'def f(x):\n    """Docs."""\n    return x + 1  # one\n'
    ident = runtime_identity(ROOT, "mha", {"backend.py": base})
    reworded = base.replace("Docs.", "Other docs.").replace("# one", "# two")
    assert runtime_identity(ROOT, "mha", {"backend.py": reworded}) == ident
    changed = base.replace("x + 1", "x + 2")
    assert runtime_identity(ROOT, "mha", {"backend.py": changed}) != ident
    assert runtime_identity(ROOT, "mla", {"backend.py": base}) != ident  # family runtime
    # what runs in a GPU check counts; the family's description (docs columns, spec
    # sections, registration) does not
    from attngen.evidence import DESCRIPTION_MODULES, _runtime_digests

    names = [name for name, _ in _runtime_digests(ROOT.resolve(), "mha")]
    assert "attngen/families/mha/runtime.py" in names
    assert "attngen/families/mha/reference.py" in names
    assert not [n for n in names if n.rsplit("/", 1)[-1] in DESCRIPTION_MODULES[1:]]
    assert "attngen/families/mha/__init__.py" not in names


def test_identities_cover_what_a_family_borrows_from_another() -> None:
    """A library that launches another family's kernel, and a runtime built on another
    family's runtime, hash those files too: editing them stales the evidence."""
    from attngen.evidence import _runtime_digests, imported_family_files, library_sha256

    families = ROOT / "attngen" / "families"
    sources = sorted((families / "dsa" / "triton").rglob("*.py"))
    borrowed = [p.relative_to(ROOT).as_posix() for p in imported_family_files(sources, "dsa")]
    assert "attngen/families/mla/triton/kernels/absorbed.py" in borrowed
    assert not [b for b in borrowed if b.startswith("attngen/families/dsa/")]
    assert not [b for b in borrowed if b.rsplit("/", 1)[1] in ("__init__.py", "spec.py")]
    # MHA's Triton library borrows nothing: its identity is its own files'
    assert imported_family_files(sorted((families / "mha" / "triton").rglob("*.py")), "mha") == []
    # MLA's and DSA's runtimes borrow MHA's config selection and split counts, which live
    # apart from the MHA runtime so that its edits leave their evidence standing
    for family in ("mla", "dsa"):
        names = [name for name, _ in _runtime_digests(ROOT.resolve(), family)]
        assert "attngen/families/mha/selection.py" in names, family
        assert "attngen/families/mha/runtime.py" not in names, family
    assert len(library_sha256(families / "dsa" / "triton")) == 64


def test_a_kernels_module_refuses_an_edited_library() -> None:
    """A generated kernels.py imported against a library edited after generation fails
    at import (its identities, and the evidence, would describe other kernels)."""
    pytest.importorskip("triton")
    rel = "sm90/triton/mha/mha_gqa_paged/kernels.py"
    text = (GENERATED / rel).read_text()
    sha = text.split('LIBRARY_SHA256 = "')[1].split('"')[0]
    stale = text.replace(f'LIBRARY_SHA256 = "{sha}"', f'LIBRARY_SHA256 = "{"0" * 64}"')
    with pytest.raises(ImportError, match="generated against MHA Triton library 000000000000"):
        exec(compile(stale, rel, "exec"), {"__name__": "stale_kernels"})


def test_packages_have_the_backend_in_their_path(files: dict[str, str]) -> None:
    packages = {rel.rsplit("/", 1)[0] for rel in files if rel.endswith("/kernels.py")}
    assert packages and all(len(p.split("/")) == 4 for p in packages)  # arch/backend/family/spec
    assert all(p.split("/")[1] in ("triton", "cute_dsl") for p in packages)


def test_generation_needs_neither_torch_nor_triton() -> None:
    """`make generate` installs only the generator's dependencies: importing torch or triton
    anywhere on the generate path must not happen."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "sys.modules['triton'] = None\n"
        "from attngen.cli import main\n"
        "sys.exit(main(['generate', '--arch', 'all', '--check']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_wrong_specs_path_touches_nothing(tmp_path: Path) -> None:
    """A missing or empty specs path, or one that would drop a family generated/ holds,
    fails before anything is written or removed."""
    out = tmp_path / "generated"
    shutil.copytree(GENERATED, out, ignore=shutil.ignore_patterns("__pycache__"))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "mla").mkdir()
    shutil.copy(ROOT / "specs/mla/deepseek_v3.yaml", tmp_path / "mla")
    for specs, message in [
        (tmp_path / "nope", "no such spec file or folder"),
        (tmp_path / "empty", "no spec files (.yaml, .yml) in this folder"),
        (
            tmp_path / "mla",
            "holds dsa, gdn, mha packages but the specs have no dsa or gdn or mha spec",
        ),
    ]:
        result = run_cli("generate", "--specs", str(specs), "--out", str(out))
        assert result.returncode == 1 and message in result.stderr, result.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_an_out_folder_that_is_not_a_generated_tree_is_left_alone(tmp_path: Path) -> None:
    """Writing removes every file of --out that generate does not write: a folder that is
    neither empty nor a generated tree (no attngen MANIFEST.json), a file, and a generated
    tree holding the specs are refused before anything is written or removed (`--out .`
    emptied the folder it named)."""
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs/mha/gqa_decode.yaml", specs)
    (tmp_path / "notes.txt").write_text("keep me\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out, message in [
        (tmp_path, "neither empty nor a generated tree (no attngen MANIFEST.json)"),
        (tmp_path / "notes.txt", "notes.txt: not a folder"),
    ]:
        result = run_cli("generate", "--specs", str(specs), "--out", str(out), "--arch", "sm90")
        assert result.returncode == 1 and message in result.stderr, result.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    out = tmp_path / "generated"
    for _ in range(2):  # a new folder, then the generated tree it became
        result = run_cli("generate", "--specs", str(specs), "--out", str(out), "--arch", "sm90")
        assert result.returncode == 0, result.stderr
    shutil.copytree(specs, out / "specs")
    result = run_cli("generate", "--specs", str(out / "specs"), "--out", str(out))
    assert result.returncode == 1, result.stderr
    assert "the specs are inside the output folder" in result.stderr
    assert (out / "specs" / "gqa_decode.yaml").is_file()


def test_read_and_write_failures_are_errors_not_tracebacks(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from attngen.cli import main

    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs/mha/gqa_decode.yaml", specs)
    (tmp_path / "file").write_text("")
    result = run_cli("generate", "--specs", str(specs), "--out", str(tmp_path / "file" / "out"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"error: {tmp_path / 'file' / 'out'}" in result.stderr
    assert "Not a directory" in result.stderr

    def unreadable(self: Path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", unreadable)
    assert main(["generate", "--specs", str(specs), "--out", str(tmp_path / "out")]) == 1
    assert "gqa_decode.yaml: cannot read: Permission denied" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_validate_and_generate_find_the_same_specs(tmp_path: Path) -> None:
    """.yml files count; hidden files and broken links (editor lock files) do not."""
    from attngen.generate import find_specs

    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs/mha/gqa_paged.yaml", specs / "a.yml")
    (specs / ".#a.yml").symlink_to(specs / "gone.yml")
    assert find_specs(specs) == [specs / "a.yml"]
    result = run_cli("validate", str(specs), str(tmp_path / "missing.yaml"))
    assert result.returncode == 1
    assert "a.yml: ok" in result.stdout and "missing.yaml: no such spec file" in result.stderr
    shutil.copy(ROOT / "specs/mha/gqa_paged.yaml", specs / "b.yaml")  # the same name again
    result = run_cli("validate", str(specs))
    assert result.returncode == 1 and "'mha_gqa_paged' is already used by" in result.stderr


@pytest.mark.parametrize("command", ["validate", "generate"])
def test_empty_and_special_paths_are_refused(tmp_path: Path, command: str) -> None:
    """An empty path (it would mean the current folder) and a path that is neither a file
    nor a folder are refused by name, by both commands, before anything is read or written."""
    out = ("--out", str(tmp_path / "out"))
    for path, message in (("", "an empty path"), ("/dev/null", "not a regular file")):
        args = (command, path) if command == "validate" else (command, "--specs", path, *out)
        result = run_cli(*args)
        assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_description_holding_code_stays_inert_text(tmp_path: Path) -> None:
    """Spec strings reach generated code only through one escaping function."""
    specs = tmp_path / "specs"
    specs.mkdir()
    text = (ROOT / "specs/mha/sliding_window.yaml").read_text(encoding="utf-8")
    payload = '"""; import os; os.system("echo injected") # \\N{DASH} """ end'
    quoted = yaml.safe_dump({"description": payload}, width=1000).strip()
    lines = [quoted if line.startswith("description:") else line for line in text.splitlines()]
    (specs / "x.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli("generate", "--specs", str(specs), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    for path in (tmp_path / "out").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "system"]
        assert not calls, path
        doc = ast.get_docstring(tree) or ""
        if path.name in ("backend.py", "__init__.py") and path.parent.name == "mha_sliding_window":
            assert 'os.system("echo injected")' in doc, path


def test_a_spec_of_many_variants_is_warned_about(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    text = (ROOT / "specs" / "mha" / "gqa_paged.yaml").read_text()
    spec = yaml.safe_load(text)
    spec["heads"] = {"head_dim": [64, 128, 256], "gqa_group": [1, 2, 4, 8, 16]}
    spec["kv_cache"] = {"page_size": [1, 16, 64, 128], "dtype": ["auto"]}
    spec["dtype"] = ["bf16", "fp16"]
    spec["targets"] = {"triton": ["sm90"]}
    (specs / "many.yaml").write_text(yaml.safe_dump(spec))
    from attngen.generate import MANY_VARIANTS, lower_all, load_all

    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        lower_all(load_all(specs, tmp_path), verbose=True)
    assert "variants (over" not in err.getvalue()  # 240 is under it
    spec["mask"] = {"kind": "causal", "logit_softcap": 30.0}
    spec["heads"]["head_dim"] = [64, 80, 96, 128, 256]
    spec["kv_cache"]["dtype"] = ["auto", "fp8_e4m3"]  # 5 x 5 x 4 x 2 x 2 = 400
    spec["kv_cache"]["scale"] = "per_tensor"
    (specs / "many.yaml").write_text(yaml.safe_dump(spec))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        lower_all(load_all(specs, tmp_path), verbose=True)
    assert f"400 variants (over {MANY_VARIANTS})" in err.getvalue()


def test_library_sha_per_arch_leaves_out_other_archs_kernels_only() -> None:
    """An arch's library sha leaves out the other archs' device code (``*_sm100.py`` is not
    in sm90's), so a compile-only Blackwell edit keeps the H200 evidence; that is sound only
    while no shared source and no other arch's source imports an arch's kernel module."""
    from attngen.evidence import _imports, library_sha256, library_source_files, source_arch

    families = ROOT / "attngen" / "families"
    cute = families / "mha" / "cute_dsl"
    assert source_arch(cute / "kernels" / "fwd_sm100.py") == "sm100"
    assert source_arch(cute / "kernels" / "decode_sm90.py") == "sm90"
    assert source_arch(cute / "kernels" / "common.py") is None
    whole, sm90, sm100 = (library_sha256(cute, arch=a) for a in (None, "sm90", "sm100"))
    assert len({whole, sm90, sm100}) == 3
    # a library without arch sources has one sha for every arch (its generated text keeps it)
    triton = families / "mha" / "triton"
    assert library_sha256(triton) == library_sha256(triton, arch="sm90")
    for package in sorted(p.parent for p in families.glob("*/*/source.py")):
        for path in library_source_files(package):
            arch = source_arch(path)
            for dep in _imports(path):
                dep_arch = source_arch(dep)
                assert dep_arch in (None, arch), f"{path.relative_to(ROOT)} imports {dep.name}"
