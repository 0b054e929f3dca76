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


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (dict(state_num_stages=3, state_block_v=32), "state_num_stages=3: 2, or 3 with"),
        (dict(state_num_stages=4), "state_num_stages=4"),
        (dict(state_num_warps=8, state_num_stages=2), "miscompiled by Triton on sm_90a"),
    ],
)
def test_state_tiles_that_cannot_run_are_refused(overrides: dict, problem: str) -> None:
    """Tiles the H200 measured as unlaunchable (shared memory) or miscompiled: refused at
    planning, with the reason, instead of failing at the first launch."""
    from attngen.families.gdn.triton.lower import kernel_config
    from attngen.families.gdn.triton.verify import config_problems, miscompiled

    config = kernel_config(base_variant(), Arch.SM90, overrides)
    problems = config_problems(config) + miscompiled(config)
    assert any(problem in p for p in problems), problems
    assert not config_problems(kernel_config(base_variant(), Arch.SM90))
    assert not miscompiled(kernel_config(base_variant(), Arch.SM90))


@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM100])
def test_transposed_state_kernel_is_refused_off_sm90(arch: Arch) -> None:
    """A spec's tuning asking sm80 / sm100 for the sm90-only transposed-state kernel is
    refused at planning, naming the key; their own defaults do not ask for it."""
    from attngen.families.gdn.triton.lower import kernel_config
    from attngen.families.gdn.triton.verify import arch_problems

    asked = kernel_config(base_variant(), arch, {"state_transposed": 1})
    assert any("state_transposed=1" in p for p in arch_problems(asked, arch))
    assert not arch_problems(kernel_config(base_variant(), arch), arch)
    assert not arch_problems(kernel_config(base_variant(), Arch.SM90), Arch.SM90)
