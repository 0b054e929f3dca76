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
