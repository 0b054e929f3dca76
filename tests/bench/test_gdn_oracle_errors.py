"""bench/gdn.py's float64 check of the prefill rows: each side's output and final state
against the token-by-token recurrence on request 0, value head 0. On CPU with the oracle's
own values as one side (error 0) and a perturbed copy as the other (error > 0)."""

from __future__ import annotations

import sys

import pytest
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
    ref = gdn.f64_oracle(x, length)
    assert torch.equal(ref[0], ref_out) and torch.equal(ref[1], ref_state[0])
    sides = {"attngen": (out, ref_state[0]), "fla": (theirs, ref_state[0] * 1.01)}
    errs = gdn.oracle_errors(ref, length, sides)
    assert errs["out_err_vs_f64"]["attngen"] == 0.0
    assert errs["state_err_vs_f64"]["attngen"] == 0.0
    rms = float(ref_out.pow(2).mean().sqrt())
    # diff() measures in fp32: equal to its relative precision
    assert abs(errs["out_err_vs_f64"]["fla"] / (0.5 / rms) - 1) < 1e-5
    assert errs["state_err_vs_f64"]["fla"] > 0.0


def _on_cpu(monkeypatch, bench, bs: int, length: int, heads: int):
    """bench/gdn.py on CPU with ``bench`` as its timer: a FlashInfer case's inputs ``x``,
    attngen's ``out`` and ``pool`` (random) and ``qsl`` for ``bs`` requests of ``length``."""
    monkeypatch.setattr(gdn, "torch", torch)
    monkeypatch.setattr(gdn, "DEV", "cpu")
    monkeypatch.setattr(gdn, "bench", bench)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    torch.manual_seed(0)
    x = gdn.inputs(bs * length, heads, heads)
    out = torch.randn(bs * length, heads, gdn.DIM).to(torch.bfloat16)
    pool = torch.randn(bs + 1, heads, gdn.DIM, gdn.DIM)
    return x, out, pool, torch.arange(bs + 1, dtype=torch.int32) * length


def test_flashinfer_rows_hand_it_the_gates_as_values(monkeypatch) -> None:
    """The FlashInfer peer (not importable here: a stand-in with its signature) gets the
    same rows in its layout, the gates as fp32 values (alpha = exp(g) in (0, 1], beta in
    (0, 1)), int64 cu_seqlens, and its output and final state are compared with attngen's
    buffers."""
    bs, length, heads = 2, 8, 2
    x, out, pool, qsl = _on_cpu(monkeypatch, lambda fn: (fn(), 2.0)[1], bs, length, heads)
    seen = {}

    def stand_in(q, k, v, alpha, beta, *, scale, initial_state, output_final_state,
                 cu_seqlens, use_qk_l2norm_in_kernel, output, output_state):  # fmt: skip
        seen.update(alpha=alpha, beta=beta, cu=cu_seqlens, l2=use_qk_l2norm_in_kernel)
        seen.update(q=q, k=k)
        assert v is x["v"] and initial_state is None and output_final_state
        output.copy_(out)
        output_state.copy_(pool[1:] * 1.01)  # its states differ from attngen's by 1%
        return output, output_state

    buffers = dict(x=x, out=out, pool=pool, qsl=qsl)
    # an oracle equal to attngen's request 0, head 0: the peer's output matches it, its state not
    buffers["oracle"] = (out[:length, :1].double(), pool[1, 0].double())
    row = gdn.flashinfer_prefill(stand_in, buffers, bs, length, heads)
    assert row["flashinfer_out_err_vs_f64"] == 0.0
    expected = gdn.diff(pool[1, 0] * 1.01, pool[1, 0].double())
    assert 0.0 < row["flashinfer_state_err_vs_f64"] == expected
    g, beta = reference.gates(x["a"], x["b"], x["A_log"], x["dt_bias"])
    assert seen["alpha"].dtype == seen["beta"].dtype == torch.float32
    assert torch.allclose(seen["alpha"].double(), torch.exp(g), rtol=1e-6)
    assert 0 < float(seen["alpha"].min()) and float(seen["alpha"].max()) <= 1
    assert torch.allclose(seen["beta"].double(), beta, rtol=1e-6)
    assert seen["cu"].dtype == torch.int64 and seen["cu"].tolist() == [0, 8, 16]
    # 0.6.14 ignores its in-kernel L2 flag: q and k reach it normalised, in their dtype
    assert not seen["l2"]
    for name in ("q", "k"):
        assert seen[name].dtype == x[name].dtype and seen[name].shape == x[name].shape
        norms = seen[name].double().norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
        assert torch.allclose(seen[name].double(), reference.l2norm(x[name]), atol=1e-2)
    assert row["out_diff_vs_flashinfer"] == 0.0 and row["state_diff_vs_flashinfer"] > 0.0
    assert row["flashinfer_ms"] == 2.0 and row["flashinfer_mtok_s"] == bs * length / 2.0 / 1e3


def test_flashinfer_rows_refuse_a_non_finite_answer(monkeypatch):
    """A peer whose output holds NaN gets an error, not a time."""
    bs, length, heads = 1, 4, 1
    no_timing = lambda fn: pytest.fail("timed a NaN answer")  # noqa: E731
    x, out, pool, qsl = _on_cpu(monkeypatch, no_timing, bs, length, heads)

    def nan_peer(*args, output, output_state, **kwargs):
        output.fill_(float("nan"))
        output_state.copy_(pool[1:])

    buffers = dict(x=x, out=out, pool=pool, qsl=qsl)
    with pytest.raises(ValueError, match="not finite"):
        gdn.flashinfer_prefill(nan_peer, buffers, bs, length, heads)
