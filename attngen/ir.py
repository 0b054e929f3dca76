"""The IR between specs and emitters: what to generate for one spec x backend x arch.

Plans hold final values (tiles, names, buffer shapes); emitters only format them. This is
the neutral base: a (family, backend) lowering returns a :class:`ModulePlan` (or a subclass
with its own fields) whose kernels carry that backend's frozen config dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from attngen.hooks import MaskHooks
from attngen.spec.enums import Arch, Backend, Family
from attngen.spec.model import Spec
from attngen.spec.variant import Variant


class PlanError(Exception):
    """The lowering produced a plan the kernels cannot run."""


@dataclass(frozen=True)
class KernelPlan:
    """One variant's kernels on one target, with the backend's config (tiles, shapes)."""

    variant: Variant
    config: Any  # a frozen dataclass of the lowering's; its ``uri`` is the variant's

    @property
    def uri(self) -> str:
        return self.variant.uri

    @property
    def fields(self) -> list[tuple[str, str]]:
        """(name, Python literal) of every config field that differs from its default, in
        declaration order (defaults are the config class's business, not the reader's)."""
        out = []
        for f in fields(self.config):
            value = getattr(self.config, f.name)
            if f.default is value or f.default == value and type(f.default) is type(value):
                continue
            out.append((f.name, py_literal(value)))
        return out


def py_literal(value: object) -> str:
    """``value`` as Python source in the formatter's style: strings in double quotes,
    tuples and lists element by element, anything else as ``repr``."""
    if isinstance(value, str):
        escaped = value.encode("unicode_escape").decode("ascii").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, tuple):
        items = [py_literal(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(py_literal(v) for v in value)}]"
    return repr(value)


@dataclass(frozen=True)
class GraphBuffer:
    """One static buffer a CUDA-graph capture needs (shape in symbolic dims)."""

    name: str
    dtype: str  # torch dtype name
    shape: tuple[str, ...]  # named dims, e.g. max_bs, max_pages, num_q_heads
    fill: int  # initial value, safe for padded rows
    doc: str

    @property
    def shape_literal(self) -> str:
        """The shape as a Python tuple expression over the dim names."""
        return f"({self.shape[0]},)" if len(self.shape) == 1 else f"({', '.join(self.shape)})"


@dataclass(frozen=True)
class MetadataPlan:
    """What the CUDA-graph metadata builder of one module allocates and fills."""

    num_sms: int
    seq_len_fill_value: int
    buffers: tuple[GraphBuffer, ...]

    @property
    def dims(self) -> tuple[str, ...]:
        """The named dims the buffers use, in first-use order (the allocator's arguments)."""
        return tuple(dict.fromkeys(d for b in self.buffers for d in b.shape))


@dataclass(frozen=True)
class ModulePlan:
    """Everything generated for one spec on one backend and arch."""

    spec: Spec
    backend: Backend
    arch: Arch
    hooks: MaskHooks
    kernels: tuple[KernelPlan, ...]
    metadata: MetadataPlan
    runtime_class: str  # "module:Class" of the runtime base the generated backend subclasses
    feature_lines: tuple[str, ...]  # what this package's variants cover (module docstrings)

    @property
    def family(self) -> Family:
        return self.spec.family

    @property
    def phases_literal(self) -> str:
        """Phases the generated backend serves, in spec order, as a Python tuple literal."""
        names = [f'"{p.value}"' for p in self.spec.phases]
        return f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"

    @property
    def package(self) -> str:
        """Repo-relative directory of the generated package."""
        parts = (self.arch.value, self.backend.value, self.family.value, self.spec.name)
        return "generated/" + "/".join(parts)

    @property
    def runtime_module(self) -> str:
        return self.runtime_class.split(":")[0]

    @property
    def runtime_name(self) -> str:
        return self.runtime_class.split(":")[1]

    @property
    def class_name(self) -> str:
        return "".join(part.capitalize() for part in self.spec.name.split("_")) + "Backend"


def check_unique_uris(plan: ModulePlan) -> list[str]:
    uris = [k.uri for k in plan.kernels]
    dupes = sorted({u for u in uris if uris.count(u) > 1})
    return [f"{plan.spec.name}: duplicate variant uris {dupes}"] if dupes else []


SHOWN_URIS = 3  # variants a plan error names per problem before it counts the rest


def unread_tuning_problems(
    plan: ModulePlan, read_by: dict[str, tuple[Callable[[Any], bool], str]]
) -> list[str]:
    """``check_plan`` problems for each key of ``read_by`` (key -> (whether a config's
    kernels read it, who does)) that the spec tunes for the plan's backend and arch while
    none of the plan's configs reads it: it would tune nothing, so it is refused, as a key
    of phases the spec does not generate is."""
    tuned = plan.spec.tuning_for(plan.backend, plan.arch)
    return [
        f"{key}: no kernel of this spec on {plan.arch.value} reads it: {why}; it would tune "
        "nothing, remove it"
        for key, (reads, why) in read_by.items()
        if key in tuned and not any(reads(k.config) for k in plan.kernels)
    ]


def shared_memory_problems(
    plan: ModulePlan, floors: Callable[[Any, tuple[str, ...]], list[tuple[str, int]]]
) -> list[str]:
    """``check_plan`` problems for every kernel config of ``plan`` whose shared-memory floor
    (``floors(config, phases)``: (what, bytes) per kernel the phases launch, what no compile
    of those tiles can go below) exceeds what one block of the plan's arch may have."""
    from attngen.arch import facts

    limit = facts(plan.arch).smem_optin_bytes
    phases = tuple(p.value for p in plan.spec.phases)
    return [
        f"{k.uri}: {what}: at least {need} B of shared memory, over {plan.arch.value}'s {limit}"
        for k in plan.kernels
        for what, need in floors(k.config, phases)
        if need > limit
    ]


def check_plan(plan: ModulePlan, problems: list[str]) -> None:
    """Raise one PlanError for ``problems`` (each ``"<variant uri>: <what>"`` or plan-wide)
    and duplicate uris, if any: each distinct <what> once, after the variants it concerns
    (the first SHOWN_URIS, then how many more), so a refused tuning value of a 72-variant
    spec reads as one problem, not 72."""
    problems = problems + check_unique_uris(plan)
    if not problems:
        return
    uris = {k.uri for k in plan.kernels}
    named: dict[str, list[str]] = {}
    for problem in problems:
        uri, sep, what = problem.partition(": ")
        if sep and uri in uris:
            named.setdefault(what, []).append(uri)
        else:
            named.setdefault(problem, [])
    parts = []
    for what, names in named.items():
        shown = ", ".join(names[:SHOWN_URIS])
        if len(names) > SHOWN_URIS:
            shown += f" and {len(names) - SHOWN_URIS} more"
        parts.append(f"{shown}: {what}" if names else what)
    raise PlanError(f"{plan.spec.path} ({plan.arch.value}): " + "; ".join(parts))
