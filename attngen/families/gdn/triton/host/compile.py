"""Ahead-of-time compile specs of the GDN kernels: what ``triton.compile`` needs per launch
(the conv is compiled without a bias, as Qwen3-Next's)."""

from __future__ import annotations

from attngen.families.gdn.triton.config import CompileSpec, GdnTraits, GdnTritonConfig
from attngen.families.gdn.triton.host.options import (
    ACCEPT_OPTIONS,
    conv_prefill_options,
    conv_update_options,
    output_options,
    prepare_options,
    recurrent_options,
    state_blocks,
    state_options,
    state_t_descriptor_blocks,
    state_t_options,
    wu_options,
)
from attngen.families.gdn.triton.kernels.chunk import (
    chunk_output_kernel,
    chunk_prepare_kernel,
    chunk_state_kernel,
    chunk_state_t_kernel,
    chunk_wu_kernel,
)
from attngen.families.gdn.triton.kernels.conv import conv_prefill_kernel, conv_update_kernel
from attngen.families.gdn.triton.kernels.recurrent import accept_kernel, recurrent_kernel

POINTER = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}
INDEX_ARGS = ("CACHE_INDICES", "QUERY_START_LOC", "HAS_INITIAL", "CHUNK_SEQ", "CHUNK_START")
INDEX_ARGS += ("PARENTS", "ACCEPTED", "SEQ_FIRST_CHUNK")
FP32_ARGS = ("A_LOG", "DT_BIAS", "G_BUF", "BETA_BUF", "QS_BUF", "KN_BUF", "T_BUF", "W_BUF")
FP32_ARGS += ("U_BUF", "KT_BUF")
IO_ARGS = ("Q", "K", "V", "A", "B", "OUT", "X", "Y", "WEIGHT", "BIAS")
STATE_ARGS = ("STATE", "STEPS")
CONV_ARGS = ("CONV_STATE", "CONV_STEPS")


def _arg_type(name: str, config: GdnTritonConfig) -> str:
    if name in INDEX_ARGS:
        return "*i32"
    if name in FP32_ARGS:
        return "*fp32"
    if name in IO_ARGS or name in CONV_ARGS:  # the conv pool keeps the activation dtype
        return POINTER[config.dtype]
    if name == "H_BUF":  # the per-chunk states: the activation dtype, or fp32
        return POINTER[config.dtype if config.chunk_state_bits == 16 else "float32"]
    if name in STATE_ARGS:
        return POINTER[config.state_dtype]
    return "fp32" if name == "scale" else "i32"


def _spec(
    name: str, kernel, options: dict, config: GdnTritonConfig, nones=(), descriptors=None
) -> CompileSpec:
    """``descriptors``: element type and TMA box of the kernel's tensor-descriptor
    arguments."""
    constexprs = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages")}
    constexprs.update({arg: None for arg in nones})
    boxes = descriptors or {}
    signature = {
        arg: (
            f"tensordesc<{boxes[arg][0]}{boxes[arg][1]}>"
            if arg in boxes
            else _arg_type(arg, config)
        )
        for arg in kernel.arg_names
        if arg not in constexprs
    }
    return CompileSpec(
        name=name,
        fn=kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=int(options["num_warps"]),
        num_stages=int(options["num_stages"]),
    )


def compile_specs(config: GdnTritonConfig, traits: GdnTraits) -> list[CompileSpec]:
    """Every kernel the spec's phases launch for ``config``, as they launch it."""
    specs = []
    if "decode" in traits.phases:
        conv = conv_update_options(config, steps=1, verify=False, tree=False, has_bias=False)
        specs.append(
            _spec("conv_decode", conv_update_kernel, conv, config, ("BIAS", "STEPS", "PARENTS"))
        )
        rec = recurrent_options(config, steps=1, verify=False, tree=False)
        specs.append(_spec("decode", recurrent_kernel, rec, config, ("STEPS", "PARENTS")))
    if "extend" in traits.phases:
        conv = conv_prefill_options(config, has_bias=False)
        specs.append(_spec("conv_prefill", conv_prefill_kernel, conv, config, ("BIAS",)))
        specs.append(_spec("chunk_prepare", chunk_prepare_kernel, prepare_options(config), config))
        specs.append(_spec("chunk_wu", chunk_wu_kernel, wu_options(config), config))
        if config.state_transposed:  # the launcher picks it or a block below per batch
            boxes = state_t_descriptor_blocks(config)
            t_options = state_t_options(config)
            specs.append(_spec("chunk_state_t", chunk_state_t_kernel, t_options, config, (), boxes))
        for bv in state_blocks(config):  # the launcher picks one per batch
            options = state_options(config, bv)
            specs.append(_spec(f"chunk_state_v{bv}", chunk_state_kernel, options, config))
        specs.append(_spec("chunk_output", chunk_output_kernel, output_options(config), config))
    if "verify" in traits.phases and config.num_draft_tokens:
        n, tree = config.num_draft_tokens, config.spec_topk > 1
        nones = () if tree else ("PARENTS",)
        conv = conv_update_options(config, steps=n, verify=True, tree=tree, has_bias=False)
        specs.append(_spec("conv_verify", conv_update_kernel, conv, config, ("BIAS", *nones)))
        rec = recurrent_options(config, steps=n, verify=True, tree=tree)
        specs.append(_spec("verify", recurrent_kernel, rec, config, nones))
        specs.append(_spec("accept", accept_kernel, ACCEPT_OPTIONS, config))
    return specs
