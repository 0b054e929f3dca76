"""Which mask transformers asks a layer for, and whether attngen's kernels can apply it.

transformers builds each layer type's mask by calling the mask function registered for the
model's attention implementation (``AttentionMaskInterface``) with a ``mask_function(batch,
head, q_idx, kv_idx) -> bool`` that says which keys each query sees: ``causal_mask_function``;
``and_masks(sliding_window_overlay(W), causal)`` for sliding-window layers;
``and_masks(chunked_overlay(C, left_padding), causal)`` for chunked layers (Llama-4);
``bidirectional_mask_function`` for non-causal models (``config.is_causal = False``); and
compositions with the model's or the caller's own functions (``or_mask_function`` /
``and_mask_function``, e.g. Gemma-3's bidirectional attention, packed sequences found in
``position_ids``, blockwise overlays). Eager and sdpa attention apply exactly that mask.

attngen's kernels apply causality and a sliding window themselves from their mask hooks, so
its mask function returns a :class:`LayerMask` instead of a tensor: what :func:`classify`
read from ``mask_function`` (a window, a chunk size, or why attngen cannot express it) and
the forward it belongs to. The attention function judges each layer by it: a layer whose
mask attngen cannot express is refused, naming the layer and the mask, instead of being
served as plain causal attention.

:func:`classify` reads the composition from the functions' names and closures (transformers'
own primitives only; anything else is refused) and checks what it read against the function
itself on rows around the window or chunk boundary, so a change in transformers' primitives
fails loudly instead of silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from attngen.runtime.checks import AttngenInputError

_AND = "and_masks.<locals>.and_mask"
_OR = "or_masks.<locals>.or_mask"
_SLIDING = "sliding_window_overlay.<locals>.inner_mask"
_CHUNKED = "chunked_overlay.<locals>.inner_mask"
_PACKED = "packed_sequence_mask_function.<locals>.inner_mask"
_BLOCKWISE = "blockwise_overlay.<locals>.inner_mask"


@dataclass(frozen=True)
class MaskPattern:
    """What a mask function asks for: causal attention over a window of ``window`` keys
    (None: all earlier keys) or within chunks of ``chunk`` positions (None: no chunks);
    ``bidirectional``: every key of the row that the padding mask keeps (an encoder's
    self-attention); or, when ``refused`` is set, something attngen's kernels do not express
    (it says what)."""

    window: int | None = None
    chunk: int | None = None
    refused: str | None = None
    bidirectional: bool = False

    def describe(self) -> str:
        if self.refused is not None:
            return self.refused
        if self.bidirectional:
            return "a bidirectional mask"
        if self.chunk is not None:
            return f"a chunked causal mask (chunks of {self.chunk} positions)"
        if self.window is not None:
            return f"a sliding-window causal mask ({self.window} keys)"
        return "a causal mask"


class LayerMask:
    """What attngen's mask function returns in place of a mask tensor: the mask's
    :class:`MaskPattern` as :func:`classify` read it, transformers' own ``mask_function``
    (observers build reference masks from it) and the forward (``generate.Forward``) it was
    built for (None for a bidirectional mask: the encoder path keeps no cache). Model code that
    computes with it, as with a tensor (Doge's dynamic mask reads its dtype), gets an error
    that says so."""

    __slots__ = ("pattern", "mask_function", "forward", "rows", "cache_free", "keys")

    def __init__(
        self,
        pattern: MaskPattern,
        mask_function: Callable[..., Any] | None,
        forward: Any,
        rows: Any = None,
        cache_free: bool = False,
        keys: Any = None,
    ) -> None:
        self.pattern = pattern
        self.mask_function = mask_function
        self.forward = forward
        self.rows = rows  # the padding as encoder.RowPlan for cache-free layers (None: no pads)
        # the layers it reaches may run cache-free (a bidirectional mask, or a plain causal
        # one in a model that does not generate)
        self.cache_free = cache_free
        # a bidirectional mask over keys other than the forward's own tokens (cross-attention,
        # a bidirectional decoder's cache) as cross.KeyPlan: which keys each row keeps
        self.keys = keys

    def __repr__(self) -> str:
        return f"LayerMask({self.pattern.describe()})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        _used_as_tensor(f".{name}")

    def __getitem__(self, index: Any) -> Any:
        _used_as_tensor("[...]")


class MaskUsedAsTensor(AttngenInputError, AttributeError):
    """A model computed with attngen's :class:`LayerMask` as with a mask tensor (also an
    AttributeError, so ``hasattr(mask, "dtype")`` stays False)."""


def _used_as_tensor(what: str) -> Any:
    raise MaskUsedAsTensor(
        f"the model's code computes with the attention mask ({what}) before its attention "
        "function: it changes the mask itself (e.g. a dynamic or learned mask), which "
        "attngen's kernels cannot express (attngen's mask function returns a description "
        "of the mask, not a tensor)"
    )


def _operator(name: str) -> Callable[..., Any]:
    return lambda self, *args: _used_as_tensor(name)


for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "and", "rand", "or", "ror"):
    setattr(LayerMask, f"__{_op}__", _operator(f"__{_op}__"))
for _op in ("invert", "neg"):
    setattr(LayerMask, f"__{_op}__", _operator(f"__{_op}__"))


def classify(mask_function: Callable[..., Any] | None) -> MaskPattern:
    """The :class:`MaskPattern` of a transformers mask function (None: plain causal)."""
    from transformers import masking_utils as mu

    if mask_function is None:
        return MaskPattern()
    causal, windows, chunks = False, [], []
    left_padding = None
    for fn in _conjuncts(mask_function):
        name = getattr(fn, "__qualname__", type(fn).__name__)
        if fn is mu.causal_mask_function:
            causal = True
        elif fn is mu.bidirectional_mask_function:
            continue  # every key: the other conjuncts decide
        elif name == _SLIDING:
            windows.append(int(_closure(fn)["sliding_window"]))
        elif name == _CHUNKED:
            cells = _closure(fn)
            chunks.append(int(cells["chunk_size"]))
            left_padding = cells["left_padding"]
        elif name == _OR:
            parts = ", ".join(_name(f) for f in _closure(fn)["mask_functions"])
            return MaskPattern(
                refused=f"a mask widened by an or_mask_function ({parts}): keys past the causal "
                "boundary (e.g. bidirectional attention or bidirectional blocks)"
            )
        elif name == _PACKED:
            return MaskPattern(
                refused="a packed-sequence mask (position_ids restart inside a row, so each row "
                "holds several sequences that must not see each other)"
            )
        elif name == _BLOCKWISE:
            return MaskPattern(refused="a blockwise mask (bidirectional blocks inside a row)")
        else:
            return MaskPattern(refused=f"a custom mask function ({name})")
    if not causal and (windows or chunks):
        return MaskPattern(refused=f"a bidirectional mask with windows / chunks {windows + chunks}")
    if not causal:  # bidirectional_mask_function alone: every key of the row
        pattern = MaskPattern(bidirectional=True)
        _verify(mask_function, pattern, None)
        return pattern
    if len(chunks) > 1 or (chunks and windows):
        return MaskPattern(refused=f"a mask of several chunk sizes / windows {chunks + windows}")
    pattern = MaskPattern(
        window=min(windows) if windows else None, chunk=chunks[0] if chunks else None
    )
    _verify(mask_function, pattern, left_padding)
    return pattern


def _conjuncts(fn: Callable[..., Any]) -> list[Callable[..., Any]]:
    """``fn`` as the list of functions it ANDs (``and_masks`` flattened)."""
    if getattr(fn, "__qualname__", None) != _AND:
        return [fn]
    out: list[Callable[..., Any]] = []
    for part in _closure(fn)["mask_functions"]:
        out += _conjuncts(part)
    return out


def _closure(fn: Callable[..., Any]) -> dict[str, Any]:
    """The variables ``fn`` closes over, by name."""
    cells = fn.__closure__ or ()
    return {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, cells)}


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


_VERIFIED: set[tuple[Any, ...]] = set()


def _verify(fn: Callable[..., Any], pattern: MaskPattern, left_padding: Any) -> None:
    """Evaluate ``fn`` (batch row 0) on query rows around the window / chunk boundary and
    compare with the mask ``pattern`` describes; once per (code of its parts, window, chunk)
    in a process."""
    key = (*(f.__code__ for f in _conjuncts(fn)), pattern.window, pattern.chunk)
    if key in _VERIFIED:
        return
    span = pattern.window or pattern.chunk or 4
    device = left_padding.device if isinstance(left_padding, torch.Tensor) else "cpu"
    pad = int(left_padding[0]) if isinstance(left_padding, torch.Tensor) else 0
    rows = sorted({0, 1, span - 1, span, span + 1, 2 * span + 1})
    q = torch.tensor(rows, device=device)[:, None] + pad
    kv = torch.arange(pad + 2 * span + 3, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    got = fn(zero, zero, q, kv).expand(q.shape[0], kv.shape[1]).to(torch.bool)
    want = kv <= q if not pattern.bidirectional else torch.ones_like(kv <= q)
    if pattern.window is not None:
        want &= kv > q - pattern.window
    if pattern.chunk is not None:
        want &= (kv - pad) // pattern.chunk == (q - pad) // pattern.chunk
    if not torch.equal(got.cpu(), want.cpu()):
        raise AttngenInputError(
            f"transformers' mask function does not mean what attngen read from it "
            f"({pattern.describe()}): this transformers version changed its mask primitives"
        )
    _VERIFIED.add(key)
