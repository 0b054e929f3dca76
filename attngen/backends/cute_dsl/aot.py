"""Ahead-of-time compile check of every generated CuTe DSL kernel, for one GPU arch, no GPU needed.

``python -m attngen.backends.cute_dsl.aot --arch sm90 [--generated DIR] [--out FILE] [--jobs N]``
imports every ``<DIR>/<arch>/cute_dsl/<family>/<spec>/kernels.py``, compiles each ``CompileSpec``
of each variant in its ``CONFIGS`` with ``cute.compile`` on fake tensors (CuTe DSL carries NVVM
and ptxas: no CUDA toolkit, no driver) for the arch's cubin target, and records registers and
spill bytes (``cuobjdump --dump-resource-usage`` on the cubin), the kernel's shared memory
(``CompileSpec.shared_bytes``) and the instructions the kernel's design relies on, counted in
its PTX and SASS (``CompileSpec.requires``: e.g. wgmma and bulk tensor copies on sm_90a,
tcgen05 on sm_100a). Identical specializations compile once and are reported for every
variant that uses them.

The JSON it writes is deterministic (no timestamps, no absolute paths) and is checked in under
``evidence/compile/cute_dsl/<arch>.json``. Exits non-zero if a kernel fails to compile, spills,
needs more shared memory than the arch has, or lacks an instruction it requires.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from attngen.arch import ARCHS, facts
from attngen.evidence import module_identity

ARCH_NAMES = sorted(a.value for a in ARCHS)
DEFAULT_GENERATED = Path("generated")
BACKEND_DIR = "cute_dsl"


class AotError(RuntimeError):
    """Some kernels failed to compile; the message lists each one with the compiler's error."""


@dataclass(frozen=True)
class Entry:
    """One kernel of one variant: what the evidence file has a row for."""

    module: str  # "generated/sm90/cute_dsl/mha/<spec>/kernels.py", relative to generated/'s parent
    identity: str  # the variant's kernel identity (attngen.evidence.kernel_identity)
    variant: str
    kernel: str
    index: int  # position in compile_specs(config)


@dataclass(frozen=True)
class Resources:
    registers: int
    spill_bytes: int
    shared_bytes: int
    instructions: dict[str, int]  # required PTX / SASS patterns -> occurrences


def discover(arch: str, generated_dir: Path) -> list[Path]:
    """Every generated CuTe DSL kernels.py of ``arch``, sorted."""
    return sorted((generated_dir / arch / BACKEND_DIR).glob("*/*/kernels.py"))


def load_module(rel: str, generated_dir: Path) -> ModuleType:
    root = str(generated_dir.resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(rel.removesuffix(".py").replace("/", "."))


def list_entries(arch: str, generated_dir: Path) -> list[Entry]:
    """Every (module, variant, kernel) of the tree, in a fixed order."""
    entries = []
    for path in discover(arch, generated_dir):
        rel = path.resolve().relative_to(generated_dir.resolve().parent).as_posix()
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


_REG = re.compile(r"REG:(\d+)")
_LOCAL = re.compile(r"LOCAL:(\d+)")


def cuda_tool(name: str) -> str:
    """A CUDA binary tool (cuobjdump): from PATH, else the copy Triton's wheel bundles."""
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    return name


def cubin_resources(cubin: bytes) -> tuple[int, int, str]:
    """(registers, local-memory (spill) bytes, SASS text) of a single-kernel cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        tool = cuda_tool("cuobjdump")
        usage = subprocess.run(
            [tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [tool, "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    regs, local = _REG.findall(usage), _LOCAL.findall(usage)
    if len(regs) != 1 or len(local) != 1:
        raise AotError(f"cannot read registers/local memory from cuobjdump:\n{usage}")
    return int(regs[0]), int(local[0]), sass


def compile_spec(spec: Any, cubin_target: str) -> Resources:
    """Compile one CompileSpec for ``cubin_target``; read what it uses and contains."""
    import cutlass.cute as cute

    with tempfile.TemporaryDirectory() as dump:
        options = f"--gpu-arch {cubin_target} --keep-ptx --keep-cubin --dump-dir {dump}"
        compiled = cute.compile(spec.kernel, *spec.fake_args(), options=options)
        ptx, cubin = compiled.artifacts.PTX, compiled.artifacts.CUBIN
    registers, spills, sass = cubin_resources(cubin)
    found = {pattern: ptx.count(pattern) for pattern in spec.requires.get("ptx", ())}
    found |= {pattern: sass.count(pattern) for pattern in spec.requires.get("sass", ())}
    return Resources(registers, spills, spec.shared_bytes, found)


def _worker_init(root: str) -> None:
    if root not in sys.path:
        sys.path.insert(0, root)


def _run_job(job: tuple[Entry, Path, str]) -> Resources | str:
    """Worker: compile one unique kernel; an error comes back as text, not as an exception."""
    entry, generated_dir, target = job
    try:
        return compile_spec(_spec(entry, generated_dir), target)
    except Exception as exc:  # noqa: BLE001 -- every failure is reported, then the run fails
        text = f"{type(exc).__name__}: {exc}"
        return text if len(text) < 4000 else text[:1500] + "\n...\n" + text[-2500:]


def _row(entry: Entry, res: Resources) -> dict[str, Any]:
    return {
        "module": entry.module,
        "identity": entry.identity,
        "variant": entry.variant,
        "kernel": entry.kernel,
        "registers": res.registers,
        "spill_bytes": res.spill_bytes,
        "shared_bytes": res.shared_bytes,
        "instructions": dict(sorted(res.instructions.items())),
    }


def _group(arch: str, generated_dir: Path) -> list[list[Entry]]:
    """Entries grouped by identical compile (the spec's dedupe_key), in the tree's order."""
    groups: dict[Any, list[Entry]] = {}
    for entry in list_entries(arch, generated_dir):
        groups.setdefault(_spec(entry, generated_dir).dedupe_key, []).append(entry)
    return list(groups.values())


def compile_arch(arch: str, generated_dir: Path, jobs: int | None = None) -> dict[str, Any]:
    """Compile every kernel of the tree for ``arch``; the evidence JSON object. Raises AotError."""
    from importlib.metadata import version

    generated_dir = Path(generated_dir)
    unique = _group(arch, generated_dir)
    target = facts(arch).cubin_target
    work = [(users[0], generated_dir, target) for users in unique]
    processes = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    rows, failures = [], []
    root = str(generated_dir.resolve().parent)
    with multiprocessing.get_context("spawn").Pool(processes, _worker_init, (root,)) as pool:
        for i, (users, res) in enumerate(zip(unique, pool.imap(_run_job, work)), 1):
            family, spec = users[0].module.split("/")[-3:-1]
            head = f"[{i}/{len(work)}] {arch} {family} {spec} {users[0].kernel}"
            more = f" (+{len(users) - 1} more variants)" if len(users) > 1 else ""
            if isinstance(res, str):
                print(f"{head}: FAILED{more}", flush=True)
                failures.append(f"{head} ({users[0].variant}):\n{res}")
                continue
            print(
                f"{head}: {res.registers} regs, {res.spill_bytes} spill, "
                f"{res.shared_bytes} B smem, {res.instructions}{more}",
                flush=True,
            )
            rows += [_row(user, res) for user in users]
    if failures:
        raise AotError(
            f"{len(failures)} kernel(s) failed to compile for {arch}:\n\n" + "\n\n".join(failures)
        )
    rows = sorted(rows, key=lambda r: (r["module"], r["variant"], r["kernel"]))
    compiler = f"nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}"
    return {"arch": arch, "compiler": compiler, "kernels": rows}


def resource_problems(result: dict[str, Any]) -> list[str]:
    """Spills, more shared memory than one block of the arch may have, or a required
    instruction missing from the kernel."""
    limit = facts(result["arch"]).smem_optin_bytes
    problems = []
    for row in result["kernels"]:
        where = f"{row['module']} {row['variant']} {row['kernel']}"
        if row["spill_bytes"] > 0:
            problems.append(f"{where}: spills {row['spill_bytes']} bytes ({row['registers']} regs)")
        if row["shared_bytes"] > limit:
            problems.append(f"{where}: {row['shared_bytes']} B shared memory > {limit} B limit")
        missing = sorted(k for k, n in row.get("instructions", {}).items() if n == 0)
        if missing:
            problems.append(f"{where}: no {', '.join(missing)} in the compiled kernel")
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
        prog="python -m attngen.backends.cute_dsl.aot", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--arch", required=True, choices=ARCH_NAMES)
    parser.add_argument("--generated", type=Path, default=DEFAULT_GENERATED)
    parser.add_argument("--out", type=Path, help="write the evidence JSON here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="compile processes")
    args = parser.parse_args(argv)
    if not discover(args.arch, args.generated):
        print(
            f"{args.arch}: no cute_dsl kernels under {args.generated / args.arch}", file=sys.stderr
        )
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
