"""Lowering of GDN variants to CuTe DSL plans: the chunk kernel's form rule, the conv's
tiles, the plan (no graph buffers: extend is not captured)."""

from __future__ import annotations

from attngen.arch import facts
from attngen.families.gdn.cute_dsl import capability
from attngen.families.gdn.cute_dsl.config import GdnCuteConfig, GdnCuteTraits
from attngen.families.gdn.spec import config_identity
from attngen.ir import ModulePlan
from attngen.library_lowering import plan_module
from attngen.spec.enums import Arch, Backend
from attngen.spec.model import Spec
from attngen.spec.variant import Variant

RUNTIME_CLASS = "attngen.families.gdn.runtime:GdnBackend"
SEQ_LEN_FILL_VALUE = 1


def tiles(arch: Arch) -> dict[str, int]:
    """Two consumer warpgroups a CTA once the batch has an SM's worth of (request, value
    head) pairs (H100, 2026-12-06, prepare + chunk kernel: 8 x 4k x 32 heads, 256 pairs,
    0.92 ms against 1.09 on one; 4 x 8k x 16, 64 pairs, 0.55 against 0.67 on two; 1 x 32k x
    16, 16 pairs, 1.40 against 2.07); up to 8 segments a long request where that form
    leaves SMs idle, 16 chunk steps (about 40 us) charged for the combine and the second
    launch; the conv on the Triton library's sm90 tiles."""
    return {
        "two_consumers_min_heads": facts(arch).num_sms,
        "chunk_early_d": 1,
        "segments_max": 8,
        "segments_overhead_chunks": 16,
        "conv_block_c": 64,
        "conv_block_t": 16,
        "conv_num_warps": 4,
    }


def kernel_config(
    variant: Variant, arch: Arch, overrides: dict[str, int] | None = None
) -> GdnCuteConfig:
    values = tiles(arch)
    values.update(overrides or {})
    return GdnCuteConfig(**config_identity(variant), arch=arch.value, **values)


def lower(spec: Spec, variants: tuple[Variant, ...], arch: Arch) -> ModulePlan:
    return plan_module(
        spec,
        variants,
        arch,
        Backend.CUTE_DSL,
        kernel_config=kernel_config,
        seq_len_fill=SEQ_LEN_FILL_VALUE,
        graph_buffers=(),
        runtime_class=RUNTIME_CLASS,
    )


def traits(plan: ModulePlan) -> GdnCuteTraits:
    """The phases the generated module serves: extend (what capability.PHASES lowers)."""
    return GdnCuteTraits(tuple(p.value for p in sorted(capability.PHASES)))
