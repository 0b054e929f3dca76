"""What the CuTe DSL GDN lowering covers: extend (chunked prefill over ragged requests, with
or without a pool state) on sm90, bf16 activations, an fp32 temporal state, key and value
head dims 128, chunks of 64, q/k L2-normalised in the kernel, the width-4 causal conv.
Decode and speculative verify are the Triton GDN library's (a spec generates them there)."""

from __future__ import annotations

from attngen.families.gdn.spec import GdnShape
from attngen.spec.enums import Arch, DType, Phase
from attngen.spec.variant import Variant
from attngen.verdict import Verdict, first_failure, first_off, phases_and_dtype

PHASES = frozenset({Phase.EXTEND})
DTYPES = frozenset({DType.BF16})
ARCHS = frozenset({Arch.SM90})  # the chunk kernel is built on wgmma
HEAD_DIM = 128  # a consumer warpgroup holds 64 x 128 fp32 of the state
CHUNK_SIZE = 64
CONV_KERNEL = 4


def supports(variant: Variant, arch: Arch) -> Verdict:
    shape = variant.shape
    assert isinstance(shape, GdnShape)
    return first_failure(
        [
            (
                arch in ARCHS,
                f"the CuTe DSL GDN chunk kernel is sm90's (wgmma); {arch.value} is not lowered",
            ),
            *phases_and_dtype(variant, PHASES, DTYPES),
            (
                shape.state_dtype is DType.FP32,
                f"{shape.state_dtype.value} temporal state is not lowered (fp32 only)",
                "gdn.state_dtype",
            ),
            (
                shape.key_dim == HEAD_DIM and shape.value_dim == HEAD_DIM,
                f"head dims {shape.key_dim}/{shape.value_dim} are not lowered (128/128)",
                first_off(
                    ("gdn.key_dim", "gdn.value_dim"),
                    (shape.key_dim, shape.value_dim),
                    (HEAD_DIM, HEAD_DIM),
                ),
            ),
            (
                shape.chunk_size == CHUNK_SIZE,
                f"chunk_size {shape.chunk_size} is not lowered (64)",
                "gdn.chunk_size",
            ),
            (
                shape.qk_l2norm,
                "q/k without the in-kernel L2 norm are not lowered (the kernels normalise)",
                "gdn.qk_l2norm",
            ),
            (
                shape.conv_kernel == CONV_KERNEL,
                f"conv_kernel {shape.conv_kernel} is not lowered (width 4)",
                "gdn.conv_kernel",
            ),
        ]
    )
