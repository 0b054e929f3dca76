"""Paged MHA / GQA attention in CuTe DSL: the kernels and launchers every spec's
cute_dsl kernels.py binds.

Arch- and spec-independent real Python source: a generated kernels.py binds its
MhaCuteTraits (mask hooks, phases) and CONFIGS and calls the launchers here with them.
Device code lives in ``kernels/`` (``fwd_sm90``: the Hopper forward kernel, GPU-verified;
``fwd_sm100``: the Blackwell one, compile-only; ``common``: their specialization and tile
layouts; ``fragments``: register views of wgmma accumulators), host code in ``host/``
(``compile``: specializations, the compile cache and AOT arguments; ``launch``: checks and
launches). A config's ``arch`` picks the kernel.

Split-KV decode (``decode`` with ``decode_workspace``): one query token per request; the
forward kernel's pipeline on tiles holding the GQA group's query heads (GQA packing; sm90:
64-row wgmma tiles, ``kernels/decode_sm90``, GPU-verified; sm100, compile-only: the 128-row
tcgen05 tile, ``kernels/decode_sm100``), each CTA one (split, kv head, request) writing fp32
partial rows and log-sum-exps, then a combine kernel that merges them (and adds the sinks).
Grids are fixed by the batch, the heads and config.max_splits; the split counts are chosen
on the device by the runtime.

Phases so far: prefill (ragged q/k/v, no cache) and extend (ragged new tokens over a paged
cache read by TMA, one copy per page: page sizes 16, 32, 64 and 128; pages of 1, 2, 4 and 8
tokens: K/V rows gathered with cp.async); speculative verify of draft chains
(``verify``: num_draft_tokens causal rows per request) and draft extend run the extend
kernel, verify of draft trees its specialization that reads each request's bit-packed tree
mask instead of the causal rule among the drafts, with grids fixed by the config and the
batch, so they are CUDA-graph capturable.
KV in the activation dtype (bf16, fp16), or for decode an fp8 e4m3 cache with per-tensor
k_scale / v_scale (TMA reads fp8 pages of 16+ tokens, the consumers convert each tile in
shared memory); head dims 64 and 128.

What the launchers check, and what they do not: shapes, dtypes, devices, strides and
alignment of every tensor, always (host-side, no sync). They never read device values:
cu_seqlens / qo_indptr and prefix lengths consistent with the tensors, page_table entries
< num_pages and wide enough for every request, are the caller's promise (the generated
backends check them in eager mode, in one host sync per forward).

Mask (MhaCuteTraits.mask, attngen.hooks.MaskHooks; compile-time branches of the kernel): a
query at position p sees key k when k <= p (causal) and k >= p - window_left (window; key
tiles wholly left of it are not loaded), or in a tree verify when k is before the request's
drafts or a draft its row of the tree mask allows; scores become cap * tanh(s / cap) with a logit
softcap; with sinks, exp(sinks[h]) joins the softmax denominator. A row with no visible key
gives zeros.
"""

from __future__ import annotations

from attngen.families.mha.cute_dsl.host.compile import compile_specs
from attngen.families.mha.cute_dsl.host.launch import (
    decode,
    decode_workspace,
    extend,
    prefill,
    verify,
)
from attngen.families.mha.cute_dsl.source import source_sha256

__all__ = [
    "compile_specs",
    "decode",
    "decode_workspace",
    "extend",
    "prefill",
    "source_sha256",
    "verify",
]
