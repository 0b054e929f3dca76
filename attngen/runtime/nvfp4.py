"""NVFP4 quantisation of KV-cache rows (pure torch: CPU or CUDA, CUDA-graph capturable).

Layout. A row of ``D`` elements (``D`` a positive multiple of 16) is stored as two tensors
plus one per-tensor number:

- ``packed``: ``torch.uint8`` of shape ``[..., D // 2]``. Element ``2*i`` sits in the LOW
  nibble (bits 3..0) of byte ``i``, element ``2*i + 1`` in the HIGH nibble (bits 7..4).
  Each nibble is an e2m1 code: bit 3 is the sign, bits 2..1 the exponent, bit 0 the
  mantissa. The magnitudes of codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6.
- ``scales``: ``torch.float8_e4m3fn`` of shape ``[..., D // 16]``: one block scale for each
  16 consecutive elements of the row (element ``j`` uses ``scales[..., j // 16]``).
- a global scale: an fp32 number (python float, or a 0-d / 1-element tensor) that
  multiplies every element of the tensor.

So element ``j`` of a row decodes to ``e2m1(code_j) * float(scales[j // 16]) * global``.

Quantisation: ``global = amax(|x|) / (6 * 448)`` (``nvfp4_global_scale``) puts the largest
block scale at the top of the e4m3 range. Each block's scale is ``amax(block) / 6 / global``
rounded to e4m3 (round to nearest even, as torch casts), and each element's code is the
e2m1 value nearest to ``x / (block_scale * global)``, ties to the even code (mantissa bit
0), values beyond 6 saturating at 6. A block whose scale rounds to zero stores codes 0.

Nothing here reads a tensor value on the host (no ``.item()``, no branch on data), so the
functions can run inside CUDA-graph capture; give a tensor global scale on ``x``'s device
there.
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_MAX",
    "E4M3_MAX",
    "NVFP4_BLOCK",
    "dequantize_nvfp4",
    "nvfp4_global_scale",
    "quantize_nvfp4",
]

NVFP4_BLOCK = 16  # elements per block scale
E2M1_MAX = 6.0  # largest e2m1 magnitude
E4M3_MAX = 448.0  # largest finite float8_e4m3fn

_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Rounding |y| onto the e2m1 grid: the code is the number of midpoints that |y| has passed.
# At a midpoint exactly, the even code (mantissa bit 0) wins, which is what the hardware's
# round-to-nearest-even conversion does: (midpoint, True) means "count it at equality".
_E2M1_MIDPOINTS = (
    (0.25, False),  # 0 | 0.5: stay at 0 (code 0)
    (0.75, True),  # 0.5 | 1: go to 1 (code 2)
    (1.25, False),  # 1 | 1.5: stay at 1 (code 2)
    (1.75, True),  # 1.5 | 2: go to 2 (code 4)
    (2.5, False),  # 2 | 3: stay at 2 (code 4)
    (3.5, True),  # 3 | 4: go to 4 (code 6)
    (5.0, False),  # 4 | 6: stay at 4 (code 6)
)


def _shape_error(name: str, expected: str, got: object) -> ValueError:
    return ValueError(f"{name}: expected {expected}, got {got}")


def _check_rows(name: str, x: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(x, torch.Tensor):
        raise _shape_error(name, "a torch.Tensor", type(x).__name__)
    if x.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise _shape_error(name, f"dtype in ({names})", x.dtype)
    if x.dim() < 1:
        raise _shape_error(name, "at least 1 dimension ([..., D])", f"shape {tuple(x.shape)}")


def _global_scale_operand(
    global_scale: float | torch.Tensor, name: str = "global_scale"
) -> float | torch.Tensor:
    """A python float, or the scale as a 0-d fp32 tensor (no host read of its value)."""
    if isinstance(global_scale, bool):
        raise _shape_error(name, "a float or a 1-element float tensor", "bool")
    if isinstance(global_scale, (int, float)):
        value = float(global_scale)
        if not (value > 0.0 and value != float("inf")):
            raise _shape_error(name, "a positive finite number", value)
        return value
    if not isinstance(global_scale, torch.Tensor):
        raise _shape_error(name, "a float or a 1-element float tensor", type(global_scale).__name__)
    if global_scale.numel() != 1:
        raise _shape_error(name, "a 0-d or 1-element tensor", f"shape {tuple(global_scale.shape)}")
    if not global_scale.dtype.is_floating_point:
        raise _shape_error(name, "a floating-point tensor", global_scale.dtype)
    return global_scale.reshape(()).to(torch.float32)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """fp32 tensor of shape [1]: ``amax(|x|) / (6 * 448)``; ``1 / (6 * 448)`` for all-zero x.

    Stays on ``x``'s device (no host sync). The result is never zero: a tiny nonzero amax
    whose quotient would underflow is lifted to the smallest normal fp32.
    """
    _check_rows("x", x, _INPUT_DTYPES)
    if x.numel() == 0:
        raise _shape_error("x", "a non-empty tensor", f"shape {tuple(x.shape)}")
    amax = x.detach().abs().amax().to(torch.float32).reshape(1)
    limit = E2M1_MAX * E4M3_MAX
    scale = torch.where(amax > 0, amax / limit, torch.full_like(amax, 1.0 / limit))
    return scale.clamp_min(torch.finfo(torch.float32).tiny)


def _e2m1_round(magnitude: torch.Tensor) -> torch.Tensor:
    """Code 0..7 (int32) of the e2m1 value nearest to ``magnitude`` (>= 0); saturates at 6."""
    code = torch.zeros(magnitude.shape, dtype=torch.int32, device=magnitude.device)
    for midpoint, inclusive in _E2M1_MIDPOINTS:
        passed = magnitude >= midpoint if inclusive else magnitude > midpoint
        code += passed.to(torch.int32)
    return code


def _e2m1_value(code: torch.Tensor) -> torch.Tensor:
    """fp32 value of e2m1 codes 0..15 (any integer dtype), computed without a lookup table.

    In halves: exponent field 0 gives m (0 or 1 halves), field e > 0 gives (2 + m) << (e - 1).
    """
    code = code.to(torch.int32)
    exponent = (code >> 1) & 3
    mantissa = code & 1
    normal = (2 + mantissa) << (exponent.clamp_min(1) - 1)
    halves = torch.where(exponent > 0, normal, mantissa)
    magnitude = halves.to(torch.float32) * 0.5
    return torch.where((code & 8) != 0, -magnitude, magnitude)


def quantize_nvfp4(
    x: torch.Tensor, global_scale: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x`` [..., D] (bf16/fp16/fp32) to NVFP4 (see the module docstring).

    Returns ``(packed, scales)``: uint8 [..., D // 2] and float8_e4m3fn [..., D // 16].
    ``global_scale`` is usually ``nvfp4_global_scale(x)`` (or that of a larger tensor the
    rows belong to); every block scale is clamped to the e4m3 range.
    """
    _check_rows("x", x, _INPUT_DTYPES)
    d = x.shape[-1]
    if d == 0 or d % NVFP4_BLOCK != 0:
        raise _shape_error("x", f"last dimension D a positive multiple of {NVFP4_BLOCK}", d)
    gs = _global_scale_operand(global_scale)
    if isinstance(gs, torch.Tensor):
        gs = gs.to(x.device)

    lead = x.shape[:-1]
    blocks = x.detach().to(torch.float32).reshape(*lead, d // NVFP4_BLOCK, NVFP4_BLOCK)

    # -- block scales: amax / 6 relative to the global scale, rounded to e4m3 ----
    block_amax = blocks.abs().amax(dim=-1)
    scales = (block_amax / E2M1_MAX / gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)

    # -- codes: nearest e2m1 value of x / (rounded block scale * global scale) ----
    step = scales.to(torch.float32) * gs  # what one e2m1 unit is worth in this block
    usable = step > 0
    safe_step = torch.where(usable, step, torch.ones_like(step))
    y = torch.where(usable[..., None], blocks / safe_step[..., None], torch.zeros_like(blocks))
    code = _e2m1_round(y.abs()) | ((y < 0).to(torch.int32) << 3)  # sign: bit 3

    # -- pack two codes per byte: even element low nibble, odd element high nibble ----
    code = code.reshape(*lead, d // 2, 2)
    packed = (code[..., 0] | (code[..., 1] << 4)).to(torch.uint8)
    return packed, scales


def dequantize_nvfp4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: float | torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Decode NVFP4 rows back to ``dtype`` [..., D] (D = 2 * packed.shape[-1]).

    Computed in fp32 as ``(e2m1 * block_scale) * global_scale`` (the first product is exact),
    then cast to ``dtype``.
    """
    _check_rows("packed", packed, (torch.uint8,))
    _check_rows("scales", scales, (torch.float8_e4m3fn,))
    if dtype not in _OUTPUT_DTYPES:
        names = ", ".join(str(d) for d in _OUTPUT_DTYPES)
        raise _shape_error("dtype", f"one of ({names})", dtype)
    half = packed.shape[-1]
    if half == 0 or half % (NVFP4_BLOCK // 2) != 0:
        raise _shape_error(
            "packed",
            f"last dimension D // 2 a positive multiple of {NVFP4_BLOCK // 2} "
            f"(D a multiple of {NVFP4_BLOCK})",
            f"shape {tuple(packed.shape)}",
        )
    d = 2 * half
    expected = (*packed.shape[:-1], d // NVFP4_BLOCK)
    if tuple(scales.shape) != expected:
        raise _shape_error(
            "scales",
            f"shape {expected} to match packed {tuple(packed.shape)} (D = {d})",
            f"shape {tuple(scales.shape)}",
        )
    if scales.device != packed.device:
        raise _shape_error("scales", f"device {packed.device} (that of packed)", scales.device)
    gs = _global_scale_operand(global_scale)
    if isinstance(gs, torch.Tensor):
        gs = gs.to(packed.device)

    # -- unpack: low nibble is element 2i, high nibble element 2i + 1 ----
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1)  # [..., D // 2, 2]
    values = _e2m1_value(codes).reshape(*packed.shape[:-1], d // NVFP4_BLOCK, NVFP4_BLOCK)

    # -- scale every block of 16 by its e4m3 scale (exact in fp32), then by the global scale:
    # one rounding in all, the same fp32 result as the Triton tile times the global scale ----
    values = values * scales.to(torch.float32)[..., None]
    return (values.reshape(*packed.shape[:-1], d) * gs).to(dtype)
