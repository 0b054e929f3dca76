"""NVFP4 decoding in registers: e2m1 codes to fp16 bits, e4m3 block scales to fp32."""

import triton
import triton.language as tl


@triton.jit
def _e2m1_to_f16(code):
    """fp16 value of 4-bit e2m1 codes, built as fp16 bits (exact: e2m1 values are fp16s).

    Magnitude m * 0.5 for e == 0 (fp16 exponent field 14 when m == 1), else 2^(e-1) * (1 +
    m/2): exponent field e + 14, mantissa bit 9 = m; the sign moves from bit 3 to bit 15.
    """
    code = code.to(tl.int32)
    e = (code >> 1) & 3
    m = code & 1
    bits = tl.where(e > 0, ((e + 14) << 10) | (m << 9), m * (14 << 10))
    bits = bits | ((code & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _e4m3_bits_to_f32(bits):
    """fp32 value of float8 e4m3fn bit patterns held as integers (for GPUs without fp8e4nv).

    Bit 7 is the sign, bits 6..3 the exponent e (bias 7), bits 2..0 the mantissa m: the
    value is m * 2^-9 when e == 0 and (1 + m/8) * 2^(e-7) otherwise, built here as fp32 bits.
    (The NaN pattern 0x7F/0xFF is not decoded: quantize_nvfp4 never writes it.)
    """
    bits = bits.to(tl.int32)
    e = (bits >> 3) & 15
    m = bits & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    magnitude = tl.where(e > 0, normal, m.to(tl.float32) * 0.001953125)  # 2^-9
    return tl.where((bits & 128) != 0, -magnitude, magnitude)


@triton.jit
def nvfp4_tile(packed_ptrs, scale_ptrs, mask, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Load and decode a [BLOCK_N, BLOCK_D] NVFP4 tile to fp32: e2m1 value * block scale.

    packed_ptrs: [BLOCK_N, BLOCK_D // 2] pointers to uint8, two codes per byte (element 2i
    in the low nibble of byte i, element 2i + 1 in the high nibble).
    scale_ptrs: [BLOCK_N, BLOCK_D // 16] pointers to float8e4nv, one scale per 16 elements
    (or to uint8 holding the same bits: sm80 has no fp8e4nv type).
    mask: [BLOCK_N, 1] rows to load; other rows come back as 0.
    The per-tensor global scale is NOT applied: the caller multiplies it in.
    """
    # -- codes: split every byte into its two nibbles and interleave them back in order ----
    packed = tl.load(packed_ptrs, mask=mask, other=0)
    low = _e2m1_to_f16(packed & 0xF)  # elements 0, 2, 4, ...
    high = _e2m1_to_f16(packed >> 4)  # elements 1, 3, 5, ...
    values = tl.reshape(tl.join(low, high), [BLOCK_N, BLOCK_D])

    # -- block scales: each one repeated over its 16 consecutive elements ----
    if scale_ptrs.dtype.element_ty == tl.uint8:
        scales = _e4m3_bits_to_f32(tl.load(scale_ptrs, mask=mask, other=0)).to(tl.float16)
    else:
        scales = tl.load(scale_ptrs, mask=mask, other=0.0).to(tl.float16)
    scales = tl.broadcast_to(scales[:, :, None], [BLOCK_N, BLOCK_D // 16, 16])
    scales = tl.reshape(scales, [BLOCK_N, BLOCK_D])
    return values * scales
