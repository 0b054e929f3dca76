"""The generated backends end to end on CPU: PagedMhaBackend with the real Triton kernels
(interpreter), against the oracle, for every phase a spec generates.

The runtime tests (test_runtime_cpu.py) run the backend over an oracle stand-in; the
interpreter tests call the library directly. This covers the path between them: the
backend's own launches (metadata it vouches for, trusted_metadata=True) into the kernels.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from attngen.runtime.batch import AttentionLayer, ForwardMode
from attngen.families.mha.testing import oracle_output
from attngen.testing import PagedBatchBuilder, make_pools
from attngen.testing.tolerance import assert_close

HEADS_KV = 1
# (spec, variant): fp16 variants with small tiles' shapes (the interpreter runs numpy)
CASES = [
    ("mha_spec_tree", "d64_g8_ps16_fp16_custom_topk4"),
    ("mha_sliding_window", "d128_g4_ps16_fp16_swa4095"),
    ("mha_gqa_paged", "d128_g4_ps1_fp16_causal"),
]


def backend_class(spec: str) -> type:
    return importlib.import_module(f"generated.sm90.triton.mha.{spec}.backend").Backend


def rig(spec: str, uri: str):
    cls = backend_class(spec)
    if uri not in cls.kernels.CONFIGS:
        pytest.skip(f"{spec} does not generate {uri}")
    config = cls.kernels.CONFIGS[uri]
    num_q_heads = HEADS_KV * config.gqa_group
    req_pool, kv_pool = make_pools(
        num_layers=1,
        max_reqs=4,
        max_context_len=96,
        num_pages=256,
        page_size=config.page_size,
        num_kv_heads=HEADS_KV,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        dtype=torch.float16,
        device="cpu",
    )
    backend = cls(
        num_q_heads=num_q_heads,
        num_kv_heads=HEADS_KV,
        head_dim=config.head_dim,
        v_head_dim=config.v_head_dim,
        page_size=config.page_size,
        dtype=torch.float16,
        device="cpu",
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
    )
    layer = AttentionLayer(
        0, num_q_heads, HEADS_KV, config.head_dim, config.v_head_dim, config.head_dim**-0.5
    )
    sinks = torch.randn(num_q_heads) + 1.0 if cls.kernels.HOOKS.sinks else None
    return backend, PagedBatchBuilder(req_pool, kv_pool), layer, sinks


def run(backend, builder, layer, sinks, pb) -> None:
    n = pb.batch.num_new_tokens
    q = torch.randn(n, layer.num_q_heads, layer.head_dim, dtype=torch.float16)
    k = torch.randn(n, layer.num_kv_heads, layer.head_dim, dtype=torch.float16)
    v = torch.randn(n, layer.num_kv_heads, layer.v_head_dim, dtype=torch.float16)
    backend.init_forward_metadata(pb.batch)
    decode = pb.batch.forward_mode is ForwardMode.DECODE
    forward = backend.forward_decode if decode else backend.forward_extend
    out = forward(q, k, v, layer, pb.batch, sinks=sinks)
    k_cache, v_cache = builder.kv_pool.get_kv_buffer(0)
    want = oracle_output(
        pb, q, k_cache, v_cache, layer.scaling, mask=backend.kernels.HOOKS, sinks=sinks
    )
    assert not out.isnan().any()
    assert_close(out.view(want.shape), want, msg=f"{backend.spec_name} {pb.batch.forward_mode}")


@pytest.mark.parametrize("spec,uri", CASES, ids=[c[1] for c in CASES])
def test_backend_runs_every_generated_phase(spec: str, uri: str) -> None:
    backend, builder, layer, sinks = rig(spec, uri)
    phases = backend.kernels.PHASES
    config = backend.config
    if "decode" in phases:
        run(backend, builder, layer, sinks, builder.decode([40, 1, 70]))
    if "extend" in phases:
        run(backend, builder, layer, sinks, builder.extend([0, 20, 33], [9, 1, 17]))
    if "verify" in phases:
        pb = builder.verify([0, 25, 50], config.num_draft_tokens, tree=config.spec_topk > 1)
        run(backend, builder, layer, sinks, pb)
