"""Test and benchmark helpers: random paged batches over attngen's runtime pools."""

from attngen.testing.batches import (
    PADDING_PAGE,
    PADDING_REQ,
    PADDING_SLOT,
    PagedBatch,
    PagedBatchBuilder,
    make_pools,
    pad_decode_batch,
    random_qkv,
)

__all__ = [
    "PADDING_PAGE",
    "PADDING_REQ",
    "PADDING_SLOT",
    "PagedBatch",
    "PagedBatchBuilder",
    "make_pools",
    "pad_decode_batch",
    "random_qkv",
]
