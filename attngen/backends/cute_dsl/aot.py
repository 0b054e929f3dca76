"""Ahead-of-time compile check of every generated CuTe DSL kernel, for one GPU arch, no GPU needed.

``python -m attngen.backends.cute_dsl.aot --arch sm90 [--generated DIR] [--out F] [--reuse F]``
imports every ``<DIR>/<arch>/cute_dsl/<family>/<spec>/kernels.py``, compiles each ``CompileSpec``
of each variant in its ``CONFIGS`` with ``cute.compile`` on fake tensors (CuTe DSL carries NVVM
and ptxas: no CUDA toolkit, no driver) for the arch's cubin target, and records registers and
spill bytes (``cuobjdump --dump-resource-usage`` on the cubin), the kernel's shared memory
(``CompileSpec.shared_bytes``) and the instructions the kernel's design relies on, counted in
its PTX and SASS (``CompileSpec.requires``: e.g. wgmma and bulk tensor copies on sm_90a,
tcgen05 on sm_100a). Identical specializations compile once and are reported for every
variant that uses them.

The JSON it writes is deterministic (no timestamps, no absolute paths) and is checked in under
``evidence/compile/cute_dsl/<arch>.json``; discovery, grouping, reuse and the evidence file are
:mod:`attngen.aot_driver`'s. Exits non-zero if a kernel fails to compile, spills,
needs more shared memory than the arch has, or lacks an instruction it requires.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from attngen import aot_driver
from attngen.aot_driver import AotError, Resources
from attngen.arch import facts

ARCH_NAMES = aot_driver.ARCH_NAMES

_REG = re.compile(r"REG:(\d+)")
_LOCAL = re.compile(r"LOCAL:(\d+)")
_STACK = re.compile(r"STACK:(\d+)")


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
    regs, local, stack = _REG.findall(usage), _LOCAL.findall(usage), _STACK.findall(usage)
    if len(regs) != 1 or len(local) != 1 or len(stack) != 1:
        raise AotError(f"cannot read registers/local memory from cuobjdump:\n{usage}")
    return int(regs[0]), int(local[0]) + int(stack[0]), sass


def compile_spec(spec: Any, cubin_target: str) -> Resources:
    """Compile one CompileSpec for ``cubin_target``; read what it uses and contains."""
    import cutlass.cute as cute

    with tempfile.TemporaryDirectory() as dump:
        options = f"--gpu-arch {cubin_target} --keep-ptx --keep-cubin --dump-dir {dump}"
        options += getattr(spec, "options", "")  # what its launcher compiles with besides
        compiled = cute.compile(spec.kernel, *spec.fake_args(), options=options)
        ptx, cubin = compiled.artifacts.PTX, compiled.artifacts.CUBIN
    registers, spills, sass = cubin_resources(cubin)
    found = {pattern: ptx.count(pattern) for pattern in spec.requires.get("ptx", ())}
    found |= {pattern: sass.count(pattern) for pattern in spec.requires.get("sass", ())}
    return Resources(
        registers, spills, spec.shared_bytes, {"instructions": dict(sorted(found.items()))}
    )


class CuteDslCompiler(aot_driver.Compiler):
    backend_dir = "cute_dsl"
    prog = "python -m attngen.backends.cute_dsl.aot"

    def version(self) -> str:
        from importlib.metadata import version

        return f"nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}"

    def group_key(self, spec: Any) -> Any:
        return spec.dedupe_key

    def compile(self, spec: Any, arch: str) -> Resources:
        return compile_spec(spec, facts(arch).cubin_target)

    def row_problems(self, where: str, row: dict[str, Any]) -> list[str]:
        """A required instruction missing from the kernel."""
        missing = sorted(k for k, n in row.get("instructions", {}).items() if n == 0)
        return [f"{where}: no {', '.join(missing)} in the compiled kernel"] if missing else []


COMPILER = CuteDslCompiler()
main = COMPILER.main

if __name__ == "__main__":  # run the importable module's compiler (its class pickles by name)
    import sys

    from attngen.backends.cute_dsl import aot

    sys.exit(aot.main())
