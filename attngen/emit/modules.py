"""Per-module emitters: one generated package per spec x backend x arch."""

from __future__ import annotations

import hashlib

from attngen.emit.env import render
from attngen.emit.header import Provenance, regenerate_command
from attngen.emit.python import format_python
from attngen.lower.ir import MhaModulePlan

PACKAGE_FILES = (
    ("kernels.py", "triton/mha_kernels.py.jinja"),
    ("backend.py", "wrapper/backend.py.jinja"),
    ("graph.py", "wrapper/graph.py.jinja"),
    ("__init__.py", "wrapper/package_init.py.jinja"),
)


def module_files(plan: MhaModulePlan) -> dict[str, str]:
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
        text = render(template, header=prov.python(), plan=plan, module=plan)
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
