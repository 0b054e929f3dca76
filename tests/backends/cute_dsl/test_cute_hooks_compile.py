"""The hooks no generated spec exercises yet still compile: the forward kernels with a
sliding window, a logit softcap and sinks (prefill and paged extend), for sm_90a and
sm_100a on CPU, without spills and with the instructions their design relies on."""

from __future__ import annotations

import pytest

from attngen.arch import facts
from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.hooks import MaskHooks

pytest.importorskip("cutlass")


def _config(head_dim: int, page: int, arch: str, tile_n: int, overlap: int) -> MhaCuteConfig:
    return MhaCuteConfig(
        uri=f"d{head_dim}_ps{page}", head_dim=head_dim, v_head_dim=head_dim, gqa_group=8,
        page_size=page, dtype="bfloat16", kv_dtype="bfloat16", kv_scale="none", spec_topk=0,
        num_draft_tokens=0, arch=arch, fwd_tile_m=128, fwd_tile_n=tile_n, fwd_num_stages=2,
        fwd_intra_wg_overlap=overlap, fwd_prefill_tile_n=tile_n,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,head_dim,page,tile_n,overlap",
    [
        ("sm90", 64, 64, 64, 0),
        ("sm90", 128, 128, 128, 0),
        ("sm90", 128, 128, 128, 1),  # the intra-warpgroup overlapped schedule
        ("sm100", 128, 128, 64, 0),
        ("sm90", 128, 16, 128, 0),  # pages smaller than the tile: one TMA copy per page
        ("sm90", 64, 32, 128, 0),
        ("sm100", 128, 16, 64, 0),
        ("sm90", 128, 1, 128, 0),  # pages below 16 tokens: K/V rows gathered with cp.async
        ("sm90", 64, 8, 128, 0),
        ("sm100", 128, 1, 64, 0),
    ],
)
def test_window_softcap_sinks_compile(
    arch: str, head_dim: int, page: int, tile_n: int, overlap: int
) -> None:
    from attngen.backends.cute_dsl.aot import compile_spec
    from attngen.families.mha.cute_dsl.library import compile_specs

    hooks = MaskHooks(causal=True, window_left=127, logit_softcap=30.0, sinks=True)
    config = _config(head_dim, page, arch, tile_n, overlap)
    specs = compile_specs(config, traits=MhaCuteTraits(hooks, ("prefill", "extend")))
    assert [s.name for s in specs] == ["prefill", "extend"]
    for spec in specs:
        res = compile_spec(spec, facts(arch).cubin_target)
        assert res.spill_bytes == 0, (spec.name, res)
        assert all(n > 0 for n in res.extra["instructions"].values()), (
            spec.name,
            res.extra["instructions"],
        )
        assert set(res.extra["instructions"]) == {*spec.requires["ptx"], *spec.requires["sass"]}
        assert ("tcgen05.mma" in res.extra["instructions"]) is (arch == "sm100")
        if spec.shape.gather:
            assert {"cp.async.ca.shared.global", "fence.proxy.async"} <= set(
                res.extra["instructions"]
            )
        elif spec.shape.pages_per_tile > 1:  # one bulk copy of K and of V per page at least
            assert (
                res.extra["instructions"]["cp.async.bulk.tensor"]
                >= 1 + 2 * spec.shape.pages_per_tile
            )
