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
    leaves SMs idle, 128 chunk steps charged for the combine, the copies and the second
    launch (H200, 2026-12-06, f79c301, forced segment counts: 1 x 8k x 16 heads 0.37 ms
    plain against 0.54 / 0.72 at 3 / 5 segments, 1 x 16k 0.73 against 0.70, 1 x 32k 1.43
    against 1.14, 1 x 32k x 8 heads 1.34 against 0.78: the segmented launch's host work,
    about 0.5 ms, is what short requests cannot hide); the conv on the Triton library's
    sm90 tiles."""
    return {
        "two_consumers_min_heads": facts(arch).num_sms,
        "chunk_early_d": 1,
        "segments_max": 8,
        "segments_overhead_chunks": 128,
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
