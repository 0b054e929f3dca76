"""The ahead-of-time compile check's driver, shared by every backend: discover a backend's
generated kernels modules, group identical compiles, compile each group once in worker
processes, and write or check the deterministic evidence JSON.

A backend supplies a :class:`Compiler` (how to key, compile and measure one ``CompileSpec``)
and exposes ``main = Compiler.main``; ``python -m attngen.aot`` runs every registered one.

With ``--reuse FILE [FILE ...]``, a kernel whose identity (the kernel library's source and the variant's
config: :func:`attngen.evidence.module_identity`) and compiler version equal a row of FILE
keeps that row's measurements instead of compiling again: re-recording after a change to one
family compiles that family only. ``--reuse`` never applies across compiler versions.

With ``--reuse`` and ``--sample``, reusable compiles are compiled again for a deterministic
sample only (the first compile in tree order of each generated module and kernel name; see
:func:`sample_groups`), and their fresh rows replace the reused ones: a test comparing the
result with the evidence file then checks the sample's measurements for real and every other
row by identity. Compiles with no reusable row always run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import sys
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from attngen.arch import ARCHS, facts
from attngen.evidence import bound_library_sha256, module_identity

ARCH_NAMES = sorted(a.value for a in ARCHS)
DEFAULT_GENERATED = Path("generated")


class AotError(RuntimeError):
    """Some kernels failed to compile; the message lists each one with the compiler's error."""


@dataclass(frozen=True)
class Entry:
    """One kernel of one variant: what the evidence file has a row for."""

    module: str  # "generated/<arch>/<backend>/<family>/<spec>/kernels.py", from generated/'s parent
    identity: str  # the variant's kernel identity (attngen.evidence.module_identity)
    variant: str
    kernel: str
    index: int  # position in compile_specs(config)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.module, self.variant, self.kernel)


@dataclass(frozen=True)
class Resources:
    registers: int
    spill_bytes: int
    shared_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific row fields


def load_module(rel: str, generated_dir: Path) -> ModuleType:
    """Import a kernels.py by its dotted name, e.g. ``generated.sm90.<backend>.<f>.<s>.kernels``."""
    root = str(generated_dir.resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(rel.removesuffix(".py").replace("/", "."))


def spec_of(entry: Entry, generated_dir: Path) -> Any:
    """The ``CompileSpec`` an entry names."""
    module = load_module(entry.module, generated_dir)
    return module.compile_specs(module.CONFIGS[entry.variant])[entry.index]


def _add_root(root: str) -> None:
    if root not in sys.path:
        sys.path.insert(0, root)


class Compiler:
    """One backend's compile check. Subclasses set ``backend_dir`` and ``prog`` and implement
    :meth:`compile`, :meth:`group_key` and :meth:`version`; the rest is shared."""

    backend_dir: str = ""
    prog: str = ""

    # -- what a backend implements ----

    def version(self) -> str:
        """The compiler's name and version, recorded in the evidence (e.g. "triton 3.6.0")."""
        raise NotImplementedError

    def group_key(self, spec: Any) -> Hashable:
        """Same key -> same binary: such specs compile once."""
        raise NotImplementedError

    def compile(self, spec: Any, arch: str) -> Resources:
        """Compile one spec for ``arch`` (in a worker process); raise on failure."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Per process, before any kernels module is imported (e.g. environment variables)."""

    def check_spec(self, entry: Entry, spec: Any) -> None:
        """Refuse a spec this compiler cannot take (raise AotError)."""

    def row_problems(self, where: str, row: dict[str, Any]) -> list[str]:
        """Backend-specific problems of one evidence row (beyond spills and shared memory)."""
        return []

    # -- shared ----

    def discover(self, arch: str, generated_dir: Path) -> list[Path]:
        """Every generated kernels.py of this backend for ``arch``, sorted."""
        return sorted((Path(generated_dir) / arch / self.backend_dir).glob("*/*/kernels.py"))

    def list_entries(self, arch: str, generated_dir: Path) -> list[Entry]:
        """Every (module, variant, kernel) of the tree, in a fixed order."""
        generated_dir = Path(generated_dir)
        entries = []
        for path in self.discover(arch, generated_dir):
            rel = path.resolve().relative_to(generated_dir.resolve().parent).as_posix()
            module = load_module(rel, generated_dir)
            if module.LIBRARY_SHA256 != bound_library_sha256(module):
                raise AotError(f"{rel}: generated against another kernel library: regenerate")
            for uri in sorted(module.CONFIGS):
                names = [spec.name for spec in module.compile_specs(module.CONFIGS[uri])]
                if len(set(names)) != len(names):
                    raise AotError(f"{rel} {uri}: compile_specs names are not unique: {names}")
                identity = module_identity(module, uri)
                entries += [Entry(rel, identity, uri, name, i) for i, name in enumerate(names)]
        return entries

    def _group(self, arch: str, generated_dir: Path) -> list[list[Entry]]:
        """Entries grouped by identical compile, in the tree's sorted order."""
        groups: dict[Hashable, list[Entry]] = {}
        for entry in self.list_entries(arch, generated_dir):
            spec = spec_of(entry, generated_dir)
            self.check_spec(entry, spec)
            groups.setdefault(self.group_key(spec), []).append(entry)
        return list(groups.values())

    def _run_job(self, job: tuple[Entry, Path, str]) -> Resources | str:
        """Worker: compile one unique kernel; an error comes back as text, not an exception."""
        entry, generated_dir, arch = job
        try:
            return self.compile(spec_of(entry, generated_dir), arch)
        except Exception as exc:  # noqa: BLE001 -- every failure is reported, then the run fails
            text = f"{type(exc).__name__}: {exc}"
            return text if len(text) < 4000 else text[:1500] + "\n...\n" + text[-2500:]

    def _worker_init(self, root: str) -> None:
        self.prepare()
        _add_root(root)

    def compile_arch(
        self,
        arch: str,
        generated_dir: Path,
        jobs: int | None = None,
        reuse: dict[str, Any] | None = None,
        sample: bool = False,
    ) -> dict[str, Any]:
        """Compile every kernel of the tree for ``arch`` (or reuse ``reuse``'s rows of the
        same identity and compiler, all but :func:`sample_groups`'s when ``sample``); the
        evidence JSON object. Raises AotError."""
        self.prepare()
        generated_dir = Path(generated_dir)
        version = self.version()
        unique = self._group(arch, generated_dir)
        known = _reusable(reuse, arch, version)
        again = {id(users) for users in sample_groups(unique)} if sample else set()
        rows, todo = [], []
        for users in unique:
            found = [known.get((*u.key, u.identity)) for u in users]
            if all(found) and id(users) not in again:
                rows += found
            else:
                todo.append(users)
        if known:
            print(f"{arch}: {len(unique) - len(todo)} compile(s) reused from evidence", flush=True)
        if sample:
            print(f"{arch}: compiling again a sample of {len(again)} of {len(unique)}", flush=True)
        work = [(users[0], generated_dir, arch) for users in todo]
        failures: list[str] = []
        if work:
            processes = max(1, min(jobs or os.cpu_count() or 1, len(work)))
            root = str(generated_dir.resolve().parent)
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(processes, self._worker_init, (root,)) as pool:
                for i, (users, res) in enumerate(zip(todo, pool.imap(self._run_job, work)), 1):
                    family, spec = users[0].module.split("/")[-3:-1]
                    head = f"[{i}/{len(work)}] {arch} {family} {spec} {users[0].kernel}"
                    more = f" (+{len(users) - 1} more variants)" if len(users) > 1 else ""
                    if isinstance(res, str):
                        print(f"{head}: FAILED{more}", flush=True)
                        failures.append(f"{head} ({users[0].variant}):\n{res}")
                        continue
                    extra = f", {res.extra}" if res.extra else ""
                    print(
                        f"{head}: {res.registers} regs, {res.spill_bytes} spill, "
                        f"{res.shared_bytes} B smem{extra}{more}",
                        flush=True,
                    )
                    rows += [_row(user, res) for user in users]
        if failures:
            raise AotError(
                f"{len(failures)} kernel(s) failed to compile for {arch}:\n\n"
                + "\n\n".join(failures)
            )
        rows = sorted(rows, key=lambda r: (r["module"], r["variant"], r["kernel"]))
        return {"arch": arch, "compiler": version, "kernels": rows}

    def resource_problems(self, result: dict[str, Any]) -> list[str]:
        """Spills, more shared memory than one block of the arch may have, and the backend's
        own row problems."""
        limit = facts(result["arch"]).smem_optin_bytes
        problems = []
        for row in result["kernels"]:
            where = f"{row['module']} {row['variant']} {row['kernel']}"
            if row["spill_bytes"] > 0:
                problems.append(
                    f"{where}: spills {row['spill_bytes']} bytes ({row['registers']} regs)"
                )
            if row["shared_bytes"] > limit:
                problems.append(f"{where}: {row['shared_bytes']} B shared memory > {limit} B limit")
            problems += self.row_problems(where, row)
        return problems

    def check_evidence(self, arch: str, generated_dir: Path, evidence_path: Path) -> list[str]:
        """What makes ``evidence_path`` untrue of the tree: missing or stale rows, spills."""
        evidence_path, generated_dir = Path(evidence_path), Path(generated_dir)
        if not evidence_path.exists():
            return [f"{evidence_path} does not exist"]
        evidence = json.loads(evidence_path.read_text())
        problems = (
            [] if evidence.get("arch") == arch else [f"evidence is for arch {evidence.get('arch')}"]
        )
        recorded = {(r["module"], r["variant"], r["kernel"]): r for r in evidence["kernels"]}
        current = {e.key: e for e in self.list_entries(arch, generated_dir)}
        for key, entry in sorted(current.items()):
            row = recorded.get(key)
            if row is None:
                problems.append(f"missing from evidence: {' '.join(key)}")
            elif row["identity"] != entry.identity:
                problems.append(f"stale evidence (kernel identity differs): {' '.join(key)}")
        problems += [
            f"in evidence but not in the tree: {' '.join(k)}"
            for k in sorted(recorded.keys() - current.keys())
        ]
        return problems + self.resource_problems(evidence)

    def main(self, argv: list[str] | None = None) -> int:
        """``python -m <prog> --arch ARCH [--generated DIR] [--out FILE] [--reuse FILE]``."""
        parser = argparse.ArgumentParser(prog=self.prog, description=_first_paragraph(self))
        parser.add_argument("--arch", required=True, choices=ARCH_NAMES)
        parser.add_argument("--generated", type=Path, default=DEFAULT_GENERATED)
        parser.add_argument("--out", type=Path, help="write the evidence JSON here")
        parser.add_argument(
            "--reuse",
            type=Path,
            nargs="+",
            default=[],
            help="earlier evidence JSONs: kernels of the same identity and compiler keep "
            "their measurements instead of compiling again (missing files are skipped)",
        )
        parser.add_argument(
            "--sample",
            action="store_true",
            help="with --reuse: compile a deterministic sample again (one compile per "
            "generated module and kernel name) instead of reusing its rows",
        )
        parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="compile processes")
        args = parser.parse_args(argv)
        if not self.discover(args.arch, args.generated):
            where = args.generated / args.arch
            print(f"{args.arch}: no {self.backend_dir} kernels under {where}", file=sys.stderr)
            return 0
        reuse = _merge([json.loads(p.read_text()) for p in args.reuse if p.exists()])
        try:
            result = self.compile_arch(args.arch, args.generated, args.jobs, reuse, args.sample)
        except AotError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(dumps(result))
        problems = self.resource_problems(result)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        n = len(result["kernels"])
        print(f"{args.arch}: {n} kernels compiled, {len(problems)} problem(s)", file=sys.stderr)
        return 1 if problems else 0


def sample_groups(unique: list[list[Entry]]) -> list[list[Entry]]:
    """The first compile group in tree order of each (generated module, kernel name): every
    kernel of every spec is compiled for at least one of its variants, whatever was reused."""
    first: dict[tuple[str, str], list[Entry]] = {}
    for users in unique:
        first.setdefault((users[0].module, users[0].kernel), users)
    return list(first.values())


def _first_paragraph(compiler: Compiler) -> str:
    doc = sys.modules[type(compiler).__module__].__doc__ or ""
    return doc.split("\n\n")[0]


def _merge(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One evidence object from several of one arch and compiler (rows of all of them)."""
    if not results:
        return None
    first = results[0]
    same = [r for r in results if (r["arch"], r["compiler"]) == (first["arch"], first["compiler"])]
    return dict(first, kernels=[row for r in same for row in r["kernels"]])


def _reusable(
    reuse: dict[str, Any] | None, arch: str, version: str
) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """Rows of an earlier evidence object that still hold: same arch and compiler version."""
    if not reuse or reuse.get("arch") != arch or reuse.get("compiler") != version:
        return {}
    return {(r["module"], r["variant"], r["kernel"], r["identity"]): r for r in reuse["kernels"]}


def _row(entry: Entry, res: Resources) -> dict[str, Any]:
    return {
        "module": entry.module,
        "identity": entry.identity,
        "variant": entry.variant,
        "kernel": entry.kernel,
        "registers": res.registers,
        "spill_bytes": res.spill_bytes,
        "shared_bytes": res.shared_bytes,
        **res.extra,
    }


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, sort_keys=True, indent=1) + "\n"
