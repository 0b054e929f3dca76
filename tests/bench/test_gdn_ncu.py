"""bench/experimental/gdn_ncu.py and bench/gdn.prefill_runner on CPU: the Triton interpreter
runs the generated gdn_gva1 extend of one short request (bf16, which the interpreter rounds
its own way: only that every output row and the final state are written, finite and
nonzero), and the script runs the case three times with its overrides."""

from __future__ import annotations

import sys

import torch

from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import gdn  # noqa: E402
from bench.experimental import gdn_ncu  # noqa: E402


def test_prefill_runner_writes_every_row(monkeypatch) -> None:
    monkeypatch.setattr(gdn, "DEV", "cpu")
    gdn.torch = torch
    torch.manual_seed(0)
    mod = gdn.kernels_module("gdn_gva1")
    run, buffers = gdn.prefill_runner(mod, 1, 20, 1, {"state_transposed": 0})
    buffers["out"].fill_(float("nan"))
    run()
    out, pool = buffers["out"].float(), buffers["pool"]
    assert out.shape == (20, 1, gdn.DIM) and torch.isfinite(out).all() and out.abs().sum() > 0
    assert torch.isfinite(pool[1]).all() and pool[1].abs().sum() > 0
    assert pool[0].abs().sum() == 0  # slot 0: padding, never written


def test_ncu_script_runs_the_case_with_its_overrides(monkeypatch) -> None:
    calls = []

    def runner(mod, bs, length, heads, tiles=None):
        return (lambda: calls.append((mod, bs, length, heads, tiles))), {}

    monkeypatch.setattr(gdn, "kernels_module", lambda spec: spec)
    monkeypatch.setattr(gdn, "prefill_runner", runner)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    gdn_ncu.main(["4", "8192", "16", '{"state_transposed": 0}'])
    assert calls == [("gdn_gva1", 4, 8192, 16, {"state_transposed": 0})] * 3
