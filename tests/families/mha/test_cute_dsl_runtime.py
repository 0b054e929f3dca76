"""The generated CuTe DSL backends on CPU, up to the launchers: speculative verify (draft
chains) and draft extend, eager and through CUDA-graph metadata, reach the CuTe DSL
launchers with the arguments they take (the launchers then refuse CPU tensors before any
GPU work, which is where a CPU run stops; construction, which refuses CPU for CuTe DSL,
is let through by the ``backends_take_cpu`` fixture). Numerics and replays: the GPU suite
(tests/families/mha/gpu/test_mha_backend_gpu.py discovers these packages)."""

from __future__ import annotations

import importlib

import pytest
import torch

from attngen.runtime.batch import AttentionLayer, ForwardMode
from attngen.runtime.checks import AttngenInputError
from attngen.testing import PagedBatchBuilder, make_pools

pytest.importorskip("cutlass")
# construction refuses CPU for CuTe DSL (tests/runtime/test_kernel_device.py); here the
# backends are built on CPU anyway, to follow the metadata up to the launchers
pytestmark = pytest.mark.usefixtures("backends_take_cpu")

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


# -- split-KV decode (mha_gqa_decode, sm90) ----


def decode_rig():
    module = importlib.import_module("generated.sm90.cute_dsl.mha.mha_gqa_decode.backend")
    req_pool, kv_pool = make_pools(
        num_layers=1, max_reqs=5, max_context_len=512, num_pages=40, page_size=64,
        num_kv_heads=2, head_dim=128, dtype=torch.bfloat16, device="cpu",
    )  # fmt: skip
    backend = module.Backend(
        num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=64, dtype=torch.bfloat16,
        device="cpu", req_to_token_pool=req_pool, kv_pool=kv_pool,
    )  # fmt: skip
    assert backend.config.uri == "d128_g4_ps64_bf16_causal"
    return backend, PagedBatchBuilder(req_pool, kv_pool), AttentionLayer(0, 8, 2, 128, 128, 0.1)


def decode_reaches_the_launcher(backend, builder, layer, pb) -> list:
    """forward_decode of ``pb``: the launcher's positional arguments (it then refuses CPU)."""
    kernels, calls = backend.kernels, []
    real = kernels.decode

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    kernels.decode = spy
    q, k, v = builder.qkv(pb.batch.num_new_tokens, layer, torch.bfloat16)
    try:
        with pytest.raises(AttngenInputError, match=CPU_REFUSAL):
            backend.forward_decode(q, k, v, layer, pb.batch)
    finally:
        kernels.decode = real
    assert len(calls) == 1
    return list(calls[0])


def test_decode_eager_metadata_reaches_the_cute_launcher() -> None:
    backend, builder, layer = decode_rig()
    pb = builder.decode([1, 300, 500])
    backend.init_forward_metadata(pb.batch)
    args = decode_reaches_the_launcher(backend, builder, layer, pb)
    page_table, seq_lens, num_splits, out, partial_o, partial_lse = args[3:]
    assert seq_lens.tolist() == [1, 300, 500] and page_table.shape == (3, 8)
    assert 1 <= int(num_splits.min()) and int(num_splits.max()) <= backend.config.max_splits
    assert num_splits.tolist() == [1, 2, 2]  # at least 256 keys per split
    assert partial_o.shape == (3, 8, 16, 128) and partial_lse.shape == (3, 8, 16)
    assert out.shape == (3, 8, 128)


def test_decode_graph_buffers_are_static() -> None:
    """Capture and replay metadata point at the same static buffers: decode metadata, then
    the split workspace in the launcher's order."""
    backend, builder, layer = decode_rig()
    backend.init_cuda_graph_state(4, 4)
    assert set(backend._graph_buffers) == {"decode"}
    bufs = backend._graph_buffers["decode"]
    assert [tuple(w.shape) for w in bufs.workspace] == [(4, 8, 16, 128), (4, 8, 16)]
    pb = builder.decode([5, 400, 64, 2])
    b = pb.batch
    backend.init_forward_metadata_capture_cuda_graph(
        4, 4, b.req_pool_indices, b.seq_lens, None, ForwardMode.DECODE, None
    )
    args = decode_reaches_the_launcher(backend, builder, layer, pb)
    static = (bufs.page_table, bufs.seq_lens, bufs.num_splits, bufs.out, *bufs.workspace)
    assert [a.data_ptr() for a in args[3:]] == [t.data_ptr() for t in static]
    backend.init_forward_metadata_replay_cuda_graph(
        4, b.req_pool_indices, b.seq_lens, int(b.seq_lens.sum()), None, ForwardMode.DECODE,
        None, b.seq_lens_cpu,
    )  # fmt: skip
    assert bufs.seq_lens.tolist() == [5, 400, 64, 2] and bufs.num_splits.tolist() == [1, 2, 1, 1]
