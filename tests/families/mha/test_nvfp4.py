"""NVFP4 KV-cache pieces: torch quantise/dequantise and the Triton tile decoder.

The torch side (attngen/runtime/nvfp4.py) is checked against the format's definition: a
literal e2m1 table, hand-built blocks that must round-trip exactly, an error bound derived
below for random data, and its error messages. The Triton helper (_nvfp4_tile in
templates/triton/_mha_fp4.py.jinja) runs in the interpreter and must agree bit for bit
with dequantize_nvfp4 at global scale 1.
"""

from __future__ import annotations

import os

# as tests/conftest.py does (it runs first): the interpreter must be on before the first
# `import triton` in the process; a GPU run (ATTNGEN_GPU=1) skips this file anyway
if os.environ.get("ATTNGEN_GPU") != "1":
    os.environ["TRITON_INTERPRET"] = "1"


import pytest
import torch
import triton
import triton.language as tl
from torch.overrides import TorchFunctionMode

from attngen.runtime.nvfp4 import dequantize_nvfp4, nvfp4_global_scale, quantize_nvfp4

# the interpreter reads 0-d values through a numpy path that numpy 2.x deprecates
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # magnitudes of codes 0..7, from the spec
E4M3_MIN_NORMAL = 2.0**-6


def e2m1_by_table(codes: torch.Tensor) -> torch.Tensor:
    """Reference decode of 4-bit codes by the literal table (sign in bit 3)."""
    codes = codes.to(torch.int64)
    magnitude = torch.tensor(E2M1)[codes & 7]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def reference_dequantize(packed: torch.Tensor, scales: torch.Tensor, gs: float) -> torch.Tensor:
    """Straight from the layout: element 2i = low nibble of byte i, 2i + 1 = high nibble."""
    d = packed.shape[-1] * 2
    out = torch.empty(*packed.shape[:-1], d, dtype=torch.float32)
    out[..., 0::2] = e2m1_by_table(packed & 0xF)
    out[..., 1::2] = e2m1_by_table(packed >> 4)
    block_scale = scales.to(torch.float32).repeat_interleave(16, dim=-1)
    return out * block_scale * gs


def randn(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------
# torch quantise / dequantise
# --------------------------------------------------------------------------------------


def half_grid_gap(y: torch.Tensor) -> torch.Tensor:
    """Half the e2m1 grid spacing around |y|: gaps are 0.5 up to 2, 1 up to 4, 2 up to 6."""
    y = y.abs()
    return torch.where(y <= 2, 0.25, torch.where(y <= 4, 0.5, 1.0))


ROUND_TRIP_CASES = [
    # (shape, dtype, multiplier)
    ((3, 16, 2, 128), torch.float32, 1.0),
    ((5, 64), torch.float32, 1.0),
    ((2, 7, 256), torch.float32, 1.0),
    ((4, 16), torch.float32, 1.0),
    ((2, 3, 128), torch.float32, 3.0e4),  # scaled up: global scale far from 1
    ((2, 3, 128), torch.float32, 1.0e-3),  # scaled down
    ((4, 2, 64), torch.float16, 1.0),
    ((4, 2, 128), torch.bfloat16, 10.0),
]


@pytest.mark.parametrize("case", range(len(ROUND_TRIP_CASES)))
def test_round_trip_within_bound(case):
    """Every element lands within half an e2m1 grid gap (of its block's step) of its input.

    Derivation. Let gs be the global scale, s = amax(block) / 6 / gs the ideal block scale,
    s_q = e4m3(s) the stored one and step = s_q * gs what one e2m1 unit is worth. The code
    is the grid value nearest to y = x / step, so:
      - |y| <= 6: |x - dq| <= step * g(|y|), g = half the grid gap there (0.25 below 2,
        0.5 below 4, 1 below 6);
      - |y| > 6 happens only because s_q rounded below s. e4m3 has 3 mantissa bits, so for
        a normal s round-to-nearest gives |s_q - s| <= s / 16, hence |y| <= 6 * s / s_q <=
        6 / (1 - 1/16) = 6.4 and the saturated code 6 is off by (|y| - 6) * step <= 0.4 step,
        inside the g = 1 bound as well.
    Both together (with step <= (17/16) * amax / 6): |x - dq| <= 0.177 * amax(block).
    Slack: y and dq are computed in fp32 (a few ulp of |x|), allowed as 1e-6 * |x|.
    The scales are checked to be normal e4m3 numbers, which the derivation needs (true for
    these randn tensors: no block's amax is below 2^-6 / 448 of the tensor's amax).
    """
    shape, dtype, mult = ROUND_TRIP_CASES[case]
    x = (randn(shape, seed=100 + case) * mult).to(dtype)
    gs = nvfp4_global_scale(x)
    packed, scales = quantize_nvfp4(x, gs)
    assert packed.dtype == torch.uint8 and packed.shape == (*shape[:-1], shape[-1] // 2)
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == (*shape[:-1], shape[-1] // 16)
    dq = dequantize_nvfp4(packed, scales, gs)
    assert dq.dtype == torch.float32 and dq.shape == x.shape
    assert torch.equal(dq, reference_dequantize(packed, scales, float(gs)))

    xf = x.to(torch.float32)
    blocks = xf.reshape(*shape[:-1], -1, 16)
    s_ideal = blocks.abs().amax(-1) / 6 / gs
    s_q = scales.to(torch.float32)
    assert s_q.min() >= E4M3_MIN_NORMAL, "derivation assumes normal e4m3 scales"
    assert ((s_q - s_ideal).abs() <= s_ideal / 16).all(), "block scale not nearest e4m3"
    assert s_q.max() == 448.0  # the global scale puts the largest block at the top of e4m3

    step = (s_q * gs).repeat_interleave(16, dim=-1)
    y = xf / step
    assert y.abs().max() <= 6.4
    err = (xf - dq).abs()
    bound = step * half_grid_gap(y) + 1e-6 * xf.abs()
    worst = (err - bound).max()
    assert worst <= 0, f"error exceeds the bound by {worst}"
    block_amax = blocks.abs().amax(-1, keepdim=True).expand_as(blocks).reshape(shape)
    assert (err <= 0.177 * block_amax + 1e-6 * xf.abs()).all()


def test_low_precision_output_dtypes():
    x = randn((3, 64), seed=7)
    gs = nvfp4_global_scale(x)
    packed, scales = quantize_nvfp4(x, gs)
    dq = dequantize_nvfp4(packed, scales, gs)
    for dtype in (torch.float16, torch.bfloat16):
        out = dequantize_nvfp4(packed, scales, gs, dtype=dtype)
        assert out.dtype == dtype
        assert torch.equal(out, dq.to(dtype))


GRID_BLOCK = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.mark.parametrize("gs", [1.0, 0.125, torch.tensor([4.0]), torch.tensor(0.5)])
def test_grid_values_round_trip_exactly(gs):
    """Every e2m1 value times a power-of-two block scale comes back exactly."""
    gen = torch.Generator().manual_seed(3)
    gs_value = float(gs)
    blocks = []
    # block scales 2^k / gs: e4m3 normals from 2^-6 up to 2^8, and one subnormal (2^-8)
    for k in (-8, -6, -1, 0, 3, 8):
        values = torch.tensor(GRID_BLOCK + [6.0 if k % 2 else -6.0])  # amax 6 in every block
        blocks.append(values[torch.randperm(16, generator=gen)] * 2.0**k * gs_value)
    x = torch.stack(blocks).reshape(2, 48)
    packed, scales = quantize_nvfp4(x, gs)
    dq = dequantize_nvfp4(packed, scales, gs)
    assert torch.equal(dq, x)
    expected_scales = torch.tensor([2.0**k for k in (-8, -6, -1, 0, 3, 8)]).reshape(2, 3)
    assert torch.equal(scales.to(torch.float32), expected_scales)
    for dtype in (torch.float16, torch.bfloat16):
        p, s = quantize_nvfp4(x.to(dtype), gs)
        assert torch.equal(p, packed) and torch.equal(s.view(torch.uint8), scales.view(torch.uint8))


def test_packed_layout_bytes():
    """Element 2i in the low nibble, 2i + 1 in the high nibble; sign in bit 3."""
    x = torch.tensor([0.5, -6.0, 1.0, 1.5, -0.5, 6.0] + [0.0] * 10)
    packed, scales = quantize_nvfp4(x, 1.0)
    assert float(scales[0]) == 1.0
    # 0.5 -> 0x1, -6 -> 0xF; 1 -> 0x2, 1.5 -> 0x3; -0.5 -> 0x9, 6 -> 0x7
    assert packed.tolist() == [0xF1, 0x32, 0x79, 0, 0, 0, 0, 0]


def test_ties_round_to_even_code():
    """Midpoints between grid values go to the even code (mantissa bit 0), deterministically."""
    midpoints = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    x = torch.tensor([6.0] + midpoints + [-m for m in midpoints] + [0.0])  # block scale 1
    packed, scales = quantize_nvfp4(x, 1.0)
    dq = dequantize_nvfp4(packed, scales, 1.0)
    assert torch.equal(dq, torch.tensor([6.0] + expected + [-e for e in expected] + [0.0]))


def test_zero_and_underflowing_blocks_give_zeros():
    x = torch.zeros(2, 3, 64)
    gs = nvfp4_global_scale(x)
    assert gs.shape == (1,) and gs.dtype == torch.float32 and float(gs) > 0
    packed, scales = quantize_nvfp4(x, gs)
    assert not packed.any() and not scales.to(torch.float32).any()
    dq = dequantize_nvfp4(packed, scales, gs)
    assert torch.equal(dq, x)

    # one zero block and one block far below the rest (its scale rounds to e4m3 zero)
    x = randn((2, 64), seed=11)
    x[0, 16:32] = 0.0
    x[1, 32:48] *= 1e-9
    gs = nvfp4_global_scale(x)
    packed, scales = quantize_nvfp4(x, gs)
    assert float(scales[0, 1]) == 0.0 and float(scales[1, 2]) == 0.0
    dq = dequantize_nvfp4(packed, scales, gs)
    assert not dq.isnan().any()
    assert not dq[0, 16:32].any() and not dq[1, 32:48].any()
    assert torch.equal(packed[0, 8:16], torch.zeros(8, dtype=torch.uint8))
    assert torch.equal(packed[1, 16:24], torch.zeros(8, dtype=torch.uint8))


def test_global_scale_value():
    x = randn((4, 32), seed=5) * 7.0
    gs = nvfp4_global_scale(x.to(torch.bfloat16))
    assert gs.shape == (1,) and gs.dtype == torch.float32
    amax = x.to(torch.bfloat16).abs().max().float()
    assert torch.allclose(gs, amax / (6 * 448), rtol=1e-6, atol=0)


class _NoHostReads(TorchFunctionMode):
    """Fails on any read of a tensor value into Python (what CUDA-graph capture forbids)."""

    FORBIDDEN = {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FORBIDDEN:
            raise AssertionError(f"host read of a tensor value: {func}")
        return func(*args, **(kwargs or {}))


def test_no_host_reads():
    x = randn((2, 4, 64), seed=9).to(torch.bfloat16)
    with _NoHostReads():
        gs = nvfp4_global_scale(x)
        packed, scales = quantize_nvfp4(x, gs)
        out = dequantize_nvfp4(packed, scales, gs, dtype=torch.bfloat16)
    assert out.shape == x.shape


U8 = torch.zeros(2, 32, dtype=torch.uint8)
E4 = torch.zeros(2, 4, dtype=torch.float8_e4m3fn)
BAD_QUANTIZE = [
    ((torch.zeros(2, 64, dtype=torch.int32), 1.0), r"x: expected dtype in .*got torch\.int32"),
    ((torch.zeros(2, 24), 1.0), r"x: expected last dimension D a positive multiple of 16.*got 24"),
    ((torch.zeros(2, 0), 1.0), r"x: expected last dimension .*got 0"),
    ((torch.tensor(1.0), 1.0), r"x: expected at least 1 dimension.*got shape \(\)"),
    (([1.0] * 16, 1.0), r"x: expected a torch\.Tensor, got list"),
    ((torch.zeros(2, 64), 0.0), r"global_scale: expected a positive finite number, got 0\.0"),
    ((torch.zeros(2, 64), torch.ones(2)), r"global_scale: expected a 0-d or 1-element .*\(2,\)"),
    ((torch.zeros(2, 64), torch.ones(1, dtype=torch.int32)), r"global_scale: .*floating"),
]
BAD_DEQUANTIZE = [
    ((U8.float(), E4, 1.0), r"packed: expected dtype in \(torch\.uint8\), got torch\.float32"),
    ((U8, E4.view(torch.uint8), 1.0), r"scales: expected dtype in \(torch\.float8_e4m3fn\)"),
    ((U8[:, :12], E4, 1.0), r"packed: expected last dimension D // 2 .*got shape \(2, 12\)"),
    ((U8, E4[:, :3], 1.0), r"scales: expected shape \(2, 4\) to match packed.*\(2, 3\)"),
    ((U8, E4[:1], 1.0), r"scales: expected shape \(2, 4\) .*got shape \(1, 4\)"),
    ((U8, E4, -2.0), r"global_scale: expected a positive finite number, got -2\.0"),
]


@pytest.mark.parametrize("args,message", BAD_QUANTIZE)
def test_quantize_errors(args, message):
    with pytest.raises(ValueError, match=message):
        quantize_nvfp4(*args)


@pytest.mark.parametrize("args,message", BAD_DEQUANTIZE)
def test_dequantize_errors(args, message):
    with pytest.raises(ValueError, match=message):
        dequantize_nvfp4(*args)


def test_other_errors():
    with pytest.raises(ValueError, match=r"dtype: expected one of .*got torch\.int32"):
        dequantize_nvfp4(U8, E4, 1.0, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"x: expected a non-empty tensor"):
        nvfp4_global_scale(torch.zeros(0, 16))
    with pytest.raises(ValueError, match=r"x: expected dtype in"):
        nvfp4_global_scale(torch.zeros(4, 16, dtype=torch.float64))


# --------------------------------------------------------------------------------------
# Triton tile decoder, in the interpreter
# --------------------------------------------------------------------------------------

# the library's own decoder, imported as any kernel module imports it
from attngen.families.mha.triton.kernels.fp4 import nvfp4_tile as _nvfp4_tile  # noqa: E402


@triton.jit
def _decode_cache_kernel(
    PACKED,
    SCALES,
    ROW_VALID,
    OUT,
    n_rows,
    stride_p,
    stride_s,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """OUT[rows] = _nvfp4_tile of cache rows; rows past n_rows or not ROW_VALID are masked."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_cache = rows < n_rows
    valid = tl.load(ROW_VALID + rows, mask=in_cache, other=0) != 0
    mask = (in_cache & valid)[:, None]
    rows = tl.where(in_cache, rows, 0).to(tl.int64)  # keep every address inside the cache
    packed_ptrs = PACKED + rows[:, None] * stride_p + tl.arange(0, BLOCK_D // 2)[None, :]
    scale_ptrs = SCALES + rows[:, None] * stride_s + tl.arange(0, BLOCK_D // 16)[None, :]
    tile = _nvfp4_tile(packed_ptrs, scale_ptrs, mask, BLOCK_N, BLOCK_D)
    out_rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(OUT + out_rows[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :], tile)


def decode_with_triton(
    packed: torch.Tensor, scales: torch.Tensor, row_valid: torch.Tensor, block_n: int
) -> torch.Tensor:
    n, d = packed.shape[0], packed.shape[1] * 2
    grid = triton.cdiv(n, block_n)
    out = torch.full((grid * block_n, d), float("nan"))  # an unwritten element shows
    _decode_cache_kernel[(grid,)](
        packed,
        scales,
        row_valid,
        out,
        n,
        packed.stride(0),
        scales.stride(0),
        BLOCK_N=block_n,
        BLOCK_D=d,
    )
    return out


def make_cache(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantised random rows, plus rows that enumerate every byte and every finite scale."""
    x = randn((n, d), seed=seed) * 3.0
    x[1] = 0.0  # a zero row
    packed, scales = quantize_nvfp4(x, nvfp4_global_scale(x))
    all_bytes = torch.arange(256, dtype=torch.uint8).reshape(-1, d // 2)  # 256 / (d/2) rows
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    scale_bits = finite[torch.arange(all_bytes.shape[0] * d // 16) % finite.numel()]
    packed[2 : 2 + all_bytes.shape[0]] = all_bytes
    scales[2 : 2 + all_bytes.shape[0]] = scale_bits.reshape(-1, d // 16).view(torch.float8_e4m3fn)
    return packed, scales


@pytest.mark.parametrize("scale_kind", ["float8e4nv", "uint8"])
@pytest.mark.parametrize("d", [64, 128])
def test_triton_tile_matches_dequantize(d, scale_kind):
    n, block_n = 37, 16  # three programs, the last one partly past the cache
    packed, scales = make_cache(n, d, seed=d)
    row_valid = torch.ones(n, dtype=torch.int8)
    row_valid[[0, 11, 20, 36]] = 0  # masked rows: their slots hold garbage that must not show
    packed[[0, 11, 20, 36]] = 0xFF
    scales[[0, 11, 20, 36]] = torch.tensor(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)

    scale_arg = scales if scale_kind == "float8e4nv" else scales.view(torch.uint8)
    out = decode_with_triton(packed, scale_arg, row_valid, block_n)

    expected = dequantize_nvfp4(packed, scales, global_scale=1.0)
    assert torch.equal(expected[2:10], reference_dequantize(packed, scales, 1.0)[2:10])
    expected[row_valid == 0] = 0.0
    assert torch.equal(out[:n], expected)  # exact, masked rows included
    assert torch.equal(out[n:], torch.zeros(out.shape[0] - n, d))  # past the cache: zeros
