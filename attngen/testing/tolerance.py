"""THE tolerance table of attngen's numerical tests (CPU interpreter, CPU runtime, GPU).

Kernel outputs are compared with the fp32 torch oracle of their family. The bounds are per
activation dtype, never widened to make a failure pass; each names what it allows.
"""

from __future__ import annotations

import torch

# A kernel's output (q, k, v, out in the dtype) vs the oracle: bf16/fp16 inputs rounded
# once, fp32 accumulation in another order, one rounding of the output.
KERNEL: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
}
# The oracle's own fp32 result rounded once to the dtype (runtime tests whose "kernels" are
# the oracle): half an ulp of values of magnitude <= 1, no relative part.
ONE_ROUNDING: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: dict(atol=1.6e-2, rtol=0.0),
    torch.float16: dict(atol=2e-3, rtol=0.0),
}


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    table: dict[torch.dtype, dict[str, float]] = KERNEL,
    msg: str | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """``actual`` matches ``expected`` within ``table[dtype]``: the dtype the inputs and the
    output were computed in (default: ``actual``'s)."""
    bounds = table[actual.dtype if dtype is None else dtype]
    torch.testing.assert_close(
        actual.float(),
        expected.float(),
        **bounds,
        msg=None if msg is None else (lambda m: f"{msg}: {m}"),
    )
