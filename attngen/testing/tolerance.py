"""THE tolerance table of attngen's numerical tests (CPU interpreter, CPU runtime, GPU).

Kernel outputs are compared with the fp32 torch oracle of their family. The bounds are per
activation dtype, never widened to make a failure pass; each names what it allows.

Two bounds hold together:

- element-wise ``|got - want| <= atol + rtol * |want|``: no element is grossly wrong;
- per row (a query token: all its heads and dims), ``rms(got - want) <= rms * rms(want)``:
  the error is small *relative to the output*. Attention over thousands of keys averages
  values, so outputs shrink like 1/sqrt(keys) (RMS ~0.01-0.02 at 8k keys) and an absolute
  bound alone would pass a skipped page or a 1% scale error. The row bound is derived from
  what a correct kernel rounds: the probabilities P cast to the dtype before P @ V and the
  output cast once, each a relative error uniform in half an ulp (RMS ulp/2/sqrt(3) =
  2^-9/sqrt(3) = 1.1e-3 in bf16, 2^-12/sqrt(3) = 1.4e-4 in fp16 ... doubled for the two
  roundings in quadrature, then a 2.5x margin for accumulation order and exp/tanh
  approximations). ``tests/families/mha/test_tolerance_mutations.py`` shows that a skipped
  page, a wrong page and a 1% softmax-scale error fail it at the GPU suite's long shapes.
"""

from __future__ import annotations

import torch

# A kernel's output (q, k, v, out in the dtype) vs the oracle: bf16/fp16 inputs rounded
# once, fp32 accumulation in another order, P and the output rounded to the dtype.
KERNEL: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2, rms=4e-3),
    torch.float16: dict(atol=1e-2, rtol=1e-2, rms=1e-3),
}
# The oracle's own fp32 result rounded once to the dtype (runtime tests whose "kernels" are
# the oracle): half an ulp of values of magnitude <= 1, no relative part.
ONE_ROUNDING: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: dict(atol=1.6e-2, rtol=0.0, rms=4e-3),
    torch.float16: dict(atol=2e-3, rtol=0.0, rms=1e-3),
}


def row_rms_error(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per row (first dim), rms(actual - expected) / rms(expected); rows whose expected
    output is all zeros (no visible key) count their absolute error."""
    got = actual.double().reshape(actual.shape[0], -1)
    want = expected.double().reshape(expected.shape[0], -1)
    err = (got - want).pow(2).mean(dim=1).sqrt()
    scale = want.pow(2).mean(dim=1).sqrt()
    return torch.where(scale > 0, err / scale.clamp_min(1e-300), err)


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    table: dict[torch.dtype, dict[str, float]] = KERNEL,
    msg: str | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """``actual`` matches ``expected`` within ``table[dtype]`` (the dtype the inputs and the
    output were computed in; default ``actual``'s): element-wise and per row RMS."""
    bounds = dict(table[actual.dtype if dtype is None else dtype])
    rms_bound = bounds.pop("rms")
    prefix = "" if msg is None else f"{msg}: "
    torch.testing.assert_close(
        actual.float(), expected.float(), **bounds, msg=lambda m: f"{prefix}{m}"
    )
    if actual.numel() == 0:
        return
    rel = row_rms_error(actual, expected)
    worst = int(rel.argmax())
    if float(rel[worst]) > rms_bound:
        bad = int((rel > rms_bound).sum())
        raise AssertionError(
            f"{prefix}row {worst} has an RMS error of {float(rel[worst]):.3g} of the output's "
            f"RMS (bound {rms_bound:g}); {bad} of {rel.shape[0]} rows exceed it"
        )
