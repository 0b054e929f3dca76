"""DSA in Triton: the kernels and launchers every DSA spec's kernels.py binds.

- ``indexer_logits`` / ``indexer_logits_ragged``: the lightning indexer's scores (fp8, or
  the model's bf16 / fp16 / fp32) of each query row over its visible keys, from the paged
  index-key pool (decode, extend, verify) or from contiguous keys (prefill);
- ``topk``: the ``index_topk`` best keys of each row (higher score, then lower position),
  as logical positions and token slots, -1 padded;
- ``sparse_mla``: absorbed MLA of each query row over its selected slots, bf16/fp16
  latent rows or the 656-byte fp8 layout, out ``[T, H, 512]`` and the natural-log LSE,
  optionally split over the top-k with MLA's combine kernel.
"""

from __future__ import annotations

from attngen.families.dsa.triton.host.compile import compile_specs
from attngen.families.dsa.triton.host.launch import (
    choose_splits,
    indexer_logits,
    indexer_logits_ragged,
    sparse_mla,
    sparse_workspace,
    topk,
)
from attngen.families.dsa.triton.source import source_sha256

__all__ = [
    "SOURCE_SHA256",
    "choose_splits",
    "compile_specs",
    "indexer_logits",
    "indexer_logits_ragged",
    "source_sha256",
    "sparse_mla",
    "sparse_workspace",
    "topk",
]

SOURCE_SHA256 = source_sha256()
