"""bench/experimental/gdn_decode_persistent.py, the persistent recurrent decode: in Triton's
interpreter each form (cp.async and TMA loads, several stages and program counts) matches
the float64 step on shuffled slots with a padding request (NaN-poisoned outputs, the
padding slot and the slots no request holds left untouched), and agrees with the generated
decode."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from attngen.families.gdn import reference as ref
from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter runs these on CPU"
)

D = 128


@pytest.mark.parametrize("form", [(8, False, 3, 2), (16, True, 4, 3), (32, True, 3, 1)])
def test_persistent_decode_matches_the_float64_step(form):
    from bench.experimental.gdn_decode_persistent import persistent_decode

    torch.manual_seed(sum(form[:1]) + form[2])
    bs, h, hv = 3, 2, 4
    x = dict(
        q=torch.randn(bs, h, D, dtype=torch.bfloat16),
        k=torch.randn(bs, h, D, dtype=torch.bfloat16),
        v=torch.randn(bs, hv, D, dtype=torch.bfloat16),
        a=torch.randn(bs, hv, dtype=torch.bfloat16),
        b=torch.randn(bs, hv, dtype=torch.bfloat16),
        A_log=torch.empty(hv).uniform_(0.0, 2.7),
        dt_bias=torch.randn(hv) * 0.5,
    )
    pool = torch.randn(6, hv, D, D)
    pool[0] = 0
    start = pool.clone()
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)  # request 1 pads
    qsl = torch.arange(bs + 1, dtype=torch.int32)
    out = torch.full((bs, hv, D), float("nan"), dtype=torch.bfloat16)
    block_v, use_tma, stages, programs = form
    persistent_decode(x, pool, idx, qsl, out, block_v=block_v, use_tma=use_tma, stages=stages,
                      programs=programs, scale=D**-0.5)  # fmt: skip
    q, k = ref.prepare_qk(x["q"], x["k"], hv // h, scale=D**-0.5, l2norm_qk=True)
    g, beta = ref.gates(x["a"], x["b"], x["A_log"], x["dt_bias"])
    for r, slot in enumerate(idx.tolist()):
        want_o, want_s = ref.gdn_step(start[slot].double(), q[r], k[r], x["v"][r].double(),
                                      g[r], beta[r])  # fmt: skip
        err = (out[r].double() - want_o).abs().max().item()
        assert err <= 0.02 * want_o.abs().max().item() + 1e-3, (r, err)
        if slot > 0:
            assert (pool[slot].double() - want_s).abs().max().item() < 1e-5
    for untouched in (0, 1, 3, 5):
        assert torch.equal(pool[untouched], start[untouched])
