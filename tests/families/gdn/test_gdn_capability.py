"""What the Triton GDN lowering says it runs: one verdict per capability rule."""

from __future__ import annotations

import dataclasses

import pytest

from attngen.capabilities import Status, supports
from attngen.families.gdn import base_variant
from attngen.spec.enums import Arch, Backend, DType, Phase


def shape(**kw):
    return dataclasses.replace(base_variant().shape, **kw)


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(shape=shape(state_dtype=DType.BF16)), "bf16 temporal state"),
        (dict(shape=shape(key_dim=256)), "key_dim 256"),
        (dict(shape=shape(chunk_size=128)), "chunk_size 128"),
        (dict(shape=shape(conv_kernel=3)), "conv_kernel 3"),
        (dict(dtype=DType.FP32), "activation dtype fp32"),
        (dict(phases=(Phase.DRAFT_EXTEND,)), "phase draft_extend"),
    ],
)
def test_not_lowered_says_why(change: dict, reason: str) -> None:
    verdict = supports(dataclasses.replace(base_variant(), **change), Backend.TRITON, Arch.SM90)
    assert verdict.status is Status.NOT_LOWERED and reason in verdict.reason


@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90, Arch.SM100])
def test_plain_variant_lowered(arch: Arch) -> None:
    variant = dataclasses.replace(base_variant(), phases=(Phase.EXTEND, Phase.DECODE, Phase.VERIFY))
    assert supports(variant, Backend.TRITON, arch).ok
