"""bench/experimental/gdn_fused_precision.py: its chunk form, in float64, is the token-by-token
recurrence (so its rounding table measures roundings, not a wrong formula), and its operand
roundings are what they say."""

from __future__ import annotations

import sys

import torch

from attngen.families.gdn import reference
from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench" / "experimental"))

import gdn_fused_precision as fp  # noqa: E402


def test_the_exact_chunk_form_is_the_recurrence() -> None:
    for slow, correlated in ((False, True), (True, False)):
        q, k, v, g, beta = fp.draw(150, slow, correlated, seed=3)  # 2 full chunks + a part
        scale = 128**-0.5
        want_out, want_state, _ = reference.gdn_sequence(
            q, k, v, g, beta, None, scale=scale, l2norm_qk=True, keep_steps=False
        )
        qn, kn = reference.prepare_qk(q, k, 1, scale=scale, l2norm_qk=True)
        out, state = fp.chunked(
            qn[:, 0], kn[:, 0], v[:, 0].double(), g[:, 0], beta[:, 0], fp.DESIGNS["exact"], 64
        )
        assert torch.allclose(out, want_out[:, 0], rtol=0, atol=1e-10)
        assert torch.allclose(state, want_state[0], rtol=0, atol=1e-10)
        bf16 = fp.chunked(
            qn[:, 0], kn[:, 0], v[:, 0].double(), g[:, 0], beta[:, 0],
            fp.DESIGNS["bf16 everywhere"], 64,
        )[1]  # fmt: skip
        assert float((bf16 - want_state[0]).abs().max()) > 1e-4  # the roundings do act


def test_operand_roundings() -> None:
    one, e = 1.0, 2.0
    x = torch.tensor([one + e**-9, one + e**-12, one + 3 * e**-11 + e**-20, one + 3 * e**-9])
    x = x.double()
    assert fp.bf16(x).tolist() == [one, one, one, one + e**-7]  # 7 stored mantissa bits
    assert fp.tf32(x).tolist() == [one + e**-9, one, one + e**-9, one + 3 * e**-9]  # 10 bits
    assert float((fp.split(x) - x).abs().max()) < e**-15  # hi + lo: about 16 bits


def test_blocked_inverse_is_the_inverse_to_its_rounding() -> None:
    """The blocked form (fp32 substitution on 16 x 16 blocks, then (I - N)(I + N^2) D^-1) is
    (I + A)^-1 to fp32 with float64 products, and its product rounding shows (bf16 is
    measurably further), for a full chunk and a partial one."""
    gen = torch.Generator().manual_seed(5)
    for n in (64, 37):
        a = torch.tril(torch.rand(n, n, generator=gen, dtype=torch.float64) * 0.6, -1)
        want = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + a)
        err = {p: float((fp.blocked_inverse(a, p) - want).abs().max()) for p in ("fp64", "bf16")}
        scale = float(want.abs().max())
        assert err["fp64"] < 1e-5 * scale
        assert err["bf16"] > 10 * err["fp64"]


def test_kernel_form_is_the_recurrence_without_its_roundings() -> None:
    """kernel_form (the fused kernel's placements: β on d, the decay on u, exact keys in the
    update) with float64 operands is the token-by-token recurrence up to its fp32 results,
    and its forms' roundings act where they say (c1's bf16 d is further off than the fp16
    form's), on ragged chunks with correlated keys."""
    q, k, v, g, beta = fp.draw(150, False, True, seed=4)
    scale = 128**-0.5
    want_out, want_state, _ = reference.gdn_sequence(
        q, k, v, g, beta, None, scale=scale, l2norm_qk=True, keep_steps=False
    )
    args = (q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0])
    exact = dict(t="fp64", d="fp64", u="fp64", p="fp64")
    err = {}
    for name, form in (("exact", exact), *fp.FORMS.items()):
        out, state = fp.kernel_form(*args, form, scale)
        err[name] = (
            float((out - want_out[:, 0]).abs().max() / want_out.abs().max()),
            float((state - want_state[0]).abs().max() / want_state.abs().max()),
        )
    # fp32 results (the state to 1e-6) and the state's bf16 operand of S^T Q^T (the outputs
    # to about a bf16 output's own rounding)
    assert err["exact"][1] < 1e-6 and err["exact"][0] < 2e-3
    c1, half = (err[n] for n in fp.FORMS if n.startswith(("c1 ", "c1h")))
    assert c1[1] > 2 * half[1]
