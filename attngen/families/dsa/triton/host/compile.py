"""Ahead-of-time compile specs of the DSA kernels: what ``triton.compile`` needs per launch."""

from __future__ import annotations

import torch

from attngen.families.dsa.triton.config import CompileSpec, DsaTraits, DsaTritonConfig
from attngen.families.dsa.triton.host.launch import (
    combine_options,
    index_dtype,
    indexer_options,
    io_dtype,
    kv_dtype,
    gluon_sparse_kernel,
    sparse_options,
    sparse_wg_options,
    topk_options,
)
from attngen.families.dsa.triton.kernels.indexer import indexer_logits_kernel
from attngen.families.dsa.triton.kernels.sparse import sparse_mla_kernel
from attngen.families.dsa.triton.kernels.topk import topk_kernel
from attngen.families.mla.triton.kernels.absorbed import absorbed_combine_kernel

POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float8_e4m3fn: "*fp8e4nv",
    torch.float32: "*fp32",
}
# Triton types of the runtime arguments that are not activations, caches or strides.
ARG_TYPES = {
    "W": "*fp32",
    "KS": "*fp32",
    "KVF": "*fp32",
    "KV16": "*i16",
    "KVW": "*i32",
    "KVB": "*bf16",
    "PAGE_TABLE": "*i32",
    "ROW_REQ": "*i32",
    "ROW_START": "*i32",
    "ROW_LENS": "*i32",
    "LOGITS": "*fp32",
    "OUT_POS": "*i32",
    "OUT_SLOT": "*i32",
    "INDICES": "*i32",
    "NUM_SPLITS": "*i32",
    "LSE": "*fp32",
    "PARTIAL_O": "*fp32",
    "PARTIAL_LSE": "*fp32",
    "sm_scale": "fp32",
}
ACTIVATIONS = ("Q_NOPE", "Q_ROPE", "OUT")


def _compile_spec(
    name: str, kernel, options: dict, config: DsaTritonConfig, nones: tuple[str, ...] = ()
) -> CompileSpec:
    constexprs = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages")}
    constexprs.update({arg: None for arg in nones})
    signature = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            continue
        if arg in ACTIVATIONS:
            signature[arg] = POINTER_TYPES[io_dtype(config)]
        elif arg == "KV":
            signature[arg] = POINTER_TYPES[kv_dtype(config)]
        elif arg in ("Q", "K"):  # the indexer's q and keys
            signature[arg] = POINTER_TYPES[index_dtype(config)]
        elif arg.startswith("stride_"):
            signature[arg] = "i32"
        else:
            signature[arg] = ARG_TYPES[arg]
    return CompileSpec(
        name=name,
        fn=kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=options.get("num_warps", 4),
        num_stages=options.get("num_stages", 2),
    )


def compile_specs(config: DsaTritonConfig, traits: DsaTraits) -> list[CompileSpec]:
    """Every kernel the spec's phases launch for ``config``, as the runtime launches it."""
    specs = []
    paged = indexer_options(config, paged=True)
    unscaled = () if config.fp8_index else ("KS",)  # keys without scales pass KS=None
    specs.append(
        _compile_spec(
            "indexer_paged", indexer_logits_kernel, paged, config, ("ROW_START", *unscaled)
        )
    )
    specs.append(
        _compile_spec(
            "indexer_decode",
            indexer_logits_kernel,
            paged,
            config,
            ("ROW_START", "ROW_REQ", *unscaled),
        )
    )
    if "extend" in traits.phases:
        ragged = indexer_options(config, paged=False)
        specs.append(
            _compile_spec(
                "indexer_ragged",
                indexer_logits_kernel,
                ragged,
                config,
                ("PAGE_TABLE", "ROW_REQ", *unscaled),
            )
        )
    specs.append(_compile_spec("topk", topk_kernel, topk_options(config), config))
    specs.append(
        _compile_spec("topk_decode", topk_kernel, topk_options(config), config, ("ROW_REQ",))
    )
    if config.sparse_gluon:  # one kernel per row layout: no views to leave None
        sparse, options, fp8 = gluon_sparse_kernel(config), sparse_wg_options, ()
    else:
        sparse, options = sparse_mla_kernel, sparse_options
        fp8 = () if config.fp8_cache else ("KVF", "KV16")
    for write_lse in (False, True):
        tag = "_lse" if write_lse else ""
        one = options(config, splits=1, write_lse=write_lse)
        nones = (*fp8, "NUM_SPLITS", "PARTIAL_O", "PARTIAL_LSE") + (() if write_lse else ("LSE",))
        specs.append(_compile_spec(f"sparse{tag}", sparse, one, config, nones))
        split = options(config, splits=config.max_splits, write_lse=write_lse)
        nones = fp8 + (() if write_lse else ("LSE",))
        specs.append(_compile_spec(f"sparse_split{tag}", sparse, split, config, nones))
    specs.append(
        _compile_spec(
            "combine", absorbed_combine_kernel, combine_options(config, write_lse=True), config
        )
    )
    return specs
