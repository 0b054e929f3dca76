"""Ahead-of-time compile check of every generated Triton kernel, for one GPU arch, no GPU needed.

``python -m attngen.aot --arch sm90 [--generated DIR] [--out FILE] [--jobs N]`` imports every
``<DIR>/<arch>/triton/<family>/<spec>/kernels.py``, compiles each ``CompileSpec`` of each variant in its
``CONFIGS`` to a cubin with Triton's own pipeline (ptxas / ptxas-blackwell included) and records
registers, spill bytes (ptxas's spill stores + spill loads) and shared memory (Triton's dynamic
allocation, ``metadata.shared``). Identical compiles (same jit function source, signature,
constexprs and options) run once and are reported for every variant that uses them.

The JSON it writes is deterministic (no timestamps, no absolute paths) and is checked in under
``evidence/compile/<arch>.json``; :func:`check_evidence` says whether that file is still true of
the tree. Exits non-zero if a kernel fails to compile, spills, or needs more shared memory than
the arch has.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import multiprocessing
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from attngen.arch import ARCHS, facts
from attngen.evidence import module_identity

ARCH_NAMES = sorted(a.value for a in ARCHS)
DEFAULT_GENERATED = Path("generated")
BACKEND_DIR = "triton"


class AotError(RuntimeError):
    """Some kernels failed to compile; the message lists each one with the compiler's error."""


@dataclass(frozen=True)
class Entry:
    """One kernel of one variant: what the evidence file has a row for."""

    module: (
        str  # "generated/sm90/triton/mha/<spec>/kernels.py", relative to the generated dir's parent
    )
    identity: str  # the variant's kernel identity (attngen.evidence.kernel_identity)
    variant: str
    kernel: str
    index: int  # position in compile_specs(config)


@dataclass(frozen=True)
class Resources:
    registers: int
    spill_bytes: int
    shared_bytes: int


def discover(arch: str, generated_dir: Path) -> list[Path]:
    """Every generated kernels.py of ``arch``, sorted."""
    return sorted((generated_dir / arch / BACKEND_DIR).glob("*/*/kernels.py"))


def _rel(path: Path, generated_dir: Path) -> str:
    return path.resolve().relative_to(generated_dir.resolve().parent).as_posix()


def load_module(rel: str, generated_dir: Path) -> ModuleType:
    """Import a kernels.py by its dotted name, e.g. ``generated.sm90.mha.<spec>.kernels``."""
    root = str(generated_dir.resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(rel.removesuffix(".py").replace("/", "."))


def list_entries(arch: str, generated_dir: Path) -> list[Entry]:
    """Every (module, variant, kernel) of the tree, in a fixed order."""
    entries = []
    for path in discover(arch, generated_dir):
        rel = _rel(path, generated_dir)
        module = load_module(rel, generated_dir)
        if module.LIBRARY_SHA256 != module.library.SOURCE_SHA256:
            raise AotError(f"{rel}: generated against another kernel library: regenerate")
        for uri in sorted(module.CONFIGS):
            names = [spec.name for spec in module.compile_specs(module.CONFIGS[uri])]
            if len(set(names)) != len(names):
                raise AotError(f"{rel} {uri}: compile_specs names are not unique: {names}")
            identity = module_identity(module, uri)
            entries += [Entry(rel, identity, uri, name, i) for i, name in enumerate(names)]
    return entries


def _spec(entry: Entry, generated_dir: Path) -> Any:
    module = load_module(entry.module, generated_dir)
    return module.compile_specs(module.CONFIGS[entry.variant])[entry.index]


def dedupe_key(spec: Any) -> str:
    """Same key -> same cubin (the jit cache_key covers source, callees and used globals)."""
    constexprs = sorted((k, repr(v)) for k, v in spec.constexprs.items())
    parts = (spec.fn.cache_key, sorted(spec.signature.items()), constexprs)
    return repr((*parts, spec.num_warps, spec.num_stages))


_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log: str) -> tuple[int, int]:
    """(registers, spill store + load bytes) of the single entry function in ptxas -v output."""
    regs, spills = _PTXAS_REGS.findall(log), _PTXAS_SPILL.findall(log)
    if len(regs) != 1 or len(spills) != 1:
        raise AotError(f"cannot read registers/spills from the ptxas log:\n{log}")
    return int(regs[0]), int(spills[0][0]) + int(spills[0][1])


def full_signature(spec: Any) -> dict[str, str]:
    """Triton's signature: every argument in order, the constexprs typed "constexpr"."""
    names = spec.fn.arg_names
    both = sorted(set(spec.signature) & set(spec.constexprs))
    unknown = sorted((set(spec.signature) | set(spec.constexprs)) - set(names))
    missing = [n for n in names if n not in spec.signature and n not in spec.constexprs]
    if both or unknown or missing:
        raise AotError(
            f"{spec.name}: bad CompileSpec for {spec.fn.__name__}{tuple(names)}: in both signature "
            f"and constexprs {both}, not arguments {unknown}, in neither {missing}"
        )
    return {n: spec.signature.get(n, "constexpr") for n in names}


def compile_spec(spec: Any, capability: int) -> Resources:
    """Compile one CompileSpec to a cubin; read resources from ptxas's -v report."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = spec.fn.arg_names
    signature = full_signature(spec)
    # What the JIT assumes of every torch tensor argument: 16-byte-aligned data pointers.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if signature[n][0] == "*"}
    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas prints its -v report to stdout ...
    triton.knobs.compilation.always_compile = True  # ... only when it actually runs
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(
            ASTSource(spec.fn, signature, spec.constexprs, attrs),
            target=GPUTarget("cuda", capability, 32),
            options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
        )
    registers, spills = parse_ptxas_log(log.getvalue())
    return Resources(registers, spills, int(compiled.metadata.shared))


def _worker_init(root: str) -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    if root not in sys.path:
        sys.path.insert(0, root)


def _run_job(job: tuple[Entry, Path, int]) -> Resources | str:
    """Worker: compile one unique kernel; an error comes back as text, not as an exception."""
    entry, generated_dir, capability = job
    try:
        return compile_spec(_spec(entry, generated_dir), capability)
    except Exception as exc:  # noqa: BLE001 -- every failure is reported, then the run fails
        text = f"{type(exc).__name__}: {exc}"
        return text if len(text) < 4000 else text[:1500] + "\n...\n" + text[-2500:]


def _describe(arch: str, entry: Entry) -> str:
    family, spec = entry.module.split("/")[-3:-1]
    return f"{arch} {family} {spec} {entry.kernel}"


def _row(entry: Entry, res: Resources) -> dict[str, Any]:
    return {
        "module": entry.module,
        "identity": entry.identity,
        "variant": entry.variant,
        "kernel": entry.kernel,
        "registers": res.registers,
        "spill_bytes": res.spill_bytes,
        "shared_bytes": res.shared_bytes,
    }


def _sort_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return (row["module"], row["variant"], row["kernel"])


def _group(arch: str, generated_dir: Path) -> list[list[Entry]]:
    """Entries grouped by identical compile, in the tree's sorted order."""
    import triton

    groups: dict[str, list[Entry]] = {}
    for entry in list_entries(arch, generated_dir):
        spec = _spec(entry, generated_dir)
        if not isinstance(spec.fn, triton.runtime.jit.JITFunction):
            raise AotError(
                f"{entry.module}: {spec.name} is a {type(spec.fn).__name__}, not a JITFunction "
                "(imported with TRITON_INTERPRET=1?): run the AOT check in a fresh process"
            )
        groups.setdefault(dedupe_key(spec), []).append(entry)
    return list(groups.values())


def compile_arch(arch: str, generated_dir: Path, jobs: int | None = None) -> dict[str, Any]:
    """Compile every kernel of the tree for ``arch``; the evidence JSON object. Raises AotError."""
    os.environ.pop("TRITON_INTERPRET", None)  # too late if triton is imported already: _group
    import triton

    generated_dir = Path(generated_dir)
    unique = _group(arch, generated_dir)
    work = [(users[0], generated_dir, facts(arch).capability) for users in unique]
    processes = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    rows, failures = [], []
    root = str(generated_dir.resolve().parent)
    with multiprocessing.get_context("spawn").Pool(processes, _worker_init, (root,)) as pool:
        for i, (users, res) in enumerate(zip(unique, pool.imap(_run_job, work)), 1):
            head = f"[{i}/{len(work)}] {_describe(arch, users[0])}"
            more = f" (+{len(users) - 1} more variants)" if len(users) > 1 else ""
            if isinstance(res, str):
                print(f"{head}: FAILED{more}", flush=True)
                failures.append(f"{head} ({users[0].variant}):\n{res}")
                continue
            regs, spill, smem = res.registers, res.spill_bytes, res.shared_bytes
            print(f"{head}: {regs} regs, {spill} spill, {smem} B smem{more}", flush=True)
            rows += [_row(user, res) for user in users]
    if failures:
        raise AotError(
            f"{len(failures)} kernel(s) failed to compile for {arch}:\n\n" + "\n\n".join(failures)
        )
    rows = sorted(rows, key=_sort_key)
    return {"arch": arch, "compiler": f"triton {triton.__version__}", "kernels": rows}


def resource_problems(result: dict[str, Any]) -> list[str]:
    """Spills, or more shared memory than one block of the arch may have."""
    limit = facts(result["arch"]).smem_optin_bytes
    problems = []
    for row in result["kernels"]:
        where = f"{row['module']} {row['variant']} {row['kernel']}"
        if row["spill_bytes"] > 0:
            problems.append(f"{where}: spills {row['spill_bytes']} bytes ({row['registers']} regs)")
        if row["shared_bytes"] > limit:
            problems.append(f"{where}: {row['shared_bytes']} B shared memory > {limit} B limit")
    return problems


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, sort_keys=True, indent=1) + "\n"


def check_evidence(arch: str, generated_dir: Path, evidence_path: Path) -> list[str]:
    """What makes ``evidence_path`` untrue of the tree: missing or stale rows, spills."""
    evidence_path, generated_dir = Path(evidence_path), Path(generated_dir)
    if not evidence_path.exists():
        return [f"{evidence_path} does not exist"]
    evidence = json.loads(evidence_path.read_text())
    problems = (
        [] if evidence.get("arch") == arch else [f"evidence is for arch {evidence.get('arch')}"]
    )
    recorded = {(r["module"], r["variant"], r["kernel"]): r for r in evidence["kernels"]}
    current = {(e.module, e.variant, e.kernel): e for e in list_entries(arch, generated_dir)}
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
    return problems + resource_problems(evidence)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attngen.aot", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--arch", required=True, choices=ARCH_NAMES)
    parser.add_argument("--generated", type=Path, default=DEFAULT_GENERATED)
    parser.add_argument("--out", type=Path, help="write the evidence JSON here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="compile processes")
    args = parser.parse_args(argv)
    if not discover(args.arch, args.generated):
        print(f"{args.arch}: no triton kernels under {args.generated / args.arch}", file=sys.stderr)
        return 0
    try:
        result = compile_arch(args.arch, args.generated, args.jobs)
    except AotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(dumps(result))
    problems = resource_problems(result)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    n = len(result["kernels"])
    print(f"{args.arch}: {n} kernels compiled, {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
