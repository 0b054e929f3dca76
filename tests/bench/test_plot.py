"""bench/plot.py on the JSON layouts the benches write: a DSA result becomes a figure, a
result without any peer row is refused with a message instead of a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import plot  # noqa: E402
from bench.device_tag import device_tag  # noqa: E402

HEADER = dict(device="NVIDIA H200", torch="2.11", triton="3.6.0", commit="abc1234", peers={})


def _dsa_row(ms: float, peer_ms: float) -> dict:
    return dict(
        kind="sparse_decode", kv="fp8", heads=128, b=64, ctx=8192, splits=1, tiles="generated",
        split_factor=1.0, timer="graph", ms=ms, tflops=100.0 / ms, peer_ms=peer_ms,
        peer_tflops=100.0 / peer_ms, ratio=peer_ms / ms,
    )  # fmt: skip


def test_dsa_result_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "dsa-h200-test.json"
    path.write_text(json.dumps(dict(HEADER, rows=[_dsa_row(0.2, 0.1), _dsa_row(0.3, 0.2)])))
    assert plot.main([str(path)]) == 0
    assert path.with_suffix(".png").stat().st_size > 0


def test_result_without_peers_is_refused(tmp_path: Path, capsys) -> None:
    row = dict(part="experimental", kernel="library", heads=16, batch=64, ctx=4096, kv="fp8")
    path = tmp_path / "mla-h200-test.json"
    path.write_text(json.dumps(dict(HEADER, rows=[dict(row, attngen_ms=0.1)])))
    with pytest.raises(plot.NothingToPlot):
        plot.plot(json.loads(path.read_text()), path.with_suffix(".png"))
    assert plot.main([str(path)]) == 0
    assert "not plotted" in capsys.readouterr().out
    assert not path.with_suffix(".png").exists()


def test_mla_prefill_variants_compare_with_the_fa4_time_of_the_library_row() -> None:
    base = dict(heads=128, batch=4, ctx=4096)
    rows = [
        dict(base, part="prefill", attngen_ms=7.5, attngen_tflops=360.0, fa4_tflops=600.0),
        dict(base, part="prefill_variant", kernel="cute_dsl", tile=[128, 128, 2],
             attngen_ms=5.0, attngen_tflops=540.0, fa4_ms=4.5, ratio_vs_fa4=0.9),  # fmt: skip
    ]
    parts = plot.from_rows(dict(HEADER, rows=rows))
    labels, per_peer = plot.ratios(parts["prefill"], "tflops")
    assert labels == ["h128 4x4096", "h128 4x4096 cute_dsl 128x128x2"]
    assert per_peer["FA4"] == pytest.approx([0.6, 0.9])


def test_gdn_result_plots_attngen_over_fla(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    gdn = dict(HEADER, peer="fla-core 0.6.0", sweep=[{"case": "x", "speedup": 9.0}])
    gdn["prefill"] = [
        dict(case="1x32768 H16", attngen_mtok_s=14.0, fla_mtok_s=22.0),
        dict(case="8x4096 H32", error="Traceback ..."),
    ]
    gdn["decode"] = [
        dict(
            case="B256 H16/32",
            attngen_tb_s=3.8,
            fla_tb_s=4.0,
            attngen_graph_tb_s=3.96,
            fla_graph_tb_s=4.11,
        ),
        dict(case="B64 H16/32", attngen_tb_s=3.1, fla_tb_s=1.8),  # eager only
    ]
    parts = plot.from_gdn(gdn)
    assert [c["case"] for c in parts["prefill"]] == ["1x32768 H16"]  # the error row is left out
    labels, per_peer = plot.ratios(parts["prefill"], "mtok_s")
    assert per_peer["fla-core 0.6.0"] == pytest.approx([14.0 / 22.0])
    labels, per_peer = plot.ratios(parts["decode"], "tbps")
    assert labels == ["B256 H16/32", "B64 H16/32 (eager)"]  # graph figures where the run has them
    assert per_peer["fla-core 0.6.0"] == pytest.approx([3.96 / 4.11, 3.1 / 1.8])
    path = tmp_path / "h200-test-gdn.json"
    path.write_text(json.dumps(gdn))
    assert plot.main([str(path)]) == 0
    assert path.with_suffix(".png").stat().st_size > 0


def test_gdn_prefill_plots_the_faster_module_and_flashinfer() -> None:
    """A prefill row with the CuTe DSL module's figure plots the faster module (named in the
    label) against fla and, where the row has it, FlashInfer; the header names both peers."""
    gdn = dict(HEADER, peer="fla-core 0.6.0", peer2="flashinfer-python 0.6.14")
    gdn["prefill"] = [
        dict(case="1x32768 H16", attngen_mtok_s=14.0, fla_mtok_s=20.0, cute_mtok_s=33.0,
             flashinfer_mtok_s=28.0),
        dict(case="8x4096 H32", attngen_mtok_s=9.0, fla_mtok_s=12.0, cute_mtok_s=6.0),
    ]  # fmt: skip
    parts = plot.from_gdn(gdn)
    labels, per_peer = plot.ratios(parts["prefill"], "mtok_s")
    assert labels == ["1x32768 H16 cute_dsl", "8x4096 H32 triton"]
    assert per_peer["fla-core 0.6.0"] == pytest.approx([33.0 / 20.0, 9.0 / 12.0])
    fi = per_peer["flashinfer-python 0.6.14"]
    assert fi[0] == pytest.approx(33.0 / 28.0) and fi[1] != fi[1]  # NaN: no FlashInfer figure
    assert "flashinfer-python 0.6.14" in parts["peers"]


def test_paired_rows_plot_with_their_interquartile_ranges(tmp_path: Path) -> None:
    """bench/run.py rows timed in paired rounds carry ``ratio_iqr``: whiskers for the row
    ratios() plots (the CuTe DSL one when it is the faster), none for rows timed alone."""

    def row(case, ours, cute, fa4, iqr):
        results = {"attngen": {"tflops": ours}, "attngen_cute": {"tflops": cute},
                   "fa4": {"tflops": fa4}}  # fmt: skip
        return dict(case=case, page_size=0, results=results, ratio_iqr=iqr)

    rows = [row("S4k causal", 400.0, 560.0, 580.0, {"fa4": [0.68, 0.70], "cute_fa4": [0.95, 0.98]}),
            row("S1k causal", 300.0, 200.0, 330.0, {"fa4": [0.90, 0.92]}),
            row("S8k causal", 400.0, 500.0, 600.0, {})]  # fmt: skip
    assert plot.spreads(rows, "tflops")["fa4"][:2] == [(0.95, 0.98), (0.90, 0.92)]
    assert all(x != x for x in plot.spreads(rows, "tflops")["fa4"][2])  # timed alone: NaN
    pytest.importorskip("matplotlib")
    result = dict(commit="abc1234", gpu="NVIDIA H200", torch="2.11", triton="3.6.0", peers=[],
                  prefill=rows)  # fmt: skip
    plot.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_the_default_is_the_newest_run_not_the_newest_named_file(tmp_path: Path) -> None:
    """Without an argument the newest <gpu>-<timestamp> run is plotted, whichever GPU ran
    it; checks and sweeps whose names sort later (cute_mha_decode_check_...) are not runs."""
    names = (
        "h100-20261204T0101Z-aaa.json",
        "h200-20261203T2142Z-bbb.json",
        "cute_mha_decode_check_2026-12-03-eager.json",
        "mla-h200-20261205T0802Z.json",
    )
    for name in names:
        (tmp_path / name).write_text("{}")
    assert plot.newest_run(tmp_path) == tmp_path / "h100-20261204T0101Z-aaa.json"
    (tmp_path / "h200-20261205T0000Z-ccc.json").write_text("{}")
    assert plot.newest_run(tmp_path) == tmp_path / "h200-20261205T0000Z-ccc.json"
    (tmp_path / "gpu-20261206T0000Z-ddd.json").write_text("{}")  # device_tag's fallback
    assert plot.newest_run(tmp_path) == tmp_path / "gpu-20261206T0000Z-ddd.json"
    assert plot.newest_run(tmp_path / "missing") is None


@pytest.mark.parametrize(
    "name, tag",
    [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA B200", "b200"),
     ("NVIDIA GeForce RTX 4090", "rtx4090"), ("Tesla V100-SXM2-16GB", "v100"), ("", "gpu")],
)  # fmt: skip
def test_result_files_are_named_for_the_gpu_that_ran_them(name: str, tag: str) -> None:
    assert device_tag(name) == tag
