"""bench/gdn.py's float64 check of the prefill rows: each side's output and final state
against the token-by-token recurrence on request 0, value head 0. On CPU with the oracle's
own values as one side (error 0) and a perturbed copy as the other (error > 0)."""

from __future__ import annotations

import sys

import torch

from attngen.families.gdn import reference
from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import gdn  # noqa: E402


def test_oracle_errors_measure_each_side_on_request_zero(monkeypatch) -> None:
    monkeypatch.setattr(gdn, "torch", torch)
    monkeypatch.setattr(gdn, "DEV", "cpu")
    torch.manual_seed(0)
    length, heads = 12, 2
    x = gdn.inputs(2 * length, heads, heads)  # two requests: only the first is checked
    one = {n: x[n][:length, :1] for n in ("q", "k", "v", "a", "b")}
    g, beta = reference.gates(one["a"], one["b"], x["A_log"][:1], x["dt_bias"][:1])
    ref_out, ref_state, _ = reference.gdn_sequence(
        one["q"], one["k"], one["v"], g, beta, None,
        scale=gdn.DIM**-0.5, l2norm_qk=True, keep_steps=False,
    )  # fmt: skip
    out = torch.zeros(2 * length, heads, gdn.DIM, dtype=torch.float64)
    out[:length, :1] = ref_out
    out[length:] = 1e3  # request 1 and head 1 are not the oracle's: they must not count
    out[:, 1] = 1e3
    theirs = out.clone()
    theirs[length - 1, 0, 5] += 0.5  # the last token of request 0 differs
    errs = gdn.oracle_errors(x, length, out, theirs, ref_state[0], ref_state[0] * 1.01)
    assert errs["out_err_vs_f64"]["attngen"] == 0.0
    assert errs["state_err_vs_f64"]["attngen"] == 0.0
    rms = float(ref_out.pow(2).mean().sqrt())
    # diff() measures in fp32: equal to its relative precision
    assert abs(errs["out_err_vs_f64"]["fla"] / (0.5 / rms) - 1) < 1e-5
    assert errs["state_err_vs_f64"]["fla"] > 0.0
