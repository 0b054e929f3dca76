"""Argument checks that run before any kernel launch.

Every failure raises :class:`AttngenInputError` naming the argument and saying what was
expected and what arrived, so a wrong tensor never reaches a kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class AttngenInputError(ValueError):
    """A tensor or argument handed to an attngen kernel or backend is not acceptable."""


def fail(name: str, expected: str, got: object) -> None:
    raise AttngenInputError(f"{name}: expected {expected}, got {got}")


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
    device: torch.device | None = None,
    last_dim_contiguous: bool = False,
    contiguous: bool = False,
) -> torch.Tensor:
    """Check one tensor; ``None`` entries in ``shape`` accept any size."""
    if not isinstance(t, torch.Tensor):
        fail(name, "a torch.Tensor", type(t).__name__)
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            fail(name, f"dtype {' or '.join(str(d) for d in allowed)}", t.dtype)
    if shape is not None:
        if t.dim() != len(shape):
            fail(name, f"{len(shape)} dims {_shape_str(shape)}", tuple(t.shape))
        for axis, want in enumerate(shape):
            if want is not None and t.shape[axis] != want:
                fail(name, f"shape {_shape_str(shape)}", tuple(t.shape))
    if device is not None and t.device != device:
        fail(name, f"device {device}", t.device)
    if contiguous and not t.is_contiguous():
        fail(name, "a contiguous tensor", f"strides {t.stride()}")
    if last_dim_contiguous and t.dim() > 0 and t.stride(-1) != 1 and t.shape[-1] > 1:
        fail(name, "stride 1 in the last dim", f"strides {t.stride()}")
    return t


def check_at_least(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        fail(name, f">= {minimum}", value)


def _shape_str(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
