"""The hooks no generated spec exercises yet still compile: the sm90 forward kernel with a
sliding window, a logit softcap and sinks (prefill and paged extend), for sm_90a on CPU,
without spills and with the instructions its design relies on."""

from __future__ import annotations

import pytest

from attngen.families.mha.cute_dsl.config import MhaCuteConfig, MhaCuteTraits
from attngen.hooks import MaskHooks

pytest.importorskip("cutlass")


def _config(head_dim: int, page: int) -> MhaCuteConfig:
    return MhaCuteConfig(
        uri=f"d{head_dim}_ps{page}", head_dim=head_dim, v_head_dim=head_dim, gqa_group=8,
        page_size=page, dtype="bfloat16", kv_dtype="bfloat16", kv_scale="none", spec_topk=0,
        num_draft_tokens=0, arch="sm90", fwd_tile_m=128, fwd_tile_n=page, fwd_num_stages=2,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("head_dim,page", [(64, 64), (128, 128)])
def test_window_softcap_sinks_compile_for_sm90a(head_dim: int, page: int) -> None:
    from attngen.backends.cute_dsl.aot import compile_spec
    from attngen.families.mha.cute_dsl.library import compile_specs

    hooks = MaskHooks(causal=True, window_left=127, logit_softcap=30.0, sinks=True)
    specs = compile_specs(
        _config(head_dim, page), traits=MhaCuteTraits(hooks, ("prefill", "extend"))
    )
    assert [s.name for s in specs] == ["prefill", "extend"]
    for spec in specs:
        res = compile_spec(spec, "sm_90a")
        assert res.spill_bytes == 0, (spec.name, res)
        assert all(n > 0 for n in res.instructions.values()), (spec.name, res.instructions)
        assert set(res.instructions) == {
            "wgmma.mma_async",
            "cp.async.bulk.tensor",
            "HGMMA",
            "UTMALDG",
        }
