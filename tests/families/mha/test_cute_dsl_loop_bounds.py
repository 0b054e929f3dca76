"""The sm90 forward's key-tile bounds, checked exhaustively on CPU against a brute-force mask.

``MhaFwdSm90.mainloop_overlapped`` runs the tiles no row masks (``unmasked_blocks``) in a
loop without mask code, so a tile wrongly counted unmasked would attend to keys past the
sequence, above the causal diagonal or left of the window, and only on shapes a GPU test
happens to hit (or, in a draft-tree verify, attend to a draft its tree mask hides). Here
every query tile of many (mask, tile, GQA packing, lengths, prefix)
cases is checked on CPU: the kernel's own bound methods run as plain Python on ints (the
``cute.jit`` functions' undecorated bodies), and each tile is compared with the mask of
every (row, key) pair it covers."""

from __future__ import annotations

import itertools
import types

import pytest

fwd_sm90 = pytest.importorskip("attngen.families.mha.cute_dsl.kernels.fwd_sm90")
from attngen.families.mha.cute_dsl.kernels.common import FwdShape  # noqa: E402

Kernel = fwd_sm90.MhaFwdSm90


def plain(name: str):
    return getattr(Kernel, name).__wrapped__


def stub(tile_m: int, tile_n: int, pack: int, causal: bool, window: int | None,
         tree: bool = False):  # fmt: skip
    shape = FwdShape(
        dtype="bfloat16", head_dim=64, v_head_dim=64, tile_m=tile_m, tile_n=tile_n,
        num_stages=2, causal=causal, window_left=window, logit_softcap=None, sinks=False,
        paged=tree, overlap=True, pack_gqa=pack, tree=tree,
    )  # fmt: skip
    return types.SimpleNamespace(shape=shape, tile_m=tile_m, tile_n=tile_n, pack=pack,
                                 rows_tok=tile_m // pack)  # fmt: skip


def loops(k, m_block: int, seqlen_q: int, seqlen_k: int):
    """The tiles of mainloop_overlapped's peeled first step and three loops, in its order
    (the partition arithmetic is the loop's; the bounds come from the kernel's methods)."""
    n_min, n_max = plain("key_blocks")(k, m_block, seqlen_q, seqlen_k)
    top = n_max - 1
    lo, hi = plain("unmasked_blocks")(k, m_block, seqlen_k, seqlen_k - seqlen_q)
    a_lo = max(min(hi, top), n_min)
    b_lo = max(min(lo, a_lo), n_min)
    masked = [top] + list(range(top - 1, a_lo - 1, -1))
    unmasked = list(range(a_lo - 1, b_lo - 1, -1))
    masked_tail = list(range(b_lo - 1, n_min - 1, -1))
    return (n_min, n_max), masked + masked_tail, unmasked, masked + unmasked + masked_tail


def tile_is_unmasked(k, n: int, m_block: int, seqlen_q: int, seqlen_k: int) -> bool:
    """Brute force: every row the tile holds sees every key of key tile n (in a tree verify
    the drafts, keys from ``offset`` on, may be hidden by a row's tree mask)."""
    offset = seqlen_k - seqlen_q
    w = k.shape.window_left
    for r in range(k.tile_m):  # row r: (token, head) pair m_block * tile_m + r, token-major
        pos = (m_block * k.tile_m + r) // k.pack + offset
        for key in range(n * k.tile_n, (n + 1) * k.tile_n):
            if key >= seqlen_k or (k.shape.causal and key > pos):
                return False
            if k.shape.tree and key >= offset:
                return False
            if w is not None and key < pos - w:
                return False
    return True


CASES = list(
    itertools.product(
        (128, 192),  # query rows per CTA (192: three consumer warpgroups, an sm90 candidate)
        (False, True),  # causal
        (None, 0, 1, 63, 100, 256, 1000),  # window_left
        (64, 80, 128),  # tile_n (80: the d 256 cache-free prefill's)
        (1, 2, 4, 8),  # GQA rows packed per token
    )
)


# draft-tree verify (not causal, no window): a request's rows are its drafts
TREE_CASES = [
    (tile_m, False, None, tile_n, pack, True)
    for tile_m, tile_n, pack in itertools.product((128, 192), (64, 128), (1, 2, 4, 8))
]
LENGTHS = ((1, 0), (37, 0), (128, 0), (300, 0), (129, 70), (64, 1000), (257, 128), (500, 3))
TREE_LENGTHS = ((1, 0), (8, 0), (8, 120), (8, 128), (16, 1000), (64, 64), (4, 255), (33, 3))


@pytest.mark.parametrize(
    "tile_m,causal,window,tile_n,pack,tree",
    [(*c, False) for c in CASES] + TREE_CASES,
)
def test_unmasked_tiles_need_no_mask_and_every_tile_runs_once(
    tile_m, causal, window, tile_n, pack, tree
):
    k = stub(tile_m, tile_n, pack, causal, window, tree)
    for seqlen_q, prefix in TREE_LENGTHS if tree else LENGTHS:
        seqlen_k = seqlen_q + prefix
        for m_block in range((seqlen_q * pack + tile_m - 1) // tile_m):
            (n_min, n_max), masked, unmasked, order = loops(k, m_block, seqlen_q, seqlen_k)
            where = (
                f"tile_m={tile_m} causal={causal} window={window} tile_n={tile_n} pack={pack} "
                f"tree={tree} seqlen_q={seqlen_q} prefix={prefix} m_block={m_block}"
            )
            assert order == list(range(n_max - 1, n_min - 1, -1)), where
            for n in unmasked:
                assert tile_is_unmasked(k, n, m_block, seqlen_q, seqlen_k), (where, n)
                assert not plain("needs_mask")(k, n, m_block, seqlen_k, seqlen_k - seqlen_q)
            # no tile is masked for nothing but the peeled first one (it always tests)
            for n in masked[1:]:
                assert not tile_is_unmasked(k, n, m_block, seqlen_q, seqlen_k), (where, n)
