"""CuTe DSL MHA: per-variant kernel configurations and per-module traits.

A generated ``kernels.py`` holds ``CONFIGS: dict[str, MhaCuteConfig]`` (one per variant,
keyed by its uri) and ``TRAITS`` (the module's mask hooks and phases). The host launchers
build the compiled kernel's specialization (:class:`~.kernels.fwd_sm90.FwdSm90Shape`) from
these two and nothing else, so the kernel identity of the evidence is the compiled kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from attngen.families.mha.key import MhaKey
from attngen.hooks import MaskHooks

DECODE_TILE_ROWS = 64  # decode packs a GQA group's heads into one wgmma M of 64 rows

# Phases the paged extend kernel runs: verify of a draft chain is an extend of
# num_draft_tokens causal rows per request, draft extend one of 1 .. num_draft_tokens rows.
PAGED_PHASES = ("extend", "verify", "draft_extend")


@dataclass(frozen=True)
class MhaCuteConfig:
    """Shapes and tiles of one MHA variant's CuTe DSL kernels on one arch.

    The first fields are the variant's identity (:class:`~attngen.families.mha.key.MhaKey`);
    the tiles after them are what a spec's ``tuning.cute_dsl.<arch>`` may override.
    """

    uri: str
    head_dim: int  # qk head dim
    v_head_dim: int  # v / output head dim
    gqa_group: int  # query heads per kv head
    page_size: int  # tokens per KV-cache page (extend reads one page per key tile)
    dtype: str  # torch dtype name of q, k, v and o: "bfloat16" | "float16"
    kv_dtype: str  # the cache's (the activations' dtype in this backend so far)
    kv_scale: str  # "none" (no quantized caches in this backend so far)
    spec_topk: int  # 0 (no speculative decoding), 1 (draft chains) or more (draft trees)
    num_draft_tokens: int  # verify rows per request (0 without speculative decoding)
    arch: str  # "sm90": the kernel family the launchers compile (wgmma + TMA)
    # -- prefill / extend forward (TMA producer warpgroup + 2 wgmma consumer warpgroups) ----
    fwd_tile_m: int  # query rows per CTA of the cache-free prefill (64 per consumer warpgroup)
    fwd_tile_n: int  # keys per pipeline stage; == page_size for paged extend
    fwd_num_stages: int  # K/V ring depth in shared memory
    # sm90: 1 overlaps S_j's softmax with P_{j-1} V_{j-1} (the sm90 default since a3885ee)
    fwd_intra_wg_overlap: int = 0
    # sm90 prefill / extend: 1 packs the GQA group's query heads into one CTA's 128 rows
    fwd_pack_gqa: int = 0
    # query rows per CTA of the paged phases (extend, verify, draft extend)
    fwd_paged_tile_m: int = 128
    # keys per pipeline stage of the cache-free prefill (the paged phases keep fwd_tile_n,
    # which holds whole pages); a multiple of 16, not a power of two at head dim 256 (80)
    fwd_prefill_tile_n: int = 128
    # sm90 prefill / extend: 1 writes O's rows through shared memory (16-byte row pieces)
    fwd_staged_store: int = 0
    # -- split-KV decode (sm90: the forward's pipeline on 64-row tiles of the group's heads,
    # fwd_tile_n keys per tile, then a combine) ----
    max_splits: int = 16  # upper bound of KV splits per request (the split kernel's grid x)
    decode_num_stages: int = 2  # K/V ring depth of the decode kernel

    @property
    def decode_block_n(self) -> int:
        """Keys per decode tile (the runtime's split heuristic reads it)."""
        return self.fwd_tile_n

    @property
    def decode_block_h(self) -> int:
        """Query-head rows per decode program: the whole group, in one 64-row tile."""
        return DECODE_TILE_ROWS

    @property
    def key(self) -> MhaKey:
        return MhaKey.of(self)


IDENTITY_FIELDS = ("uri", "num_draft_tokens", "arch", *(f.name for f in fields(MhaKey)))
TUNING_KEYS = tuple(f.name for f in fields(MhaCuteConfig) if f.name not in IDENTITY_FIELDS)


@dataclass(frozen=True)
class MhaCuteTraits:
    """What one generated kernels module fixes for all its configs."""

    mask: MaskHooks  # compiled into the kernels as compile-time branches
    phases: tuple[str, ...]  # phases the spec generates
