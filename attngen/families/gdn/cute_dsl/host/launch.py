"""Launching the CuTe DSL GDN kernels: chunked prefill / extend of ragged requests.

``extend`` takes the Triton GDN library's arguments (the generated backend calls either the
same way): q, k ``[N, H, K]``, v ``[N, HV, V]``, a, b ``[N, HV]`` (bf16, last dims
contiguous), A_log and dt_bias ``[HV]`` fp32, the pool ``ssm_states [slots + 1, HV, V, K]``
fp32, cache_indices, has_initial_state ``[B]`` and query_start_loc ``[B + 1]`` int32, the
output ``[N, HV, V]`` and the chunk plan of ``chunk_plan``. It runs two launches: the prepare
kernel (gates, norms, fp16 T a chunk and head) and the chunk kernel, whose form the batch's
(request, value head) count picks (``GdnCuteConfig.two_consumers_min_heads``). A request
with ``has_initial_state[b] != 0`` starts from its pool row and every request's final state
is written there; a padding request (slot 0) runs from a zero state: its output rows are
written, no pool row is read or written (as the Triton library's extend).

``chunk_plan`` and ``conv_prefill`` (the width-4 causal conv over the prefill's tokens) are
the Triton GDN library's, bound here so a generated module offers what the backend calls.

What the launcher checks: shapes, dtypes, devices and strides of every tensor (host-side,
no sync); rows of q, k and v that are not 16-byte aligned are copied (the kernels' 16-byte
copies need it), an output that is not is refused. Device values (slots in range, the plan
consistent with query_start_loc) are the caller's promise, as for the Triton library.
"""

from __future__ import annotations

from typing import Any

import torch

from attngen.families.gdn.cute_dsl.config import GdnCuteConfig
from attngen.families.gdn.cute_dsl.host.compile import PrepareShape, chunk_shape, compiled
from attngen.families.gdn.triton.host import checks
from attngen.families.gdn.triton.host.launch import ChunkPlan, chunk_plan, conv_prefill
from attngen.runtime.checks import fail

__all__ = ["ChunkPlan", "chunk_plan", "conv_prefill", "extend", "prepare"]

ALIGN = 16  # bytes: the kernels' row copies


def _aligned(x: torch.Tensor) -> bool:
    size = x.element_size()
    return x.data_ptr() % ALIGN == 0 and all(s * size % ALIGN == 0 for s in x.stride()[:-1])


def _rows(t: torch.Tensor) -> Any:
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=ALIGN).mark_layout_dynamic(leading_dim=t.dim() - 1)


def _small(t: torch.Tensor) -> Any:
    from cutlass.cute.runtime import from_dlpack

    align = min(4, t.element_size())
    return from_dlpack(t, assumed_align=align).mark_layout_dynamic(leading_dim=t.dim() - 1)


def _stream() -> Any:
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


def prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    query_start_loc: torch.Tensor,
    plan: ChunkPlan,
    config: GdnCuteConfig,
    scale: float,
    hv: int,
) -> tuple[torch.Tensor, ...]:
    """The prepare kernel: (T fp16 ``[N, HV, C]``, G, beta, qs, kn ``[HV, N]`` fp32), the
    chunk kernel's inputs beside q, k and v (arguments checked by ``extend``)."""
    import cutlass

    n = q.shape[0]
    f32 = dict(dtype=torch.float32, device=q.device)
    vecs = [torch.empty((hv, n), **f32) for _ in range(4)]
    t16 = torch.empty((n, hv, config.chunk_size), dtype=torch.float16, device=q.device)
    args = (
        _rows(q), _rows(k), _small(a), _small(b), _small(A_log), _small(dt_bias),
        _small(plan.chunk_seq), _small(plan.chunk_start), _small(query_start_loc),
        *(_small(v) for v in vecs), _rows(t16), cutlass.Float32(scale), _stream(),
    )  # fmt: skip
    compiled(config.arch, PrepareShape(config.v_heads_per_k_head), args)(*args)
    return (t16, *vecs)


def extend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    plan: ChunkPlan,
    config: GdnCuteConfig,
    scale: float,
) -> torch.Tensor:
    """Chunked prefill / extend of ragged requests (see the module's docstring)."""
    n, h, hv = checks.check_qkvab(config, q, k, v, a, b, rows=plan.num_tokens)
    dev = q.device
    bs = int(cache_indices.shape[0]) if isinstance(cache_indices, torch.Tensor) else 0
    checks.check_gate_params(A_log, dt_bias, hv, dev)
    checks.check_state_pool(config, ssm_states, hv, dev)
    checks.check_index("cache_indices", cache_indices, bs, dev)
    checks.check_index("has_initial_state", has_initial_state, bs, dev)
    checks.check_index("query_start_loc", query_start_loc, bs + 1, dev)
    checks.check_out("out", out, [n, hv, config.value_dim], q.dtype, dev)
    if not _aligned(out):
        fail("out", "16-byte aligned rows (base and strides)", f"strides {out.stride()}")
    if plan.seq_first_chunk.shape[0] != bs:
        fail("plan", f"a chunk plan of {bs} requests", int(plan.seq_first_chunk.shape[0]))
    if dev.type != "cuda":
        fail("q", "a CUDA tensor (CuTe DSL kernels have no CPU path)", dev)
    q, k, v = (x if _aligned(x) else x.contiguous() for x in (q, k, v))
    t16, g, beta, qs, kn = prepare(
        q, k, a, b, A_log, dt_bias, query_start_loc, plan, config, scale, hv
    )
    starts, ends = query_start_loc[:-1], query_start_loc[1:]
    # (the mode bits are read only by context parallelism's form: cache_indices stands in)
    args = (
        _rows(q), _rows(k), _rows(v), _rows(t16), _small(g), _small(beta), _small(qs),
        _small(kn), _small(ssm_states), _small(cache_indices), _small(has_initial_state),
        _small(starts), _small(ends), _small(cache_indices), _rows(out), _stream(),
    )  # fmt: skip
    compiled(config.arch, chunk_shape(config, bs * hv), args)(*args)
    return out
