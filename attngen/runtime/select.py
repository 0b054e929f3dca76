"""Build a generated backend by arch and spec name, or a hybrid of two; detect the arch.

``make_backend("sm90", "mha_gqa_paged", **kwargs)`` imports
``generated.sm90.<backend>.<family>.mha_gqa_paged.backend`` and constructs its ``Backend``.
The family is found from the tree; the kernel backend is ``backend=`` or, when several
backends generate the spec for the arch, chosen per phase: among the backends whose
generated kernels serve the phase (their ``PHASES``), the one measured faster than the
others on this arch and phase (``evidence/speed/<arch>.json``, :mod:`attngen.speed`), else
the first of ``attngen.selection.preference(arch)``. When extend and decode pick different
backends of one spec, the result is a :class:`~attngen.runtime.hybrid.HybridAttnBackend`.
With ``prefill_spec=`` and/or ``decode_spec=`` it builds one backend per phase (an
unspecified phase inherits ``spec_name``, as SGLang's ``--prefill-attention-backend`` /
``--decode-attention-backend`` inherit ``--attention-backend``) and, when the two specs
differ, wraps them in a :class:`~attngen.runtime.hybrid.HybridAttnBackend`. Both backends get
the same ``backend_kwargs``, so they share one KV pool and one ``req_to_token`` table.

The ``generated`` package must be importable (the repository root on ``sys.path``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path
from typing import Any

import torch

from attngen.arch import ARCHS as ARCH_TABLE
from attngen.arch import arch_for_device
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.hybrid import HybridAttnBackend
from attngen.selection import fastest_or_first, preference
from attngen.spec.enums import Arch, Backend, Phase
from attngen.speed import NO_SPEED, SpeedEvidence, load_speed

GENERATED_PACKAGE = "generated"
ARCHS = tuple(a.value for a in ARCH_TABLE)


def arch_from_capability(major: int, minor: int) -> str:
    """The generated arch that runs on a GPU of compute capability ``major.minor``.

    8.x (A100, and Ampere/Ada parts, which run the sm80 Triton kernels) -> sm80;
    9.0 (H100/H200) -> sm90; 10.x (B200/GB200, B300) -> sm100. Anything else is refused.
    """
    arch = arch_for_device(major, minor)
    if arch is not None:
        return arch.value
    raise AttngenInputError(
        f"compute capability {major}.{minor}: attngen generates kernels for "
        f"{', '.join(ARCHS)} (capability 8.x, 9.0, 10.x); this GPU is none of them"
    )


def detect_arch(device: torch.device | str | int | None = None) -> str:
    """The generated arch for a CUDA device (default: the current one)."""
    if not torch.cuda.is_available():
        raise AttngenInputError("detect_arch: no CUDA device is available")
    major, minor = torch.cuda.get_device_capability(device)
    return arch_from_capability(major, minor)


def available_specs(arch: str) -> dict[str, list[tuple[str, str]]]:
    """Spec packages generated for ``arch``: spec name -> [(backend, family)], from the tree
    (folders generated/<arch>/<backend>/<family>/<spec>/ with a ``backend.py``)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for root in _generated_roots():
        for path in sorted((root / _check_arch(arch)).glob("*/*/*/backend.py")):
            backend, family, spec = path.parent.relative_to(root / arch).parts
            found.setdefault(spec, []).append((backend, family))
    return found


def load_backend_class(
    arch: str,
    spec_name: str,
    backend: str | None = None,
    phase: str | None = None,
    speed: SpeedEvidence | None = None,
) -> type:
    """The ``Backend`` class of ``generated.<arch>.<backend>.<family>.<spec_name>.backend``.

    Without ``backend``: the one :func:`choose_backend` picks for ``phase`` (None: the first
    generated one in the arch's preference order)."""
    arch = _check_arch(arch)
    known = available_specs(arch)
    where = known.get(spec_name, [])
    if backend is not None:
        where = [w for w in where if w[0] == backend]
    if not where:
        on = f" on {backend}" if backend else ""
        raise AttngenInputError(
            f"spec {spec_name!r}: no generated backend{on} for {arch}; "
            f"available: {', '.join(sorted(known)) or 'none'} (generated/{arch}/)"
        )
    chosen = _choose(arch, spec_name, where, phase, speed) if backend is None else backend
    family = dict(where)[chosen]
    return _module(arch, chosen, family, spec_name, "backend").Backend


def choose_backend(
    arch: str, spec_name: str, phase: str | None, speed: SpeedEvidence | None = None
) -> str:
    """The generated backend that serves ``spec_name``'s ``phase`` on ``arch``.

    Candidates: the backends that generate the spec for the arch and whose kernels serve the
    phase, in the arch's preference order. The one that ``speed`` (default: the repository's
    ``evidence/speed``) measured faster than each other candidate on this arch and phase
    wins; else the first (:func:`attngen.selection.fastest_or_first`, as ``select_backend``
    decides). When none serves the phase (or ``phase`` is None), the first generated backend
    in the preference order (it refuses the phase itself)."""
    arch = _check_arch(arch)
    where = available_specs(arch).get(spec_name, [])
    if not where:
        raise AttngenInputError(f"spec {spec_name!r}: no generated backend for {arch}")
    return _choose(arch, spec_name, where, phase, speed)


def _choose(
    arch: str,
    spec_name: str,
    where: list[tuple[str, str]],
    phase: str | None,
    speed: SpeedEvidence | None,
) -> str:
    """:func:`choose_backend` over ``where``, the spec's (backend, family) pairs on ``arch``
    (an :func:`available_specs` entry, not empty)."""
    order = [b.value for b in preference(arch)]
    ranked = sorted(where, key=lambda w: order.index(w[0]) if w[0] in order else len(order))
    if phase is None or len(ranked) == 1:
        return ranked[0][0]
    serving = [
        Backend(b)
        for b, family in ranked
        if phase in _module(arch, b, family, spec_name, "kernels").PHASES
    ]
    if not serving:  # none serves it: the first refuses the phase itself
        return ranked[0][0]
    speed = _repository_speed() if speed is None else speed
    return fastest_or_first(serving, Arch(arch), Phase(phase), speed)[0].value


def _module(arch: str, backend: str, family: str, spec_name: str, name: str) -> Any:
    return importlib.import_module(
        f"{GENERATED_PACKAGE}.{arch}.{backend}.{family}.{spec_name}.{name}"
    )


def _repository_speed() -> SpeedEvidence:
    """The speed evidence next to the generated tree (none there: no evidence), read once
    per process (:func:`_speed_at`)."""
    return _speed_at(_generated_roots()[0].parent)


@functools.lru_cache(maxsize=None)
def _speed_at(root: Path) -> SpeedEvidence:
    """``root``'s ``evidence/speed`` files, read on the first call for ``root`` only: a file
    changed later in the process is not seen (``_speed_at.cache_clear()`` rereads)."""
    try:
        return load_speed(root)
    except (OSError, ValueError):
        return NO_SPEED


def make_backend(
    arch: str,
    spec_name: str | None,
    *,
    prefill_spec: str | None = None,
    decode_spec: str | None = None,
    backend: str | None = None,
    capture_prefill: bool = False,
    **backend_kwargs: Any,
) -> Any:
    """A generated backend, or a hybrid one when the prefill and decode specs (or, without
    ``backend``, the backends chosen for extend and for decode) differ.

    ``backend_kwargs`` go to every constructed backend (``num_q_heads``, ``num_kv_heads``,
    ``head_dim``, ``page_size``, ``dtype``, ``device``, ``req_to_token_pool``, ``kv_pool``,
    ...). ``spec_name`` may be ``None`` when both ``prefill_spec`` and ``decode_spec`` are
    given. ``capture_prefill`` is passed to the hybrid (see ``HybridAttnBackend``).
    """
    prefill = prefill_spec or spec_name
    decode = decode_spec or spec_name
    if prefill is None or decode is None:
        missing = "prefill_spec" if prefill is None else "decode_spec"
        raise AttngenInputError(f"make_backend: spec_name is None, so {missing} is required")
    # Resolve both classes before constructing anything, so a bad name fails first.
    prefill_cls = load_backend_class(arch, prefill, backend, Phase.EXTEND.value)
    decode_cls = load_backend_class(arch, decode, backend, Phase.DECODE.value)
    if prefill_cls is decode_cls:
        return prefill_cls(**backend_kwargs)
    return HybridAttnBackend(
        prefill_cls(**backend_kwargs),
        decode_cls(**backend_kwargs),
        capture_prefill=capture_prefill,
    )


def _check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise AttngenInputError(f"arch: expected one of {', '.join(ARCHS)}, got {arch!r}")
    return arch


def _generated_roots() -> list[Path]:
    try:
        found = importlib.util.find_spec(GENERATED_PACKAGE)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise AttngenInputError(
            f"the {GENERATED_PACKAGE!r} package is not importable: put the attngen repository "
            f"root (the folder holding generated/) on sys.path"
        )
    return [Path(root) for root in found.submodule_search_locations]
