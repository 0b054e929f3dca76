"""The card's read + write ceiling at the GDN decode's state sizes (experimental,
2026-12-07): B x 32 heads x 128 x 128 fp32 states (B 64 and 256), timed in CUDA graphs as
an out-of-place copy (``dst.copy_(src)``) and as an in-place update of the same bytes
(``x.mul_(1.0)``: each element read and written back at its own address, as the decode
updates its pool), three rounds each, alternating. TB/s = (bytes read + bytes written) /
time. One line of JSON a row.

    python bench/experimental/copy_ceiling.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.graph_timing import graph_ms  # noqa: E402


def main() -> None:
    for bs in (64, 256):
        src = torch.randn(bs, 32, 128, 128, device="cuda")
        dst = torch.empty_like(src)
        x = src.clone()
        nbytes = 2 * src.numel() * 4
        forms = {
            "copy_out_of_place": lambda: dst.copy_(src),
            "update_in_place": lambda: x.mul_(1.0),
        }
        times: dict[str, list[float]] = {name: [] for name in forms}
        for _ in range(3):
            for name, fn in forms.items():
                times[name].append(graph_ms(fn) * 1e3)
        for name, ts in times.items():
            us = min(ts)
            row = dict(device=torch.cuda.get_device_name(), case=f"B{bs}", form=name)
            row.update(graph_us=ts, tb_s=nbytes / us / 1e6)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
