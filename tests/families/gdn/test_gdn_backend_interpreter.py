"""The generated GDN backend end to end on CPU (interpreter, fp16, small heads): conv +
gated delta rule through GdnBackend's own launches, against the float64 oracle, with the
states of every request checked in the pool after every forward."""

from __future__ import annotations

import random

import pytest
import torch

from attngen.families.gdn.testing import make_rig
from attngen.runtime.checks import AttngenInputError
from gdn_modules import backend_class, small_config

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


@pytest.mark.parametrize("group", [1, 2])
def test_extend_decode_verify(group: int) -> None:
    torch.manual_seed(group)
    rng = random.Random(group)
    cls = backend_class([small_config(group, topk=4, drafts=4)])
    rig = make_rig(cls, num_k_heads=2, dtype=torch.float16, device="cpu", spec_topk=4, bias=True)
    rig.run_extend([1, 2, 3], [5, 37, 16], [False, False, False])
    rig.run_extend([2, 4, 1], [20, 3, 1], [True, False, True])
    for step in range(1, 4):
        rig.run_decode([4, 2, 1, 3], step)
    rig.run_verify([3, 1], tree=True, rng=rng)
    rig.run_decode([1, 3], 4)
    temporal, conv = rig.pool.layer(0)
    assert not temporal[0].any() and not conv[0].any(), "slot 0 (padding) was written"


def test_verify_chain_then_accept() -> None:
    torch.manual_seed(3)
    cls = backend_class([small_config(2, topk=1, drafts=3)])
    rig = make_rig(cls, num_k_heads=1, dtype=torch.float16, device="cpu", spec_topk=1)
    rig.run_extend([5, 6], [9, 2], [False, False])
    rig.run_verify([6, 5], tree=False, rng=random.Random(3))
    rig.run_decode([5, 6], 2)


def test_bad_inputs_are_named() -> None:
    cls = backend_class([small_config(2)])
    rig = make_rig(cls, num_k_heads=1, dtype=torch.float16, device="cpu", spec_topk=0)
    with pytest.raises(AttngenInputError, match=r"req_pool_indices\[1\]"):
        rig.backend.init_forward_metadata(rig.decode_batch([1, 0]))
    fb = rig.decode_batch([1])
    rig.backend.init_forward_metadata(fb)
    x, a, b = rig.inputs(1)
    with pytest.raises(AttngenInputError, match="mixed_qkv"):
        rig.backend.forward_decode(rig.layer, fb, x.float(), a, b)
    with pytest.raises(AttngenInputError, match="^b: "):
        rig.backend.forward_decode(rig.layer, fb, x, a, b[:, :1])
    with pytest.raises(AttngenInputError, match="no generated config"):
        cls(
            num_k_heads=1,
            num_v_heads=3,
            head_k_dim=32,
            head_v_dim=32,
            dtype=torch.float16,
            device="cpu",
            state_pool=rig.pool,
        )
