"""Small fp16 GDN configs and a kernels module bound in memory to the GDN Triton library
(the interpreter computes bf16 wrongly and runs numpy: small dims, fp16)."""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from attngen.families.gdn.testing import backend_with_kernels
from attngen.families.gdn.triton import library
from attngen.families.gdn.triton.config import GdnTraits, GdnTritonConfig

LAUNCHERS = ("decode", "extend", "target_verify", "accept", "conv_update", "conv_prefill")


def small_config(
    group: int = 2, *, topk: int = 0, drafts: int = 0, dim: int = 32
) -> GdnTritonConfig:
    return GdnTritonConfig(
        uri=f"k{dim}_v{dim}_gv{group}_fp16_topk{topk}",
        key_dim=dim,
        value_dim=dim,
        v_heads_per_k_head=group,
        dtype="float16",
        state_dtype="float32",
        chunk_size=16,
        conv_kernel=4,
        l2norm=True,
        spec_topk=topk,
        num_draft_tokens=drafts,
        decode_block_v=8,
        decode_tiles=2,
        decode_num_warps=1,
        prepare_num_warps=4,
        wu_num_warps=4,
        state_block_v=16,
        state_block_v_max=32,
        state_min_programs=8,
        state_num_warps=4,
        state_num_stages=2,
        output_block_v=16,
        output_num_warps=4,
        chunk_state_bits=16,
        state_transposed=0,
        state_t_min_programs=1,
        conv_block_c=64,
        conv_block_t=16,
        conv_num_warps=4,
    )


def kernels_module(configs: list[GdnTritonConfig], phases=("extend", "decode", "verify")):
    module = ModuleType("attngen_test_gdn_kernels")
    module.library = library
    module.LIBRARY_SHA256 = library.SOURCE_SHA256
    module.PHASES = tuple(phases)
    module.TRAITS = GdnTraits(module.PHASES)
    module.CONFIGS = {c.uri: c for c in configs}
    for name in (*LAUNCHERS, "chunk_plan"):
        setattr(module, name, getattr(library, name))
    return module


def backend_class(configs: list[GdnTritonConfig]) -> type:
    """The generated Qwen3-Next backend class (sm90) bound to ``configs``."""
    cls = importlib.import_module("generated.sm90.triton.gdn.gdn_qwen3_next.backend").Backend
    return backend_with_kernels(cls, kernels_module(configs))


def replace(config: GdnTritonConfig, **kw) -> GdnTritonConfig:
    return dataclasses.replace(config, **kw)
