"""Plot a bench result: attngen against each peer per case, from the JSON `bench/run.py` (or
`bench/mla.py`, `bench/dsa.py`, `bench/gdn.py`) wrote.

    python bench/plot.py bench/results/<run>.json      # writes bench/results/<run>.png
    make bench-plot                                    # the newest result

One panel per part (decode, quantized decode, verify, prefill): for every case, the ratio
attngen / peer of the part's figure (TB/s or TFLOP/s; above 1 is faster than the peer), one
bar per peer, the best attngen row of the case (its page size in the label). The title names
the commit, GPU and peer versions; the plot is regenerated from the JSON, never edited.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.run import RATIO_PREFIX  # noqa: E402 (run.py imports no torch at import)

PARTS = (  # (JSON key, title, figure per result)
    ("decode", "paged decode (TB/s ratio)", "tbps"),
    ("quantized_decode", "quantized decode (TB/s ratio)", "tbps"),
    ("verify", "speculative verify (TB/s ratio)", "tbps"),
    ("prefill", "prefill (TFLOP/s ratio)", "tflops"),
    ("head_dims", "causal prefill at head dims 64, 256, 192/128 (TFLOP/s ratio)", "tflops"),
    ("extend", "extend over a paged prefix (TFLOP/s ratio)", "tflops"),
)
MLA_PARTS = (  # bench/mla.py's parts (see from_rows)
    ("decode", "MLA absorbed decode, 16-bit latent (TFLOP/s ratio)", "tflops"),
    ("quantized_decode", "MLA absorbed decode, fp8 / NVFP4 latent (TFLOP/s ratio)", "tflops"),
    ("prefill", "MLA prefill 192/128 with LSE (TFLOP/s ratio)", "tflops"),
)

DSA_PARTS = (  # bench/dsa.py's parts (see from_dsa_rows)
    ("decode", "DSA sparse decode, top-2048 (TFLOP/s ratio)", "tflops"),
    ("prefill", "DSA sparse prefill (TFLOP/s ratio)", "tflops"),
)

GDN_PARTS = (  # bench/gdn.py's parts (see from_gdn)
    ("prefill", "GDN chunked prefill (M tokens/s ratio)", "mtok_s"),
    ("decode", "GDN recurrent decode, fp32 state (TB/s ratio)", "tbps"),
)


def _ours(case: dict, figure: str) -> dict[str, float]:
    """The case's attngen rows that have the figure: {result key: figure}."""
    return {
        k: r[figure]
        for k, r in case["results"].items()
        if k.startswith("attngen") and isinstance(r, dict) and r.get(figure)
    }


def _peers(cases: list[dict]) -> list[str]:
    return sorted({k for c in cases for k in c["results"] if not k.startswith("attngen")})


def spreads(cases: list[dict], figure: str) -> dict[str, list[tuple[float, float]]]:
    """Per peer, for the attngen row ``ratios`` plots, the interquartile range over paired
    rounds of its ratio (``ratio_iqr`` of rows timed in rounds; NaN where the row was
    timed on its own)."""
    nan = (float("nan"), float("nan"))
    out: dict[str, list[tuple[float, float]]] = {}
    for case in cases:
        ours = _ours(case, figure)
        best = max(ours, key=ours.get) if ours else None
        prefix = RATIO_PREFIX.get(best)
        for peer in _peers(cases):
            iqr = None if prefix is None else case.get("ratio_iqr", {}).get(prefix + peer)
            out.setdefault(peer, []).append(tuple(iqr) if iqr else nan)
    return out


def ratios(cases: list[dict], figure: str) -> tuple[list[str], dict[str, list[float]]]:
    """Case labels and, per peer, attngen's figure / the peer's (NaN where either is missing).

    A case may hold several attngen rows (``attngen``, ``attngen ps64``, ...): the best one
    counts, and the label says which."""
    labels, per_peer = [], {}
    peers = _peers(cases)
    for case in cases:
        ours = _ours(case, figure)
        best = max(ours, key=ours.get) if ours else None
        page = case.get("page_size", "")
        label = case["case"] + (" no cache" if page == 0 else f" ps{page}" if page != "" else "")
        labels.append(label if best else f"{label}\n(no attngen row)")
        for peer in peers:
            theirs = case["results"].get(peer, {})
            value = theirs.get(figure) if isinstance(theirs, dict) else None
            ok = best is not None and value
            per_peer.setdefault(peer, []).append(ours[best] / value if ok else float("nan"))
    return labels, per_peer


def from_rows(result: dict) -> dict:
    """A ``bench/mla.py`` result (``rows`` with parts) in ``bench/run.py``'s shape: its
    decode table as the decode and quantized-decode parts (TFLOP/s, so the 16-head
    bandwidth rows and the 128-head compute rows share one figure), its prefill rows as
    prefill; each peer's figure as in the row."""
    peers = {"flashmla": "FlashMLA", "sglang": "SGLang Triton", "fa4": "FA4"}
    parts: dict[str, list] = {}
    for row in result["rows"]:
        if row.get("part") not in ("decode", "prefill", "prefill_variant"):
            continue
        if "attngen_ms" not in row:
            continue
        figures = {"attngen": {"tflops": row["attngen_tflops"]}}
        for key, name in peers.items():
            if row.get(f"{key}_tflops"):
                figures[name] = {"tflops": row[f"{key}_tflops"]}
        if row["part"] == "prefill_variant":  # FA4 timed once, on the library's row
            if row.get("ratio_vs_fa4"):
                figures["FA4"] = {"tflops": row["attngen_tflops"] / row["ratio_vs_fa4"]}
            tile = "x".join(str(t) for t in row.get("tile", []))
            label = f"h{row['heads']} {row['batch']}x{row['ctx']} {row['kernel']} {tile}"
            parts.setdefault("prefill", []).append({"case": label, "results": figures})
            continue
        if row["part"] == "prefill":
            part, label = "prefill", f"h{row['heads']} {row['batch']}x{row['ctx']}"
        else:
            part = "decode" if row["kv"] == "bf16" else "quantized_decode"
            label = f"h{row['heads']} {row['kv']} B{row['batch']}x{row['ctx']}"
        parts.setdefault(part, []).append({"case": label, "results": figures})
    return _with_header(parts, result)


def _with_header(parts: dict, result: dict, peers: list[str] | None = None) -> dict:
    """``parts`` with the title fields of a rows-style result (commit, GPU, versions, the
    peers that loaded: ``peers``, else those of its ``peers`` table)."""
    if peers is None:
        info = result.get("peers", {})
        peers = [f"{k}: {v}" for k, v in info.items() if "Error" not in str(v)]
    return dict(
        parts,
        commit=result.get("commit", ""),
        gpu=result.get("device", ""),
        torch=result.get("torch", ""),
        triton=result.get("triton", ""),
        peers=peers,
    )


def from_dsa_rows(result: dict) -> dict:
    """A ``bench/dsa.py`` result (``rows`` with kinds) in ``bench/run.py``'s shape: the
    generated tiles' sparse decode and prefill rows that FlashMLA ran too (TFLOP/s)."""
    parts: dict[str, list] = {}
    for row in result["rows"]:
        kind = row.get("kind")
        if not row.get("peer_tflops"):
            continue
        if kind == "sparse_decode" and row.get("tiles") == "generated":
            part, label = "decode", f"h{row['heads']} {row['kv']} B{row['b']}x{row['ctx']}"
        elif kind == "sparse_prefill":
            part, label = "prefill", f"h{row['heads']} {row['s_q']}x{row['s_kv']}"
        else:
            continue
        figures = {"attngen": {"tflops": row["tflops"]}, "FlashMLA": {"tflops": row["peer_tflops"]}}
        parts.setdefault(part, []).append({"case": label, "results": figures})
    return _with_header(parts, result)


def from_gdn(result: dict) -> dict:
    """A ``bench/gdn.py`` result (``prefill`` / ``decode`` rows, attngen and fla figures in
    each, one peer named in ``peer``) in ``bench/run.py``'s shape; the tile sweep is left
    out (its rows are attngen's own tiles, not the generated ones). Decode rows plot their
    CUDA-graph figures where the run has them (eager B64 timing is host time); a row with
    eager figures only says so in its label. A prefill row with the CuTe DSL module's figure
    (``cute_mtok_s``) plots the faster of the two modules, named in its label, and one with
    FlashInfer's (``flashinfer_mtok_s``) that second peer (``peer2``) beside fla."""
    peer, peer2 = result.get("peer", "fla"), result.get("peer2", "FlashInfer")
    figures = {"prefill": ("mtok_s", "mtok_s"), "decode": ("tb_s", "tbps")}
    parts: dict[str, list] = {}
    named = [peer]
    for part, (key, figure) in figures.items():
        for row in result.get(part, []):
            case, k = row["case"], key
            if part == "decode":
                if row.get(f"attngen_graph_{key}") is not None:
                    k = f"graph_{key}"
                else:
                    case = f"{case} (eager)"
            if row.get(f"fla_{k}") is None or row.get(f"attngen_{k}") is None:
                continue  # an error row
            ours = row[f"attngen_{k}"]
            if row.get(f"cute_{k}") is not None:
                modules = {"triton": ours, "cute_dsl": row[f"cute_{k}"]}
                backend = max(modules, key=modules.get)
                ours = modules[backend]
                case = f"{case} {backend}"
            results = {"attngen": {figure: ours}, peer: {figure: row[f"fla_{k}"]}}
            if row.get(f"flashinfer_{k}") is not None:
                results[peer2] = {figure: row[f"flashinfer_{k}"]}
                if peer2 not in named:
                    named.append(peer2)
            parts.setdefault(part, []).append({"case": case, "results": results})
    return _with_header(parts, result, named)


class NothingToPlot(ValueError):
    """A result without any row that has a peer to compare against."""


def plot(result: dict, out: Path) -> None:
    parts = PARTS
    if "sweep" in result:  # bench/gdn.py
        result, parts = from_gdn(result), GDN_PARTS
    elif "rows" in result and any("kind" in r for r in result["rows"]):  # bench/dsa.py
        result, parts = from_dsa_rows(result), DSA_PARTS
    elif "rows" in result:  # bench/mla.py
        result, parts = from_rows(result), MLA_PARTS
    parts = [p for p in parts if result.get(p[0])]
    if not parts:
        raise NothingToPlot("no row of this result has a peer to compare against")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(parts), 1, figsize=(12, 3.2 * len(parts)), squeeze=False)
    for ax, (key, title, figure) in zip(axes[:, 0], parts):
        labels, per_peer = ratios(result[key], figure)
        spread = spreads(result[key], figure)
        width = 0.8 / max(1, len(per_peer))
        for i, (peer, values) in enumerate(sorted(per_peer.items())):
            xs = [x + (i - (len(per_peer) - 1) / 2) * width for x in range(len(labels))]
            # whiskers: the interquartile range over paired rounds, where the row has one
            # (around the bar's ratio of medians, which may sit just outside the range)
            pairs = list(zip(values, spread[peer]))
            low = [max(v - lo, 0.0) if lo == lo else 0.0 for v, (lo, _) in pairs]
            high = [max(hi - v, 0.0) if hi == hi else 0.0 for v, (_, hi) in pairs]
            ax.bar(xs, values, width, label=f"vs {peer}", yerr=[low, high], capsize=2)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("attngen / peer")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
    peers = ", ".join(str(p) for p in result.get("peers", []))
    fig.suptitle(
        f"attngen {result['commit']} on {result['gpu']} (torch {result['torch']}, "
        f"triton {result['triton']}; peers: {peers})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def newest_run(results: Path) -> Path | None:
    """The newest bench run in ``results``: ``<gpu>-<UTC timestamp>-<commit>.json`` files
    (``h200-20261206T0207Z-564d0f0.json``) by their timestamp (other JSONs there are checks,
    sweeps and other benches, not runs)."""
    # <gpu> is bench.device_tag's: a model name (h200, rtx4090) or "gpu"
    stamp = re.compile(r"^[a-z0-9]+-(\d{8}T\d{4}Z)-[0-9a-f]+(-[a-z-]+)?\.json$")
    runs = sorted(
        (m.group(1), p) for p in results.glob("*.json") if (m := stamp.match(p.name)) is not None
    )
    return runs[-1][1] if runs else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "result", type=Path, nargs="?", help="a bench JSON (default: the newest run, any GPU)"
    )
    args = parser.parse_args(argv)
    path = args.result or newest_run(Path("bench/results"))
    if path is None:
        print("bench/results: no <gpu>-<date>-<commit>.json run to plot; name one")
        return 1
    result = json.loads(path.read_text())
    out = path.with_suffix(".png")
    try:
        plot(result, out)
    except NothingToPlot as e:
        print(f"{path}: not plotted: {e}")
        return 0
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
