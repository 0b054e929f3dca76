"""Per-module emitters: one generated package per spec x backend x arch.

A package is the lowering's binding (``kernels.py``, from the lowering's own template) and
the spine's wrappers: ``backend.py`` (subclasses the plan's runtime class), ``graph.py``
(the CUDA-graph metadata buffers of the plan) and ``__init__.py``.
"""

from __future__ import annotations

import hashlib

from attngen.emit.env import render
from attngen.emit.header import Provenance, regenerate_command
from attngen.emit.python import format_python
from attngen.ir import ModulePlan

WRAPPERS = (
    ("backend.py", "wrapper/backend.py.jinja"),
    ("graph.py", "wrapper/graph.py.jinja"),
    ("__init__.py", "wrapper/package_init.py.jinja"),
)
NAMESPACE_TEMPLATE = "wrapper/namespace_init.py.jinja"


def package_files(plan: ModulePlan, binding_template: str, **binding: object) -> dict[str, str]:
    """{path relative to generated/: text} for one plan's package."""
    prefix = plan.package.removeprefix("generated/")
    out = {}
    for name, template in (("kernels.py", binding_template), *WRAPPERS):
        prov = Provenance(
            (plan.spec.path,),
            f"templates/{template}" if template.startswith("wrapper/") else f"attngen/{template}",
            plan.spec.sha256,
            regenerate_command(plan.arch.value),
        )
        rel = f"{prefix}/{name}"
        text = render(template, header=prov.python(), plan=plan, **binding)
        out[rel] = format_python(text, rel)
    return out


def namespace_files(plans: list[ModulePlan], archs: tuple[str, ...], digest: str) -> dict[str, str]:
    """__init__.py of generated/ and of every folder above a package."""
    dirs: dict[str, str] = {
        "": "attngen's generated code: generated/<arch>/<backend>/<family>/<spec>/."
    }
    for arch in archs:
        dirs[arch] = f"Generated code for {arch}."
    for plan in plans:
        arch, backend, family = plan.arch.value, plan.backend.value, plan.family.value
        dirs[f"{arch}/{backend}"] = f"Generated {backend} packages for {arch}."
        dirs[f"{arch}/{backend}/{family}"] = f"Generated {family} packages on {backend} {arch}."
    out = {}
    for rel_dir, doc in sorted(dirs.items()):
        rel = f"{rel_dir}/__init__.py" if rel_dir else "__init__.py"
        arch = rel_dir.split("/")[0] or "all"
        prov = Provenance(
            ("specs/",), f"templates/{NAMESPACE_TEMPLATE}", digest, regenerate_command(arch)
        )
        text = render(NAMESPACE_TEMPLATE, header=prov.python(), doc=doc)
        out[rel] = format_python(text, rel)
    return out


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
