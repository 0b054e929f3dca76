"""Recorded test evidence, checked into evidence/: what the docs may call verified or compiles.

- evidence/gpu/<arch>.json: GPU numerical and CUDA-graph checks that passed on a device,
  written by the GPU test suite (tests/gpu/conftest.py) with commit, date and device.
- evidence/compile/<backend>/<arch>.json: ahead-of-time compile results of every generated kernel
  (registers, spills, shared memory), written by ``python -m attngen.aot``.

Each record is keyed by what was proved: the **kernel identity** of one variant, a sha256
over the kernel library's code (comments and docstrings left out) for the variant's arch
(another arch's device code, ``kernels/*_sm100.py`` for an sm90 variant, is left out), the
module's traits (hooks, phases, arch quirks) and the variant's config
(:func:`kernel_identity`). Moving a package or generating the same kernel from two specs
keeps its evidence; changing the library, the hooks or a tile drops it. The
``module`` field of a record only says where the check ran.

A GPU check also ran the host code around the kernels: the generated package's modules
(backend, graph metadata, bindings), the spine runtime (``attngen/runtime/``) and the
family's runtime, keys and oracle (``attngen/families/<family>/*.py`` but the modules that
only describe the family: ``DESCRIPTION_MODULES``). GPU records carry
their **runtime identity** (:func:`runtime_identity`, a sha256 over that code with comments
and docstrings left out), and a check counts only while both identities hold: editing a
graph builder drops the graph checks it could break, editing a docstring drops nothing.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

# The GPU checks a record may name, in the order the per-variant docs tables show them.
GPU_CHECKS: tuple[str, ...] = (
    "prefill",
    "extend",
    "decode",
    "cuda_graph",
    "verify",
    "cuda_graph_verify",
    "draft_extend",
    "cuda_graph_draft_extend",
    "quantized_vs_bf16",
    "mqa",
)


# What a kernel library is made of (relative to its package): device code, host launchers,
# the library module that binds them, and its config types. Its sha256 is part of every
# kernel identity.
LIBRARY_SOURCES: tuple[str, ...] = ("library.py", "config.py", "kernels/*.py", "host/*.py")


# A library source whose stem ends in ``_<arch>`` (``fwd_sm90.py``) is that arch's device code
# only: no other arch's kernels run it.
ARCH_SOURCE = re.compile(r"_(sm\d+)$")


def source_arch(path: Path) -> str | None:
    """The arch a library source belongs to alone (``ARCH_SOURCE``), or None: every arch's."""
    match = ARCH_SOURCE.search(path.stem)
    return match.group(1) if match else None


def library_source_files(
    package_dir: Path, patterns: tuple[str, ...] = LIBRARY_SOURCES, arch: str | None = None
) -> list[Path]:
    """A kernel library's own source files (``patterns`` under ``package_dir``), resolved and
    sorted; with ``arch``, without other archs' device code (``source_arch``)."""
    own = sorted({p.resolve() for pattern in patterns for p in package_dir.glob(pattern)})
    return [p for p in own if arch is None or source_arch(p) in (None, arch)]


def library_sha256(
    package_dir: Path, patterns: tuple[str, ...] = LIBRARY_SOURCES, arch: str | None = None
) -> str:
    """sha256 over a kernel library's source files (sorted relative paths and each file's
    :func:`code_digest`: comments, docstrings and blank lines do not count, as in the runtime
    identity, so correcting a library's documentation keeps its evidence), and over the
    files of other families, and of its family's other lowering packages, that they import
    (a library may launch another family's or backend's kernel: its edits must change this
    identity too). With ``arch``, the sources
    of other archs (``source_arch``) are left out: editing a Blackwell kernel keeps the
    Hopper kernels' identity, and their evidence. A library without arch sources has one
    sha for every arch. Importable without torch or the backend's compiler, so the
    generator records it in every generated kernels.py and computes identities without
    importing the library."""
    own = library_source_files(package_dir, patterns, arch)
    family = _family_of(package_dir.resolve())
    digest = hashlib.sha256()
    for path in own:
        digest.update(path.relative_to(package_dir.resolve()).as_posix().encode() + b"\0")
        digest.update(_file_code_digest(path).encode() + b"\0")
    for path in imported_family_files(own, family, package_dir.resolve()):
        digest.update(b"imports " + _package_relative(path).encode() + b"\0")
        digest.update(_file_code_digest(path).encode() + b"\0")
    return digest.hexdigest()


def _per_file_version(read: Callable[[Path], object]) -> Callable[[Path], object]:
    """``read(path)``, computed once per version of the file (its path, size and modification
    time): a generator run asks the same library's sha for every plan it lowers, and an
    edited file is read again."""

    @functools.lru_cache(maxsize=None)
    def cached(path: Path, size: int, mtime_ns: int) -> object:
        return read(path)

    def call(path: Path) -> object:
        stat = path.stat()
        return cached(path, stat.st_size, stat.st_mtime_ns)

    return call


def _code_digest_of(path: Path) -> str:
    return code_digest(path.read_text(encoding="utf-8"))


# A family package's modules that describe it (registration, docs columns, spec sections)
# and never run in a GPU check or a kernel; its other modules do.
DESCRIPTION_MODULES = ("__init__.py", "docs.py", "spec.py")
FAMILIES_PACKAGE = "attngen.families"
_PACKAGE_ROOT = Path(__file__).resolve().parent  # attngen/


def _family_of(path: Path) -> str | None:
    """The family folder a path of ``attngen/families/<family>/...`` lies in."""
    parts = path.relative_to(_PACKAGE_ROOT).parts if path.is_relative_to(_PACKAGE_ROOT) else ()
    return parts[1] if len(parts) > 1 and parts[0] == "families" else None


def _package_relative(path: Path) -> str:
    return path.relative_to(_PACKAGE_ROOT).as_posix()


def _module_files(name: str, imported: list[str]) -> list[Path]:
    """The files a ``from name import imported`` (or ``import name``) loads from attngen."""
    base = _PACKAGE_ROOT.joinpath(*name.split(".")[1:])
    if base.with_suffix(".py").is_file():
        return [base.with_suffix(".py")]
    if not base.is_dir():
        return []
    subs = [base / f"{n}.py" for n in imported if (base / f"{n}.py").is_file()]
    return subs or [base / "__init__.py"]


def _parse_imports(path: Path) -> list[Path]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [(node.module, [a.name for a in node.names])]
        elif isinstance(node, ast.Import):
            names = [(a.name, []) for a in node.names]
        else:
            continue
        for module, imported in names:
            if module == FAMILIES_PACKAGE or module.startswith(FAMILIES_PACKAGE + "."):
                found += _module_files(module, imported)
    return found


_imports = _per_file_version(_parse_imports)  # the family modules a source imports


def _other_lowering(path: Path, package: Path | None) -> bool:
    """Whether ``path`` lies in a lowering package of its family (``families/<family>/<
    backend>/``) other than ``package``: a library built on another backend's kernels of
    its own family (its conv, its chunk plan) borrows them as it would another family's."""
    if package is None or path.is_relative_to(package):
        return False
    parts = path.relative_to(_PACKAGE_ROOT).parts if path.is_relative_to(_PACKAGE_ROOT) else ()
    return len(parts) > 3 and parts[0] == "families"


def imported_family_files(
    start: list[Path], family: str | None, package: Path | None = None
) -> list[Path]:
    """The modules of other families that ``start`` imports, directly or through each other
    (description modules left out), and with ``package`` (the library's own lowering
    package) those of its family's other lowering packages, sorted."""
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        for dep in _imports(todo.pop()):
            dep = dep.resolve()
            if dep in seen or _family_of(dep) is None:
                continue
            if _family_of(dep) == family and not _other_lowering(dep, package):
                continue
            if dep.name in DESCRIPTION_MODULES:
                continue
            seen.add(dep)
            todo.append(dep)
    return sorted(seen)


def kernel_identity(library_sha256: str, traits: object, config: object) -> str:
    """sha256 of what a variant's kernels are: library sources, module traits, config.

    ``traits`` and ``config`` are frozen dataclasses; their repr is deterministic and lists
    every field, so two equal reprs are the same kernels.
    """
    text = f"{library_sha256}\n{traits!r}\n{config!r}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def library_source_sha256(package_dir: Path) -> Callable[[str | None], str]:
    """A kernel library's ``source_sha256(arch=None)`` (its ``source.py`` binds it):
    :func:`library_sha256` of ``package_dir`` for ``arch``, computed once per arch in a
    process."""

    @functools.cache
    def source_sha256(arch: str | None = None) -> str:
        return library_sha256(package_dir, arch=arch)

    return source_sha256


def bound_library_sha256(module: ModuleType) -> str:
    """What :func:`library_sha256` says now of the library a generated kernels module binds
    (``module.library``), for the module's arch (``LIBRARY_ARCH``; modules of a library
    without arch sources have none): equal to the module's ``LIBRARY_SHA256`` unless the
    library was edited after generation."""
    return module.library.source_sha256(getattr(module, "LIBRARY_ARCH", None))


def module_identity(module: ModuleType, uri: str) -> str:
    """The identity of variant ``uri`` of a generated kernels module (LIBRARY_SHA256,
    TRAITS and CONFIGS are every binding's contract)."""
    return kernel_identity(module.LIBRARY_SHA256, module.TRAITS, module.CONFIGS[uri])


def code_digest(text: str) -> str:
    """sha256 of a Python source's code: comments, docstrings, blank lines and trailing
    spaces do not count. Computed on the text (not on ``ast.dump``, whose output differs
    between Python versions), so the generator and a GPU machine agree."""
    tree = ast.parse(text)
    dropped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            dropped.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines = text.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    kept = [line.rstrip() for n, line in enumerate(lines, 1) if n not in dropped]
    code = "\n".join(line for line in kept if line.strip())
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


_file_code_digest = _per_file_version(_code_digest_of)  # a source file's code_digest


RUNTIME_DIR = "attngen/runtime"


@functools.lru_cache(maxsize=None)
def _runtime_digests(root: Path, family: str) -> tuple[tuple[str, str], ...]:
    family_modules = [
        p
        for p in sorted((root / "attngen" / "families" / family).glob("*.py"))
        if p.name not in DESCRIPTION_MODULES
    ]
    borrowed = imported_family_files(family_modules, family) if family_modules else []
    if borrowed and root.resolve() != _PACKAGE_ROOT.parent:  # a checkout other than this one
        borrowed = [root / "attngen" / _package_relative(p) for p in borrowed]
    paths = sorted((root / RUNTIME_DIR).glob("*.py")) + family_modules + borrowed
    return tuple(
        (p.relative_to(root).as_posix(), code_digest(p.read_text(encoding="utf-8"))) for p in paths
    )


def runtime_identity(root: Path, family: str, package: dict[str, str]) -> str:
    """sha256 of the host code a GPU check of a generated package runs: the package's
    modules (``{file name: text}``), the spine runtime, the family's top-level modules and
    the other families' modules those import."""
    parts = [f"{name}:{code_digest(text)}" for name, text in sorted(package.items())]
    parts += [f"{name}:{digest}" for name, digest in _runtime_digests(root.resolve(), family)]
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()


def package_runtime_identity(root: Path, package_dir: Path) -> str:
    """:func:`runtime_identity` of a generated package on disk
    (``generated/<arch>/<backend>/<family>/<spec>/``)."""
    texts = {p.name: p.read_text(encoding="utf-8") for p in sorted(package_dir.glob("*.py"))}
    return runtime_identity(root, package_dir.parent.name, texts)


@dataclass(frozen=True)
class KernelUsage:
    kernel: str
    registers: int
    spill_bytes: int
    shared_bytes: int


@dataclass(frozen=True)
class GpuEvidence:
    path: str  # repo-relative
    device: str
    commit: str
    date: str
    passed: frozenset[tuple[str, str, str]]  # (kernel identity, runtime identity, check)
    details: dict[tuple[str, str], str] = field(default_factory=dict)  # measured figures
    earlier: tuple[str, ...] = ()  # "commit date" of earlier runs whose records were kept

    def has(self, identity: str, runtime: str, check: str) -> bool:
        return (identity, runtime, check) in self.passed

    def detail(self, identity: str, check: str) -> str:
        return self.details.get((identity, check), "")


@dataclass(frozen=True)
class CompileEvidence:
    paths: tuple[str, ...]  # one file per backend with a compile check
    compilers: tuple[str, ...]  # e.g. "triton 3.6.0"
    usage: dict[str, tuple[KernelUsage, ...]] = field(default_factory=dict)  # by identity

    def kernels(self, identity: str) -> tuple[KernelUsage, ...]:
        return self.usage.get(identity, ())


def gpu_path(arch: str) -> str:
    return f"evidence/gpu/{arch}.json"


COMPILE_DIR = "evidence/compile"  # one file per backend and arch below it


def compile_file(backend: str, arch: str) -> str:
    """A backend's compile evidence for an arch, relative to COMPILE_DIR."""
    return f"{backend}/{arch}.json"


def load_gpu(root: Path, arch: str) -> GpuEvidence | None:
    rel = gpu_path(arch)
    if not (root / rel).is_file():
        return None
    data = _read(root, rel, "results")
    ok = [r for r in data["results"] if r.get("passed") is True]
    # a record from before runtime identities matches no runtime: stale, not an error
    passed = frozenset((r["identity"], r.get("runtime", ""), r["check"]) for r in ok)
    details = {(r["identity"], r["check"]): r["detail"] for r in ok if r.get("detail")}
    earlier = tuple(f"{r['commit'][:12]} {r['date']}" for r in data.get("earlier_runs", []))
    return GpuEvidence(rel, data["device"], data["commit"], data["date"], passed, details, earlier)


def load_compile(root: Path, arch: str) -> CompileEvidence | None:
    """Every backend's compile evidence for ``arch``, merged (identities never collide:
    they hash the backend's library)."""
    rels = sorted(
        p.relative_to(root).as_posix()
        for p in root.glob(f"{COMPILE_DIR}/{compile_file('*', arch)}")
    )
    if not rels:
        return None
    usage: dict[str, list[KernelUsage]] = {}
    compilers = []
    for rel in rels:
        data = _read(root, rel, "kernels")
        compilers.append(data.get("compiler", "?"))
        for r in data["kernels"]:
            usage.setdefault(r["identity"], []).append(
                KernelUsage(r["kernel"], r["registers"], r["spill_bytes"], r["shared_bytes"])
            )
    frozen = {k: tuple(v) for k, v in usage.items()}
    return CompileEvidence(tuple(rels), tuple(compilers), frozen)


class EvidenceFormatError(ValueError):
    """An evidence file is not in the identity-keyed format."""


def _read(root: Path, rel: str, records: str) -> dict:
    data = json.loads((root / rel).read_text(encoding="utf-8"))
    old = [r for r in data.get(records, []) if "identity" not in r]
    if old:
        raise EvidenceFormatError(
            f"{rel}: {len(old)} records have no kernel identity (the format before kernel "
            "identities): record the evidence again (README: Recording evidence)"
        )
    return data
