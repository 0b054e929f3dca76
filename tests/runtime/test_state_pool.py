"""RequestStatePool: per-request recurrent states indexed by slot (slot 0 pads)."""

from __future__ import annotations

import pytest
import torch

from attngen.runtime.checks import AttngenInputError
from attngen.runtime.state_pool import RequestStatePool


def pool(verify: bool = False) -> RequestStatePool:
    return RequestStatePool(
        num_layers=2,
        size=3,
        max_reqs=5,
        temporal_shape=(2, 4, 4),
        temporal_dtype=torch.float32,
        conv_shape=(6, 3),
        conv_dtype=torch.float16,
        device="cpu",
        verify_shape=(2, 3) if verify else None,
    )


def test_shapes_and_slots() -> None:
    p = pool(verify=True)
    temporal, conv = p.layer(1)
    assert temporal.shape == (4, 2, 4, 4) and conv.shape == (4, 6, 3)
    steps, conv_steps = p.steps(0)
    assert steps.shape == (2, 3, 2, 4, 4) and conv_steps.shape == (2, 3, 6, 3)
    p.assign(2, 3)
    p.assign(4, 1)
    got = p.slots(torch.tensor([4, 0, 2], dtype=torch.int32))
    assert got.tolist() == [1, 0, 3] and got.dtype == torch.int32


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda p: p.assign(0, 1), r"req_index: expected 1\.\.4 \(row 0 pads\)"),
        (lambda p: p.assign(1, 0), r"slot: expected 1\.\.3 \(slot 0 pads\)"),
        (lambda p: p.assign(1, 4), r"slot: expected 1\.\.3"),
        (lambda p: p.layer(2), r"layer_id: expected 0\.\.1"),
        (lambda p: p.steps(0), "built without verify_shape"),
    ],
)
def test_errors_name_the_argument(call, match: str) -> None:
    with pytest.raises(AttngenInputError, match=match):
        call(pool())
