"""bench/experimental/gdn_ab.py, the GDN A/B of a tree, on CPU with bench/gdn.py's cases
stubbed (they need CUDA and fla): one row per case and variant, each variant's overrides
reach its cases, prefill rows ask for the float64 check, and a failing case is a row."""

from __future__ import annotations

import json
import sys
import types

from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import gdn  # noqa: E402
from bench.experimental import gdn_ab  # noqa: E402


def test_rows_per_case_and_variant(monkeypatch, tmp_path) -> None:
    fla = types.ModuleType("fla.ops.gated_delta_rule")
    fla.chunk_gated_delta_rule = fla.fused_recurrent_gated_delta_rule = object()
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", fla)
    monkeypatch.setattr(gdn, "kernels_module", lambda spec: spec)
    calls = []

    def prefill_case(mod, fn, bs, length, heads, tiles=None, oracle=False):
        calls.append(("prefill", mod, tiles, oracle))
        if tiles and tiles.get("boom"):
            raise RuntimeError("compile failed")
        return {"case": f"{bs}x{length}", "speedup": 0.5, "out_err_vs_f64": {"fla": 1.0}}

    def decode_case(mod, fn, bs, h, hv, tiles=None):
        calls.append(("decode", mod, tiles, None))
        return {"case": f"B{bs}", "graph_speedup": 0.9, "dropped": 1}

    monkeypatch.setattr(gdn, "prefill_case", prefill_case)
    monkeypatch.setattr(gdn, "decode_case", decode_case)
    out = tmp_path / "ab.jsonl"
    failed = gdn_ab.main(str(out), {"base": {}, "bad": {"boom": 1}}, {"prefill", "decode"})
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    n_pre, n_dec = len(gdn.PREFILL_CASES), len(gdn.DECODE_CASES)
    assert failed == 1 and len(rows) == 2 * (n_pre + n_dec)
    assert [r["variant"] for r in rows] == ["base"] * (n_pre + n_dec) + ["bad"] * (n_pre + n_dec)
    assert {c[1] for c in calls if c[0] == "prefill"} == {"gdn_gva1"}
    assert {c[1] for c in calls if c[0] == "decode"} == {"gdn_qwen3_next"}
    assert all(c[3] for c in calls if c[0] == "prefill")  # the float64 check on every row
    assert [c[2] for c in calls] == [None] * (n_pre + n_dec) + [{"boom": 1}] * (n_pre + n_dec)
    assert sum("compile failed" in r.get("error", "") for r in rows) == n_pre
    assert rows[n_pre]["graph_speedup"] == 0.9 and "dropped" not in rows[n_pre]
