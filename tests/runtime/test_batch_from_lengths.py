"""ForwardBatch.from_lengths: the batch a model runner builds from host lengths."""

import pytest
import torch

from attngen.runtime.batch import ForwardBatch, ForwardMode, VerifyInfo
from attngen.runtime.checks import AttngenInputError


def slots(n: int) -> torch.Tensor:
    return torch.arange(100, 100 + n, dtype=torch.int64)


def test_extend_fields_and_lengths():
    fb = ForwardBatch.from_lengths(ForwardMode.EXTEND, [3, 1], [5, 0], [2, 4], slots(6))
    assert fb.batch_size == 2 and fb.forward_mode is ForwardMode.EXTEND
    assert fb.req_pool_indices.dtype == torch.int64 and fb.req_pool_indices.tolist() == [3, 1]
    assert fb.seq_lens.tolist() == [7, 4] and fb.seq_lens_cpu.tolist() == [7, 4]
    assert fb.extend_prefix_lens.tolist() == [5, 0] and fb.extend_seq_lens.tolist() == [2, 4]
    assert fb.extend_prefix_lens_cpu == [5, 0] and fb.extend_seq_lens_cpu == [2, 4]
    assert fb.num_new_tokens == 6 and fb.out_cache_loc.tolist() == list(range(100, 106))
    fb.check(device=torch.device("cpu"), max_context_len=16)


def test_decode_has_no_extend_fields_and_keeps_a_row_tensor():
    rows = torch.tensor([2, 4, 6], dtype=torch.int32)
    fb = ForwardBatch.from_lengths(ForwardMode.DECODE, rows, [9, 1, 4], [1, 1, 1], slots(3))
    assert fb.req_pool_indices is rows
    assert fb.seq_lens_cpu.tolist() == [10, 2, 5]
    assert fb.extend_prefix_lens is None and fb.extend_seq_lens_cpu is None
    fb.check(device=torch.device("cpu"), max_context_len=16)


def test_verify_carries_spec_info():
    info = VerifyInfo(3)
    fb = ForwardBatch.from_lengths(
        ForwardMode.TARGET_VERIFY, [1, 2], [4, 8], [3, 3], slots(6), spec_info=info
    )
    assert fb.spec_info is info and fb.extend_seq_lens_cpu == [3, 3]
    fb.check(device=torch.device("cpu"), max_context_len=16)


@pytest.mark.parametrize(
    "mode, rows, prefix, new, loc, match",
    [
        (ForwardMode.DECODE, [1, 2], [3, 3], [1, 2], slots(3), "1 for every request"),
        (ForwardMode.EXTEND, [1, 2], [3], [1, 2], slots(3), "one length per request"),
        (ForwardMode.EXTEND, [1], [3], [2], slots(3), "out_cache_loc"),
        (ForwardMode.EXTEND, [1], [3], [2.0], slots(2), "host integers"),
        (ForwardMode.EXTEND, [1], [True], [2], slots(2), "host integers"),
        (ForwardMode.EXTEND, [1], [3], [2], [100, 101], "torch.Tensor"),
        (ForwardMode.IDLE, [1], [3], [1], slots(1), "DECODE or an extend-like mode"),
    ],
)
def test_bad_lengths_are_named(mode, rows, prefix, new, loc, match):
    with pytest.raises(AttngenInputError, match=match):
        ForwardBatch.from_lengths(mode, rows, prefix, new, loc)
