"""Ahead-of-time compile check of every generated Triton kernel, for one GPU arch, no GPU needed.

``python -m attngen.backends.triton.aot --arch sm90 [--generated DIR] [--out FILE] [--reuse F]``
imports every ``<DIR>/<arch>/triton/<family>/<spec>/kernels.py``, compiles each ``CompileSpec``
of each variant in its ``CONFIGS`` to a cubin with Triton's own pipeline (ptxas /
ptxas-blackwell included) and records registers, spill bytes (ptxas's spill stores + spill
loads) and shared memory (Triton's dynamic allocation, ``metadata.shared``). Identical compiles
(same jit function source, signature, constexprs and options) run once and are reported for
every variant that uses them.

Each kernel compiles twice, and its row holds the worse of the two for each measure: with
its integer arguments generic, and with every one of them a multiple of 16, as Triton's JIT
specializes them whenever the launch's values are (strides of contiguous tensors, head
counts, usually token counts too). Either may be what runs, and neither bounds the other
(the GDN state kernel at 64 value rows spilled 16 bytes specialized only; the GDN decode
kernel took 80 registers generic, 72 specialized).

The JSON it writes is deterministic (no timestamps, no absolute paths) and is checked in under
``evidence/compile/triton/<arch>.json``; :func:`check_evidence` says whether that file is still
true of the tree. Discovery, grouping, reuse and the evidence file are
:mod:`attngen.aot_driver`'s. Exits non-zero if a kernel fails to compile, spills, or needs more
shared memory than the arch has.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import Any

from attngen import aot_driver
from attngen.aot_driver import AotError, Entry, Resources
from attngen.arch import facts

ARCH_NAMES = aot_driver.ARCH_NAMES

_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame")


def dedupe_key(spec: Any) -> str:
    """Same key -> same cubin (the jit cache_key covers source, callees and used globals)."""
    constexprs = sorted((k, repr(v)) for k, v in spec.constexprs.items())
    parts = (spec.fn.cache_key, sorted(spec.signature.items()), constexprs)
    return repr((*parts, spec.num_warps, spec.num_stages, launch_options(spec)))


def launch_options(spec: Any) -> dict[str, int]:
    """The compile options of a CompileSpec: warps, stages and, when it caps them, the
    registers a thread may use (``max_registers``, ptxas's maxnreg)."""
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if getattr(spec, "max_registers", 0):
        options["maxnreg"] = spec.max_registers
    return options


def parse_ptxas_log(log: str) -> tuple[int, int]:
    """(registers, spill store + load bytes + stack frame bytes) of the single entry function
    in ptxas -v output. The stack frame counts too: local memory a kernel touches in its loops
    whether ptxas calls it spilling or not (the CuTe DSL check missed such spills once)."""
    regs, spills = _PTXAS_REGS.findall(log), _PTXAS_SPILL.findall(log)
    frames = _PTXAS_FRAME.findall(log)
    if len(regs) != 1 or len(spills) != 1 or len(frames) > 1:
        raise AotError(f"cannot read registers/spills from the ptxas log:\n{log}")
    frame = int(frames[0]) if frames else 0
    return int(regs[0]), int(spills[0][0]) + int(spills[0][1]) + frame


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


INT_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
SPECIALIZATIONS = ("generic", "ints16")  # the two compiles of every kernel (module docstring)


def divisibility(spec: Any, specialization: str) -> dict[tuple[int, ...], list[list[Any]]]:
    """Triton's ``tt.divisibility`` attributes of one compile: every pointer 16-byte aligned
    (what the JIT assumes of torch tensors), and with ``ints16`` every integer argument a
    multiple of 16 too (what it assumes of an integer argument whose value is a multiple
    of 16; a value of 1 it makes a constant, which neither compile covers)."""
    signature = full_signature(spec)
    ints = specialization == "ints16"
    return {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(spec.fn.arg_names)
        if signature[name][0] == "*" or (ints and signature[name] in INT_TYPES)
    }


def compile_once(spec: Any, capability: int, specialization: str) -> Resources:
    """One compile to a cubin; resources from ptxas's -v report."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    # Gluon kernels (Triton's layout-explicit dialect) go through their own front end
    source = GluonASTSource if getattr(spec.fn, "is_gluon", lambda: False)() else ASTSource
    attrs = divisibility(spec, specialization)
    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas prints its -v report to stdout ...
    triton.knobs.compilation.always_compile = True  # ... only when it actually runs
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(
            source(spec.fn, full_signature(spec), spec.constexprs, attrs),
            target=GPUTarget("cuda", capability, 32),
            options=launch_options(spec),
        )
    registers, spills = parse_ptxas_log(log.getvalue())
    return Resources(registers, spills, int(compiled.metadata.shared))


def compile_spec(spec: Any, capability: int) -> Resources:
    """Both compiles of one CompileSpec (:data:`SPECIALIZATIONS`); the worse of each measure."""
    both = [compile_once(spec, capability, s) for s in SPECIALIZATIONS]
    return Resources(
        max(r.registers for r in both),
        max(r.spill_bytes for r in both),
        max(r.shared_bytes for r in both),
    )


class TritonCompiler(aot_driver.Compiler):
    backend_dir = "triton"
    prog = "python -m attngen.backends.triton.aot"

    def prepare(self) -> None:
        os.environ.pop("TRITON_INTERPRET", None)  # too late if triton is imported: check_spec

    def version(self) -> str:
        import triton

        # the method is part of the version: rows of a single compile are never reused
        return (
            f"triton {triton.__version__} (int arguments generic and as multiples of 16: the worse)"
        )

    def group_key(self, spec: Any) -> str:
        return dedupe_key(spec)

    def check_spec(self, entry: Entry, spec: Any) -> None:
        import triton

        if not isinstance(spec.fn, triton.runtime.jit.JITFunction):
            raise AotError(
                f"{entry.module}: {spec.name} is a {type(spec.fn).__name__}, not a JITFunction "
                "(imported with TRITON_INTERPRET=1?): run the AOT check in a fresh process"
            )

    def compile(self, spec: Any, arch: str) -> Resources:
        return compile_spec(spec, facts(arch).capability)


COMPILER = TritonCompiler()
main = COMPILER.main

if __name__ == "__main__":  # run the importable module's compiler (its class pickles by name)
    import sys

    from attngen.backends.triton import aot

    sys.exit(aot.main())
