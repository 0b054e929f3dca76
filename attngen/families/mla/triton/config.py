"""Triton MLA: the per-variant launch configuration a generated ``kernels.py`` holds.

``CONFIGS: dict[str, MlaTritonConfig]``: one entry per variant (keyed by its uri), filled in
by the lowering's tile heuristics for one arch; the runtime and the launchers read shapes
and tiles from it and re-derive nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from attngen.families.mla.key import MlaKey


@dataclass(frozen=True)
class MlaTritonConfig:
    """Shapes and tiles of one MLA variant's Triton kernels on one arch.

    The identity fields come first (:class:`~attngen.families.mla.key.MlaKey`); the tiles
    after them are what a spec's ``tuning.triton.<arch>`` may override.
    """

    uri: str
    num_heads: int  # query heads per rank
    kv_lora_rank: int  # latent width (the absorbed key/value dim): 512
    qk_rope_head_dim: int  # decoupled rope key width: 64
    qk_nope_head_dim: int  # non-absorbed per-head key width: 128
    v_head_dim: int  # non-absorbed per-head value width: 128
    page_size: int  # latent rows per KV-cache page
    dtype: str  # torch dtype name of q and out: "bfloat16" | "float16"
    kv_dtype: str  # latent cache: the activations' dtype name or "float8_e4m3fn"
    spec_topk: int  # speculative verify: 0 none, 1 draft chains
    num_draft_tokens: int  # verify rows per request (0 without speculative decoding)
    # -- absorbed attention (decode, extend, verify): split-KV, then combine ----
    decode_block_h: int  # query heads per program (the M of both products)
    decode_block_n: int  # latent rows per inner iteration
    decode_num_warps: int
    decode_num_stages: int
    decode_lora_parts: int  # programs sharing a head block, each owning LORA / parts columns
    decode_keys_major: int  # 1: both products transposed (keys / latent columns as the M)
    decode_value_reload: int  # 1: load the value tile apart from the score's (quantized)
    decode_waves: int  # KV-split target: up to waves x SMs // programs-per-split splits
    max_splits: int  # upper bound of KV splits per row (grid dim)
    combine_num_warps: int
    # -- ragged MHA with LSE (prefill, prefix chunks) ----
    ragged_block_m: int
    ragged_block_n: int
    ragged_num_warps: int
    ragged_num_stages: int
    # 1: absorbed attention of a 16-bit cache without a draft tree runs the sm90 Gluon
    # kernel (``kernels/absorbed_wg.py``: 64 heads x 64 rows, 8 warps, its own layouts)
    decode_gluon: int = 0
    # registers a thread of the Gluon absorbed kernel may use (ptxas's maxnreg; 0: its own
    # choice): a cap of 128 lets two 8-warp programs share an SM
    decode_max_registers: int = 0

    @property
    def key(self) -> MlaKey:
        return MlaKey.of(self)

    @property
    def kv_width(self) -> int:
        """Elements of one latent cache row: latent plus rope (576)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def gluon_shape_problems(self) -> list[str]:
        """What keeps the sm90 Gluon absorbed kernels (``decode_gluon``) from running this
        config: their fixed tiles, all in one column part. Head-major: a 16-bit or fp8 cache,
        64 heads x 64 rows on 8 warps. Keys-major (2+ stages): 16 or 32 heads x 64 rows of a
        16-bit cache on 8 warps, or 16 heads x 64 rows of an fp8 cache on 4 warps; no Gluon
        kernel reads NVFP4. The plan check and the launcher both ask."""
        quantized, fp4 = self.kv_dtype != self.dtype, self.kv_dtype == "nvfp4"
        tile = (self.decode_block_h, self.decode_block_n, self.decode_num_warps)
        stages = self.decode_num_stages
        if self.decode_keys_major and quantized:
            ok = not fp4 and tile == (16, 64, 4) and stages >= 2
            want = "16 heads x 64 rows on 4 warps, 2+ stages (an fp8 cache, keys-major)"
        elif self.decode_keys_major:
            ok = tile[:2] in ((16, 64), (32, 64)) and tile[2] == 8 and stages >= 2
            want = "16 or 32 heads x 64 rows on 8 warps, 2+ stages (a 16-bit cache, keys-major)"
        else:
            ok = not fp4 and tile == (64, 64, 8)
            want = "64 heads x 64 rows on 8 warps (a 16-bit or fp8 cache, head-major)"
        if ok and self.decode_lora_parts == 1:
            return []
        return [
            f"decode_gluon=1 takes {want} in 1 part, not the {self.kv_dtype} cache at "
            f"decode_block_h={tile[0]}, decode_block_n={tile[1]}, decode_num_warps={tile[2]}, "
            f"decode_num_stages={stages}, decode_lora_parts={self.decode_lora_parts}"
        ]


IDENTITY_FIELDS = ("uri", "num_draft_tokens", *(f.name for f in fields(MlaKey)))
TUNING_KEYS = tuple(f.name for f in fields(MlaTritonConfig) if f.name not in IDENTITY_FIELDS)


@dataclass(frozen=True)
class CompileSpec:
    """Everything ``triton.compile`` needs to build one kernel ahead of time (no GPU)."""

    name: str
    fn: Any
    signature: dict[str, str] = field(default_factory=dict)
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2
    max_registers: int = 0  # ptxas's maxnreg (0: its own choice)


@dataclass(frozen=True)
class MlaTraits:
    """What one generated kernels module fixes for all its configs."""

    phases: tuple[str, ...]  # phases the spec generates
