"""Ahead-of-time compile specs of the MLA kernels: what ``triton.compile`` needs per launch."""

from __future__ import annotations

import torch

from attngen.families.mla.triton.config import CompileSpec, MlaTraits, MlaTritonConfig
from attngen.families.mla.triton.host.launch import (
    MERGE_BLOCK_H,
    absorbed_options,
    cache_words,
    combine_options,
    fp4,
    gluon_kernel,
    io_dtype,
    kv_dtype,
    quantized,
    ragged_options,
)
from attngen.families.mla.triton.kernels.absorbed import (
    absorbed_combine_kernel,
    absorbed_split_kernel,
)
from attngen.families.mla.triton.kernels.ragged import merge_state_kernel, ragged_attend_kernel

POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float8_e4m3fn: "*fp8e4nv",
    torch.uint8: "*u8",
}
# Triton types of the runtime arguments that are not activations, caches or strides.
ARG_TYPES = {
    "PAGE_TABLE": "*i32",
    "ROW_LENS": "*i32",
    "ROW_REQ": "*i32",
    "TREE_MASK": "*u8",
    "TREE_MASK_INDPTR": "*i32",
    "NUM_SPLITS": "*i32",
    "QO_INDPTR": "*i32",
    "KV_INDPTR": "*i32",
    "KV_SCALE": "*fp32",
    "KV_BSCALE": "*fp8e4nv",
    "LSE": "*fp32",
    "LSE_A": "*fp32",
    "LSE_B": "*fp32",
    "LSE_OUT": "*fp32",
    "PARTIAL_O": "*fp32",
    "PARTIAL_LSE": "*fp32",
    "sm_scale": "fp32",
}
ACTIVATIONS = ("Q", "Q_NOPE", "Q_ROPE", "K_NOPE", "K_ROPE", "V", "OUT", "O_A", "O_B")


def _compile_spec(
    name: str, kernel, options: dict, config: MlaTritonConfig, nones: tuple[str, ...] = ()
) -> CompileSpec:
    launch = ("num_warps", "num_stages", "maxnreg")
    constexprs = {k: v for k, v in options.items() if k not in launch}
    constexprs.update({arg: None for arg in nones})
    io = POINTER_TYPES[io_dtype(config)]
    signature = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            continue
        if arg in ACTIVATIONS:
            signature[arg] = io
        elif arg == "KV_CACHE" and kernel is not absorbed_split_kernel and cache_words(config):
            signature[arg] = "*i32"  # the int32 view of the fp8 cache (see cache_words)
        elif arg == "KV_CACHE":
            signature[arg] = POINTER_TYPES[kv_dtype(config)]
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
        max_registers=options.get("maxnreg", 0),
    )


def compile_specs(config: MlaTritonConfig, traits: MlaTraits) -> list[CompileSpec]:
    """Every kernel the spec's phases launch for ``config``, as the runtime launches it."""
    phases, specs = traits.phases, []
    scale = ("TREE_MASK", "TREE_MASK_INDPTR") + (() if quantized(config) else ("KV_SCALE",))
    scale += () if fp4(config) else ("KV_BSCALE",)
    # the absorbed kernel as the launcher picks it (the Gluon ones take no tree arguments,
    # and a scale only when keys-major)
    rows, options = absorbed_split_kernel, absorbed_options(config, write_lse=False)
    if config.decode_gluon:
        rows, options = gluon_kernel(config, write_lse=False)
        scale = tuple(arg for arg in scale if arg in rows.arg_names)
    if "decode" in phases:
        specs.append(_compile_spec("decode_split", rows, options, config, ("ROW_REQ", *scale)))
    if phases != ("decode",):  # extend / verify: absorbed rows, split or not
        specs.append(_compile_spec("absorbed_rows", rows, options, config, scale))
        nosplit = (*scale, "NUM_SPLITS")
        specs.append(_compile_spec("absorbed_rows_nosplit", rows, options, config, nosplit))
    if "verify" in phases and config.spec_topk > 1:  # draft trees: the mask hook on
        options = absorbed_options(config, write_lse=False, tree=True)
        nones = tuple(n for n in scale if not n.startswith("TREE"))
        specs.append(_compile_spec("verify_tree", absorbed_split_kernel, options, config, nones))
    specs.append(
        _compile_spec(
            "combine", absorbed_combine_kernel, combine_options(config, write_lse=False), config
        )
    )
    if "extend" in phases or "prefill" in phases:
        for causal in (True, False):
            options = ragged_options(config, causal=causal)
            name = "ragged_causal" if causal else "ragged_prefix"
            specs.append(_compile_spec(name, ragged_attend_kernel, options, config))
        merge = dict(NUM_HEADS=config.num_heads, DIM=config.v_head_dim, BLOCK_H=MERGE_BLOCK_H)
        specs.append(_compile_spec("merge_state", merge_state_kernel, merge, config))
    return specs
