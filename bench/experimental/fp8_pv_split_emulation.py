"""CPU emulation for the CuTe DSL fp8 decode (issue 10): can P V run on e4m3 MMAs over the
stored e4m3 values, with P split into e4m3 parts, as Q K^T already does with q?

The decode walks 128-key tiles with an online softmax: per tile, m = max(m, tile max),
P = exp(s - m) in fp32 registers (every element <= 1), O = O * exp(m_old - m) + P V, and
l sums P in fp32. Today P goes to fp16 and V is converted to fp16 in shared memory (exact),
so P V's only rounding is P's. Here P (times a power of two, ``P_SCALE``, so that 1 maps
below e4m3's 448 and small values stay above its subnormals) is split into 1 or 2 e4m3
parts, each multiplied exactly with the e4m3 values; the fp8 MMA's narrow accumulation is
modelled pessimistically: the accumulator of a tile is rounded to ``ACC_BITS`` significant
bits after every k = 32 step (one wgmma), and promoted to fp64 once a tile. Errors are the
row RMS error relative to the row's RMS against the float64 oracle on the dequantized
cache (the tolerance table's measure), output left unrounded, worst row over ``reps``
draws of 8 heads. Scores are exact here (the q split's error is studied in
fp8_qsplit_emulation.py). Run: ``python bench/experimental/fp8_pv_split_emulation.py``.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
TILE = 128
K_STEP = 32  # keys per e4m3 wgmma
P_SCALE = 256.0
ACC_BITS = 14


def round_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    mant, exp = torch.frexp(x)
    return torch.ldexp(torch.round(mant * 2**bits) / 2**bits, exp)


def split_e4m3(p: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``p * P_SCALE`` as ``parts`` e4m3 tensors whose sum approximates it."""
    rest, out = p * P_SCALE, []
    for _ in range(parts):
        piece = rest.to(torch.float32).to(E4M3)
        out.append(piece.double())
        rest = rest - piece.double()
    return out


def tile_pv(p: torch.Tensor, v8: torch.Tensor, parts: int, acc_bits: int | None) -> torch.Tensor:
    """P V of one tile (p [H, n] <= 1, v8 [n, D] e4m3 as float64), the way ``parts`` selects:
    0 = P in fp16 on 16-bit MMAs (today), else e4m3 parts of P on e4m3 MMAs."""
    if parts == 0:
        return p.to(torch.float16).double() @ v8
    total = torch.zeros(p.shape[0], v8.shape[1], dtype=torch.float64)
    for piece in split_e4m3(p, parts):
        acc = torch.zeros_like(total)
        for k0 in range(0, p.shape[1], K_STEP):
            acc = acc + piece[:, k0 : k0 + K_STEP] @ v8[k0 : k0 + K_STEP]
            if acc_bits:
                acc = round_bits(acc, acc_bits)
        total = total + acc
    return total / P_SCALE


def decode(scores: torch.Tensor, v8: torch.Tensor, parts: int, acc_bits: int | None):
    heads, keys = scores.shape
    m = torch.full((heads, 1), -torch.inf, dtype=torch.float64)
    o = torch.zeros(heads, v8.shape[1], dtype=torch.float64)
    l = torch.zeros(heads, 1, dtype=torch.float64)
    for k0 in range(0, keys, TILE):
        s = scores[:, k0 : k0 + TILE]
        m_new = torch.maximum(m, s.amax(dim=1, keepdim=True))
        p = torch.exp(s - m_new).to(torch.float32).double()  # fp32 registers
        alpha = torch.exp(m - m_new)
        o = o * alpha + tile_pv(p, v8[k0 : k0 + TILE], parts, acc_bits)
        l = l * alpha + p.sum(dim=1, keepdim=True)
        m = m_new
    return o / l


def worst_row_error(keys: int, q_mul: float, parts: int, acc_bits: int | None,
                    reps: int = 8, heads: int = 8, dim: int = 128) -> float:  # fmt: skip
    worst = 0.0
    for _ in range(reps):
        q = (torch.randn(heads, dim, dtype=torch.float64) * q_mul).to(torch.bfloat16).double()
        k = (torch.randn(keys, dim, dtype=torch.float64) / 0.02).to(torch.float32).to(E4M3)
        v8 = (torch.randn(keys, dim, dtype=torch.float64) / 0.05).to(torch.float32).to(E4M3)
        k, v8 = k.double() * 0.02, v8.double()
        scores = q @ k.T * dim**-0.5
        ref = torch.softmax(scores, dim=1) @ v8
        out = decode(scores, v8, parts, acc_bits)
        err = (out - ref).pow(2).mean(1).sqrt() / ref.pow(2).mean(1).sqrt()
        worst = max(worst, float(err.max()))
    return worst


def main() -> None:
    torch.manual_seed(0)
    cols = [(0, None), (1, None), (2, None), (1, ACC_BITS), (2, ACC_BITS)]
    names = ["fp16 P", "1 part", "2 parts", f"1, {ACC_BITS}-bit acc", f"2, {ACC_BITS}-bit acc"]
    print("q scale, keys | " + " | ".join(names))
    for q_mul in (1, 4, 16):
        for keys in (300, 4096):
            row = [worst_row_error(keys, q_mul, n, bits) for n, bits in cols]
            print(f"x{q_mul}, {keys} | " + " | ".join(f"{e:.2e}" for e in row))


if __name__ == "__main__":
    main()
