"""The writer brings an output tree to exactly the generated files, whatever it found there."""

from __future__ import annotations

from pathlib import Path

from attngen.emit.writer import check_tree, write_tree

ARCHS = ("sm80", "sm90", "sm100")
FILES = {
    "MANIFEST.json": "{}\n",
    "sm90/__init__.py": "",
    "sm90/triton/pkg/__init__.py": "",
    "sm90/triton/pkg/backend.py": "x = 1\n",
    "sm90/triton/other/kernels.py": "y = 2\n",
}


def tree(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def test_a_link_in_the_tree_is_replaced_never_written_through(tmp_path: Path) -> None:
    """A link in the generated tree (to a file or a folder) is reported by the check and
    replaced by the plain file or folder on writing: nothing outside the tree is written,
    removed or left reachable. Before, write_tree wrote the generated text through the
    link into the file outside, and the check called a linked folder up to date."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    write_tree(out, FILES, ARCHS)
    outside.mkdir()
    (outside / "precious.py").write_text("keep me\n")
    (outside / "mine.txt").write_text("mine\n")
    (out / "sm90/triton/pkg/backend.py").unlink()
    (out / "sm90/triton/pkg/backend.py").symlink_to(outside / "precious.py")
    (outside / "kernels.py").write_text("y = 2\n")
    for path in (out / "sm90/triton/other").iterdir():
        path.unlink()
    (out / "sm90/triton/other").rmdir()
    (out / "sm90/triton/other").symlink_to(outside, target_is_directory=True)
    drift = check_tree(out, FILES, ARCHS)
    assert not drift.clean
    assert drift.links == ["out/sm90/triton/other", "out/sm90/triton/pkg/backend.py"]
    assert "  link, not a plain file or folder: out/sm90/triton/other" in drift.report("regen")
    write_tree(out, FILES, ARCHS)
    assert (outside / "precious.py").read_text() == "keep me\n"
    assert sorted(p.name for p in outside.iterdir()) == ["kernels.py", "mine.txt", "precious.py"]
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert tree(out) == {rel: text.encode() for rel, text in FILES.items()}
    assert check_tree(out, FILES, ARCHS).clean


def test_a_file_where_a_folder_goes_and_the_reverse_are_replaced(tmp_path: Path) -> None:
    """A stale file standing where generate writes a folder, or a stale folder where it
    writes a file, is removed before writing. Before, writing stopped half way with "File
    exists" / "Is a directory" every time, though the check said to regenerate."""
    out = tmp_path / "out"
    write_tree(out, FILES, ARCHS)
    for path in (out / "sm90/triton/pkg").iterdir():
        path.unlink()
    (out / "sm90/triton/pkg").rmdir()
    (out / "sm90/triton/pkg").write_text("not a folder\n")
    (out / "sm90/triton/other/kernels.py").unlink()
    (out / "sm90/triton/other/kernels.py/sub").mkdir(parents=True)
    (out / "sm90/triton/other/kernels.py/sub/x.txt").write_text("stale\n")
    assert not check_tree(out, FILES, ARCHS).clean
    write_tree(out, FILES, ARCHS)
    assert tree(out) == {rel: text.encode() for rel, text in FILES.items()}
    assert check_tree(out, FILES, ARCHS).clean


def test_writing_leaves_no_temporary_file_and_plain_modes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_tree(out, FILES, ARCHS)
    (out / "sm90/triton/pkg/backend.py").write_text("edited\n")
    (out / "sm90/triton/pkg/backend.py").chmod(0o755)
    write_tree(out, FILES, ARCHS)
    assert sorted(tree(out)) == sorted(FILES)
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in out.rglob("*") if p.is_file())


def test_a_removed_packages_bytecode_folder_goes_with_it(tmp_path: Path) -> None:
    """A package whose spec is gone, imported once (so it has a __pycache__), is removed
    whole. Before, generate removed its .py files but left the folder with __pycache__,
    and --check then reported it as a stale folder on every run: generate never removed it."""
    out = tmp_path / "out"
    files = {**FILES, "sm90/triton/gone/__init__.py": "", "sm90/triton/gone/sub/k.py": ""}
    write_tree(out, files, ARCHS)
    for folder in ("sm90/triton/gone", "sm90/triton/gone/sub", "sm90/triton/pkg"):
        (out / folder / "__pycache__").mkdir()
        (out / folder / "__pycache__" / "k.cpython-311.pyc").write_bytes(b"\0")
    assert check_tree(out, FILES, ARCHS).stale_dirs == []  # its files still count as stale
    write_tree(out, FILES, ARCHS)
    assert not (out / "sm90/triton/gone").exists()
    assert (out / "sm90/triton/pkg/__pycache__/k.cpython-311.pyc").is_file()  # a live package's
    assert check_tree(out, FILES, ARCHS).clean
