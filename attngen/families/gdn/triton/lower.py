"""Lowering of GDN variants to Triton plans: tiles per head dim, the graph buffers, the plan.

Tiles are starting points checked to compile without spills (sm_80, sm_90a, sm_100a; see
evidence/compile/); a spec's ``tuning`` section overrides them per arch.
"""

from __future__ import annotations

from attngen.arch import facts
from attngen.families.gdn.triton.config import GdnTraits, GdnTritonConfig
from attngen.hooks import MaskHooks
from attngen.ir import GraphBuffer, KernelPlan, MetadataPlan, ModulePlan
from attngen.probes import feature_lines
from attngen.spec.enums import Arch, Backend, DType, Phase
from attngen.spec.model import Spec
from attngen.families.gdn.spec import GdnShape
from attngen.spec.variant import Variant

RUNTIME_CLASS = "attngen.families.gdn.runtime:GdnBackend"
SEQ_LEN_FILL_VALUE = 1  # padded rows of a replayed batch (their slot is 0: nothing is touched)
TORCH_DTYPES = {DType.BF16: "bfloat16", DType.FP16: "float16", DType.FP32: "float32"}


def tiles(shape: GdnShape, arch: Arch) -> dict[str, int]:
    """Decode / verify: value blocks of 8 rows on one warp (an 8 x K fp32 state slice per
    program; B64 x 32 heads gives 32768 programs), the shape flash-linear-attention's
    recurrent kernel uses (4.1 TB/s at B256 on the H200, next to this kernel's 3.6 TB/s
    with 32-row blocks on 8 warps; 16 x 2 and 64 x 8 measured the same as 32 x 8: 291-299
    us; 8 x 1 itself not measured yet). Chunk prepare: 8 warps
    over [chunk, K] tiles. Chunk scan: value blocks of 16 (a request's head spreads over
    V / 16 programs: 1 x 32k tokens x 16 heads fills 128 SMs), 8 warps, two pipeline stages
    (sm_100a: one; two spilled there). Conv prefill: 16 tokens x 64 channels (32 x 128
    spilled on sm_90a). All measured spill-free on sm_90a and sm_100a (evidence/compile/)."""
    wide = shape.chunk_size * max(shape.key_dim, shape.value_dim) >= 64 * 128
    return {
        "decode_block_v": 8,
        "decode_num_warps": 1,
        "prepare_num_warps": 8 if wide else 4,
        "solve_num_warps": 8 if wide else 4,
        "scan_block_v": 16,
        "scan_num_warps": 8 if wide else 4,
        "scan_num_stages": 1 if arch is Arch.SM100 else 2,
        "conv_block_c": 64,
        "conv_block_t": 16,
        "conv_num_warps": 4,
    }


def kernel_config(
    variant: Variant, arch: Arch, overrides: dict[str, int] | None = None
) -> GdnTritonConfig:
    shape = variant.shape
    assert isinstance(shape, GdnShape)
    values = tiles(shape, arch)
    values.update(overrides or {})
    return GdnTritonConfig(
        uri=variant.uri,
        key_dim=shape.key_dim,
        value_dim=shape.value_dim,
        v_heads_per_k_head=shape.v_heads_per_k_head,
        dtype=TORCH_DTYPES[variant.dtype],
        state_dtype=TORCH_DTYPES[shape.state_dtype],
        chunk_size=shape.chunk_size,
        conv_kernel=shape.conv_kernel,
        l2norm=shape.qk_l2norm,
        spec_topk=variant.spec_topk or 0,
        num_draft_tokens=variant.num_draft_tokens,
        **values,
    )


def graph_buffers(verify: bool) -> tuple[GraphBuffer, ...]:
    """Static buffers of a decode / verify capture: the requests' state slots (0: padding,
    never written) and their row offsets; trees add the drafts' parents."""
    buffers = (
        GraphBuffer("cache_indices", "int32", ("max_bs",), 0, "state pool slot per request"),
        GraphBuffer(
            "query_start_loc",
            "int32",
            ("max_bs_plus_one",),
            0,
            "first row of each request (set to b * tokens per request)",
        ),
    )
    if verify:
        buffers += (
            GraphBuffer(
                "parents", "int32", ("max_bs", "max_drafts"), -1, "draft tree parents (-1: root)"
            ),
        )
    return buffers


def lower(spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
    overrides = spec.tuning_for(Backend.TRITON, arch)
    verify = Phase.VERIFY in spec.phases
    return ModulePlan(
        spec=spec,
        backend=Backend.TRITON,
        arch=arch,
        hooks=MaskHooks.from_mask(spec.mask),
        kernels=tuple(KernelPlan(v, kernel_config(v, arch, overrides)) for v in variants),
        metadata=MetadataPlan(facts(arch).num_sms, SEQ_LEN_FILL_VALUE, graph_buffers(verify)),
        runtime_class=RUNTIME_CLASS,
        feature_lines=feature_lines(variants, spec.family, Backend.TRITON, arch),
    )


def traits(plan: ModulePlan) -> GdnTraits:
    return GdnTraits(tuple(p.value for p in plan.spec.phases))
