"""Argument checks of the GDN launchers: shapes, dtypes, devices and strides, before any
launch (every failure names the argument; see attngen.runtime.checks)."""

from __future__ import annotations

import torch

from attngen.families.gdn.triton.config import GdnTritonConfig
from attngen.runtime.checks import check_tensor, fail

IO_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
STATE_DTYPES = {"float32": torch.float32}
CONV_STATE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def io_dtype(config: GdnTritonConfig) -> torch.dtype:
    return IO_DTYPES[config.dtype]


def state_dtype(config: GdnTritonConfig) -> torch.dtype:
    return STATE_DTYPES[config.state_dtype]


def check_qkvab(
    config: GdnTritonConfig,
    q: object,
    k: object,
    v: object,
    a: object,
    b: object,
    rows: int | None = None,
) -> tuple[int, int, int]:
    """q, k [N, H, K], v [N, HV, V], a, b [N, HV] on one device, last dims contiguous;
    returns (N, H, HV)."""
    dt = io_dtype(config)
    kd, vd, group = config.key_dim, config.value_dim, config.v_heads_per_k_head
    q = check_tensor("q", q, dtype=dt, shape=[rows, None, kd], last_dim_contiguous=True)
    n, h = q.shape[0], q.shape[1]
    dev = q.device
    check_tensor("k", k, dtype=dt, shape=[n, h, kd], device=dev, last_dim_contiguous=True)
    check_tensor("v", v, dtype=dt, shape=[n, h * group, vd], device=dev, last_dim_contiguous=True)
    for name, x in (("a", a), ("b", b)):
        check_tensor(name, x, dtype=dt, shape=[n, h * group], device=dev, last_dim_contiguous=True)
    return n, h, h * group


def check_gate_params(A_log: object, dt_bias: object, hv: int, device: torch.device) -> None:
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_tensor(name, x, dtype=torch.float32, shape=[hv], device=device, contiguous=True)


def check_state_pool(
    config: GdnTritonConfig, ssm_states: object, hv: int, device: torch.device
) -> None:
    """ssm_states [slots + 1, HV, V, K] in the state dtype, every slot row contiguous."""
    shape = [None, hv, config.value_dim, config.key_dim]
    s = check_tensor(
        "ssm_states", ssm_states, dtype=state_dtype(config), shape=shape, device=device
    )
    if not s[0].is_contiguous():
        fail("ssm_states", "contiguous [HV, V, K] rows", f"strides {s.stride()}")


def check_conv_pool(
    config: GdnTritonConfig, conv_states: object, conv_dim: int, device: torch.device
) -> torch.dtype:
    shape = [None, conv_dim, config.conv_kernel - 1]
    c = check_tensor(
        "conv_states", conv_states, dtype=CONV_STATE_DTYPES, shape=shape, device=device
    )
    if not c[0].is_contiguous():
        fail("conv_states", "contiguous [conv_dim, W-1] rows", f"strides {c.stride()}")
    return c.dtype


def check_index(name: str, x: object, rows: int, device: torch.device) -> None:
    check_tensor(name, x, dtype=torch.int32, shape=[rows], device=device, contiguous=True)


def check_out(name: str, out: object, shape: list[int], dtype: torch.dtype, device) -> None:
    check_tensor(name, out, dtype=dtype, shape=shape, device=device, last_dim_contiguous=True)
