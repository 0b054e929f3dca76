"""MHA x CuTe DSL on CPU: what the lowering accepts (and why not), the configs it plans, the
checks on a plan, and the launchers' argument checks (they fail before any GPU work).

The kernels themselves are compiled for sm_90a in tests/backends/cute_dsl and run against the
oracle on the H200 (tests/families/mha/gpu, bench/cute_mha_check.py)."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import torch

from attngen import registry
from attngen.capabilities import Status, supports
from attngen.families.mha.cute_dsl import capability, lower, tiles, verify
from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.hooks import MaskHooks
from attngen.ir import PlanError
from attngen.probes import base_variant
from attngen.runtime.checks import AttngenInputError
from attngen.spec.enums import Arch, Backend, DType, Family, MaskKind, Phase, ScaleGranularity
from attngen.families.mha.spec import MhaShape

ROOT = Path(__file__).resolve().parents[3]


def prefill_extend(page: int = 128, head_dim: int = 128, **kw: object):
    v = base_variant(Family.MHA)
    v = dataclasses.replace(v, phases=(Phase.PREFILL, Phase.EXTEND), page_size=page, **kw)
    return dataclasses.replace(v, shape=MhaShape(head_dim, head_dim, 4))


def reason(v, arch: Arch = Arch.SM90) -> str:
    verdict = supports(v, Backend.CUTE_DSL, arch)
    assert verdict.status is Status.NOT_LOWERED, verdict
    return verdict.reason


def test_prefill_and_extend_on_sm90_and_sm100_are_lowered() -> None:
    for page in (16, 32, 64, 128):
        for head_dim in (64, 128):
            for dtype in (DType.BF16, DType.FP16):
                v = prefill_extend(page, head_dim, dtype=dtype, kv_dtype=dtype)
                assert supports(v, Backend.CUTE_DSL, Arch.SM90).ok, v.uri
                assert supports(v, Backend.CUTE_DSL, Arch.SM100).ok, v.uri
    only_prefill = dataclasses.replace(prefill_extend(page=1), phases=(Phase.PREFILL,))
    assert supports(only_prefill, Backend.CUTE_DSL, Arch.SM90).ok  # no cache: any page size


def test_what_is_not_lowered_says_why() -> None:
    assert "page size 3 is not lowered in CuTe DSL on sm100" in reason(
        dataclasses.replace(base_variant(Family.MHA), page_size=3), Arch.SM100
    )
    for arch in (Arch.SM90, Arch.SM100):  # pages below 16 tokens: K/V rows gathered
        assert supports(prefill_extend(page=1), Backend.CUTE_DSL, arch).ok
    assert "gathered with cp.async" in reason(prefill_extend(page=3))
    assert "page size 3 is not lowered in CuTe DSL on sm100" in reason(
        prefill_extend(page=3), Arch.SM100
    )
    assert "head dims 256/256" in reason(prefill_extend(head_dim=256))
    fp8 = prefill_extend(kv_dtype=DType.FP8_E4M3, kv_scale=ScaleGranularity.PER_TENSOR)
    assert "fp8_e4m3 KV cache" in reason(fp8)
    tree = prefill_extend()
    tree = dataclasses.replace(tree, mask=dataclasses.replace(tree.mask, kind=MaskKind.CUSTOM))
    assert "custom masks are lowered for speculative draft trees" in reason(tree)
    spec_tree = dataclasses.replace(
        tree, phases=(*tree.phases, Phase.VERIFY), spec_topk=4, num_draft_tokens=8
    )
    for arch in (Arch.SM90, Arch.SM100):
        assert supports(spec_tree, Backend.CUTE_DSL, arch).ok
    windowed = dataclasses.replace(
        spec_tree, mask=dataclasses.replace(tree.mask, kind=MaskKind.SLIDING_WINDOW,
                                            window_left=64)  # fmt: skip
    )
    assert "draft trees with a sliding window" in reason(windowed)
    assert supports(prefill_extend(), Backend.CUTE_DSL, Arch.SM80).status is Status.UNSUPPORTED
    assert registry.lowering(Family.MHA, Backend.CUTE_DSL).supports is not None


def test_configs_fill_key_tiles_with_whole_pages() -> None:
    c = lower.kernel_config(prefill_extend(page=64), Arch.SM90)  # two pages a 128-key tile
    assert (c.fwd_tile_m, c.fwd_tile_n, c.fwd_num_stages, c.arch) == (128, 128, 2, "sm90")
    assert c.key.page_size == 64 and c.key.gqa_group == 4
    assert lower.kernel_config(prefill_extend(page=128), Arch.SM90).fwd_tile_n == 128
    # d 256: two 128-key stages do not fit shared memory, so a 64-token page is the tile
    assert lower.kernel_config(prefill_extend(page=64, head_dim=256), Arch.SM90).fwd_tile_n == 64
    prefill = dataclasses.replace(prefill_extend(page=1), phases=(Phase.PREFILL,))
    assert lower.kernel_config(prefill, Arch.SM90).fwd_tile_n == 128
    assert verify.config_problems(c, ("prefill", "extend")) == []
    # sm100: 64-key tiles (a softmax thread's row of S), two per 128-token page
    c100 = lower.kernel_config(prefill_extend(page=128), Arch.SM100)
    assert (c100.fwd_tile_n, c100.arch) == (64, "sm100")
    assert verify.config_problems(c100, ("prefill", "extend")) == []
    assert "128 spill" in verify.config_problems(dataclasses.replace(c100, fwd_tile_n=128), ())[0]
    overlapped = dataclasses.replace(c100, fwd_intra_wg_overlap=1)
    assert "sm90 only" in verify.config_problems(overlapped, ())[0]
    assert verify.config_problems(dataclasses.replace(c, fwd_intra_wg_overlap=1), ()) == []
    # the staged O store: sm90's epilogue, in the Q tile's columns
    assert c.fwd_staged_store == 1 and c100.fwd_staged_store == 0
    assert (
        "sm90 only" in verify.config_problems(dataclasses.replace(c100, fwd_staged_store=1), ())[0]
    )
    wide_v = dataclasses.replace(c, v_head_dim=c.head_dim * 2)
    assert any("must not exceed head_dim" in p for p in verify.config_problems(wide_v, ()))


def test_small_pages_fill_a_tile_one_copy_each() -> None:
    """Pages of 16 / 32 (and on sm90 64) tokens: the arch's default key tile, several pages
    per tile."""
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.host.compile import fwd_shape

    traits = MhaCuteTraits(MaskHooks(causal=True), ("prefill", "extend"))
    for page, arch, tile, ppt in ((16, Arch.SM90, 128, 8), (32, Arch.SM90, 128, 4),
                                  (64, Arch.SM90, 128, 2), (16, Arch.SM100, 64, 4),
                                  (128, Arch.SM100, 64, 1)):  # fmt: skip
        c = lower.kernel_config(prefill_extend(page=page), arch)
        assert c.fwd_tile_n == tile and verify.config_problems(c, traits.phases) == []
        shape = fwd_shape(c, traits, paged=True)
        assert (shape.pages_per_tile, shape.page_rows) == (ppt, tile // ppt)
        assert fwd_shape(c, traits, paged=False).pages_per_tile == 1
    c = lower.kernel_config(prefill_extend(page=1), Arch.SM90)
    assert c.fwd_tile_n == 128 and verify.config_problems(c, traits.phases) == []
    gathered = fwd_shape(c, traits, paged=True)
    assert gathered.gather and (gathered.pages_per_tile, gathered.page_rows) == (128, 1)
    assert not fwd_shape(lower.kernel_config(prefill_extend(page=16), Arch.SM90), traits,
                         paged=True).gather  # fmt: skip
    c100 = lower.kernel_config(prefill_extend(page=1), Arch.SM100)
    assert c100.fwd_tile_n == 64 and fwd_shape(c100, traits, paged=True).gather
    c = lower.kernel_config(prefill_extend(page=16), Arch.SM90)
    assert (
        "not one of (16, 32, 64, 128, 1, 2, 4, 8)"
        in verify.config_problems(dataclasses.replace(c, page_size=3), ("extend",))[0]
    )
    assert (
        "not a multiple of page_size=128"
        in verify.config_problems(
            dataclasses.replace(c, page_size=128, fwd_tile_n=64), ("extend",)
        )[0]
    )


def test_bad_tiles_fail_before_emission() -> None:
    c = lower.kernel_config(prefill_extend(page=128), Arch.SM90)
    problems = verify.config_problems(
        dataclasses.replace(c, fwd_paged_tile_m=64, fwd_tile_n=64, fwd_num_stages=9), ("extend",)
    )
    assert len(problems) == 4, problems
    assert "fwd_paged_tile_m=64" in problems[0] and "warpgroups" in problems[0]
    assert "page_size=128" in problems[1]
    assert "shared memory" in problems[2] and "1 .. 4" in problems[3]
    # the cache-free prefill's rows are checked where the module has a prefill
    bad_m = dataclasses.replace(c, fwd_tile_m=64)
    assert verify.config_problems(bad_m, ("extend",)) == []
    assert "fwd_tile_m=64" in verify.config_problems(bad_m, ("prefill",))[0]
    d128_192 = dataclasses.replace(c, fwd_tile_m=192)  # three warpgroups: head dims <= 64
    assert "three consumer warpgroups" in verify.config_problems(d128_192, ("prefill",))[0]
    assert verify.config_problems(dataclasses.replace(c, fwd_tile_n=32), ()) == [
        f"{c.uri}: fwd_tile_n=32 is not one of (64, 128)"
    ]


def test_decode_rings_that_overflow_shared_memory_fail_before_emission() -> None:
    """Decode holds a 64-row Q tile and its K/V ring (fp8: Q as e4m3 parts, plus one
    converted V tile): four 128-key bf16 stages at d 128 (272 KiB) cannot exist; four fp8
    stages (169 KiB) can."""
    v = dataclasses.replace(base_variant(Family.MHA), page_size=128)
    v = dataclasses.replace(v, shape=MhaShape(128, 128, 4))
    c = lower.kernel_config(v, Arch.SM90)
    assert c.decode_block_n == 128 and verify.config_problems(c, ("decode",)) == []
    deep = dataclasses.replace(c, decode_num_stages=4)
    problems = verify.config_problems(deep, ("decode",))
    assert len(problems) == 1 and "decode_num_stages=4 of 128-key tiles" in problems[0]
    assert "279552 B of shared memory" in problems[0], problems
    fp8 = dataclasses.replace(deep, kv_dtype="float8_e4m3fn", kv_scale="per_tensor")
    assert verify.config_problems(fp8, ("decode",)) == []


def test_plan_checks_raise_with_the_spec(tmp_path) -> None:
    from attngen.generate import build
    from attngen.testing.paths import REPO_ROOT

    result = build(REPO_ROOT, REPO_ROOT / "specs" / "mha" / "gqa_prefill.yaml", verbose=False)
    plans = [p for p in result.plans if p.backend is Backend.CUTE_DSL]
    assert [p.arch for p in plans] == [Arch.SM90, Arch.SM100]
    plan = plans[0]
    assert len(plan.kernels) == 16 and {k.config.fwd_tile_n for k in plans[1].kernels} == {64}
    assert {k.config.fwd_tile_n for k in plan.kernels} == {128}
    bad = dataclasses.replace(
        plan, kernels=(dataclasses.replace(plan.kernels[0], config=dataclasses.replace(
            plan.kernels[0].config, fwd_tile_n=256)),)  # fmt: skip
    )
    with pytest.raises(PlanError, match="gqa_prefill.yaml.*fwd_tile_n=256"):
        verify.verify_plan(bad)
    assert lower.traits(plan) == MhaCuteTraits(MaskHooks(causal=True), ("prefill", "extend"))
    # one refused tile in every variant reads as one problem naming three variants and a count
    every = dataclasses.replace(
        plan, kernels=tuple(dataclasses.replace(k, config=dataclasses.replace(
            k.config, fwd_tile_n=256)) for k in plan.kernels)  # fmt: skip
    )
    with pytest.raises(PlanError) as refused:
        verify.verify_plan(every)
    message = str(refused.value)
    first = ", ".join(k.uri for k in plan.kernels[:3])
    assert message.count("fwd_tile_n=256 is not one of") == 1, message
    assert f"{first} and {len(plan.kernels) - 3} more: fwd_tile_n=256" in message, message


# -- launcher checks: everything is refused before a kernel is compiled or launched ----


def _config() -> MhaCuteConfig:
    return lower.kernel_config(prefill_extend(page=64), Arch.SM90)


def _launch_prefill(q, k, v, cu, out, **kw) -> None:
    from attngen.families.mha.cute_dsl.library import prefill

    traits = MhaCuteTraits(MaskHooks(causal=True, sinks=kw.pop("has_sinks", False)), ("prefill",))
    prefill(q, k, v, cu, out, max_seq_len=kw.pop("max_seq_len", 8), config=_config(),
            traits=traits, sm_scale=kw.pop("sm_scale", 0.1), **kw)  # fmt: skip


def _tensors(device: str = "cpu", dtype: torch.dtype = torch.bfloat16):
    q = torch.randn(8, 8, 128, dtype=dtype, device=device)
    k = torch.randn(8, 2, 128, dtype=dtype, device=device)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    return q, k, k.clone(), cu, torch.empty_like(q)


def test_launchers_refuse_bad_arguments_before_any_gpu_work() -> None:
    pytest.importorskip("cutlass")
    q, k, v, cu, out = _tensors()
    with pytest.raises(AttngenInputError, match="q: expected a CUDA tensor"):
        _launch_prefill(q, k, v, cu, out)
    with pytest.raises(AttngenInputError, match="q: expected dtype torch.bfloat16"):
        _launch_prefill(*_tensors(dtype=torch.float16))
    with pytest.raises(AttngenInputError, match="sm_scale: expected a Python float"):
        _launch_prefill(q, k, v, cu, out, sm_scale="0.1")
    with pytest.raises(AttngenInputError, match="max_seq_len: expected a Python int"):
        _launch_prefill(q, k, v, cu, out, max_seq_len=8.0)
    with pytest.raises(AttngenInputError, match="q: expected 3 dims"):
        _launch_prefill(q[0], k, v, cu, out)


def test_extend_refuses_fp8_scales() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import extend

    q, _, _, cu, out = _tensors()
    cache = torch.randn(4, 64, 2, 128, dtype=torch.bfloat16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    prefix = torch.zeros(1, dtype=torch.int32)
    traits = MhaCuteTraits(MaskHooks(causal=True), ("extend",))
    with pytest.raises(AttngenInputError, match="k_scale: expected None"):
        extend(q, cache, cache, table, cu, prefix, out, max_extend_len=8, config=_config(),
               traits=traits, sm_scale=0.1, k_scale=torch.ones(1))  # fmt: skip


def test_capability_constants_agree_with_the_kernel() -> None:
    assert capability.TMA_PAGE_SIZES == set(verify.PAGE_SIZES)
    assert capability.GATHER_PAGE_SIZES == set(verify.GATHER_PAGE_SIZES)
    assert all(t % p == 0 or p % t == 0 for t in verify.TILE_N for p in verify.PAGE_SIZES)
    assert capability.HEAD_DIMS[Arch.SM90] == {(64, 64), (128, 128), (256, 256), (192, 128)}
    assert capability.HEAD_DIMS[Arch.SM100] == {(64, 64), (128, 128), (256, 256), (192, 128)}


def test_every_group_plans_both_forward_tiles() -> None:
    """The lowering's own config passes its plan check for every GQA group it supports, at
    head dims 64 (192-row prefill tiles, 128-row paged ones) and 128: one packing decision
    must hold for both tiles (a group of 3, 6 or 12 divides 192 rows, not 128; 32 the other
    way round)."""
    phases = ("prefill", "extend")
    for arch in (Arch.SM90, Arch.SM100):
        for head_dim in (64, 128):
            for group in (*range(1, 17), 24, 32, 48, 64):
                v = dataclasses.replace(
                    prefill_extend(page=64), shape=MhaShape(head_dim, head_dim, group)
                )
                if not supports(v, Backend.CUTE_DSL, arch).ok:
                    continue
                c = lower.kernel_config(v, arch)
                assert verify.config_problems(c, phases) == [], (arch, head_dim, group)
                packed = c.fwd_tile_m % group == 0 and c.fwd_paged_tile_m % group == 0
                assert not c.fwd_pack_gqa or packed, (arch, head_dim, group)


def wide(head_dim: int, v_head_dim: int, page: int = 64, phases=(Phase.PREFILL, Phase.EXTEND)):
    v = dataclasses.replace(prefill_extend(page=page), phases=phases)
    return dataclasses.replace(v, shape=MhaShape(head_dim, v_head_dim, 2))


def test_wide_head_dims_fit_their_tiles() -> None:
    """d 256 on sm90 with 64-key tiles (pages up to 64), on sm100 with its 64-key tiles
    (S and O take all 512 tensor-memory columns; any page size); 192 / 128 (MLA prefill)
    with 128-key tiles on sm90 and 64 on sm100; decode stays at 64 and 128; a tuned tile
    that overflows shared memory fails before emission."""
    from attngen.families.mha.cute_dsl import tiles

    for page in (1, 16, 32, 64):
        c = lower.kernel_config(wide(256, 256, page), Arch.SM90)
        assert c.fwd_tile_n == 64 and verify.config_problems(c, ("prefill", "extend")) == []
    prefill = lower.kernel_config(wide(256, 256, phases=(Phase.PREFILL,)), Arch.SM90)
    assert prefill.fwd_tile_n == 64
    assert "page size 128 with head dims 256/256" in reason(wide(256, 256, 128))
    for page in (1, 16, 32, 64, 128):
        c = lower.kernel_config(wide(256, 256, page), Arch.SM100)
        assert c.fwd_tile_n == 64 and verify.config_problems(c, ("prefill", "extend")) == []
    deep = dataclasses.replace(c, fwd_num_stages=3)  # 64 + 32 + 3 x 64 KiB
    problems = verify.config_problems(deep, ("prefill",))
    assert len(problems) == 1 and "3 stages of 64-key tiles" in problems[0], problems
    wider = dataclasses.replace(c, fwd_tile_n=320)
    assert any("512 of tensor memory" in p for p in verify.config_problems(wider, ("prefill",)))
    decode = wide(256, 256, phases=(Phase.DECODE,))
    assert "decode with head dims 256/256" in reason(decode)
    for page, tile in ((16, 128), (64, 128), (128, 128)):
        c = lower.kernel_config(wide(192, 128, page), Arch.SM90)
        assert c.fwd_tile_n == tile and verify.config_problems(c, ("extend",)) == []
    assert lower.kernel_config(wide(192, 128), Arch.SM100).fwd_tile_n == 64
    assert "head dims 96/96" in reason(wide(96, 96))
    assert tiles.sm90_fwd_shared_bytes(192, 128, 128, 2) <= tiles.SM90_SHARED_BYTES
    over = dataclasses.replace(lower.kernel_config(wide(256, 256), Arch.SM90), fwd_tile_n=128)
    problems = verify.config_problems(over, ("prefill",))
    assert len(problems) == 1 and "over sm90's 232448" in problems[0], problems


def test_shared_memory_budget_matches_the_kernel() -> None:
    """tiles.sm90_fwd_shared_bytes / sm100_fwd_shared_bytes (what the planner reads,
    importable without the DSL) equal the kernels' own counts (checked at compile time) on
    every head-dim pair, and sm100's tensor memory holds S and O."""
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl import tiles
    from attngen.families.mha.cute_dsl.host.compile import fwd_shape
    from attngen.families.mha.cute_dsl.kernels import fwd_sm90, fwd_sm100

    traits = MhaCuteTraits(MaskHooks(causal=True), ("prefill", "extend"))
    for d, dv in sorted(capability.HEAD_DIMS[Arch.SM90]):
        c = lower.kernel_config(wide(d, dv), Arch.SM90)
        want = tiles.sm90_fwd_shared_bytes(
            d, dv, c.fwd_tile_n, c.fwd_num_stages, c.fwd_paged_tile_m
        )
        assert fwd_sm90.shared_bytes(fwd_shape(c, traits, paged=True)) == want, (d, dv)
    for d, dv in sorted(capability.HEAD_DIMS[Arch.SM100]):
        c = lower.kernel_config(wide(d, dv), Arch.SM100)
        shape = fwd_shape(c, traits, paged=True)
        want = tiles.sm100_fwd_shared_bytes(d, dv, c.fwd_tile_n, c.fwd_num_stages)
        assert fwd_sm100.shared_bytes(shape) == want, (d, dv)
        cols = fwd_sm100.tmem_cols(shape)
        assert c.fwd_tile_n + dv <= cols <= tiles.SM100_TMEM_COLS and cols & (cols - 1) == 0
    assert fwd_sm100.tmem_cols(fwd_shape(lower.kernel_config(wide(256, 256), Arch.SM100),
                                         traits, paged=True)) == 512  # fmt: skip


# -- speculative draft chains: verify and draft extend run the extend kernel ----


def chain(page: int = 64, topk: int = 1, phases=(Phase.VERIFY, Phase.DRAFT_EXTEND)):
    v = dataclasses.replace(prefill_extend(page=page), phases=phases)
    return dataclasses.replace(v, spec_topk=topk, num_draft_tokens=4)


def test_draft_chains_and_trees_are_lowered() -> None:
    for arch in (Arch.SM90, Arch.SM100):
        assert supports(chain(), Backend.CUTE_DSL, arch).ok
        assert supports(chain(128, phases=(Phase.EXTEND, Phase.VERIFY)), Backend.CUTE_DSL, arch).ok
        assert supports(chain(topk=2), Backend.CUTE_DSL, arch).ok
    assert "page size 12" in reason(chain(page=12), Arch.SM100)  # verify reads the cache too
    c = lower.kernel_config(chain(page=64), Arch.SM90)
    assert (c.fwd_tile_n, c.spec_topk, c.num_draft_tokens) == (128, 1, 4)
    assert verify.config_problems(c, ("verify", "draft_extend")) == []
    assert verify.config_problems(dataclasses.replace(c, spec_topk=4), ("verify",)) == []
    no_drafts = dataclasses.replace(c, num_draft_tokens=0)
    assert "num_draft_tokens >= 1" in verify.config_problems(no_drafts, ("verify",))[0]


def test_verify_and_draft_extend_compile_the_extend_kernel() -> None:
    """Chains verify on the extend kernel; trees on its tree specialization (not causal:
    the masks decide among the drafts), which no other phase launches."""
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import compile_specs

    c = lower.kernel_config(chain(page=64), Arch.SM90)
    for phases in (("verify",), ("draft_extend",), ("extend", "verify", "draft_extend")):
        specs = compile_specs(c, traits=MhaCuteTraits(MaskHooks(causal=True), phases))
        assert [(s.name, s.shape.paged) for s in specs] == [("extend", True)], phases
    tree = dataclasses.replace(c, spec_topk=4)
    hooks = MaskHooks(causal=True, tree=True)
    specs = compile_specs(tree, traits=MhaCuteTraits(hooks, ("verify",)))
    assert [(s.name, s.shape.tree, s.shape.causal) for s in specs] == [("verify", True, False)]
    specs = compile_specs(tree, traits=MhaCuteTraits(hooks, ("extend", "verify", "decode")))
    names = [(s.name, getattr(s.shape, "tree", None)) for s in specs]
    assert names[:2] == [("extend", False), ("verify", True)], names
    assert all(s.shape.causal for s in specs if s.name in ("extend", "decode"))


def test_verify_checks_tree_masks_before_any_gpu_work() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import verify as verify_launch

    q, _, _, cu, out = _tensors()
    cache = torch.randn(4, 64, 2, 128, dtype=torch.bfloat16)
    table, prefix = torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    traits = MhaCuteTraits(MaskHooks(causal=True), ("verify",))
    c = lower.kernel_config(chain(page=64), Arch.SM90)
    args = (q, cache, cache, table, cu, prefix, out)
    with pytest.raises(AttngenInputError, match="tree_mask: expected None"):
        verify_launch(*args, config=c, traits=traits, sm_scale=0.1,
                      tree_mask=torch.zeros(4, dtype=torch.uint8))  # fmt: skip
    with pytest.raises(AttngenInputError, match="config.spec_topk: expected >= 1"):
        verify_launch(*args, config=dataclasses.replace(c, spec_topk=0), traits=traits,
                      sm_scale=0.1)  # fmt: skip
    with pytest.raises(AttngenInputError, match="q: expected a CUDA tensor"):
        verify_launch(*args, config=c, traits=traits, sm_scale=0.1)
    tree, tree_traits = dataclasses.replace(c, spec_topk=4), MhaCuteTraits(
        MaskHooks(causal=True, tree=True), ("verify",)
    )
    mask, indptr = torch.zeros(8, dtype=torch.uint8), torch.zeros(2, dtype=torch.int32)
    for bad, match in (
        (dict(tree_mask_indptr=indptr), "tree_mask: expected a torch.Tensor"),
        (dict(tree_mask=mask), "tree_mask_indptr: expected a torch.Tensor"),
        (dict(tree_mask=mask.int(), tree_mask_indptr=indptr), "tree_mask: expected dtype"),
        (dict(tree_mask=mask, tree_mask_indptr=indptr.long()), "tree_mask_indptr: expected"),
        (dict(tree_mask=mask.view(2, 4), tree_mask_indptr=indptr), "tree_mask: expected"),
        (dict(tree_mask=mask[::2], tree_mask_indptr=indptr), "tree_mask: expected"),
    ):
        with pytest.raises(AttngenInputError, match=match):
            verify_launch(*args, config=tree, traits=tree_traits, sm_scale=0.1, **bad)
    # a well-formed tree verify gets as far as the device check
    with pytest.raises(AttngenInputError, match="q: expected a CUDA tensor"):
        verify_launch(*args, config=tree, traits=tree_traits, sm_scale=0.1, tree_mask=mask,
                      tree_mask_indptr=indptr)  # fmt: skip


# -- split-KV decode: the forward pipeline on tiles of a group's heads (sm90: 64 rows,
# sm100: 128, compile-only) ----


def decode_variant(page: int = 64, group: int = 4, head_dim: int = 128):
    v = dataclasses.replace(base_variant(Family.MHA), page_size=page)
    return dataclasses.replace(v, shape=MhaShape(head_dim, head_dim, group))


def test_decode_is_lowered_on_sm90_and_sm100() -> None:
    for page in (1, 2, 4, 8, 16, 32, 64, 128):
        for group in (1, 4, 7, 16, 64):
            for head_dim in (64, 128):
                v = decode_variant(page, group, head_dim)
                for arch in (Arch.SM90, Arch.SM100):
                    assert supports(v, Backend.CUTE_DSL, arch).ok, (v.uri, arch)
    for arch in (Arch.SM90, Arch.SM100):
        assert "group 65 is not lowered" in reason(decode_variant(group=65), arch)
        assert "page size 3" in reason(decode_variant(page=3), arch)
    assert "decode with head dims 192/128" in reason(
        dataclasses.replace(decode_variant(), shape=MhaShape(192, 128, 4)), Arch.SM100
    )


def test_decode_config_and_kernels() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import compile_specs

    c = lower.kernel_config(decode_variant(page=16, group=8), Arch.SM90)
    assert (c.max_splits, c.decode_block_n, c.decode_block_h) == (16, 128, 64)
    assert verify.config_problems(c, ("extend", "decode")) == []
    bad = dataclasses.replace(c, arch="sm80", max_splits=0)
    problems = " ".join(verify.config_problems(bad, ("decode",)))
    assert "not lowered for sm80" in problems and "max_splits=0" in problems
    hooks = MaskHooks(causal=True, sinks=True)
    specs = compile_specs(c, traits=MhaCuteTraits(hooks, ("extend", "decode")))
    assert [s.name for s in specs] == ["extend", "decode", "decode_combine"]
    split, combine = specs[1].shape, specs[2].shape
    # the group's heads fill one 64-row tile; the sinks join in the combine only
    assert (split.tile_m, split.decode_group, split.sinks, split.paged) == (64, 8, False, True)
    assert (split.tile_n, split.pages_per_tile) == (128, 8)
    assert (combine.v_head_dim, combine.sinks) == (128, True)
    assert specs[1].requires["ptx"][0] == "wgmma.mma_async"


def test_decode_resident_ctas_are_the_kernels() -> None:
    """What every generated sm90 CuTe module tells the runtime's split rule (its decode's
    CTAs an SM: DECODE_RESIDENT_CTAS, from tiles.py without the DSL) is what the kernel asks
    ptxas for (decode_sm90.resident_ctas), config by config; sm100 modules state none (their
    decode has not been timed)."""
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.host.compile import decode_shape
    from attngen.families.mha.cute_dsl.kernels.decode_sm90 import resident_ctas

    seen = set()
    for arch in (Arch.SM90, Arch.SM100):
        for path in sorted(
            (ROOT / "generated" / arch.value / "cute_dsl" / "mha").glob("*/kernels.py")
        ):
            name = path.parent.name
            module = importlib.import_module(f"generated.{arch.value}.cute_dsl.mha.{name}.kernels")
            stated = module.DECODE_RESIDENT_CTAS
            if arch is Arch.SM100 or "decode" not in module.PHASES:
                assert stated == {}, name
                continue
            assert set(stated) == set(module.CONFIGS), name
            for uri, config in module.CONFIGS.items():
                want = resident_ctas(decode_shape(config, module.TRAITS))
                assert stated[uri] == want, (name, uri)
                seen.add((want, config.page_size < 16, config.kv_dtype == config.dtype))
    # gathered pages (1), TMA pages over 16-bit (1 at d 128, 2 at d 64) and fp8 caches (2)
    assert {(1, True, True), (1, False, True), (2, False, True), (2, False, False)} <= seen


def test_sm100_decode_config_and_kernels() -> None:
    """sm100 decode: the group's heads are rows of the forward's 128-row tcgen05 tile over
    64-key tiles (a 128-token page is two tiles, 16-token pages fill one four at a time,
    1-token pages are gathered), the sm90 combine after it; bf16 / fp16 caches only."""
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.kernels import decode_sm100
    from attngen.families.mha.cute_dsl.library import compile_specs

    hooks = MaskHooks(causal=True, sinks=True)
    traits = MhaCuteTraits(hooks, ("decode",))
    for page, ppt, gather in ((1, 64, True), (16, 4, False), (64, 1, False), (128, 1, False)):
        c = lower.kernel_config(decode_variant(page=page, group=16), Arch.SM100)
        assert (c.decode_block_n, c.max_splits) == (64, 16)
        assert verify.config_problems(c, ("decode",)) == []
        specs = compile_specs(c, traits=traits)
        assert [s.name for s in specs] == ["decode", "decode_combine"]
        split = specs[0].shape
        # the planned 64 rows, padded by the kernel to its 128-row tcgen05 tile
        assert (split.tile_m, split.tile_n, split.decode_group) == (64, 64, 16)
        assert decode_sm100.padded(split).tile_m == 128
        assert specs[0].shared_bytes == 1024 + 128 * (128 + 64) * 2 + 2 * 64 * 256 * 2
        assert (split.pages_per_tile, split.gather, split.sinks) == (ppt, gather, False)
        assert specs[0].requires["ptx"][0] == "tcgen05.mma"
        assert specs[1].shape.sinks  # the sinks join in the combine
    fp8 = dataclasses.replace(c, kv_dtype="float8_e4m3fn", kv_scale="per_tensor")
    assert verify.config_problems(fp8, ("decode",)) == []  # see test_fp8_kv_decode_on_sm100


def _decode_args(batch: int = 2, splits: int = 16):
    q = torch.randn(batch, 8, 128, dtype=torch.bfloat16)
    cache = torch.randn(4, 64, 2, 128, dtype=torch.bfloat16)
    ints = torch.ones(batch, dtype=torch.int32)
    partial = (torch.empty(batch, 8, splits, 128), torch.empty(batch, 8, splits))
    return (q, cache, cache, torch.zeros(batch, 1, dtype=torch.int32), ints, ints,
            torch.empty_like(q), *partial)  # fmt: skip


def test_decode_launcher_refuses_bad_arguments_before_any_gpu_work() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import decode

    c = lower.kernel_config(decode_variant(page=64), Arch.SM90)
    traits = MhaCuteTraits(MaskHooks(causal=True), ("extend", "decode"))
    with pytest.raises(AttngenInputError, match="q: expected a CUDA tensor"):
        decode(*_decode_args(), config=c, traits=traits, sm_scale=0.1)
    with pytest.raises(AttngenInputError, match="k_scale: expected None"):
        decode(*_decode_args(), config=c, traits=traits, sm_scale=0.1, k_scale=torch.ones(1))
    with pytest.raises(AttngenInputError, match="generates no decode"):
        decode(*_decode_args(), config=c, traits=MhaCuteTraits(MaskHooks(), ("extend",)),
               sm_scale=0.1)  # fmt: skip


# -- fp8 e4m3 KV cache (decode, sm90): TMA reads fp8 pages, e4m3 Q K^T, V converted ----


def fp8_decode(
    page: int = 64, phases=(Phase.DECODE,), scale=ScaleGranularity.PER_TENSOR, group: int = 4
):
    v = dataclasses.replace(decode_variant(page, group), phases=phases)
    return dataclasses.replace(v, kv_dtype=DType.FP8_E4M3, kv_scale=scale)


def test_fp8_kv_decode_groups_up_to_32() -> None:
    """Each query head takes two rows of the 64-row tile (q's two e4m3 parts): supports()
    says so before any plan check, and the plan check agrees at the edge."""
    for group in (1, 7, 16, 32):
        assert supports(fp8_decode(group=group), Backend.CUTE_DSL, Arch.SM90).ok, group
    for group in (33, 64):
        assert "GQA groups up to 32 (sm90 puts" in reason(fp8_decode(group=group))
    assert (
        verify.config_problems(lower.kernel_config(fp8_decode(group=32), Arch.SM90), ("decode",))
        == []
    )


def test_fp8_kv_decode_is_lowered_on_sm90_pages_of_16_or_more() -> None:
    for page in (16, 32, 64, 128):
        assert supports(fp8_decode(page), Backend.CUTE_DSL, Arch.SM90).ok
    for bad in (
        fp8_decode(page=1),
        fp8_decode(phases=(Phase.EXTEND, Phase.DECODE)),
        fp8_decode(scale=ScaleGranularity.PER_HEAD),
    ):
        assert "fp8_e4m3 KV cache in CuTe DSL: decode only" in reason(bad)
    e5m2 = dataclasses.replace(fp8_decode(), kv_dtype=DType.FP8_E5M2)
    assert "fp8_e5m2 KV cache is not lowered" in reason(e5m2)


def test_fp8_kv_decode_config_and_kernel() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import compile_specs

    c = lower.kernel_config(fp8_decode(page=128), Arch.SM90)
    assert (c.kv_dtype, c.kv_scale) == ("float8_e4m3fn", "per_tensor")
    assert verify.config_problems(c, ("decode",)) == []
    assert "only float8_e4m3fn" in verify.config_problems(c, ("extend", "decode"))[0]
    specs = compile_specs(c, traits=MhaCuteTraits(MaskHooks(causal=True), ("decode",)))
    assert [s.name for s in specs] == ["decode", "decode_combine"]
    assert specs[0].shape.kv_fp8 and "cvt.rn.f16x2.e4m3x2" in specs[0].requires["ptx"]
    assert "f32.e4m3.e4m3" in specs[0].requires["ptx"]  # QK on e4m3 MMAs
    # Q's two e4m3 parts, the fp8 stages and one converted V tile: 1 KiB + 8 KiB + 2 x 32
    # KiB + 32 KiB
    assert specs[0].shared_bytes == 1024 + 64 * 128 + 2 * 128 * 256 + 128 * 128 * 2
    wide = dataclasses.replace(c, gqa_group=33)
    assert "over an fp8 cache" in " ".join(verify.config_problems(wide, ("decode",)))
    assert verify.config_problems(dataclasses.replace(c, gqa_group=32), ("decode",)) == []


def test_fp8_kv_decode_on_sm100() -> None:
    """sm100 (compile-only): a head a row of the 128-row tcgen05 tile, q's two e4m3 parts as
    two accumulating e4m3 MMAs (kind::f8f6f4) on the K stages, V converted to fp16 by the
    softmax warps; groups up to 64, pages of 16 .. 128 tokens."""
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import compile_specs

    for page in (16, 32, 64, 128):
        for group in (1, 7, 32, 64):
            assert supports(fp8_decode(page, group=group), Backend.CUTE_DSL, Arch.SM100).ok
    assert "group 65 is not lowered" in reason(fp8_decode(group=65), Arch.SM100)
    assert "fp8_e4m3 KV cache in CuTe DSL: decode only" in reason(fp8_decode(page=1), Arch.SM100)
    c = lower.kernel_config(fp8_decode(page=128, group=64), Arch.SM100)
    assert verify.config_problems(c, ("decode",)) == []
    specs = compile_specs(c, traits=MhaCuteTraits(MaskHooks(causal=True), ("decode",)))
    assert [s.name for s in specs] == ["decode", "decode_combine"]
    split = specs[0]
    assert split.shape.kv_fp8 and split.shape.tile_n == 64
    assert {"kind::f8f6f4", "cvt.rn.f16x2.e4m3x2", "tcgen05.mma"} <= set(split.requires["ptx"])
    # the Q and P tiles (128 rows: two e4m3 parts of Q take Q's 16-bit bytes), two e4m3 K/V
    # stages of 64 keys and one converted V tile
    want = 1024 + 128 * (128 + 64) * 2 + 2 * 64 * 256 + 64 * 128 * 2
    assert split.shared_bytes == want == tiles.sm100_fwd_shared_bytes(128, 128, 64, 2, 1)


def test_fp8_decode_launcher_needs_the_scales() -> None:
    pytest.importorskip("cutlass")
    from attngen.families.mha.cute_dsl.library import decode

    c = lower.kernel_config(fp8_decode(page=64), Arch.SM90)
    traits = MhaCuteTraits(MaskHooks(causal=True), ("decode",))
    with pytest.raises(AttngenInputError, match="k_scale: expected a torch.Tensor"):
        decode(*_decode_args(), config=c, traits=traits, sm_scale=0.1)
