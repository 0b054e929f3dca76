"""MLA attention in Triton: the kernels and launchers every MLA spec's kernels.py binds.

- ``absorbed``: absorbed attention over the paged latent cache ``[pages, page_size, 1,
  576]`` (512 latent + 64 rope, one KV head shared by every query head): decode rows (one
  per request) or extend / chain-verify rows (one per new token, causal), split-KV with a
  combine step; out ``[T, H, 512]`` and, on request, the natural-log LSE ``[T, H]``. The
  query heads of a row form the M dimension of both tensor-core products (BLOCK_H heads
  per program), the latent tile is read once per program and serves as key and value.
  fp8 e4m3 caches are upcast in registers, their per-tensor scale folded into the score
  scale and the output.
- ``ragged``: the non-absorbed path: ragged MHA with qk 128 + 64 and v 128 (k_rope shared
  by the heads or per head), causal over the new tokens or unmasked over a prefix chunk,
  returning the LSE; ``merge_state`` combines two (out, lse) results.
"""

from __future__ import annotations

from attngen.families.mla.triton.host.compile import compile_specs
from attngen.families.mla.triton.host.launch import (
    absorbed,
    absorbed_workspace,
    merge_state,
    ragged,
)
from attngen.families.mla.triton.source import source_sha256

__all__ = [
    "SOURCE_SHA256",
    "absorbed",
    "absorbed_workspace",
    "compile_specs",
    "merge_state",
    "ragged",
    "source_sha256",
]

SOURCE_SHA256 = source_sha256()
