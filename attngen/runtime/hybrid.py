"""A hybrid attention backend: one backend for prefill/extend, another for decode.

The counterpart of SGLang's hybrid attention (``--prefill-attention-backend`` /
``--decode-attention-backend``): both backends are chosen at construction and each
forward goes to one of them by its ``ForwardMode``:

- extend-like modes (``ForwardMode.is_extend()``: EXTEND, TARGET_VERIFY, DRAFT_EXTEND)
  and ``forward_extend`` go to the prefill backend;
- DECODE and ``forward_decode`` go to the decode backend;
- IDLE clears both backends' metadata.

CUDA graphs capture decode, so the graph methods go to the decode backend; a capture or
replay in an extend-like mode goes to the prefill backend, when it has graph methods.
``init_cuda_graph_state`` sets up the decode backend, and the prefill backend too when the
hybrid is built with ``capture_prefill=True``.

Both backends must describe the same attention layer (heads, head dims, page size, dtype,
device; KV-cache dtype and scale granularity where they have them), compute the same attention (their kernels' sliding window, logit softcap and
sinks agree; ``causal`` may differ, it does not change decode), and share the very same KV
pool and ``req_to_token`` table, since one writes the K/V that the other reads.
Construction checks all of it (and that the prefill backend generates ``extend`` and the
decode backend ``decode``) and names what disagrees.

A forward must run on the backend its metadata went to: after an EXTEND
``init_forward_metadata``, ``forward_decode`` is refused rather than served from the decode
backend's stale metadata. Speculative decoding with the decode backend serving
TARGET_VERIFY (SGLang's ``--speculative-attention-mode decode``) is not offered.
"""

from __future__ import annotations

from typing import Any

import torch

from attngen.runtime.batch import ForwardBatch, ForwardMode
from attngen.runtime.checks import AttngenInputError, fail
from attngen.hooks import SAME_ATTENTION_FIELDS

# What both backends must agree on (==): the attributes the prefill backend's family names
# as describing its layer (``LAYER_ATTRS``; every backend has a dtype and a device), and
# what they must share (is).
BASE_LAYER_ATTRS = ("dtype",)
SHARED_ATTRS = ("kv_pool", "req_to_token_pool")
# Compared when both backends have them (the family's ``OPTIONAL_LAYER_ATTRS``).
BASE_OPTIONAL_ATTRS = ("kv_cache_dtype",)
GRAPH_METHODS = (
    "init_forward_metadata_capture_cuda_graph",
    "init_forward_metadata_replay_cuda_graph",
)

_MISSING = object()


class HybridAttnBackend:
    """Dispatch extend-like forwards to ``prefill_backend`` and decode to ``decode_backend``.

    Exposes the shared attributes (``num_q_heads`` ... ``device``, ``kv_pool``,
    ``req_to_token_pool``) so it stands wherever a single backend does.
    """

    def __init__(self, prefill_backend: Any, decode_backend: Any, *, capture_prefill: bool = False):
        check_compatible(prefill_backend, decode_backend)
        if capture_prefill:
            missing = _missing_graph_methods(prefill_backend, ("init_cuda_graph_state",))
            if missing:
                raise AttngenInputError(
                    f"capture_prefill: the prefill backend {_describe(prefill_backend)} has no "
                    f"CUDA-graph methods ({', '.join(missing)})"
                )
        self.prefill_backend = prefill_backend
        self.decode_backend = decode_backend
        self.capture_prefill = capture_prefill
        for name in layer_attrs(decode_backend) + ("device",) + SHARED_ATTRS + ("kv_cache_dtype",):
            if hasattr(decode_backend, name):
                setattr(self, name, getattr(decode_backend, name))
        self._active: Any = None  # the backend the current forward's metadata went to

    def __repr__(self) -> str:
        return (
            f"HybridAttnBackend(prefill={_describe(self.prefill_backend)}, "
            f"decode={_describe(self.decode_backend)})"
        )

    def backend_for(self, mode: ForwardMode) -> Any:
        """The backend that runs a forward in ``mode`` (IDLE has none)."""
        if mode.is_extend():
            return self.prefill_backend
        if mode.is_decode():
            return self.decode_backend
        raise AttngenInputError(f"forward_mode: {mode.name} runs on neither backend")

    # -- per-forward metadata ----

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.prefill_backend.init_forward_metadata(forward_batch)
            if self.decode_backend is not self.prefill_backend:
                self.decode_backend.init_forward_metadata(forward_batch)
            self._active = None
            return
        backend = self.backend_for(mode)
        backend.init_forward_metadata(forward_batch)
        self._active = backend

    # -- per-layer forward ----

    def forward_extend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``prefill_backend.forward_extend`` with every argument (``sinks=`` included)."""
        self._check_active(self.prefill_backend, "forward_extend")
        return self.prefill_backend.forward_extend(*args, **kwargs)

    def forward_decode(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``decode_backend.forward_decode`` with every argument (``sinks=`` included)."""
        self._check_active(self.decode_backend, "forward_decode")
        return self.decode_backend.forward_decode(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``forward_decode`` or ``forward_extend`` (a LayerForward's arguments: q, k, v,
        layer, forward_batch, ...), by ``forward_batch.forward_mode``."""
        forward_batch = kwargs["forward_batch"] if "forward_batch" in kwargs else args[4]
        mode = forward_batch.forward_mode
        if mode.is_decode():
            return self.forward_decode(*args, **kwargs)
        if mode.is_extend():
            return self.forward_extend(*args, **kwargs)
        raise AttngenInputError(f"forward: forward_mode {mode.name} has no attention to run")

    def _check_active(self, backend: Any, caller: str) -> None:
        # Sharing one object for both phases is allowed; then either call is its own business.
        if self._active is backend or self.prefill_backend is self.decode_backend:
            return
        if self._active is None:
            raise AttngenInputError(
                f"{caller}: no forward metadata; call init_forward_metadata (or CUDA-graph "
                f"capture/replay) for this forward first"
            )
        which = "prefill" if self._active is self.prefill_backend else "decode"
        raise AttngenInputError(
            f"{caller}: this forward's metadata went to the {which} backend "
            f"({_describe(self._active)}); {caller} runs on {_describe(backend)}"
        )

    # -- CUDA graphs ----

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static buffers of the decode backend (and of the prefill one if ``capture_prefill``)."""
        self.decode_backend.init_cuda_graph_state(max_bs, max_num_tokens)
        prefill = self.prefill_backend
        if self.capture_prefill and prefill is not self.decode_backend:
            prefill.init_cuda_graph_state(max_bs, max_num_tokens)

    # The graph calls take AttentionBackend's arguments (attngen.runtime.protocol), passed on
    # unchanged to the backend their forward_mode goes to.
    CAPTURE_MODE_ARG, REPLAY_MODE_ARG = 5, 5  # positions of forward_mode

    def init_forward_metadata_capture_cuda_graph(self, *args: Any, **kwargs: Any) -> None:
        backend = self._graph_backend(_mode_arg(args, kwargs, self.CAPTURE_MODE_ARG), "capture")
        backend.init_forward_metadata_capture_cuda_graph(*args, **kwargs)
        self._active = backend

    def init_forward_metadata_replay_cuda_graph(self, *args: Any, **kwargs: Any) -> None:
        backend = self._graph_backend(_mode_arg(args, kwargs, self.REPLAY_MODE_ARG), "replay")
        backend.init_forward_metadata_replay_cuda_graph(*args, **kwargs)
        self._active = backend

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.decode_backend.get_cuda_graph_seq_len_fill_value()

    def _graph_backend(self, mode: ForwardMode, phase: str) -> Any:
        if not mode.is_extend():
            return self.decode_backend  # decode (and whatever it refuses) is its call
        prefill = self.prefill_backend
        missing = _missing_graph_methods(prefill)
        if missing:
            raise AttngenInputError(
                f"cuda graph {phase}: forward_mode {mode.name} goes to the prefill backend "
                f"{_describe(prefill)}, which has no CUDA-graph methods ({', '.join(missing)})"
            )
        return prefill


def _mode_arg(args: tuple, kwargs: dict, position: int) -> ForwardMode:
    mode = kwargs["forward_mode"] if "forward_mode" in kwargs else args[position]
    if not isinstance(mode, ForwardMode):
        fail("forward_mode", "a ForwardMode", type(mode).__name__)
    return mode


def check_compatible(prefill_backend: Any, decode_backend: Any) -> None:
    """Raise :class:`AttngenInputError` naming the first attribute the backends disagree on."""
    pair = {"prefill_backend": prefill_backend, "decode_backend": decode_backend}
    for name in layer_attrs(prefill_backend) + ("device",):
        want, got = (_required(role, b, name) for role, b in pair.items())
        if name == "device":
            want, got = torch.device(want), torch.device(got)
        if want != got:
            fail(f"decode_backend.{name}", f"{want} (as prefill_backend.{name})", got)
    for name in SHARED_ATTRS:
        want, got = (_required(role, b, name) for role, b in pair.items())
        if want is not got:
            fail(
                f"decode_backend.{name}",
                f"the same object as prefill_backend.{name} (both backends share one)",
                f"a different {type(got).__name__}",
            )
    optional = getattr(prefill_backend, "OPTIONAL_LAYER_ATTRS", BASE_OPTIONAL_ATTRS)
    for name in optional:
        want, got = (_lookup(b, name) for b in pair.values())
        if want is not _MISSING and got is not _MISSING and want != got:
            fail(f"decode_backend.{name}", f"{want} (as prefill_backend.{name})", got)
    _check_phase(prefill_backend, "prefill_backend", ("extend", "prefill"))
    _check_phase(decode_backend, "decode_backend", ("decode",))
    _check_masks(prefill_backend, decode_backend)


def layer_attrs(backend: Any) -> tuple[str, ...]:
    """What describes a backend's attention layer: its family runtime's ``LAYER_ATTRS``."""
    return tuple(getattr(backend, "LAYER_ATTRS", BASE_LAYER_ATTRS))


def _required(role: str, backend: Any, name: str) -> Any:
    value = getattr(backend, name, _MISSING)
    if value is _MISSING:
        fail(f"{role}.{name}", "an attribute of every attention backend", "none")
    return value


def _lookup(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _check_phase(backend: Any, role: str, wanted: tuple[str, ...]) -> None:
    phases = getattr(getattr(backend, "kernels", None), "PHASES", None)
    if phases is not None and not set(wanted) & set(phases):
        one_of = " or ".join(repr(p) for p in wanted)
        fail(
            f"{role}.kernels.PHASES",
            f"to contain {one_of} ({_describe(backend)} is the {role.split('_')[0]} backend)",
            tuple(phases),
        )


def _check_masks(prefill_backend: Any, decode_backend: Any) -> None:
    """Both phases must compute the same attention: window, softcap and sinks agree."""
    hooks = [
        getattr(getattr(b, "kernels", None), "HOOKS", None)
        for b in (prefill_backend, decode_backend)
    ]
    if any(h is None for h in hooks):
        return
    for name in SAME_ATTENTION_FIELDS:
        want, got = (getattr(h, name, None) for h in hooks)
        if want != got:
            fail(f"decode_backend.kernels.HOOKS.{name}", f"{want} (as the prefill backend)", got)


def _missing_graph_methods(backend: Any, extra: tuple[str, ...] = ()) -> list[str]:
    return [m for m in extra + GRAPH_METHODS if not hasattr(backend, m)]


def _describe(backend: Any) -> str:
    spec = getattr(backend, "spec_name", None)
    arch = getattr(backend, "arch", None)
    name = type(backend).__name__
    return f"{name} ({spec} on {arch})" if spec and arch else name
