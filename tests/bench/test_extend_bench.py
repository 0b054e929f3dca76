"""bench/run.py's extend-over-a-prefix part on CPU (Triton interpreter, fp16: the
interpreter's numpy has no bf16): the call it times is the one the engine makes, and its
checks catch a wrong output. FA4 is not here, so only attngen's row and the fp32 check run."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import run  # noqa: E402
from cpu_bench import cpu_fp16_bench  # noqa: E402


@pytest.fixture
def fp16_bench(monkeypatch):
    """bench.run on CPU tensors in fp16, Triton only, a fake clock for the paired rounds."""
    variants = cpu_fp16_bench(monkeypatch)
    timer = lambda fn, calls: float(calls)  # noqa: E731 (1 ms a call, no GPU clock here)
    monkeypatch.setattr(run, "run_then_pair", functools.partial(run.run_then_pair, timer=timer))
    return variants


def test_extend_over_a_prefix_matches_the_fp32_rows(fp16_bench) -> None:
    torch.manual_seed(0)
    row = run.run_extend_prefix(2, 70, 33, 64, fp16_bench, None)
    res = row["results"]["attngen"]
    assert res["uri"] == "d128_g4_ps64_fp16_causal"
    assert res["vs_ref"]["ok"] and res["mismatch"] == [], res
    assert row["results"]["fa4"] == {"status": "unavailable"}
    assert row["flops"] == 2 * 2 * run.HQ * (33 * 70 + 33 * 33 / 2) * (2 * run.D)


def test_a_wrong_output_is_flagged(fp16_bench, monkeypatch) -> None:
    """The same row with the cached prefix shifted by one position: the checks must fail."""
    torch.manual_seed(0)
    wrong = run.token_slots

    def shifted(page_table, page_size, seq_len):
        return torch.roll(wrong(page_table, page_size, seq_len), 1, dims=1)

    monkeypatch.setattr(run, "token_slots", shifted)
    row = run.run_extend_prefix(2, 70, 33, 64, fp16_bench, None)
    assert row["results"]["attngen"]["mismatch"] == ["vs_ref"]
