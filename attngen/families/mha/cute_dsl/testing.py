"""Test and benchmark helpers of the CuTe DSL MHA kernels that need no GPU.

:func:`fake_launch` builds the arguments the launchers pass a compiled kernel
(``host.launch.launch_args``, the same types) from torch tensors that have no memory
(``FakeTensorMode`` on a "cuda" device, which CPU torch allows once
``torch.cuda.current_device`` answers), so the launchers' compile path, and the on-disk
cache it goes through, run on a CPU-only machine up to the point of launching.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.families.mha.cute_dsl.host.compile import fwd_shape
from attngen.families.mha.cute_dsl.host.launch import launch_args
from attngen.families.mha.cute_dsl.kernels.common import FwdShape


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """Fake "cuda:0" tensors on any machine (dlpack export asks for the current device)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
            # dlpack export reads the (null) data pointer of a fake tensor
            warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor")
            yield
    finally:
        torch.cuda.current_device = real  # type: ignore[assignment]


def fake_launch(
    config: MhaCuteConfig, traits: MhaCuteTraits, phase: str, *, kv_heads: int = 2
) -> tuple[str, FwdShape, tuple[Any, ...]]:
    """(arch, shape, args) of ``phase`` ("prefill" | "extend" | "verify": a tree verify
    when ``config.spec_topk`` > 1) as the launchers build them; call inside
    :func:`fake_cuda`."""
    import cuda.bindings.driver as cuda

    dtype, dev = getattr(torch, config.dtype), torch.device("cuda", 0)
    heads, d, dv = kv_heads * config.gqa_group, config.head_dim, config.v_head_dim
    tokens, i32 = 256, dict(dtype=torch.int32, device=dev)
    q = torch.empty(tokens, heads, d, dtype=dtype, device=dev)
    out = torch.empty(tokens, heads, dv, dtype=dtype, device=dev)
    sinks = torch.empty(heads, dtype=torch.float32, device=dev) if traits.mask.sinks else None
    indptr = torch.empty(3, **i32)
    tree = phase == "verify" and config.spec_topk > 1
    if phase == "prefill":
        k = torch.empty(tokens, kv_heads, d, dtype=dtype, device=dev)
        v = torch.empty(tokens, kv_heads, dv, dtype=dtype, device=dev)
        small = (indptr, None, None, sinks, None, None)
    else:
        pages, ps = 8, config.page_size
        k = torch.empty(pages, ps, kv_heads, d, dtype=dtype, device=dev)
        v = torch.empty(pages, ps, kv_heads, dv, dtype=dtype, device=dev)
        masks = (torch.empty(16, dtype=torch.uint8, device=dev), torch.empty(2, **i32))
        small = (indptr, torch.empty(2, **i32), torch.empty(2, 4, **i32), sinks,
                 *(masks if tree else (None, None)))  # fmt: skip
    shape = fwd_shape(config, traits, paged=phase != "prefill", tree=tree)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=dev)
    args = launch_args((q, k, v, out), small, lse, 1.0, tokens, True, cuda.CUstream(0))
    return config.arch, shape, args
