"""Lowering: (spec, variants) x backend x arch -> verified IR plans."""

from __future__ import annotations

from attngen.capabilities import supports
from attngen.features import feature_lines
from attngen.lower.ir import GraphBuffer, MetadataPlan, MhaKernelPlan, MhaModulePlan
from attngen.lower.mha_triton import kernel_config
from attngen.lower.verify import verify_module
from attngen.runtime.configs import MhaMask
from attngen.spec.enums import Arch, Backend, Family, MaskKind
from attngen.spec.model import Mask, Spec
from attngen.spec.variant import Variant

SEQ_LEN_FILL_VALUE = 1  # padded rows of a replayed decode batch read one (valid) token


def decode_graph_buffers(fill: int) -> tuple[GraphBuffer, ...]:
    """Static buffers of a decode capture (split-KV decode + combine)."""
    return (
        GraphBuffer(
            "page_table", "int32", ("max_bs", "max_pages"), 0, "physical page of each logical page"
        ),
        GraphBuffer(
            "seq_lens",
            "int32",
            ("max_bs",),
            fill,
            "cached tokens per request (padded rows: fill value)",
        ),
        GraphBuffer(
            "num_splits", "int32", ("max_bs",), 1, "KV splits per request, chosen on device"
        ),
        GraphBuffer(
            "partial_o",
            "float32",
            ("max_bs", "num_q_heads", "max_splits", "v_head_dim"),
            0,
            "split outputs",
        ),
        GraphBuffer(
            "partial_lse",
            "float32",
            ("max_bs", "num_q_heads", "max_splits"),
            0,
            "split log-sum-exps",
        ),
    )


def module_mask(mask: Mask) -> MhaMask:
    """The spec's mask section as the kernels' compile-time mask constants."""
    return MhaMask(
        # custom (speculative trees): the tree mask applies to verify's drafts, the rest is causal
        causal=mask.kind is not MaskKind.NONE,
        window_left=mask.window_left if mask.window_left is not None else -1,
        logit_softcap=mask.logit_softcap or 0.0,
        has_sinks=mask.sinks,
    )


def lower_module(
    spec: Spec, variants: tuple[Variant, ...], backend: Backend, arch: Arch
) -> MhaModulePlan | None:
    """The plan for one spec on one target, or None when no variant is lowered there."""
    lowered = tuple(v for v in variants if supports(v, backend, arch).ok)
    if not lowered:
        return None
    assert spec.family is Family.MHA and backend is Backend.TRITON
    plan = MhaModulePlan(
        spec=spec,
        backend=backend,
        arch=arch,
        mask=module_mask(spec.mask),
        kernels=tuple(MhaKernelPlan(v, kernel_config(v, arch, spec)) for v in lowered),
        metadata=MetadataPlan(
            arch.num_sms, SEQ_LEN_FILL_VALUE, decode_graph_buffers(SEQ_LEN_FILL_VALUE)
        ),
        feature_lines=feature_lines(spec.family, backend, arch),
    )
    verify_module(plan)
    return plan
