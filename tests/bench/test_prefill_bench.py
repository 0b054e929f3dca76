"""bench/run.py's prefill rows on CPU (Triton interpreter, fp16): the cache-free prefill and
the extend over pages of one case run once for their outputs, are timed in paired rounds
(a fake timer here) and checked against fp32 rows; a peer that fails is reported, not timed;
a wrong output is flagged."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import run  # noqa: E402
from cpu_bench import cpu_fp16_bench  # noqa: E402

HEADS = (4, 1, 64, 64)  # mha_gqa_prefill generates d64 g4 (cache-free and pages 64 / 128)


@pytest.fixture
def fp16_prefill(monkeypatch):
    variants = cpu_fp16_bench(monkeypatch)
    monkeypatch.setattr(run, "PREFILL_TOKENS", 128)
    monkeypatch.setattr(run, "SCALE", 64**-0.5)
    # every kernel "takes" 1 ms a call, FA2 2 ms: the ratio comes out of the rounds
    timer = lambda fn, calls: calls * (2.0 if getattr(fn, "peer", "") == "fa2" else 1.0)  # noqa
    monkeypatch.setattr(run, "run_then_pair", functools.partial(run.run_then_pair, timer=timer))

    def sdpa(backend, q4, k4, v4, causal):
        if backend == "CUDNN_ATTENTION":
            raise RuntimeError("cuDNN attention needs a GPU")
        qt, kt, vt = (x.transpose(1, 2) for x in (q4, k4, v4))
        kt, vt = (x.repeat_interleave(qt.shape[1] // x.shape[1], 1) for x in (kt, vt))

        def fn():
            return torch.nn.functional.scaled_dot_product_attention(
                qt.float(), kt.float(), vt.float(), is_causal=causal, scale=run.SCALE
            ).to(q4.dtype)

        fn.peer = "fa2"
        return fn, "kv heads expanded"

    monkeypatch.setattr(run, "sdpa_fn", sdpa)
    return variants


def test_prefill_rows_are_checked_and_timed_in_rounds(fp16_prefill) -> None:
    torch.manual_seed(0)
    rows = run.run_prefill(64, True, [0, 64], fp16_prefill, None, HEADS)
    assert [r["page_size"] for r in rows] == [0, 64]
    for row in rows:
        res = row["results"]
        assert res["attngen"]["uri"].startswith("d64_g4_ps"), res["attngen"]
        assert res["attngen"]["vs_ref"]["ok"] and res["attngen"]["mismatch"] == [], res
        assert res["attngen"]["ms"] == pytest.approx(1.0)
        assert res["fa2"]["ms"] == pytest.approx(2.0) and res["fa2"]["vs_ref"]["ok"]
        assert res["cudnn"] == {"error": "RuntimeError: cuDNN attention needs a GPU"}
        assert res["fa4"] == {"status": "unavailable"}
        assert row["ratio"] == {"fa2": pytest.approx(2.0)}  # FA2's time / attngen's
        assert row["ratio_iqr"]["fa2"] == [pytest.approx(2.0), pytest.approx(2.0)]


def test_a_wrong_prefill_output_is_flagged(fp16_prefill, monkeypatch) -> None:
    """The cache-free prefill handed keys shifted by one token: the checks must fail."""
    torch.manual_seed(0)
    real = run.attngen_prefill

    def shifted(found, q, k, v, batch, seqlen):
        return real(found, q, torch.roll(k, 1, dims=0), v, batch, seqlen)

    monkeypatch.setattr(run, "attngen_prefill", shifted)
    [row] = run.run_prefill(64, True, [0], fp16_prefill, None, HEADS)
    assert row["results"]["attngen"]["mismatch"] == ["vs_ref", "vs_fa2"]
