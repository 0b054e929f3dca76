"""Launchers of the GDN kernels, with SGLang's kernel seams (``decode``, ``extend``,
``target_verify``) plus the conv, the accept step and the chunk plan.

Layouts: q, k ``[N, H, K]``, v ``[N, HV, V]`` (views into the conv output are fine: only
the last dim must be contiguous), the raw gate inputs a, b ``[N, HV]``, A_log and dt_bias
``[HV]`` fp32; the temporal state pool ``ssm_states [slots + 1, HV, V, K]`` (fp32), the
conv state pool ``conv_states [slots + 1, conv_dim, W - 1]``; ``cache_indices [B]`` int32
pool slots (<= 0: padding: nothing read or written), ``query_start_loc [B + 1]`` int32 row
offsets. Outputs are ``[N, HV, V]`` in the activation dtype. Nothing here syncs with the
host except ``chunk_plan`` (host lengths), so decode and verify are graph-capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from attngen.families.gdn.triton.config import GdnTritonConfig
from attngen.families.gdn.triton.host import checks
from attngen.families.gdn.triton.host.options import (
    ACCEPT_BLOCK,
    ACCEPT_OPTIONS,
    conv_prefill_options,
    conv_update_options,
    output_options,
    prepare_options,
    recurrent_options,
    state_block_for,
    state_options,
    state_t_descriptor_blocks,
    state_t_options,
    state_transposed_for,
    wu_options,
)
from attngen.families.gdn.triton.kernels.chunk import (
    chunk_output_kernel,
    chunk_prepare_kernel,
    chunk_state_kernel,
    chunk_state_t_kernel,
    chunk_wu_kernel,
)
from attngen.families.gdn.triton.kernels.conv import conv_prefill_kernel, conv_update_kernel
from attngen.families.gdn.triton.kernels.recurrent import accept_kernel, recurrent_kernel
from attngen.runtime.checks import check_tensor, fail


@dataclass(frozen=True)
class ChunkPlan:
    """The chunks of one ragged batch: chunk c covers tokens ``chunk_start[c] ..`` of
    request ``chunk_seq[c]``; request b's chunks start at ``seq_first_chunk[b]`` (int32, on
    the device)."""

    chunk_seq: torch.Tensor
    chunk_start: torch.Tensor
    seq_first_chunk: torch.Tensor
    max_len: int  # longest request (host)
    num_tokens: int

    @property
    def num_chunks(self) -> int:
        return int(self.chunk_seq.shape[0])


def chunk_plan(extend_lens: list[int], chunk_size: int, device: torch.device) -> ChunkPlan:
    """The chunk plan of requests with ``extend_lens`` new tokens each (host ints)."""
    if not extend_lens or min(extend_lens) < 1:
        fail("extend_lens", "one or more lengths >= 1", extend_lens)
    seqs, starts, firsts, offset = [], [], [], 0
    for b, n in enumerate(extend_lens):
        firsts.append(len(seqs))
        for s in range(0, n, chunk_size):
            seqs.append(b)
            starts.append(offset + s)
        offset += n
    firsts += [0] * (len(seqs) - len(firsts))  # one tensor of three equal rows
    as_i32 = dict(dtype=torch.int32)
    rows = torch.tensor([seqs, starts, firsts], **as_i32).to(device, non_blocking=True)
    return ChunkPlan(rows[0], rows[1], rows[2, : len(extend_lens)], max(extend_lens), offset)


def _tma_ready(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a contiguous copy where a TMA descriptor could not address it (a base or
    a stride that is not a multiple of 16 bytes)."""
    size = x.element_size()
    if x.data_ptr() % 16 or x.stride(-1) != 1 or any(s * size % 16 for s in x.stride()[:-1]):
        return x.clone(memory_format=torch.contiguous_format)
    return x


def _rows_of(x: torch.Tensor) -> tuple[int, int]:
    return x.stride(0), x.stride(1)


def _launch(kernel, grid, args: list, options: dict[str, object]) -> None:
    kernel[grid](*args, **options)


def conv_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    config: GdnTritonConfig,
    steps: torch.Tensor | None = None,
    parents: torch.Tensor | None = None,
    tokens_per_request: int = 1,
) -> torch.Tensor:
    """Causal conv + SiLU of ``tokens_per_request`` tokens per request (rows
    ``query_start_loc[b] ..``) from the request's conv state. Without ``steps`` (decode) the
    pool row is updated in place; with ``steps [B, T, conv_dim, W-1]`` (verify) every
    token's window goes there and the pool is left alone; ``parents [B, T]`` int32: trees."""
    check_tensor("x", x, dtype=checks.io_dtype(config), shape=[None, None])
    conv_dim = int(x.shape[1])
    bs = int(cache_indices.shape[0])
    dev = x.device
    cdt = checks.check_conv_pool(config, conv_states, conv_dim, dev)
    check_tensor("weight", weight, shape=[conv_dim, config.conv_kernel], device=dev)
    if not weight.is_contiguous():
        fail("weight", "a contiguous tensor", f"strides {weight.stride()}")
    if bias is not None:
        check_tensor("bias", bias, shape=[conv_dim], device=dev, contiguous=True)
    checks.check_index("cache_indices", cache_indices, bs, dev)
    checks.check_index("query_start_loc", query_start_loc, bs + 1, dev)
    checks.check_out("out", out, list(x.shape), x.dtype, dev)
    for name, t in (("x", x), ("out", out)):
        if t.stride(1) != 1:
            fail(name, "stride 1 in the last dim", f"strides {t.stride()}")
    verify = steps is not None
    T = tokens_per_request
    step_strides = (0, 0, 0)
    if verify:
        shape = [None, T, conv_dim, config.conv_kernel - 1]
        check_tensor("conv_steps", steps, dtype=cdt, shape=shape, device=dev)
        if steps.shape[0] < bs or not steps.is_contiguous():
            fail("conv_steps", f"contiguous, >= {bs} rows", tuple(steps.shape))
        step_strides = steps.stride()[:3]
    if parents is not None:
        check_tensor("parents", parents, dtype=torch.int32, shape=[bs, T], device=dev)
    options = conv_update_options(
        config, steps=T, verify=verify, tree=parents is not None, has_bias=bias is not None
    )
    grid = (bs, triton.cdiv(conv_dim, config.conv_block_c))
    args = [x, weight, bias, conv_states, cache_indices, query_start_loc, out, steps, parents]
    args += [x.stride(0), conv_states.stride(0), conv_states.stride(1), out.stride(0)]
    args += [*step_strides, parents.stride(0) if parents is not None else 0, conv_dim]
    _launch(conv_update_kernel, grid, args, options)
    return out


def conv_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    config: GdnTritonConfig,
    max_len: int,
) -> torch.Tensor:
    """Causal conv + SiLU of ragged requests; a request with ``has_initial_state[b] != 0``
    starts from its conv state; every request's last inputs become its conv state."""
    check_tensor("x", x, dtype=checks.io_dtype(config), shape=[None, None])
    conv_dim = int(x.shape[1])
    bs = int(cache_indices.shape[0])
    dev = x.device
    checks.check_conv_pool(config, conv_states, conv_dim, dev)
    check_tensor("weight", weight, shape=[conv_dim, config.conv_kernel], device=dev)
    if bias is not None:
        check_tensor("bias", bias, shape=[conv_dim], device=dev, contiguous=True)
    checks.check_index("cache_indices", cache_indices, bs, dev)
    checks.check_index("has_initial_state", has_initial_state, bs, dev)
    checks.check_index("query_start_loc", query_start_loc, bs + 1, dev)
    checks.check_out("out", out, list(x.shape), x.dtype, dev)
    options = conv_prefill_options(config, has_bias=bias is not None)
    grid = (
        bs,
        triton.cdiv(conv_dim, config.conv_block_c),
        triton.cdiv(max_len, config.conv_block_t),
    )
    args = [x, weight.contiguous(), bias, conv_states, cache_indices, has_initial_state]
    args += [query_start_loc, out, x.stride(0), conv_states.stride(0), conv_states.stride(1)]
    args += [out.stride(0), conv_dim]
    _launch(conv_prefill_kernel, grid, args, options)
    return out


def _recurrent(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    ssm_states,
    cache_indices,
    query_start_loc,
    out,
    *,
    config: GdnTritonConfig,
    scale: float,
    steps_per_request: int,
    steps: torch.Tensor | None,
    parents: torch.Tensor | None,
) -> torch.Tensor:
    n, h, hv = checks.check_qkvab(config, q, k, v, a, b)
    dev = q.device
    bs = int(cache_indices.shape[0])
    T = steps_per_request
    checks.check_gate_params(A_log, dt_bias, hv, dev)
    checks.check_state_pool(config, ssm_states, hv, dev)
    checks.check_index("cache_indices", cache_indices, bs, dev)
    checks.check_index("query_start_loc", query_start_loc, bs + 1, dev)
    if n < bs * T:
        fail("q", f">= {bs * T} rows ({bs} requests x {T} tokens)", n)
    checks.check_out("out", out, [n, hv, config.value_dim], q.dtype, dev)
    verify = steps is not None
    step_strides = (0, 0, 0)
    if verify:
        shape = [None, T, hv, config.value_dim, config.key_dim]
        check_tensor("steps", steps, dtype=ssm_states.dtype, shape=shape, device=dev)
        if steps.shape[0] < bs or not steps.is_contiguous():
            fail("steps", f"contiguous, >= {bs} rows", tuple(steps.shape))
        step_strides = steps.stride()[:3]
    if parents is not None:
        check_tensor("parents", parents, dtype=torch.int32, shape=[bs, T], device=dev)
    options = recurrent_options(config, steps=T, verify=verify, tree=parents is not None)
    grid = (config.value_dim // (config.decode_block_v * config.decode_tiles), hv, bs)
    args = [q, k, v, a, b, A_log, dt_bias, ssm_states, cache_indices, query_start_loc, out]
    args += [steps, parents, scale, *_rows_of(q), *_rows_of(k), *_rows_of(v)]
    args += [a.stride(0), b.stride(0), ssm_states.stride(0), ssm_states.stride(1)]
    args += [*_rows_of(out), *step_strides, parents.stride(0) if parents is not None else 0]
    _launch(recurrent_kernel, grid, args, options)
    return out


def decode(
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
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    config: GdnTritonConfig,
    scale: float,
) -> torch.Tensor:
    """One token per request (row ``query_start_loc[b]``); the pool rows are updated."""
    return _recurrent(
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        ssm_states,
        cache_indices,
        query_start_loc,
        out,
        config=config,
        scale=scale,
        steps_per_request=1,
        steps=None,
        parents=None,
    )


def target_verify(
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
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    steps: torch.Tensor,
    parents: torch.Tensor | None,
    config: GdnTritonConfig,
    scale: float,
) -> torch.Tensor:
    """``config.num_draft_tokens`` drafts per request: every draft's state goes to
    ``steps [>= B, T, HV, V, K]`` (row b = batch row), the pool is read only. ``parents
    [B, T]`` int32 (trees; -1: the request's state) or None (chains)."""
    return _recurrent(
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        ssm_states,
        cache_indices,
        query_start_loc,
        out,
        config=config,
        scale=scale,
        steps_per_request=config.num_draft_tokens,
        steps=steps,
        parents=parents,
    )


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
    config: GdnTritonConfig,
    scale: float,
) -> torch.Tensor:
    """Chunked prefill / extend of ragged requests; a request with ``has_initial_state[b]
    != 0`` starts from its pool row; every request's final state is written to it."""
    n, h, hv = checks.check_qkvab(config, q, k, v, a, b, rows=plan.num_tokens)
    dev = q.device
    bs = int(cache_indices.shape[0])
    checks.check_gate_params(A_log, dt_bias, hv, dev)
    checks.check_state_pool(config, ssm_states, hv, dev)
    checks.check_index("cache_indices", cache_indices, bs, dev)
    checks.check_index("has_initial_state", has_initial_state, bs, dev)
    checks.check_index("query_start_loc", query_start_loc, bs + 1, dev)
    checks.check_out("out", out, [n, hv, config.value_dim], q.dtype, dev)
    if plan.seq_first_chunk.shape[0] != bs:
        fail("plan", f"a chunk plan of {bs} requests", int(plan.seq_first_chunk.shape[0]))
    f32 = dict(dtype=torch.float32, device=dev)
    h_dtype = q.dtype if config.chunk_state_bits == 16 else torch.float32
    kd, vd, nc = config.key_dim, config.value_dim, plan.num_chunks
    w_buf = torch.empty((n, hv, kd), **f32)
    # the keys per chunk, transposed, in fp32 (the transposed-state kernel reads k itself)
    transposed = state_transposed_for(config, bs, hv)
    kt_chunks = 0 if transposed else nc
    kt_buf = torch.empty((kt_chunks, hv, kd, config.chunk_size), **f32)
    u_buf = torch.empty((n, hv, vd), **f32)  # U, then u (the state kernel writes it over U)
    h_buf = torch.empty((nc, hv, kd, vd), dtype=h_dtype, device=dev)  # chunks' first states
    t_buf = torch.empty((n, hv, config.chunk_size), **f32)
    # per-row vectors head-major ([HV, N]): a chunk's values of one head are contiguous
    g_buf, beta_buf, qs_buf, kn_buf = (torch.empty((hv, n), **f32) for _ in range(4))
    chunks = [plan.chunk_seq, plan.chunk_start, query_start_loc]
    args = [q, k, a, b, A_log, dt_bias, *chunks, g_buf, beta_buf, qs_buf, kn_buf, t_buf]
    args += [scale, *_rows_of(q), *_rows_of(k), a.stride(0), b.stride(0), hv, n]
    _launch(chunk_prepare_kernel, (nc, hv), args, prepare_options(config))
    args = [k, v, *chunks, g_buf, beta_buf, kn_buf, t_buf, w_buf, u_buf, kt_buf]
    args += [*_rows_of(k), *_rows_of(v), hv, n]
    products = 2 if transposed else 3  # W, U (and KT)
    _launch(chunk_wu_kernel, (nc, hv, products), args, wu_options(config))
    tail = [g_buf, kn_buf, h_buf, ssm_states, cache_indices, has_initial_state]
    tail += [query_start_loc, plan.seq_first_chunk, *ssm_states.stride()[:2], hv, n]
    if transposed:
        boxes = state_t_descriptor_blocks(config)
        descs = [
            TensorDescriptor.from_tensor(t, boxes[name][1])
            for t, name in ((w_buf, "W_DESC"), (u_buf, "U_DESC"), (_tma_ready(k), "K_DESC"))
        ]
        options = state_t_options(config)
        grid = (vd // options["BLOCK_V"], bs, hv)
        _launch(chunk_state_t_kernel, grid, [*descs, u_buf, *tail], options)
    else:
        block_v = state_block_for(config, bs, hv)
        args = [w_buf, u_buf, kt_buf, *tail]
        _launch(chunk_state_kernel, (vd // block_v, bs, hv), args, state_options(config, block_v))
    args = [q, k, u_buf, g_buf, qs_buf, kn_buf, h_buf, *chunks, out]
    args += [*_rows_of(q), *_rows_of(k), *_rows_of(out), hv, n]
    grid = (nc, hv, vd // config.output_block_v)
    _launch(chunk_output_kernel, grid, args, output_options(config))
    return out


def accept(
    ssm_states: torch.Tensor,
    conv_states: torch.Tensor,
    steps: torch.Tensor,
    conv_steps: torch.Tensor,
    cache_indices: torch.Tensor,
    accepted: torch.Tensor,
) -> None:
    """Copy request b's accepted draft (``accepted[b]``, int32; < 0: none) state and conv
    window from the verify step buffers into its pool slot ``cache_indices[b]``."""
    bs = int(cache_indices.shape[0])
    dev = ssm_states.device
    checks.check_index("cache_indices", cache_indices, bs, dev)
    checks.check_index("accepted", accepted, bs, dev)
    for name, t in (("steps", steps), ("conv_steps", conv_steps)):
        if not t.is_contiguous() or t.shape[0] < bs or t.device != dev:
            fail(name, f"a contiguous tensor of >= {bs} rows on {dev}", tuple(t.shape))
    if steps.dtype != ssm_states.dtype or conv_steps.dtype != conv_states.dtype:
        fail("steps / conv_steps", "the pools' dtypes", (steps.dtype, conv_steps.dtype))
    if steps.shape[2:] != ssm_states.shape[1:] or conv_steps.shape[2:] != conv_states.shape[1:]:
        fail("steps / conv_steps", "[B, T, *pool row]", (steps.shape, conv_steps.shape))
    state_numel = ssm_states[0].numel()
    conv_numel = conv_states[0].numel()
    grid = (bs, triton.cdiv(state_numel + conv_numel, ACCEPT_BLOCK))
    args = [ssm_states, conv_states, steps, conv_steps, cache_indices, accepted]
    args += [ssm_states.stride(0), conv_states.stride(0), *steps.stride()[:2]]
    args += [*conv_steps.stride()[:2], state_numel, conv_numel]
    _launch(accept_kernel, grid, args, ACCEPT_OPTIONS)
