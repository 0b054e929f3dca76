"""Per-module emitters: one generated package per spec x backend x arch."""

from __future__ import annotations

import hashlib

from attngen.emit.env import render
from attngen.emit.header import Provenance, regenerate_command
from attngen.emit.python import format_python
from attngen.lower.ir import MhaModulePlan

LIBRARY = "triton/mha.py"  # relative to generated/: the shared Triton MHA kernels
LIBRARY_TEMPLATE = "triton/mha_library.py.jinja"
LIBRARY_IMPORT = "from ....triton import mha as library"  # from generated/<arch>/mha/<spec>/

PACKAGE_FILES = (
    ("kernels.py", "triton/mha_kernels.py.jinja"),
    ("backend.py", "wrapper/backend.py.jinja"),
    ("graph.py", "wrapper/graph.py.jinja"),
    ("__init__.py", "wrapper/package_init.py.jinja"),
)


def library_files() -> dict[str, str]:
    """The shared Triton MHA library and its package: spec- and arch-independent.

    Its provenance digest is the sha256 of its body (what it was rendered from is the
    templates alone); every spec's kernels.py records it, so evidence keyed by a
    kernels.py's bytes goes stale when the library changes.
    """
    body = render(LIBRARY_TEMPLATE, header="")
    prov = Provenance(
        ("attngen/templates/triton/",),
        f"templates/{LIBRARY_TEMPLATE}",
        sha256_text(body),
        regenerate_command("all"),
    )
    doc = "Shared generated kernel libraries (arch- and spec-independent)."
    init_prov = Provenance(
        ("attngen/templates/triton/",),
        "templates/wrapper/namespace_init.py.jinja",
        sha256_text(body),
        regenerate_command("all"),
    )
    return {
        LIBRARY: format_python(render(LIBRARY_TEMPLATE, header=prov.python()), LIBRARY),
        "triton/__init__.py": format_python(
            render("wrapper/namespace_init.py.jinja", header=init_prov.python(), doc=doc),
            "triton/__init__.py",
        ),
    }


def module_files(plan: MhaModulePlan, library_sha256: str) -> dict[str, str]:
    """{path relative to generated/: text} for one plan's package."""
    prefix = plan.package.removeprefix("generated/")
    out = {}
    for name, template in PACKAGE_FILES:
        prov = Provenance(
            (plan.spec.path,),
            f"templates/{template}",
            plan.spec.sha256,
            regenerate_command(plan.arch.value),
        )
        rel = f"{prefix}/{name}"
        text = render(
            template,
            header=prov.python(),
            plan=plan,
            module=plan,
            library_import=LIBRARY_IMPORT,
            library_sha256=library_sha256,
        )
        out[rel] = format_python(text, rel)
    return out


def namespace_files(
    plans: list[MhaModulePlan], archs: tuple[str, ...], digest: str
) -> dict[str, str]:
    """__init__.py of generated/, generated/<arch>/ and generated/<arch>/<family>/."""
    out = {}
    dirs: dict[str, str] = {"": "attngen's generated code: one package per arch, family and spec."}
    for arch in archs:
        dirs[arch] = f"Generated code for {arch}."
    for plan in plans:
        arch, family = plan.arch.value, plan.spec.family.value
        dirs[f"{arch}/{family}"] = f"Generated {family} packages for {arch}."
    for rel_dir, doc in sorted(dirs.items()):
        rel = f"{rel_dir}/__init__.py" if rel_dir else "__init__.py"
        arch = rel_dir.split("/")[0] or "all"
        prov = Provenance(
            ("specs/",),
            "templates/wrapper/namespace_init.py.jinja",
            digest,
            regenerate_command(arch),
        )
        out[rel] = format_python(
            render("wrapper/namespace_init.py.jinja", header=prov.python(), doc=doc), rel
        )
    return out


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
