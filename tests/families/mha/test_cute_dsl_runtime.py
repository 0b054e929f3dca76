"""The generated CuTe DSL backends on CPU, up to the launchers: speculative verify (draft
chains) and draft extend, eager and through CUDA-graph metadata, reach the CuTe DSL
launchers with the arguments they take (the launchers then refuse CPU tensors before any
GPU work, which is where a CPU run stops). Numerics and replays: the GPU suite
(tests/families/mha/gpu/test_mha_backend_gpu.py discovers these packages)."""

from __future__ import annotations

import importlib

import pytest
import torch

from attngen.runtime.batch import AttentionLayer, ForwardMode
from attngen.runtime.checks import AttngenInputError
from attngen.testing import PagedBatchBuilder, make_pools

pytest.importorskip("cutlass")

SPEC = "mha_spec_chain_large_pages"
CPU_REFUSAL = "q: expected a CUDA tensor"  # the CuTe DSL launchers' first device check


def rig(arch: str = "sm90"):
    module = importlib.import_module(f"generated.{arch}.cute_dsl.mha.{SPEC}.backend")
    config = module.Backend.kernels.CONFIGS["d128_g4_ps64_bf16_causal_topk1"]
    req_pool, kv_pool = make_pools(
        num_layers=1, max_reqs=5, max_context_len=512, num_pages=40, page_size=64,
        num_kv_heads=2, head_dim=128, dtype=torch.bfloat16, device="cpu",
    )  # fmt: skip
    backend = module.Backend(
        num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=64, dtype=torch.bfloat16,
        device="cpu", req_to_token_pool=req_pool, kv_pool=kv_pool,
    )  # fmt: skip
    assert backend.config == config and config.num_draft_tokens == 4
    layer = AttentionLayer(0, 8, 2, 128, 128, 128**-0.5)
    return backend, PagedBatchBuilder(req_pool, kv_pool), layer


def launched(backend, builder, layer, pb, calls: list) -> None:
    """forward_extend of ``pb`` reaches a launcher (recorded in ``calls``), which refuses the
    CPU tensors."""
    kernels = backend.kernels
    saved = {n: getattr(kernels, n) for n in ("verify", "extend", "prefill")}
    for name, real in saved.items():

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, kwargs.get("max_extend_len")))
            return _real(*args, **kwargs)

        setattr(kernels, name, spy)
    q, k, v = builder.qkv(pb.batch.num_new_tokens, layer, torch.bfloat16)
    try:
        with pytest.raises(AttngenInputError, match=CPU_REFUSAL):
            backend.forward_extend(q, k, v, layer, pb.batch)
    finally:
        for name, real in saved.items():
            setattr(kernels, name, real)


def test_verify_and_draft_extend_reach_the_cute_launchers() -> None:
    backend, builder, layer = rig()
    calls: list = []
    pb = builder.verify([0, 70, 200], 4, tree=False)
    backend.init_forward_metadata(pb.batch)
    launched(backend, builder, layer, pb, calls)
    assert calls == [("verify", None)]
    calls.clear()
    pb = builder.draft_extend([10, 100], [3, 1])
    backend.init_forward_metadata(pb.batch)
    launched(backend, builder, layer, pb, calls)
    assert calls == [("extend", 3)]


def test_graph_metadata_for_verify_and_draft_extend() -> None:
    """Capture-time metadata points at the static buffers, with grids fixed by the config."""
    backend, builder, layer = rig()
    backend.init_cuda_graph_state(4, 16)
    assert set(backend._graph_buffers) == {"verify", "draft_extend"}
    pb = builder.verify([5, 300, 0, 64], 4, tree=False)
    b = pb.batch
    backend.init_forward_metadata_capture_cuda_graph(
        4, 16, b.req_pool_indices, b.seq_lens, None, ForwardMode.TARGET_VERIFY, b.spec_info
    )
    meta = backend.forward_metadata
    bufs = backend._graph_buffers["verify"]
    assert meta.verify and meta.max_extend_len == 4
    assert meta.out.data_ptr() == bufs.out.data_ptr()
    assert meta.prefix_lens.tolist() == [5, 300, 0, 64]
    calls: list = []
    launched(backend, builder, layer, pb, calls)
    assert calls == [("verify", None)]
    with pytest.raises(AttngenInputError, match="does not generate decode"):
        backend.init_forward_metadata_capture_cuda_graph(
            1, 1, b.req_pool_indices[:1], b.seq_lens[:1], None, ForwardMode.DECODE, None
        )
