"""The sparse kernels' split heuristic: one wave of SMs for the Gluon kernels (one program
an SM), two for the Triton kernel, each split at least two slot tiles, a power of two."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

mod = importlib.import_module("generated.sm90.triton.dsa.dsa_deepseek_v32_fp8.kernels")


def _config(heads: int, gluon: int):
    cfg = next(c for c in mod.CONFIGS.values() if c.num_heads == heads)
    return dataclasses.replace(cfg, sparse_gluon=gluon)


@pytest.mark.parametrize(
    "heads, rows, gluon, want",
    [
        (128, 64, 1, 1),  # 128 programs: a second split would need a second wave
        (128, 128, 1, 1),
        (64, 64, 1, 2),  # 64 programs: two splits fill one wave of 132
        (64, 128, 1, 1),
        (64, 16, 1, 8),  # 16 programs: 8 splits (max_splits)
        (128, 64, 0, 2),  # the Triton kernel: two waves
        (64, 64, 0, 4),
    ],
)
def test_choose_splits(heads, rows, gluon, want):
    cfg = _config(heads, gluon)
    assert mod.choose_splits(cfg, rows, 132) == want


def test_choose_splits_keeps_two_tiles_a_split():
    cfg = dataclasses.replace(_config(64, 1), max_splits=64)
    tiles = cfg.index_topk // cfg.sparse_block_n
    splits = mod.choose_splits(cfg, 1, 132)
    assert splits & (splits - 1) == 0 and tiles // splits >= 2 and splits == tiles // 2
