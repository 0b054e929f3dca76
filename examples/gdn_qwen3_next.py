"""One Qwen3-Next gated delta rule layer (16 k / 32 v heads, K = V = 128, bf16) through the
generated GDN backend of spec ``gdn_e2e_qwen3_next``: a prefill of two requests, then decode
steps that continue from the states the prefill left in the state pool. Random weights;
prints what each step returns.

    make generate && .venv/bin/python examples/gdn_qwen3_next.py     # on a GPU (sm90)
    TRITON_INTERPRET=1 .venv/bin/python examples/gdn_qwen3_next.py --device cpu --dtype fp16 --lens 9,4

(On CPU, Triton's interpreter runs the same kernels in fp16: it mishandles bf16 products.)

A serving engine builds the ``ForwardBatch`` of each forward and the layer's inputs
(``mixed_qkv``: the q | k | v channels before the causal conv, ``a`` and ``b``: the gate
inputs); the backend runs the conv, the gates and the recurrence, and keeps each request's
states in its pool slot.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # generated/ and attngen/

from attngen.families.gdn.runtime import GdnLayer  # noqa: E402
from attngen.runtime.batch import ForwardBatch, ForwardMode  # noqa: E402
from attngen.runtime.state_pool import RequestStatePool  # noqa: E402

K_HEADS, V_HEADS, DIM = 16, 32, 128
CONV_DIM = 2 * K_HEADS * DIM + V_HEADS * DIM  # q | k | v channels


def batch(
    mode: ForwardMode, rows: list[int], cached: list[int], new: list[int], dev
) -> ForwardBatch:
    """The forward's batch: request rows, their cached token counts and new tokens."""
    i32 = dict(dtype=torch.int32, device=dev)
    seq = [c + n for c, n in zip(cached, new)]
    extend = mode is ForwardMode.EXTEND
    return ForwardBatch(
        batch_size=len(rows),
        forward_mode=mode,
        req_pool_indices=torch.tensor(rows, **i32),
        seq_lens=torch.tensor(seq, **i32),
        seq_lens_cpu=torch.tensor(seq, dtype=torch.int32),
        out_cache_loc=torch.zeros(sum(new), dtype=torch.int64, device=dev),  # (no KV cache)
        extend_prefix_lens=torch.tensor(cached, **i32) if extend else None,
        extend_seq_lens=torch.tensor(new, **i32) if extend else None,
        extend_prefix_lens_cpu=list(cached) if extend else None,
        extend_seq_lens_cpu=list(new) if extend else None,
    )


def layer_inputs(tokens: int, dtype, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixed_qkv [T, conv_dim] and the gate inputs a, b [T, HV] of ``tokens`` new tokens."""
    kw = dict(dtype=dtype, device=dev)
    mixed_qkv = torch.randn(tokens, CONV_DIM, **kw)
    return mixed_qkv, torch.randn(tokens, V_HEADS, **kw), torch.randn(tokens, V_HEADS, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--lens", default="100,37", help="prefill tokens per request")
    ap.add_argument("--steps", type=int, default=2, help="decode steps after the prefill")
    args = ap.parse_args()
    from generated.sm90.triton.gdn.gdn_e2e_qwen3_next.backend import Backend

    dev, lens = args.device, [int(n) for n in args.lens.split(",")]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    # one state slot per live request: temporal [HV, V, K] fp32, conv window [conv_dim, 3]
    pool = RequestStatePool(
        num_layers=1,
        size=8,
        max_reqs=16,
        temporal_shape=(V_HEADS, DIM, DIM),
        temporal_dtype=torch.float32,
        conv_shape=(CONV_DIM, 3),
        conv_dtype=dtype,
        device=dev,
    )
    rows = list(range(1, len(lens) + 1))  # request rows (row 0 pads)
    for row in rows:
        pool.assign(row, row + 2)  # request row -> its state slot
    backend = Backend(
        num_k_heads=K_HEADS,
        num_v_heads=V_HEADS,
        head_k_dim=DIM,
        head_v_dim=DIM,
        dtype=dtype,
        device=dev,
        state_pool=pool,
    )
    layer = GdnLayer(
        layer_id=0,
        num_k_heads=K_HEADS,
        num_v_heads=V_HEADS,
        head_k_dim=DIM,
        head_v_dim=DIM,
        A_log=torch.empty(V_HEADS, device=dev).uniform_(0.0, 2.7),
        dt_bias=torch.randn(V_HEADS, device=dev) * 0.5,
        conv_weight=(torch.randn(CONV_DIM, 4, device=dev) * 0.5).to(dtype),
    )

    fb = batch(ForwardMode.EXTEND, rows, [0] * len(rows), lens, dev)
    backend.init_forward_metadata(fb)
    out = backend.forward_extend(layer, fb, *layer_inputs(sum(lens), dtype, dev))
    print(
        f"prefill of {lens} tokens: out {tuple(out.shape)}, rms {out.float().pow(2).mean().sqrt():.3f}"
    )

    cached = list(lens)
    for step in range(args.steps):
        fb = batch(ForwardMode.DECODE, rows, cached, [1] * len(rows), dev)
        backend.init_forward_metadata(fb)
        out = backend.forward_decode(layer, fb, *layer_inputs(len(rows), dtype, dev))
        cached = [n + 1 for n in cached]
        print(
            f"decode step {step + 1}: out {tuple(out.shape)}, finite {bool(out.isfinite().all())}"
        )
    temporal, conv = pool.layer(0)
    print(
        f"pool: slot 0 untouched {not temporal[0].any().item()}, states of slots "
        f"{[row + 2 for row in rows]} written {[bool(temporal[row + 2].any()) for row in rows]}"
    )


if __name__ == "__main__":
    main()
