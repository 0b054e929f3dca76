"""Key-tile sizes of the CuTe DSL forward kernels, from their shared-memory budget.

The sm90 kernel keeps the Q tile (128 rows) and ``stages`` K and V tiles in shared memory
(``kernels/fwd_sm90.shared_bytes``): 128 x d x 2 B + stages x tile_n x (d + dv) x 2 B plus
1 KiB of barriers. Two stages of 128 keys fit at d 64, 128 and 192 / 128 (208 KiB at the
last); at d 256 they would take 320 KiB, and 64-key tiles (192 KiB) are the largest that
fit. The split-KV decode kernel holds a 64-row Q tile, its ring of K and V tiles in the
cache's type, and over an fp8 cache one K and one V tile converted to 16 bits.
Importable without the DSL: the generator plans with it.
"""

from __future__ import annotations

SM90_SHARED_BYTES = 227 * 1024  # dynamic shared memory a Hopper CTA may use
BARRIER_BYTES = 1024  # the kernels' mbarriers, padded to a 1 KiB tile alignment
ELEMENT_BYTES = 2  # bf16 / fp16 tiles
TILE_M = 128  # query rows per CTA (two consumer warpgroups of 64)


def sm90_fwd_shared_bytes(
    head_dim: int, v_head_dim: int, tile_n: int, stages: int, tile_m: int = TILE_M
) -> int:
    """Shared memory of one sm90 forward CTA (16-bit K/V)."""
    q = tile_m * head_dim * ELEMENT_BYTES
    kv = stages * tile_n * (head_dim + v_head_dim) * ELEMENT_BYTES
    return BARRIER_BYTES + q + kv


def sm90_tile_n(head_dim: int, v_head_dim: int, stages: int = 2) -> int:
    """The sm90 forward's keys per tile: 128 where ``stages`` such tiles fit, else 64."""
    fits = sm90_fwd_shared_bytes(head_dim, v_head_dim, 128, stages) <= SM90_SHARED_BYTES
    return 128 if fits else 64


def sm90_prefill_tile_n(head_dim: int, v_head_dim: int, stages: int, tile_m: int) -> int:
    """Keys per tile of the sm90 cache-free prefill: the widest multiple of 16 up to 128
    whose ``stages`` K and V tiles fit beside the ``tile_m``-row Q tile (128 at head dims
    up to 192 / 128; 80 at 256, FA4's sm90 tile there, where the paged phases' power of two
    is 64)."""
    for tile_n in range(128, 63, -16):
        if sm90_fwd_shared_bytes(head_dim, v_head_dim, tile_n, stages, tile_m) <= SM90_SHARED_BYTES:
            return tile_n
    return 64


def sm90_paged_tile_n(page_size: int, tile_n: int) -> int:
    """Keys per tile of an sm90 kernel reading a paged cache through TMA, one copy a page:
    the default ``tile_n`` holds whole pages (pages of 16 / 32 / 64 tokens fill a 128-key
    tile), and a page wider than the tile is the tile. Measured on the H200 (bench/results/
    cute_mha_decode_check_2026-12-03-6cabcdb-early-exit.json): at 64-token pages, fp8 decode
    is 6-19% faster on 128-key tiles than on 64-key ones."""
    return max(page_size, tile_n)


PACK_GQA_ARCHS = frozenset({"sm90"})  # forwards whose tiles can hold a GQA group's heads


def gqa_packs(arch: str, group: int, tile_m: int) -> bool:
    """Whether ``group`` query heads per token can share the rows of a ``tile_m``-row
    prefill / extend tile on ``arch`` (the sm90 kernel packs whole tokens: the group must
    divide the tile)."""
    return arch in PACK_GQA_ARCHS and tile_m % group == 0


def sm100_fwd_shared_bytes(
    head_dim: int, v_head_dim: int, tile_n: int, stages: int, kv_bytes: int = ELEMENT_BYTES
) -> int:
    """Shared memory of one sm100 forward or decode CTA (``kernels/fwd_sm100.shared_bytes``):
    the Q and P tiles (128 rows) and ``stages`` K and V tiles, 16-bit (d 256 with 64-key
    tiles: 209 KiB at two stages); over an fp8 cache (``kv_bytes`` 1, decode) Q as two e4m3
    parts, e4m3 stages and one V tile converted to 16 bits."""
    q_p = TILE_M * (head_dim + tile_n) * ELEMENT_BYTES
    converted = tile_n * v_head_dim * ELEMENT_BYTES if kv_bytes < ELEMENT_BYTES else 0
    kv = stages * tile_n * (head_dim + v_head_dim) * kv_bytes
    return BARRIER_BYTES + q_p + kv + converted


SM100_TMEM_COLS = 512  # fp32 columns of an SM's tensor memory: S (tile_n) + O (Dv) must fit


DECODE_TILE_M = 64  # decode: the GQA group's heads in one wgmma M
# over an fp8 cache each head takes two rows (q's two e4m3 parts, rows r and r + 8 of a warp)
FP8_DECODE_MAX_GROUP = 32


def sm90_decode_shared_bytes(
    head_dim: int, v_head_dim: int, tile_n: int, stages: int, kv_bytes: int
) -> int:
    """Shared memory of one sm90 split-KV decode CTA over a cache of ``kv_bytes`` a value."""
    fp8 = kv_bytes < ELEMENT_BYTES  # q as e4m3 parts; V tiles converted to 16 bits
    q = DECODE_TILE_M * head_dim * (1 if fp8 else ELEMENT_BYTES)
    row = tile_n * (head_dim + v_head_dim)
    converted = tile_n * v_head_dim * ELEMENT_BYTES if fp8 else 0
    return BARRIER_BYTES + q + stages * row * kv_bytes + converted


SM90_SHARED_PER_SM = 228 * 1024  # one SM's shared memory; each resident CTA reserves 1 KiB
CTA_RESERVED_SHARED = 1024
SM90_DECODE_MAX_RESIDENT = 2  # the decode launch asks ptxas for at most 2 CTAs an SM


def sm90_decode_resident_ctas(
    head_dim: int, v_head_dim: int, tile_n: int, stages: int, kv_bytes: int, gather: bool
) -> int:
    """CTAs of one sm90 split-KV decode an SM holds: what the kernel asks ptxas for
    (``kernels/decode_sm90.resident_ctas``, which tests hold this equal to): 1 where K/V rows
    are gathered, else as many as shared memory holds, at most 2. The runtime's split rule
    fills whole waves of them (``attngen.families.mha.runtime.decode_split_cap``)."""
    if gather:
        return 1
    cta = sm90_decode_shared_bytes(head_dim, v_head_dim, tile_n, stages, kv_bytes)
    return max(1, min(SM90_DECODE_MAX_RESIDENT, SM90_SHARED_PER_SM // (cta + CTA_RESERVED_SHARED)))
