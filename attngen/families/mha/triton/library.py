"""Paged MHA / GQA attention in Triton: split-KV decode, ragged extend, speculative
verify and cache-free prefill: the kernels and launchers every spec's kernels.py binds.

Arch- and spec-independent real Python source: a spec's generated kernels.py binds its
MhaTraits (mask hooks, phases, arch quirks) and CONFIGS and calls the launchers here with
them. Device code lives in ``kernels/`` (fp4, attend, decode, extend), host code in
``host/`` (checks, launch options, launchers, compile specs); this module is their API.

KV cache: k_cache [num_pages, page_size, Hkv, D] and v_cache [num_pages, page_size, Hkv, Dv],
read through page_table[b, j] = physical page of tokens j*page_size .. (j+1)*page_size-1 of
request b.

What the launchers check, and what they do not: shapes, dtypes, devices, strides and
alignment of every tensor, always (host-side, no sync). They never read device values:
seq_lens[b] <= page_table.shape[1] * page_size, page_table entries < num_pages, qo_indptr
and prefix lengths consistent with the tensors are the caller's promise, and a broken one
reads out of bounds or gives wrong output. The generated backends (the runtime) check
those values in eager mode, in one host sync per forward; call the kernels directly only
with inputs built as the backend builds them. Query head h reads kv head h // gqa_group. Every q/out/cache row must start on 16
bytes (data pointer and strides): the kernels tell the compiler so, and the launchers check it.
D and Dv are multiples of 8 in 16 .. 256, not necessarily equal; the kernels' tiles are their
next powers of two (BLOCK_D, BLOCK_DV), with the padded lanes masked (no masks when D and Dv
are powers of two).

decode: one query token per request. Stage 1 (grid B x Hkv x max_splits) attends one split of
the request's KV range for the gqa_group query heads of one kv head and writes the split's
normalised output and natural-log LSE; stage 2 (grid B x Hq) merges the splits. The grid
depends only on B and the config; seq_lens and num_splits are read on the device.

extend: ragged new tokens over a cached prefix; their K/V are already in the paged cache.
Grid cdiv(max_extend_len, BLOCK_M) x Hq x B; key blocks that need no mask come first.
verify: extend with num_draft_tokens rows per request and a grid fixed by the config:
draft chains are causal, draft trees read a bit-packed per-request mask over the drafts.
prefill: extend without a cache; K/V rows are read from contiguous [T, Hkv, D] tensors.

KV dtypes: a config's kv_dtype is the activations', fp8 (e4m3 / e5m2) or nvfp4. fp8 K/V
are upcast to q's dtype in registers; the fp32 K scale (per tensor or per kv head) folds
into the score scale and the V scale into the output. NVFP4 K/V are uint8 code pairs (e2m1,
low nibble first) with an e4m3 scale per 16 elements in separate tensors, decoded in
registers (exactly, in bf16/fp16); its per-tensor global scales act as fp8's do.

Mask (MhaTraits.mask, attngen.hooks.MaskHooks; host/options.py makes them constexprs): a query at position p (decode: seq_len - 1) sees
key k when k <= p (CAUSAL) and k >= p - WINDOW_LEFT (WINDOW_LEFT >= 0; key blocks wholly left
of the window are never read); scores s = q.k * sm_scale become LOGIT_SOFTCAP * tanh(s /
LOGIT_SOFTCAP) when LOGIT_SOFTCAP > 0; with HAS_SINKS, sinks[h] (natural-log logit) joins
the softmax denominator only. A row with no visible key gives zeros.
"""

from __future__ import annotations

from attngen.families.mha.triton.host.compile import compile_specs
from attngen.families.mha.triton.host.launch import (
    decode,
    decode_workspace,
    extend,
    prefill,
    verify,
)
from attngen.families.mha.triton.source import source_sha256

__all__ = [
    "SOURCE_SHA256",
    "compile_specs",
    "decode",
    "decode_workspace",
    "extend",
    "prefill",
    "source_sha256",
    "verify",
]

SOURCE_SHA256 = source_sha256()  # generated kernels.py files record the one they bind
