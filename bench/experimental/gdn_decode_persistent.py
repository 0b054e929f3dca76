"""A persistent recurrent decode, measured (experimental, 2026-12-07).

The generated decode (``recurrent_kernel``) runs one 1-warp program per (8 value rows,
value head, request): 32 resident programs an SM at most, and each program's warp has its
4 KB of state in flight only until the load lands, then computes and stores with nothing in
flight. fla's kernel is of the same form. This one keeps loads in flight while it computes:
a fixed grid (a few programs an SM) walks the (request, value head, value block) items in a
software-pipelined loop, the next items' state tiles loading (through TMA into shared
memory, or cp.async) while one is updated. Same arithmetic as ``recurrent_kernel`` (the
output from the old state), same pool layout ``[slots + 1, HV, V, K]``, slot <= 0 starts
from zeros and writes nothing.

On a GPU it checks each form against the generated decode on the same inputs (outputs and
pool rows; both fp32 state, so the differences are rounding-order only) and times both,
fla beside, in CUDA graphs, at B64 / B256, 16 k / 32 v heads, shuffled slots. One JSON
line a row.

    PYTHONPATH=<fla> FLA_FLASH_QLA=0 python bench/experimental/gdn_decode_persistent.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attngen.families.gdn.triton.kernels.common import gate_values, l2norm_rows  # noqa: E402


@triton.jit
def persistent_decode_kernel(
    Q,
    K,
    V,
    A,
    B,
    A_LOG,
    DT_BIAS,
    STATE,
    STATE_DESC,
    CACHE_INDICES,
    QUERY_START_LOC,
    OUT,
    scale,
    n_items,
    stride_q_tok,
    stride_k_tok,
    stride_v_tok,
    stride_a_tok,
    stride_b_tok,
    stride_o_tok,
    HV: tl.constexpr,
    GROUP: tl.constexpr,
    KEY_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    BLOCK_V: tl.constexpr,
    USE_TMA: tl.constexpr,
    STAGES: tl.constexpr,
):
    NVB: tl.constexpr = VALUE_DIM // BLOCK_V
    ks = tl.arange(0, KEY_DIM)
    rows = tl.arange(0, BLOCK_V)
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=STAGES):
        # item -> (request, value head, value block), value blocks fastest
        vb = item % NVB
        hv = (item // NVB) % HV
        req = item // (NVB * HV)
        hk = hv // GROUP
        slot = tl.load(CACHE_INDICES + req).to(tl.int64)
        row = tl.load(QUERY_START_LOC + req).to(tl.int64)
        srow = (slot * HV + hv) * VALUE_DIM + vb * BLOCK_V  # first pool row of the tile
        if USE_TMA:
            h = STATE_DESC.load([srow.to(tl.int32), 0]).to(tl.float32)
        else:
            tile = STATE + (srow + rows[:, None]) * KEY_DIM + ks[None, :]
            h = tl.load(tile).to(tl.float32)
        h = tl.where(slot > 0, h, 0.0)
        vs = vb * BLOCK_V + rows
        q = tl.load(Q + row * stride_q_tok + hk * KEY_DIM + ks).to(tl.float32)
        k = tl.load(K + row * stride_k_tok + hk * KEY_DIM + ks).to(tl.float32)
        v = tl.load(V + row * stride_v_tok + hv * VALUE_DIM + vs).to(tl.float32)
        q = l2norm_rows(q, True) * scale
        k = l2norm_rows(k, True)
        a = tl.load(A + row * stride_a_tok + hv)
        b = tl.load(B + row * stride_b_tok + hv)
        g, beta = gate_values(a, b, tl.load(A_LOG + hv), tl.load(DT_BIAS + hv))
        decay = tl.exp(g)
        hk_dot = tl.sum(h * k[None, :], axis=1)
        hq = tl.sum(h * q[None, :], axis=1)
        u = beta * (v - decay * hk_dot)
        o = decay * hq + u * tl.sum(k * q, axis=0)
        h = h * decay + u[:, None] * k[None, :]
        tl.store(OUT + row * stride_o_tok + hv * VALUE_DIM + vs, o.to(OUT.dtype.element_ty))
        dst = STATE + (srow + rows[:, None]) * KEY_DIM + ks[None, :]
        tl.store(dst, h.to(STATE.dtype.element_ty), mask=slot > 0)


def persistent_decode(x, pool, idx, qsl, out, *, block_v, use_tma, stages, programs, scale):
    """Launch over the batch ``x`` (q/k/v/a/b, A_log, dt_bias) and pool ``pool``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bs, hv, dim = idx.shape[0], pool.shape[1], pool.shape[-1]
    h = x["q"].shape[1]
    flat = pool.view(-1, dim)
    desc = TensorDescriptor.from_tensor(flat, [block_v, dim]) if use_tma else flat
    n_items = bs * hv * (dim // block_v)
    grid = (min(programs, n_items),)
    persistent_decode_kernel[grid](
        x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], pool, desc, idx,
        qsl, out, scale, n_items, x["q"].stride(0), x["k"].stride(0), x["v"].stride(0),
        x["a"].stride(0), x["b"].stride(0), out.stride(0), HV=hv, GROUP=hv // h,
        KEY_DIM=dim, VALUE_DIM=dim, BLOCK_V=block_v, USE_TMA=use_tma, STAGES=stages,
        num_warps=max(1, block_v // 8), num_stages=stages,
    )  # fmt: skip


FORMS = [  # (block_v, use_tma, stages, programs an SM: as many as shared memory and registers fit)
    (8, False, 3, 8),
    (16, True, 3, 8),
    (16, True, 3, 10),
    (16, True, 4, 8),
    (32, True, 3, 4),
    (32, True, 3, 5),
    (32, True, 4, 4),
]


def main() -> None:
    import torch
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    import bench.gdn as gdn_bench

    gdn_bench.torch = torch
    from bench.gdn import DIM, config_for, diff, fla_decode_call, inputs, kernels_module
    from bench.graph_timing import graph_ms

    def alloc(size, align, stream):  # on-device descriptors' scratch (unused with host ones)
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(alloc)
    mod = kernels_module("gdn_qwen3_next")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator().manual_seed(0)
    for bs in (64, 256):
        h, hv = 16, 32
        cfg = config_for(mod, hv // h)
        x = inputs(bs, h, hv)
        state = torch.randn(bs, hv, DIM, DIM, dtype=torch.float32, device="cuda") * 0.05
        slots = (torch.randperm(bs, generator=gen) + 1).cuda()
        idx = slots.to(torch.int32)
        qsl = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
        nbytes = 2 * bs * hv * DIM * DIM * 4
        start = torch.zeros(bs + 1, hv, DIM, DIM, dtype=torch.float32, device="cuda")
        start[slots] = state
        pool = start.clone()
        out = torch.empty(bs, hv, DIM, dtype=torch.bfloat16, device="cuda")

        def ours():
            mod.decode(
                x["q"], x["k"], x["v"], x["a"], x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                ssm_states=pool, cache_indices=idx, query_start_loc=qsl, out=out, config=cfg,
                scale=DIM**-0.5,
            )  # fmt: skip

        ours()
        ref = (out.clone(), pool.clone())
        runs = {"generated": ours}
        for block_v, use_tma, stages, per_sm in FORMS:
            name = f"v{block_v}{'_tma' if use_tma else ''}_s{stages}_p{per_sm}"
            p_pool, p_out = start.clone(), torch.empty_like(out)

            def fn(p_pool=p_pool, p_out=p_out, f=(block_v, use_tma, stages, per_sm)):
                persistent_decode(
                    x, p_pool, idx, qsl, p_out, block_v=f[0], use_tma=f[1], stages=f[2],
                    programs=f[3] * sms, scale=DIM**-0.5,
                )  # fmt: skip

            try:
                fn()
                torch.cuda.synchronize()
            except Exception as err:  # a form that does not compile here: say so, go on
                print(json.dumps({"case": f"B{bs}", "form": name, "error": repr(err)[:300]}))
                continue
            row = {"case": f"B{bs}", "form": name, "out_diff": diff(p_out, ref[0])}
            row.update(state_diff=diff(p_pool, ref[1]), pad_untouched=bool((p_pool[0] == 0).all()))
            print(json.dumps(row), flush=True)
            runs[name] = fn
        runs["fla"] = fla_decode_call(fused_recurrent_gated_delta_rule, x, state)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(2):
            for name, fn in runs.items():
                times[name].append(graph_ms(fn))
        fla_us = min(times["fla"]) * 1e3
        for name, ts in times.items():
            us = min(ts) * 1e3
            row = {"case": f"B{bs} H{h}/{hv}", "form": name, "graph_us": [t * 1e3 for t in ts]}
            row.update(tb_s=nbytes / us / 1e6, speedup_vs_fla=fla_us / us)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
