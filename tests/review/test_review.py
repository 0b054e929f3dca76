"""``attngen review`` on synthetic changes in a temporary git repository (see conftest):
each test changes the working tree, reviews it against HEAD and checks what the Markdown
and JSON outputs say, not only that they exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.capabilities import supports
from attngen.evidence import COMPILE_DIR, compile_file
from attngen.review.report import build, to_json, to_markdown, to_text
from attngen.review.sides import load_sides
from attngen.spec.enums import Arch, Backend
from attngen.spec.errors import SpecError
from attngen.spec.expand import expand
from attngen.spec.loader import load_spec
from review_repo import commit, compile_record, git

# A variant no spec of the test repository generates (page size 32), on one arch that
# has GPU evidence and one that has compile evidence only.
NEW_SPEC = """\
name: mha_review_new
family: mha
description: a new variant for the review tests
phases: [extend, decode]
dtype: bf16
heads:
  head_dim: 128
  gqa_group: 4
kv_cache:
  page_size: [32]
targets:
  triton: [sm80, sm90]
"""
NEW_URI = "d128_g4_ps32_bf16_causal"
GPU_SUITE_SM90 = "ATTNGEN_COMMIT=$(git rev-parse HEAD) ATTNGEN_EVIDENCE_OUT=evidence/gpu/sm90.json make test-gpu"  # then GPU_TESTS="<the suites that re-record what the change took>"
# one line of the MHA Triton kernel library (its sources are hashed into every identity)
KERNEL_FILE = "attngen/families/mha/triton/kernels/decode.py"


def review(repo: Path, base: str = "HEAD") -> tuple[dict, str]:
    report = build(load_sides(repo, base))
    return json.loads(to_json(report)), to_markdown(report)


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attngen", "review", "--repo", str(repo), *args],
        capture_output=True,
        text=True,
    )


def test_add_spec_lists_new_variants_cells_and_commands(repo: Path) -> None:
    (repo / "specs/mha/review_new.yaml").write_text(NEW_SPEC)
    data, md = review(repo)
    r = data["review"]
    [spec] = r["specs"]
    assert (spec["name"], spec["status"], spec["path"]) == (
        "mha_review_new",
        "added",
        "specs/mha/review_new.yaml",
    )
    assert spec["added"] == {"triton sm80": [NEW_URI], "triton sm90": [NEW_URI]}
    assert spec["new_evidence"] == [0, 0, 2]
    assert spec["packages_added"] == [
        "generated/sm80/triton/mha/mha_review_new",
        "generated/sm90/triton/mha/mha_review_new",
    ]
    # sm80 cells were "compiles", sm90 cells "verified": a new variant without evidence
    # turns the first into "no evidence" and the second into "partly verified"
    page = {(c["arch"], c["column"]): c for c in r["cells"]}
    sm80 = page[("sm80", "Page Size > 1 (native)")]
    sm90 = page[("sm90", "Page Size > 1 (native)")]
    assert (sm80["before_symbol"], sm80["after_symbol"], sm80["loss"]) == (
        "compiles",
        "no_evidence",
        True,
    )
    assert sm90["before_symbol"] == sm90["after_symbol"] == "verified"
    assert sm90["loss"] and "variants)" in sm90["after"]
    assert sm80["why"] == [f"1 new variant without evidence (mha_review_new {NEW_URI})"]
    assert all(c["backend"] == "triton" and c["arch"] in ("sm80", "sm90") for c in r["cells"])
    assert len(r["evidence_loss"]) == len(r["cells"]) > 0
    commands = [c["command"] for c in data["commands"]]
    assert commands[0] == "make generate"  # the new packages are not generated yet
    assert "make evidence-compile" in commands
    gpu = [c for c in data["commands"] if "make test-gpu" in c["command"]]
    # the new variants' family suite alone: no integration verified them before
    assert [c["command"] for c in gpu] == [f'{GPU_SUITE_SM90} GPU_TESTS="tests/families/mha/gpu"']
    assert gpu[0]["why"] == "on an sm90 GPU: GPU evidence for 1 new or changed variant(s) (mha 1)"
    assert "make bench" not in commands  # no kernel code changed
    # Markdown: the spec, its variants per target, the cell row and the commands
    assert "- **added** `mha_review_new` (`specs/mha/review_new.yaml`)" in md
    assert f"  - added on triton sm80, sm90: 1 variant(s): {NEW_URI}" in md
    assert "| MHA backends · triton sm80 | 🔨 → ❔ |" in md
    assert "| MHA backends · triton sm90 | ✅ → ✅ partly |" in md
    assert "make evidence-compile\n" in md and "ATTNGEN_EVIDENCE_OUT=evidence/gpu/sm90.json" in md


def test_new_variant_with_shared_kernels_keeps_compile_evidence(repo: Path) -> None:
    """A spec whose kernels another spec already generates: compile evidence is keyed by
    kernel identity, so it counts; GPU evidence also needs the new package's runtime
    identity, so only the GPU-verified row moves, and only the GPU suite is left to run."""
    text = (repo / "specs/mha/gqa_paged.yaml").read_text()
    (repo / "specs/mha/gqa_copy.yaml").write_text(text.replace("mha_gqa_paged", "mha_gqa_copy"))
    data, md = review(repo)
    [spec] = data["review"]["specs"]
    assert spec["status"] == "added" and spec["shared_with"] == ["mha_gqa_paged"]
    gpu, compiled, none = spec["new_evidence"]
    assert gpu == 0 and compiled > 0 and none == 0
    cells = data["review"]["cells"]
    assert cells and {c["arch"] for c in cells} == {"sm90"}
    assert all(c["moves"].keys() == {"new_compiled"} for c in cells)
    assert all(c["before_symbol"] == c["after_symbol"] == "verified" for c in cells)
    commands = [c["command"] for c in data["commands"]]
    assert "make evidence-compile" not in commands
    assert any("evidence/gpu/sm90.json" in c for c in commands)
    assert "kernels also generated by mha_gqa_paged: their compile evidence counts" in md


def test_kernel_line_change_lists_cells_and_dropped_evidence(repo: Path) -> None:
    path = repo / KERNEL_FILE
    path.write_text(path.read_text() + "_REVIEW_TEST_LINE = 1\n")
    data, md = review(repo)
    r = data["review"]
    assert r["specs"] == []
    group = "kernel library / lowering (mha x triton)"
    assert [f["path"] for f in data["sources"][group]] == [KERNEL_FILE]
    per = {i["target"]: i for i in r["identities"]}
    assert set(per) == {"triton sm80", "triton sm90", "triton sm100"}
    sm90 = per["triton sm90"]
    assert sm90["config"] == 0 and sm90["code"] > 0
    assert sm90["gpu_lost"] == sm90["code"] and sm90["compile_lost"] == sm90["code"]
    assert per["triton sm80"]["gpu_lost"] == 0 and per["triton sm80"]["compile_lost"] > 0
    assert r["cells"] and all(c["loss"] for c in r["cells"])
    assert all(c["after_symbol"] == "no_evidence" for c in r["cells"])
    assert all("changed kernel identity: kernel code changed" in c["why"][0] for c in r["cells"])
    commands = [c["command"] for c in data["commands"]]
    assert "make evidence-compile" in commands and "make bench" in commands
    assert any("evidence/gpu/sm90.json" in c for c in commands)
    assert f"{KERNEL_FILE} (M, +1 -0)" in md
    assert "triton sm90: " in md and "kernel identities by kernel code" in md
    assert "changed kernel identity: kernel code changed" in md
    # one Markdown row per target: its cells moved alike, for one reason
    rows = [line for line in md.splitlines() if line.startswith("| MHA backends · ")]
    assert [row.split(" | ")[0] for row in rows] == [
        f"| MHA backends · triton {a}" for a in ("sm80", "sm90", "sm100")
    ]
    assert all(c["moves"].keys() == {"kernel_code"} for c in r["cells"])


def test_kernel_comment_and_docstring_changes_keep_the_evidence(repo: Path) -> None:
    """Kernel identities digest the library's code, not its comments and docstrings: a
    corrected comment keeps every identity, and so every recorded check."""
    path = repo / KERNEL_FILE
    text = path.read_text()
    head, rest = text.split('"""', 1)
    path.write_text(head + '"""A reworded docstring. ' + rest + "# one more comment\n")
    data, _ = review(repo)
    assert data["review"]["identities"] == [] and data["review"]["cells"] == []


def test_removed_spec_lists_removed_packages(repo: Path) -> None:
    (repo / "specs/mha/bidirectional.yaml").unlink()
    for pkg in (repo / "generated").glob("*/*/*/mha_bidirectional"):
        for f in pkg.iterdir():
            f.unlink()
        pkg.rmdir()
    data, md = review(repo)
    [spec] = data["review"]["specs"]
    assert (spec["name"], spec["status"]) == ("mha_bidirectional", "removed")
    assert spec["packages_removed"] == [
        f"generated/{a}/triton/mha/mha_bidirectional" for a in ("sm100", "sm80", "sm90")
    ]
    assert set(spec["removed"]) == {"triton sm80", "triton sm90", "triton sm100"}
    assert spec["added"] == {}
    cells = data["review"]["cells"]
    assert cells and all(any("no longer generated" in w for w in c["why"]) for c in cells)
    # generated/ agrees with the specs (packages deleted), no evidence to restore
    assert data["commands"] == []
    kinds = {s["kind"]: s for s in data["sizes"]}
    assert kinds["kernels"]["deleted"] == 3
    assert "- **removed** `mha_bidirectional` (`specs/mha/bidirectional.yaml`)" in md
    assert "packages removed: generated/sm100/triton/mha/mha_bidirectional" in md
    assert "  - removed from triton sm80, sm90, sm100: " in md


def test_description_only_changes_no_cell(repo: Path) -> None:
    path = repo / "specs/mha/gqa_paged.yaml"
    lines = path.read_text().splitlines(keepends=True)
    lines = [
        "description: reworded for the review test\n" if l.startswith("description:") else l
        for l in lines
    ]
    path.write_text("".join(lines))
    data, md = review(repo)
    [spec] = data["review"]["specs"]
    assert (spec["status"], spec["fields"]) == ("changed", ["description"])
    assert spec["added"] == spec["removed"] == {}
    assert data["review"]["cells"] == [] and data["review"]["identities"] == []
    assert data["commands"] == []
    assert "fields changed: description" in md and "no variant added or removed" in md
    assert "No cell changes." in md
    assert cli(repo, "HEAD", "--fail-on-evidence-loss").returncode == 0


def test_refused_variant_shows_the_capability_reason(repo: Path) -> None:
    """A target that does not lower a variant is listed with supports()'s reason; the spec
    stays valid because another target lowers it."""
    text = NEW_SPEC.replace("triton: [sm80, sm90]", "triton: [sm90]\n  cute_dsl: [sm100]")
    # an fp8 cache: CuTe DSL decodes one on sm90 only (and extends none)
    text = text.replace(
        "  page_size: [32]", "  page_size: [32]\n  dtype: fp8_e4m3\n  scale: per_tensor"
    )
    (repo / "specs/mha/review_new.yaml").write_text(text)
    spec = load_spec(repo / "specs/mha/review_new.yaml", repo)
    [variant] = expand(spec)
    verdict = supports(variant, Backend.CUTE_DSL, Arch.SM100)
    assert not verdict.ok
    data, md = review(repo)
    [change] = data["review"]["specs"]
    assert change["error"] is None
    assert change["added"] == {"triton sm90": [variant.uri]}
    assert change["refused"] == [
        {
            "targets": ["cute_dsl sm100"],
            "status": verdict.status.value,
            "reason": verdict.reason,
            "uris": [variant.uri],
        }
    ]
    status = verdict.status.value.replace("_", " ")
    assert f"refused on cute_dsl sm100 (1 variant(s), {status}): {verdict.reason}" in md


def test_refused_spec_shows_the_validate_message_and_fails(repo: Path) -> None:
    """A variant no target may run (hardware) refuses the whole spec, as generate does:
    the review shows validate's message and exits 1."""
    text = NEW_SPEC.replace(
        "page_size: [32]", "page_size: [32]\n  dtype: fp8_e4m3\n  scale: per_tensor"
    )
    (repo / "specs/mha/review_new.yaml").write_text(text)
    data, md = review(repo)
    [change] = data["review"]["specs"]
    assert change["error"].startswith("specs/mha/review_new.yaml:")
    assert "sm80 cannot run variant d128_g4_ps32_bf16_kvfp8_e4m3_causal" in change["error"]
    assert change["added"] == {}
    [refused] = change["refused"]
    assert refused["targets"] == ["triton sm80"] and refused["status"] == "unsupported"
    assert data["review"]["errors"] == [change["error"]]
    assert f"- :x: **refused**: `{change['error']}`" in md
    run = cli(repo, "HEAD", "--format", "json")
    assert run.returncode == 1 and "1 spec(s) are refused" in run.stderr
    assert json.loads(run.stdout)["review"]["errors"] == [change["error"]]


def test_cli_fail_on_evidence_loss_and_default_base(repo: Path) -> None:
    (repo / "specs/mha/review_new.yaml").write_text(NEW_SPEC)
    assert cli(repo).returncode == 0  # default BASE: merge base of HEAD and main
    run = cli(repo, "--fail-on-evidence-loss", "--format", "md")
    assert run.returncode == 1
    assert "support-matrix cells fall back" in run.stderr
    assert run.stdout.startswith("### attngen review: `merge-base(HEAD, main)`")


def test_committed_branch_against_main_and_generated_sizes(repo: Path) -> None:
    """On a branch with commits, BASE is where it left main; generated/ files count by kind
    (untracked files included)."""
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "specs/mha/review_new.yaml").write_text(NEW_SPEC)
    commit(repo, "add a spec")
    for arch in ("sm80", "sm90"):
        pkg = repo / f"generated/{arch}/triton/mha/mha_review_new"
        pkg.mkdir(parents=True)
        (pkg / "kernels.py").write_text("a\nb\n")
        (pkg / "backend.py").write_text("c\n")
    (repo / "generated/docs/support_matrix.md").write_text("# placeholder matrix\nrow\n")
    data, _ = review(repo, None)
    assert data["base"] == "merge-base(HEAD, main)"
    assert data["base_commit"] == git(repo, "rev-parse", "main").strip()
    assert [s["name"] for s in data["review"]["specs"]] == ["mha_review_new"]
    sizes = {s["kind"]: s for s in data["sizes"]}
    assert (sizes["kernels"]["added"], sizes["kernels"]["lines_added"]) == (2, 4)
    assert (sizes["backends"]["added"], sizes["backends"]["lines_added"]) == (2, 2)
    assert (sizes["docs"]["modified"], sizes["docs"]["lines_added"]) == (1, 1)
    # generated/ holds the new packages: no "make generate" before the evidence commands
    assert data["commands"][0]["command"] == "make evidence-compile"
    assert git(repo, "status", "--short") != ""  # the untracked files stay untracked
    assert "?? generated/" in git(repo, "status", "--short", "--untracked-files=normal")


def test_text_output_names_every_section(repo: Path) -> None:
    (repo / "specs/mha/review_new.yaml").write_text(NEW_SPEC)
    text = to_text(build(load_sides(repo, "HEAD")))
    for heading in ("Specs:", "Support matrix:", "Kernel code:", "Evidence:", "To run:"):
        assert f"\n{heading}" in text
    assert "      # CPU; compile evidence for 2 new or changed variant(s)" in text


def test_spec_that_does_not_load_is_shown_with_its_error(repo: Path) -> None:
    text = NEW_SPEC.replace("page_size: [32]", "page_size: [32]\n  dtype: fp8_e4m3")
    (repo / "specs/mha/review_new.yaml").write_text(text)
    with pytest.raises(SpecError) as err:  # the loader's own message, file:line included
        load_spec(repo / "specs/mha/review_new.yaml", repo)
    error = str(err.value)
    assert error.startswith("specs/mha/review_new.yaml:") and "kv_cache.scale" in error
    data, md = review(repo)
    [change] = data["review"]["specs"]
    assert (change["status"], change["error"]) == ("added", error)
    assert data["review"]["errors"] == [error] and data["review"]["cells"] == []
    assert f"- :x: **refused**: `{error}`" in md


def test_base_whose_code_cannot_compute_its_model_falls_back(repo: Path) -> None:
    """A BASE whose spine lacks what the snapshot asks (an older revision) is read with the
    working tree's code, and the report says so."""
    lower = repo / "attngen/lower.py"
    good = lower.read_text()
    lower.write_text(good.replace("def plan_identities(", "def _old_plan_identities("))
    commit(repo, "a base without plan_identities")
    lower.write_text(good)
    (repo / "specs/mha/review_new.yaml").write_text(NEW_SPEC)
    data, md = review(repo)
    [note] = data["notes"]
    assert "HEAD's code could not compute its model" in note
    assert "read with the working tree's code" in note and f"> note: {note}" in md
    assert [s["name"] for s in data["review"]["specs"]] == ["mha_review_new"]
    assert {c["arch"] for c in data["review"]["cells"]} == {"sm80", "sm90"}


def test_evidence_added_moves_cells_up(repo: Path) -> None:
    """BASE has a variant without evidence; the working tree records its compile evidence:
    the cells go back to "compiles", nothing is lost and nothing is left to run."""
    (repo / "specs/mha/review_new.yaml").write_text(NEW_SPEC.replace("sm80, sm90", "sm80"))
    pkg = repo / "generated/sm80/triton/mha/mha_review_new"
    pkg.mkdir(parents=True)
    (pkg / "kernels.py").write_text("# placeholder\n")
    commit(repo, "a spec without evidence")
    [row] = [r for r in load_sides(repo, "HEAD").now["variants"] if r["spec"] == "mha_review_new"]
    path = repo / COMPILE_DIR / compile_file(row["backend"], row["arch"])
    record = json.loads(path.read_text())
    record["kernels"].append(compile_record(row))
    path.write_text(json.dumps(record))
    data, md = review(repo)
    assert data["review"]["specs"] == []
    cells = data["review"]["cells"]
    assert cells and all(c["arch"] == "sm80" for c in cells)
    assert all(
        (c["before_symbol"], c["after_symbol"]) == ("no_evidence", "compiles") for c in cells
    )
    assert all(c["why"] == [f"1 variant gained evidence (mha_review_new {NEW_URI})"] for c in cells)
    assert data["review"]["evidence_loss"] == [] and data["commands"] == []
    assert [e["path"] for e in data["evidence"]] == [path.relative_to(repo).as_posix()]
    assert "| MHA backends · triton sm80 | ❔ → 🔨 |" in md


def test_runtime_change_drops_gpu_evidence_only(repo: Path) -> None:
    """Host code a GPU check ran is in the packages' runtime identities: a code change drops
    the GPU evidence (verified -> compiles), the compile evidence stands; a comment changes
    nothing."""
    path = repo / "attngen/runtime/graph.py"
    text = path.read_text()
    path.write_text(text + "# a comment\n")
    data, _ = review(repo)
    assert data["review"]["cells"] == [] and data["commands"] == []
    assert list(data["sources"]) == ["runtime"]
    path.write_text(text + "\nREVIEW_TEST_CONSTANT = 1\n")
    data, md = review(repo)
    r = data["review"]
    assert r["cells"] and {c["arch"] for c in r["cells"]} == {"sm90"}
    assert all(
        (c["before_symbol"], c["after_symbol"]) == ("verified", "compiles") for c in r["cells"]
    )
    assert all(c["moves"].keys() == {"runtime_code"} for c in r["cells"])
    per = {i["target"]: i for i in r["identities"]}
    assert per["triton sm90"]["runtime"] > 0 and per["triton sm90"]["code"] == 0
    assert per["triton sm90"]["gpu_lost"] == per["triton sm90"]["runtime"]
    assert per["triton sm90"]["compile_lost"] == 0
    commands = {c["command"]: c["why"] for c in data["commands"]}
    [gpu] = [c for c in commands if c.startswith(GPU_SUITE_SM90)]
    assert "make bench" in commands
    # host code every family runs: every family's suite, and the suites of the
    # integrations whose runs had recorded some of the variants' evidence
    tests = gpu.split('GPU_TESTS="')[1].rstrip('"').split()
    assert tests == ["tests/families/mha/gpu", "tests/families/mla/gpu"]
    assert "verified by" not in commands[gpu]
    assert "make evidence-compile" not in commands
    assert "changed runtime identity: host code of the package changed" in md


def test_evidence_an_integration_recorded_names_its_suite(repo: Path) -> None:
    """A variant whose GPU evidence came from an integration's run (detail
    ``via=<integration>-<model>``) is re-recorded by that integration's suite: the review's
    GPU command names it beside the family's."""
    path = repo / "evidence/gpu/sm90.json"
    ev = json.loads(path.read_text())
    first = next(r for r in ev["results"] if "/mha/" in r["module"] and r["check"] == "decode")
    first["detail"] = "via=transformers-llama"
    path.write_text(json.dumps(ev, indent=1) + "\n")
    commit(repo, "evidence from an integration")
    (repo / "attngen/runtime/graph.py").open("a").write("\nREVIEW_TEST_CONSTANT = 1\n")
    data, _ = review(repo)
    [(command, why)] = [
        (c["command"], c["why"]) for c in data["commands"] if "test-gpu" in c["command"]
    ]
    tests = command.split('GPU_TESTS="')[1].rstrip('"').split()
    assert tests == [
        "tests/families/mha/gpu",
        "tests/families/mla/gpu",
        "tests/integrations/transformers/gpu",
    ]
    assert why.endswith("; 1 of them verified by transformers)")


def test_spec_change_without_regenerating_asks_for_generate(repo: Path) -> None:
    manifest = repo / "generated/MANIFEST.json"
    manifest.write_text('{"files": {}}\n')
    commit(repo, "a manifest")
    path = repo / "specs/mha/gqa_paged.yaml"
    path.write_text(path.read_text() + "# a comment changes the spec's hash\n")
    data, md = review(repo)
    [spec] = data["review"]["specs"]
    assert (spec["status"], spec["fields"]) == ("changed", [])
    assert "no field changed (comments or formatting)" in md
    assert data["commands"] == [
        {
            "command": "make generate",
            "why": "generated/ is not what the specs give: specs changed but "
            "generated/MANIFEST.json did not",
        }
    ]
    manifest.write_text('{"files": {"x": 1}}\n')
    assert review(repo)[0]["commands"] == []


def test_capability_change_relowers_an_unchanged_spec(repo: Path) -> None:
    """The code, not the spec, changes what a spec generates: the spec is listed as
    relowered, with the variants the targets now refuse and validate's message."""
    path = repo / "attngen/families/mha/triton/capability.py"
    text = path.read_text()
    assert "192, 256})" in text
    path.write_text(text.replace("192, 256})", "192})"))
    data, md = review(repo)
    [spec] = data["review"]["specs"]
    assert (spec["name"], spec["status"], spec["fields"]) == ("mha_gqa_paged", "relowered", [])
    assert "no target lowers variant d256_g1_ps1_bf16_causal" in spec["error"]
    assert "head_dim 256 is not lowered yet" in spec["error"]
    refused = [r for r in spec["refused"] if r["reason"] == "head_dim 256 is not lowered yet"]
    assert [r["targets"] for r in refused] == [["triton sm80", "triton sm90", "triton sm100"]]
    # generate stops at the refused spec: every variant of it is gone from the tree
    assert set(spec["removed"]) == {"triton sm80", "triton sm90", "triton sm100"}
    assert "spec file unchanged: the code lowers it differently" in md
    assert "kernel library / lowering (mha x triton)" in data["sources"]
    assert data["review"]["identities"] == []  # capability rules are not kernel code


def test_broken_working_tree_or_base_is_an_error(repo: Path) -> None:
    run = cli(repo, "no-such-revision")
    assert run.returncode == 2 and "no-such-revision" in run.stderr
    (repo / "attngen/lower.py").write_text("def broken(:\n")
    run = cli(repo, "HEAD")
    assert run.returncode == 2
    assert "computing the model of the working tree failed" in run.stderr
    assert "SyntaxError" in run.stderr and run.stdout == ""


def test_a_column_one_side_lacks_names_its_values_once() -> None:
    """A cell of a new column shows what it holds, not the placeholder's words; a cell
    whose values moved shows both."""
    from attngen.review.cells import NO_CELL, CellChange
    from attngen.review.report import _column

    def cell(before: str, after: str) -> CellChange:
        return CellChange("T", "triton", "sm90", "GVA", before, after, "", "", False, {}, ())

    assert _column(cell(NO_CELL, "🔨 1, 2, 3")) == "GVA (→ 1, 2, 3)"
    assert _column(cell("✅ 1, 2", "🔨 1, 2, 3")) == "GVA (1, 2 → 1, 2, 3)"
    assert _column(cell("✅ 1, 2", NO_CELL)) == "GVA"
    assert _column(cell("✅ 1, 2", "🔨 1, 2")) == "GVA"
