"""Gated delta rule (GDN) linear attention in Triton: the kernels and launchers every GDN
spec's kernels.py binds (see host/launch.py for layouts and arguments).

- ``decode``: recurrent, one token per request, pool rows updated in place;
- ``extend``: chunked prefill / extend over ragged requests (``chunk_plan`` first), initial
  state from the pool row when the request has one, final state written back;
- ``target_verify``: T drafts per request (chains, or trees through parents), every draft's
  state to a step buffer; ``accept`` copies the accepted draft's state and conv window
  into the pool;
- ``conv_update`` / ``conv_prefill``: the width-4 causal conv with SiLU and its state.

Device code lives in ``kernels/`` (common, conv, recurrent, chunk), host code in ``host/``.
"""

from __future__ import annotations

from attngen.families.gdn.triton.host.compile import compile_specs
from attngen.families.gdn.triton.host.launch import (
    ChunkPlan,
    accept,
    chunk_plan,
    conv_prefill,
    conv_update,
    decode,
    extend,
    target_verify,
)
from attngen.families.gdn.triton.source import source_sha256

__all__ = [
    "SOURCE_SHA256",
    "ChunkPlan",
    "accept",
    "chunk_plan",
    "compile_specs",
    "conv_prefill",
    "conv_update",
    "decode",
    "extend",
    "source_sha256",
    "target_verify",
]

SOURCE_SHA256 = source_sha256()  # generated kernels.py files record the one they bind
