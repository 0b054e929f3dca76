"""bench/experimental kernels compute what they claim: interpreter numerics at small shapes
against the float64 oracle (fp16: the interpreter gets bf16 arithmetic wrong), NaN-poisoned
outputs, the same cases as the library kernel they stand beside."""

from __future__ import annotations

import sys

import pytest
import torch

from attngen.families.mla import reference as ref
from attngen.families.mla.testing import check_close, check_lse
from attngen.testing.paths import REPO_ROOT

F16 = torch.float16
SM_SCALE = 192**-0.5


@pytest.fixture(scope="module")
def tma():
    sys.path.insert(0, str(REPO_ROOT))
    from bench.experimental import mla_prefill_tma

    return mla_prefill_tma


@pytest.mark.parametrize("shared_rope", [True, False])
@pytest.mark.parametrize(
    "qo,kv,causal",
    [([5, 37, 16], [5, 37, 16], True), ([3, 20], [40, 19], True), ([5, 17], [33, 1], False)],
)
def test_mla_prefill_tma_matches_the_oracle(tma, qo, kv, causal, shared_rope):
    torch.manual_seed(sum(qo) + sum(kv))
    tq, tk, h = sum(qo), sum(kv), 2
    q = torch.randn(tq, h, 192).to(F16)
    k = torch.randn(tk, h, 192).to(F16)
    k_nope = k[..., :128]
    k_rope = k[:, :1, 128:] if shared_rope else k[..., 128:]
    v = torch.randn(tk, h, 128).to(F16)
    cum = lambda xs: torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    out = torch.full((tq, h, 128), float("nan"), dtype=F16)
    lse = torch.full((tq, h), float("nan"))
    tma.launch(q, k_nope, k_rope, v, cum(qo), cum(kv), out, lse, max_q_len=max(qo),
               sm_scale=SM_SCALE, variant=(16, 16, 4, 1), causal=causal)  # fmt: skip
    want, want_lse = ref.ragged_mha(q, k_nope, k_rope, v, qo, kv, SM_SCALE, causal)
    check_close(out, want, F16, "tma ragged out")
    check_lse(lse, want_lse, "tma ragged lse")
