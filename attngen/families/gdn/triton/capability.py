"""What the Triton GDN lowering covers: extend (chunked prefill, with or without a pool
state), decode (recurrent, pool rows in place) and verify (draft chains and trees, per-step
states); bf16/fp16 activations, an fp32 temporal state, key/value head dims 64 or 128,
chunks of 16..64 tokens, the width-4 causal conv."""

from __future__ import annotations

from attngen.spec.enums import DType, Phase
from attngen.families.gdn.spec import GdnShape
from attngen.spec.variant import Variant
from attngen.verdict import Verdict, first_failure, phases_and_dtype

PHASES = frozenset({Phase.EXTEND, Phase.DECODE, Phase.VERIFY})
DTYPES = frozenset({DType.BF16, DType.FP16})
STATE_DTYPES = frozenset({DType.FP32})
HEAD_DIMS = frozenset({64, 128})  # the chunk kernels hold [chunk, dim] fp32 tiles
CHUNK_SIZES = frozenset({16, 32, 64})
MAX_DRAFT_TOKENS = 16  # verify unrolls its drafts
CONV_KERNEL = 4


def supports(variant: Variant) -> Verdict:
    shape = variant.shape
    assert isinstance(shape, GdnShape)
    return first_failure(
        [
            *phases_and_dtype(variant, PHASES, DTYPES),
            (
                shape.state_dtype in STATE_DTYPES,
                f"{shape.state_dtype.value} temporal state is not lowered yet (fp32 only)",
                "gdn.state_dtype",
            ),
            (
                shape.key_dim in HEAD_DIMS,
                f"key_dim {shape.key_dim} is not lowered (64, 128)",
                "gdn.key_dim",
            ),
            (
                shape.value_dim in HEAD_DIMS,
                f"value_dim {shape.value_dim} is not lowered (64, 128)",
                "gdn.value_dim",
            ),
            (
                shape.chunk_size in CHUNK_SIZES,
                f"chunk_size {shape.chunk_size} is not lowered (16, 32, 64)",
                "gdn.chunk_size",
            ),
            (
                shape.conv_kernel == CONV_KERNEL,
                f"conv_kernel {shape.conv_kernel} is not lowered (the conv kernels are width 4)",
                "gdn.conv_kernel",
            ),
            (
                variant.num_draft_tokens <= MAX_DRAFT_TOKENS,
                f"{variant.num_draft_tokens} draft tokens > {MAX_DRAFT_TOKENS} are not lowered",
                "speculative.num_draft_tokens",
            ),
        ]
    )
