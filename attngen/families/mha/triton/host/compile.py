"""Ahead-of-time compile specs of the MHA kernels: what ``triton.compile`` needs per launch."""

from __future__ import annotations

import torch

from attngen.families.mha.triton.config import CompileSpec, MhaTraits, MhaTritonConfig
from attngen.families.mha.triton.host.checks import io_torch_dtype, kv_torch_dtype
from attngen.families.mha.triton.host.options import (
    decode_combine_options,
    decode_split_options,
    extend_options,
)
from attngen.families.mha.triton.kernels.decode import decode_combine_kernel, decode_split_kernel
from attngen.families.mha.triton.kernels.extend import extend_kernel

# Triton types of the kernels' runtime arguments, by argument name: Q and OUT take the
# config's dtype, K_CACHE and V_CACHE its KV dtype, every "stride_*" is "i32". Arguments
# the launcher passes as None (SINKS without sinks, scales of a bf16/fp16 cache, block
# scales of a non-NVFP4 cache, the tree mask outside tree verify, the page table in
# prefill) are constexprs to Triton.
POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float8_e4m3fn: "*fp8e4nv",
    torch.float8_e5m2: "*fp8e5",
    torch.uint8: "*u8",
}
ARG_TYPES = {
    "PAGE_TABLE": "*i32",
    "SEQ_LENS": "*i32",
    "NUM_SPLITS": "*i32",
    "QO_INDPTR": "*i32",
    "PREFIX_LENS": "*i32",
    "PARTIAL_O": "*fp32",
    "PARTIAL_LSE": "*fp32",
    "SINKS": "*fp32",
    "K_SCALE": "*fp32",
    "V_SCALE": "*fp32",
    "TREE_MASK": "*u8",
    "TREE_MASK_INDPTR": "*i32",
    "sm_scale": "fp32",
}


def _compile_spec(
    name: str,
    kernel,
    options: dict,
    config: MhaTritonConfig,
    traits: MhaTraits,
    none_args: tuple[str, ...] = (),
    kv_dtype: torch.dtype | None = None,
) -> CompileSpec:
    """The CompileSpec of one launch: ``options`` and None arguments as the launcher's."""
    constexprs = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages")}
    nones = set(none_args)
    if not traits.mask.sinks:
        nones.add("SINKS")
    if not options.get("KV_SCALED", True):
        nones.update(("K_SCALE", "V_SCALE"))
    if not options.get("MASK_TREE", True):
        nones.update(("TREE_MASK", "TREE_MASK_INDPTR"))
    if not options.get("KV_FP4", True):
        nones.update(("K_BSCALE", "V_BSCALE"))
    constexprs.update({arg: None for arg in kernel.arg_names if arg in nones})
    pointers = {
        "Q": POINTER_TYPES[io_torch_dtype(config)],
        "OUT": POINTER_TYPES[io_torch_dtype(config)],
        "K_CACHE": POINTER_TYPES[kv_dtype or kv_torch_dtype(config)],
        "V_CACHE": POINTER_TYPES[kv_dtype or kv_torch_dtype(config)],
        "K_BSCALE": "*u8" if traits.fp4_scales_as_bytes else "*fp8e4nv",
        "V_BSCALE": "*u8" if traits.fp4_scales_as_bytes else "*fp8e4nv",
    }
    signature = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            continue
        if arg in pointers:
            signature[arg] = pointers[arg]
        elif arg.startswith("stride_"):
            signature[arg] = "i32"
        else:
            signature[arg] = ARG_TYPES[arg]
    return CompileSpec(
        name=name,
        fn=kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=options["num_warps"],
        num_stages=options["num_stages"],
    )


def compile_specs(config: MhaTritonConfig, traits: MhaTraits) -> list[CompileSpec]:
    """Every kernel the spec's phases launch for ``config``, as they launch it."""
    phases, specs = traits.phases, []
    if "decode" in phases:
        split, combine = decode_split_options, decode_combine_options
        specs.append(
            _compile_spec(
                "decode_split", decode_split_kernel, split(config, traits), config, traits
            )
        )
        specs.append(
            _compile_spec(
                "decode_combine", decode_combine_kernel, combine(config, traits), config, traits
            )
        )
    if "extend" in phases or "draft_extend" in phases:
        options = extend_options(config, traits)
        specs.append(_compile_spec("extend", extend_kernel, options, config, traits))
    if "verify" in phases:
        options = extend_options(config, traits, tree=config.spec_topk > 1, verify=True)
        specs.append(_compile_spec("verify", extend_kernel, options, config, traits))
    if "prefill" in phases:
        options = extend_options(config, traits, paged=False)
        nones = ("PAGE_TABLE", "PREFIX_LENS")
        kv = io_torch_dtype(config)
        specs.append(_compile_spec("prefill", extend_kernel, options, config, traits, nones, kv))
    return specs
