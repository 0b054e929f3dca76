"""Closed vocabularies of the spec language. Each member says what it means.

Spellings shared by every backend (torch dtype names) live in the tables at the bottom of
this module; a backend's own (Triton pointer types) live in its package, hardware facts in
attngen/arch.py. Templates receive them precomputed.
"""

from __future__ import annotations

from enum import Enum


class Family(str, Enum):
    MHA = "mha"  # multi-head / grouped-query / multi-query softmax attention
    MLA = "mla"  # DeepSeek multi-head latent attention (compressed KV latent + rope part)
    GDN = "gdn"  # gated delta rule linear attention (recurrent state, chunked prefill)
    DSA = "dsa"  # DeepSeek sparse attention: lightning indexer + top-k sparse MLA


class Phase(str, Enum):
    PREFILL = "prefill"  # new tokens only, no cached prefix read (encoder / first chunk)
    EXTEND = "extend"  # new tokens attend to a cached (paged) prefix plus themselves
    DECODE = "decode"  # one new query token per request against the cache
    VERIFY = "verify"  # speculative-decoding target verify of draft tokens
    DRAFT_EXTEND = "draft_extend"  # draft model extend after a verify step


class DType(str, Enum):
    BF16 = "bf16"  # bfloat16
    FP16 = "fp16"  # IEEE half
    FP32 = "fp32"  # IEEE single (GDN state)
    FP8_E4M3 = "fp8_e4m3"  # 8-bit float, 4 exponent / 3 mantissa bits, needs scales
    FP8_E5M2 = "fp8_e5m2"  # 8-bit float, 5 exponent / 2 mantissa bits, needs scales
    NVFP4 = "nvfp4"  # e2m1 values, fp8 e4m3 scale per 16 elements + per-tensor scale
    MXFP4 = "mxfp4"  # e2m1 values, e8m0 scale per 32 elements
    AUTO = "auto"  # KV cache only: the same dtype as the activations


class ScaleGranularity(str, Enum):
    PER_TENSOR = "per_tensor"  # one scale for all of K (and one for V)
    PER_HEAD = "per_head"  # one scale per kv head
    PER_BLOCK = "per_block"  # one scale per block of elements (FP4 formats; blocked fp8)


class MaskKind(str, Enum):
    CAUSAL = "causal"  # query i sees keys at positions <= its own
    NONE = "none"  # bidirectional: every query sees every key of its request
    SLIDING_WINDOW = "sliding_window"  # causal, limited to the last window_left keys
    CUSTOM = "custom"  # per-request bit mask (speculative trees)


class Backend(str, Enum):
    TRITON = "triton"  # Triton kernels: portable across sm80 / sm90 / sm100
    CUTE_DSL = "cute_dsl"  # CuTe DSL kernels: wgmma (sm90) and tcgen05 (sm100)


class Arch(str, Enum):
    SM80 = "sm80"  # Ampere (A100)
    SM90 = "sm90"  # Hopper (H100 / H200)
    SM100 = "sm100"  # Blackwell (B200)
    # their hardware facts: attngen/arch.py (the one table)


# -- spellings: one table each (a backend's own live in its package) ----

TORCH_DTYPE_NAME = {
    DType.BF16: "bfloat16",
    DType.FP16: "float16",
    DType.FP32: "float32",
    DType.FP8_E4M3: "float8_e4m3fn",
    DType.FP8_E5M2: "float8_e5m2",
}
# what a generated config's kv_dtype field says: torch's name, or "nvfp4" (uint8 code pairs
# plus separate e4m3 block scales; torch has no dtype for it)
KV_DTYPE_NAME = {**TORCH_DTYPE_NAME, DType.NVFP4: "nvfp4"}
# bytes one cache element takes, by that name (NVFP4: two e2m1 codes a byte, scales apart)
KV_ELEMENT_BYTES = {
    "bfloat16": 2.0,
    "float16": 2.0,
    "float32": 4.0,
    "float8_e4m3fn": 1.0,
    "float8_e5m2": 1.0,
    "nvfp4": 0.5,
}


# The quantized KV cache dtypes and the scale granularities each takes.
QUANTIZED_KV = {
    # per_block: one scale per block of values (e.g. each 128 values of an fp8 latent row)
    DType.FP8_E4M3: (
        ScaleGranularity.PER_TENSOR,
        ScaleGranularity.PER_HEAD,
        ScaleGranularity.PER_BLOCK,
    ),
    DType.FP8_E5M2: (ScaleGranularity.PER_TENSOR, ScaleGranularity.PER_HEAD),
    DType.NVFP4: (ScaleGranularity.PER_BLOCK,),
    DType.MXFP4: (ScaleGranularity.PER_BLOCK,),
}
