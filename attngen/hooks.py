"""The neutral hook vocabulary: what a kernel skeleton does at its hook points.

Every attention kernel attngen generates is a fixed skeleton (load a query tile, loop over
key tiles, online softmax, write the output) with named hook points. The lowering fills
them from the spec; each backend translates them into its own terms (Triton: constexprs
and sentinels, in its launch options; CuTe DSL: its compile-time branches). Nothing here
knows a backend.

A query at absolute position ``p`` (decode: ``seq_len - 1``) sees key position ``k`` when

- ``k <= p`` if ``causal`` (mask_mod),
- ``k >= p - window_left`` if ``window_left`` is set (mask_mod; key blocks wholly left of
  the window are never read),
- and, with ``tree``, the speculative draft rows see the drafts their per-request
  bit-packed tree mask allows instead of the causal rule among drafts (mask_mod).

Scores are ``s = q.k * sm_scale``, then ``logit_softcap * tanh(s / logit_softcap)`` when
the cap is set (score_mod). With ``sinks`` a per-head logit ``sinks[h]`` joins the softmax
denominator only (softmax-stat update). A row that sees no key gives zeros (output).
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.spec.enums import MaskKind
from attngen.spec.model import Mask


@dataclass(frozen=True)
class MaskHooks:
    """mask_mod, score_mod and the sinks' softmax-stat update of one generated module."""

    causal: bool = True
    window_left: int | None = None  # None: no window
    logit_softcap: float | None = None  # None: no cap
    sinks: bool = False
    # the spec's mask is kind custom: the draft-tree mask (a bit-packed mask over the drafts).
    # It describes the layer's mask, not which kernels exist: a causal spec with speculative
    # topk > 1 builds tree verify kernels too, and their configs' ``spec_topk`` says so
    tree: bool = False

    @classmethod
    def from_mask(cls, mask: Mask) -> MaskHooks:
        """The spec's mask section; kind ``custom`` is the speculative tree over a causal base."""
        return cls(
            causal=mask.kind is not MaskKind.NONE,
            window_left=mask.window_left,
            logit_softcap=mask.logit_softcap,
            sinks=mask.sinks,
            tree=mask.kind is MaskKind.CUSTOM,
        )


# Fields on which two modules compute the same attention for the same inputs (``causal``
# does not change decode, where one query sees every cached key; ``tree`` only verify).
SAME_ATTENTION_FIELDS: tuple[str, ...] = ("window_left", "logit_softcap", "sinks")
