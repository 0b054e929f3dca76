"""Hybrid prefill/decode backends, automatic backend selection, and their docs section.

Dispatch is checked twice: with recording fakes (every method, every mode, arguments passed
through untouched) and with real generated sm90 backends built on CPU (metadata only; no
kernel runs). Selection is checked against the capability model's own reasons.
"""

from __future__ import annotations

import ast
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import attngen.selection as selection
from attngen.capabilities import SUPPORTED, Status, Verdict
from attngen.emit.docs import hybrid_pairs
from attngen.probes import base_variant
from attngen.families.mha.runtime import PagedMhaBackend
from attngen.runtime.batch import ForwardBatch, ForwardMode
from attngen.runtime.checks import AttngenInputError
from attngen.hooks import MaskHooks
from attngen.runtime.graph import DecodeMetadata, ExtendMetadata
from attngen.runtime.hybrid import HybridAttnBackend
from attngen.runtime.select import (
    arch_from_capability,
    available_specs,
    load_backend_class,
    make_backend,
)
from attngen.speed import load_speed
from attngen.selection import (
    PREFERENCE,
    VerifiedSet,
    for_phase,
    select_backend,
)
from attngen.spec.enums import Arch, Backend, Family, Phase
from attngen.spec.loader import load_spec
from attngen.testing import PagedBatchBuilder, make_pools
from attngen.validate import validate
from attngen.testing.paths import REPO_ROOT as ROOT

# these tests build bf16 backends on CPU for what construction and metadata decide, not
# to run their kernels (Triton's interpreter refuses bf16: tests/runtime/test_kernel_device.py)
pytestmark = pytest.mark.usefixtures("backends_take_cpu")

CPU = torch.device("cpu")


# -- fakes ----


class FakeBackend:
    """Records every call; shaped like a generated backend (attributes and methods)."""

    LAYER_ATTRS = PagedMhaBackend.LAYER_ATTRS
    OPTIONAL_LAYER_ATTRS = PagedMhaBackend.OPTIONAL_LAYER_ATTRS

    def __init__(
        self, name: str, pools: tuple[object, object], *, phases=("extend", "decode"), **over
    ):
        self.name = name
        self.calls: list[tuple[str, tuple, dict]] = []
        attrs = dict(
            num_q_heads=8,
            num_kv_heads=2,
            head_dim=64,
            v_head_dim=64,
            page_size=16,
            dtype=torch.bfloat16,
            device=CPU,
            req_to_token_pool=pools[0],
            kv_pool=pools[1],
        )
        attrs.update(over)
        for k, v in attrs.items():
            setattr(self, k, v)
        self.kernels = SimpleNamespace(PHASES=phases, HOOKS=MaskHooks())

    def _record(name: str):  # noqa: N805 (a method factory)
        def method(self, *args, **kwargs):
            self.calls.append((name, args, kwargs))
            return (self.name, name)

        return method

    init_forward_metadata = _record("init_forward_metadata")
    forward_extend = _record("forward_extend")
    forward_decode = _record("forward_decode")
    init_cuda_graph_state = _record("init_cuda_graph_state")
    init_forward_metadata_capture_cuda_graph = _record("init_forward_metadata_capture_cuda_graph")
    init_forward_metadata_replay_cuda_graph = _record("init_forward_metadata_replay_cuda_graph")

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 7 if self.name == "decode" else 1

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class NoGraphBackend(FakeBackend):
    """A prefill backend without CUDA-graph methods."""

    def __getattribute__(self, name: str) -> Any:
        if "cuda_graph" in name:
            raise AttributeError(name)
        return super().__getattribute__(name)


def fake_pair(**decode_over) -> tuple[FakeBackend, FakeBackend, HybridAttnBackend]:
    pools = (object(), object())
    prefill = FakeBackend("prefill", pools)
    decode = FakeBackend("decode", pools, **decode_over)
    return prefill, decode, HybridAttnBackend(prefill, decode)


def batch(mode: ForwardMode) -> ForwardBatch:
    one = torch.ones(1, dtype=torch.int32)
    return ForwardBatch(1, mode, one, one, one, one.long())


EXTEND_LIKE = [ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND]


# -- dispatch with fakes ----


@pytest.mark.parametrize("mode", EXTEND_LIKE)
def test_extend_like_modes_go_to_the_prefill_backend(mode: ForwardMode) -> None:
    prefill, decode, hybrid = fake_pair()
    fb = batch(mode)
    hybrid.init_forward_metadata(fb)
    sinks = torch.zeros(8)
    out = hybrid.forward_extend("q", "k", "v", "layer", fb, save_kv_cache=False, sinks=sinks)
    assert out == ("prefill", "forward_extend")
    assert decode.calls == []
    assert prefill.calls[0] == ("init_forward_metadata", (fb,), {})
    name, args, kwargs = prefill.calls[1]
    assert (name, args) == ("forward_extend", ("q", "k", "v", "layer", fb))
    assert kwargs["save_kv_cache"] is False and kwargs["sinks"] is sinks
    assert hybrid.forward("q", "k", "v", "layer", fb) == ("prefill", "forward_extend")


def test_decode_goes_to_the_decode_backend() -> None:
    prefill, decode, hybrid = fake_pair()
    fb = batch(ForwardMode.DECODE)
    hybrid.init_forward_metadata(fb)
    sinks = torch.ones(8)
    assert hybrid.forward_decode(1, 2, 3, "layer", fb, True, sinks=sinks) == (
        "decode",
        "forward_decode",
    )
    assert prefill.calls == []
    assert decode.calls[1] == ("forward_decode", (1, 2, 3, "layer", fb, True), {"sinks": sinks})
    assert hybrid.forward(1, 2, 3, "layer", fb) == ("decode", "forward_decode")
    assert hybrid.backend_for(ForwardMode.DECODE) is decode


def test_idle_clears_both_backends() -> None:
    prefill, decode, hybrid = fake_pair()
    hybrid.init_forward_metadata(batch(ForwardMode.DECODE))
    fb = batch(ForwardMode.IDLE)
    hybrid.init_forward_metadata(fb)
    assert prefill.calls == [("init_forward_metadata", (fb,), {})]
    assert decode.calls[-1] == ("init_forward_metadata", (fb,), {})
    with pytest.raises(AttngenInputError, match="no forward metadata"):
        hybrid.forward_decode(1, 2, 3, "layer", fb)
    with pytest.raises(AttngenInputError, match="IDLE has no attention"):
        hybrid.forward(1, 2, 3, "layer", fb)


def test_a_forward_must_run_on_the_backend_its_metadata_went_to() -> None:
    _, decode, hybrid = fake_pair()
    with pytest.raises(AttngenInputError, match="forward_extend: no forward metadata"):
        hybrid.forward_extend(1, 2, 3, "layer", batch(ForwardMode.EXTEND))
    hybrid.init_forward_metadata(batch(ForwardMode.EXTEND))
    with pytest.raises(AttngenInputError, match="went to the prefill backend"):
        hybrid.forward_decode(1, 2, 3, "layer", batch(ForwardMode.DECODE))
    assert "forward_decode" not in decode.names()


def test_cuda_graph_methods_go_to_the_decode_backend() -> None:
    prefill, decode, hybrid = fake_pair()
    hybrid.init_cuda_graph_state(8, 16)
    args = (4, 4, "rows", "lens", None, ForwardMode.DECODE, None)
    hybrid.init_forward_metadata_capture_cuda_graph(*args)
    hybrid.forward_decode(1, 2, 3, "layer", "fb")  # the captured forward runs on decode
    replay = (4, "rows", "lens", 40, None, ForwardMode.DECODE, None)
    hybrid.init_forward_metadata_replay_cuda_graph(*replay, seq_lens_cpu="cpu")
    assert hybrid.get_cuda_graph_seq_len_fill_value() == 7
    assert prefill.calls == []
    assert decode.calls == [
        ("init_cuda_graph_state", (8, 16), {}),
        ("init_forward_metadata_capture_cuda_graph", args, {}),
        ("forward_decode", (1, 2, 3, "layer", "fb"), {}),
        ("init_forward_metadata_replay_cuda_graph", replay, {"seq_lens_cpu": "cpu"}),
    ]


def test_extend_like_capture_goes_to_the_prefill_backend() -> None:
    pools = (object(), object())
    prefill, decode = FakeBackend("prefill", pools), FakeBackend("decode", pools)
    hybrid = HybridAttnBackend(prefill, decode, capture_prefill=True)
    hybrid.init_cuda_graph_state(8, 64)
    assert prefill.names() == decode.names() == ["init_cuda_graph_state"]
    args = (2, 8, "rows", "lens", None, ForwardMode.TARGET_VERIFY, "spec")
    hybrid.init_forward_metadata_capture_cuda_graph(*args)
    assert prefill.calls[-1] == ("init_forward_metadata_capture_cuda_graph", args, {})
    hybrid.forward_extend("q", "k", "v", "layer", "fb")
    assert decode.names() == ["init_cuda_graph_state"]


def test_extend_like_capture_without_graph_methods_is_refused() -> None:
    pools = (object(), object())
    prefill, decode = NoGraphBackend("prefill", pools), FakeBackend("decode", pools)
    hybrid = HybridAttnBackend(prefill, decode)
    with pytest.raises(
        AttngenInputError, match="EXTEND goes to the prefill backend.*no CUDA-graph"
    ):
        hybrid.init_forward_metadata_capture_cuda_graph(
            1, 4, "rows", "lens", None, ForwardMode.EXTEND, None
        )
    with pytest.raises(AttngenInputError, match="capture_prefill: .* no CUDA-graph methods"):
        HybridAttnBackend(prefill, decode, capture_prefill=True)  # refused before any allocation
    hybrid.init_cuda_graph_state(1, 1)  # decode alone is fine
    assert decode.names() == ["init_cuda_graph_state"]


# -- construction checks ----


@pytest.mark.parametrize(
    "attr, value",
    [
        ("num_q_heads", 16),
        ("num_kv_heads", 4),
        ("head_dim", 128),
        ("v_head_dim", 32),
        ("page_size", 64),
        ("dtype", torch.float16),
        ("device", torch.device("meta")),
    ],
)
def test_backends_must_agree(attr: str, value: object) -> None:
    with pytest.raises(
        AttngenInputError, match=rf"^decode_backend\.{attr}: expected .*as prefill_backend\.{attr}"
    ):
        fake_pair(**{attr: value})


@pytest.mark.parametrize("attr", ["kv_pool", "req_to_token_pool"])
def test_backends_must_share_the_pools(attr: str) -> None:
    with pytest.raises(
        AttngenInputError, match=rf"^decode_backend\.{attr}: expected the same object"
    ):
        fake_pair(**{attr: object()})


def test_optional_attributes_must_agree_when_both_have_them() -> None:
    pools = (object(), object())
    prefill, decode = FakeBackend("p", pools), FakeBackend("d", pools)
    prefill.kv_cache_dtype = torch.float8_e4m3fn
    HybridAttnBackend(prefill, decode)  # the decode fake does not say: nothing to compare
    decode.kv_cache_dtype = torch.bfloat16
    with pytest.raises(AttngenInputError, match=r"^decode_backend\.kv_cache_dtype: expected"):
        HybridAttnBackend(prefill, decode)
    decode.kv_cache_dtype = torch.float8_e4m3fn
    prefill.config = SimpleNamespace(kv_scale="per_tensor")
    decode.config = SimpleNamespace(kv_scale="per_head")
    with pytest.raises(AttngenInputError, match=r"^decode_backend\.config\.kv_scale: expected"):
        HybridAttnBackend(prefill, decode)


def test_missing_attribute_is_named() -> None:
    pools = (object(), object())
    prefill, decode = FakeBackend("prefill", pools), FakeBackend("decode", pools)
    del decode.page_size
    with pytest.raises(AttngenInputError, match="^decode_backend.page_size: expected an attribute"):
        HybridAttnBackend(prefill, decode)


def test_phases_must_match_the_role() -> None:
    pools = (object(), object())
    decode_only = FakeBackend("d", pools, phases=("decode",))
    extend_only = FakeBackend("e", pools, phases=("extend",))
    with pytest.raises(
        AttngenInputError, match=r"prefill_backend\.kernels\.PHASES: expected to contain 'extend'"
    ):
        HybridAttnBackend(decode_only, decode_only)
    with pytest.raises(
        AttngenInputError, match=r"decode_backend\.kernels\.PHASES: expected to contain 'decode'"
    ):
        HybridAttnBackend(extend_only, extend_only)
    HybridAttnBackend(extend_only, decode_only)  # the natural split


def test_masks_must_agree_except_causal() -> None:
    pools = (object(), object())
    prefill, decode = FakeBackend("p", pools), FakeBackend("d", pools)
    prefill.kernels.HOOKS = MaskHooks(causal=False)
    HybridAttnBackend(prefill, decode)  # decode does not care about causal
    decode.kernels.HOOKS = MaskHooks(window_left=127)
    with pytest.raises(AttngenInputError, match=r"decode_backend\.kernels\.HOOKS\.window_left"):
        HybridAttnBackend(prefill, decode)


# -- real generated backends on CPU ----

SHAPE = dict(num_q_heads=4, num_kv_heads=4, head_dim=64, page_size=16, dtype=torch.bfloat16)


@pytest.fixture
def pools():
    return make_pools(
        num_layers=1,
        max_reqs=8,
        max_context_len=256,
        num_pages=64,
        page_size=16,
        num_kv_heads=4,
        head_dim=64,
        dtype=torch.bfloat16,
        device="cpu",
    )


def backend_kwargs(pools) -> dict[str, Any]:
    req_pool, kv_pool = pools
    return dict(SHAPE, device="cpu", req_to_token_pool=req_pool, kv_pool=kv_pool)


def test_make_backend_builds_a_real_hybrid(pools) -> None:
    hybrid = make_backend(
        "sm90", "mha_gqa_paged", prefill_spec="mha_bidirectional", **backend_kwargs(pools)
    )
    assert isinstance(hybrid, HybridAttnBackend)
    prefill, decode = hybrid.prefill_backend, hybrid.decode_backend
    assert (prefill.spec_name, prefill.arch) == ("mha_bidirectional", "sm90")
    assert (decode.spec_name, decode.arch) == ("mha_gqa_paged", "sm90")
    assert prefill.kv_pool is decode.kv_pool is hybrid.kv_pool is pools[1]
    assert hybrid.head_dim == 64 and hybrid.page_size == 16

    builder = PagedBatchBuilder(*pools, seed=0)
    ext = builder.extend([0, 20], [5, 3]).batch
    hybrid.init_forward_metadata(ext)
    assert isinstance(prefill.forward_metadata, ExtendMetadata)
    assert decode.forward_metadata is None
    assert prefill.forward_metadata.num_tokens == 8

    dec = builder.decode([9, 33, 17]).batch
    hybrid.init_forward_metadata(dec)
    assert isinstance(decode.forward_metadata, DecodeMetadata)
    assert decode.forward_metadata.batch_size == 3
    assert isinstance(prefill.forward_metadata, ExtendMetadata)  # untouched, but not used:
    with pytest.raises(AttngenInputError, match="went to the decode backend"):
        hybrid.forward_extend(None, None, None, None, ext)

    idle = dataclasses.replace(dec, forward_mode=ForwardMode.IDLE)
    hybrid.init_forward_metadata(idle)
    assert prefill.forward_metadata is None and decode.forward_metadata is None


def test_real_hybrid_cuda_graph_state_is_the_decode_backends(pools, monkeypatch) -> None:
    hybrid = make_backend(
        "sm90", "mha_gqa_paged", prefill_spec="mha_bidirectional", **backend_kwargs(pools)
    )
    prefill, decode = hybrid.prefill_backend, hybrid.decode_backend
    hybrid.init_cuda_graph_state(4, 4)
    assert decode._graph_buffers
    assert not prefill._graph_buffers
    dec = PagedBatchBuilder(*pools, seed=1).decode([5, 40]).batch
    hybrid.init_forward_metadata_capture_cuda_graph(
        2, 2, dec.req_pool_indices, dec.seq_lens, None, ForwardMode.DECODE, None
    )
    assert isinstance(decode.forward_metadata, DecodeMetadata)
    assert prefill.forward_metadata is None
    assert hybrid.get_cuda_graph_seq_len_fill_value() == decode.seq_len_fill_value
    # an extend-like capture reaches the prefill backend (which decides whether it can)
    seen = []
    monkeypatch.setattr(
        prefill, "init_forward_metadata_capture_cuda_graph", lambda *a: seen.append(a)
    )
    args = (2, 8, dec.req_pool_indices, dec.seq_lens, None, ForwardMode.TARGET_VERIFY, None)
    hybrid.init_forward_metadata_capture_cuda_graph(*args)
    assert seen == [args]


def test_make_backend_same_spec_is_not_hybrid(pools) -> None:
    one = make_backend(
        "sm90", "mha_gqa_paged", decode_spec="mha_gqa_paged", **backend_kwargs(pools)
    )
    assert type(one) is load_backend_class("sm90", "mha_gqa_paged")
    plain = make_backend("sm100", "mha_gqa_paged", **backend_kwargs(pools))
    assert (plain.spec_name, plain.arch) == ("mha_gqa_paged", "sm100")


def test_make_backend_refuses_an_extend_only_decode_spec(pools) -> None:
    with pytest.raises(AttngenInputError, match=r"decode_backend\.kernels\.PHASES.*'decode'"):
        make_backend(
            "sm90", "mha_gqa_paged", decode_spec="mha_bidirectional", **backend_kwargs(pools)
        )


def test_make_backend_refuses_mismatched_masks() -> None:
    req_pool, kv_pool = make_pools(
        num_layers=1,
        max_reqs=4,
        max_context_len=64,
        num_pages=8,
        page_size=16,
        num_kv_heads=1,
        head_dim=64,
        dtype=torch.bfloat16,
        device="cpu",
    )
    kw = dict(
        num_q_heads=8,
        num_kv_heads=1,
        head_dim=64,
        page_size=16,
        dtype=torch.bfloat16,
        device="cpu",
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
    )
    with pytest.raises(AttngenInputError, match=r"HOOKS\.window_left: expected 127"):
        make_backend("sm90", "mha_gpt_oss_full", prefill_spec="mha_gpt_oss_swa", **kw)


def test_make_backend_unknown_spec_lists_the_available_ones() -> None:
    on_disk = sorted({p.parent.name for p in (ROOT / "generated/sm90").glob("*/*/*/backend.py")})
    assert sorted(available_specs("sm90")) == on_disk and "mha_gqa_paged" in on_disk
    with pytest.raises(AttngenInputError) as err:
        make_backend("sm90", "mha_nope", num_q_heads=1)
    msg = str(err.value)
    assert "'mha_nope'" in msg and "generated/sm90/" in msg
    assert f"available: {', '.join(on_disk)}" in msg
    with pytest.raises(AttngenInputError, match="'mha_nope'"):
        make_backend("sm80", "mha_gqa_paged", prefill_spec="mha_nope")
    with pytest.raises(
        AttngenInputError, match="arch: expected one of sm80, sm90, sm100, got 'sm75'"
    ):
        make_backend("sm75", "mha_gqa_paged")
    with pytest.raises(AttngenInputError, match="decode_spec is required"):
        make_backend("sm90", None, prefill_spec="mha_gqa_paged")
    gdn = [s for s, where in available_specs("sm90").items() if ("triton", "gdn") in where]
    assert gdn == [
        "gdn_e2e_qwen3_5",
        "gdn_e2e_qwen3_next",
        "gdn_gva1",
        "gdn_qwen3_5",
        "gdn_qwen3_next",
    ]
    with pytest.raises(AttngenInputError, match="no generated backend on cute_dsl for sm90"):
        make_backend("sm90", "mha_gqa_paged", backend="cute_dsl")


@pytest.mark.parametrize(
    "cap, arch",
    [
        ((8, 0), "sm80"),
        ((8, 6), "sm80"),
        ((8, 9), "sm80"),
        ((9, 0), "sm90"),
        ((10, 0), "sm100"),
        ((10, 3), "sm100"),
    ],
)
def test_arch_from_capability(cap: tuple[int, int], arch: str) -> None:
    assert arch_from_capability(*cap) == arch


@pytest.mark.parametrize("cap", [(7, 5), (9, 1), (12, 0), (11, 0)])
def test_arch_from_capability_refuses_others(cap: tuple[int, int]) -> None:
    with pytest.raises(
        AttngenInputError, match=rf"compute capability {cap[0]}\.{cap[1]}: .*sm80, sm90, sm100"
    ):
        arch_from_capability(*cap)


# -- selection ----


def test_preference_order() -> None:
    assert PREFERENCE == {
        Arch.SM100: (Backend.CUTE_DSL, Backend.TRITON),
        Arch.SM90: (Backend.CUTE_DSL, Backend.TRITON),
        Arch.SM80: (Backend.TRITON,),
    }


@pytest.mark.parametrize("arch", list(Arch))
@pytest.mark.parametrize("phase", [Phase.EXTEND, Phase.DECODE])
def test_mha_resolves_by_preference_and_says_why(arch: Arch, phase: Phase) -> None:
    sel = select_backend(base_variant(Family.MHA), arch.value, phase.value)
    assert sel.ok and sel.status is Status.SUPPORTED and sel.skipped == ()
    assert (sel.arch, sel.phase, sel.verified) == (arch, phase, None)
    # CuTe DSL gathers pages of 1 (extend and split-KV decode on sm90 and sm100); sm80 has
    # no CuTe DSL backend in its preference order
    want = Backend.TRITON if arch is Arch.SM80 else Backend.CUTE_DSL
    assert sel.backend is want
    assert sel.reason.startswith(f"{want.value} is the first supported backend")
    assert str(sel).startswith(f"{arch.value} {phase.value}: {want.value} (")
    if arch is Arch.SM80:
        assert "cute_dsl" not in sel.reason


@pytest.mark.parametrize("arch", list(Arch))
def test_gdn_selects_triton(arch: Arch) -> None:
    """GDN decode is lowered in Triton only: CuTe DSL (where the arch has it) is skipped
    with its reason (sm90: its GDN package lowers extend; sm100: none)."""
    sel = select_backend(base_variant(Family.GDN), arch, Phase.DECODE)
    assert sel.ok and sel.backend is Backend.TRITON and sel.status is Status.SUPPORTED
    skipped = [s.backend for s in sel.skipped]
    assert skipped == [b for b in PREFERENCE[arch] if b is not Backend.TRITON]
    if skipped:
        why = "phase decode is not lowered" if arch is Arch.SM90 else "sm100 is not lowered"
        assert why in sel.reason


def test_gdn_extend_selects_cute_dsl_on_sm90() -> None:
    """GDN prefill / extend: the CuTe DSL chunk kernel on sm90 (first in the preference
    order), Triton elsewhere."""
    for arch in Arch:
        sel = select_backend(base_variant(Family.GDN), arch, Phase.EXTEND)
        want = Backend.CUTE_DSL if arch is Arch.SM90 else Backend.TRITON
        assert sel.ok and sel.backend is want, (arch, sel.reason)


def test_dsa_on_sm80_is_unsupported() -> None:
    sel = select_backend(base_variant(Family.DSA), Arch.SM80, Phase.EXTEND)
    assert sel.backend is None and sel.status is Status.UNSUPPORTED
    assert "fp8 e4m3" in sel.reason


def test_selection_judges_one_phase(monkeypatch) -> None:
    """supports() sees the variant narrowed to the asked phase only."""
    asked = []

    def fake_supports(variant, backend, arch):
        asked.append(variant.phases)
        if Phase.VERIFY in variant.phases:
            return Verdict(Status.NOT_LOWERED, "verify is not lowered (fake)")
        return SUPPORTED

    monkeypatch.setattr(selection, "supports", fake_supports)
    v = base_variant(Family.MHA)
    phases = (Phase.EXTEND, Phase.DECODE, Phase.VERIFY)
    v = dataclasses.replace(v, phases=phases)
    assert select_backend(v, Arch.SM80, Phase.DECODE).backend is Backend.TRITON
    assert asked == [(Phase.DECODE,)]
    verify = select_backend(v, Arch.SM80, Phase.VERIFY)
    assert verify.backend is None and verify.status is Status.NOT_LOWERED
    assert verify.reason == "no backend available: triton: verify is not lowered (fake)"
    assert for_phase(v, "decode").phases == (Phase.DECODE,)
    assert v.phases == phases  # the caller's variant is untouched
    with pytest.raises(ValueError, match="phase prefill is not one of the spec's phases"):
        select_backend(v, Arch.SM90, Phase.PREFILL)


@pytest.fixture
def cute_supported(monkeypatch):
    """Pretend CuTe DSL is lowered, to exercise the order and the evidence preference."""
    monkeypatch.setattr(selection, "supports", lambda variant, backend, arch: SUPPORTED)


def test_evidence_prefers_a_verified_backend(cute_supported) -> None:
    v = base_variant(Family.MHA)
    assert select_backend(v, Arch.SM90, Phase.DECODE).backend is Backend.CUTE_DSL
    only_triton = VerifiedSet(
        frozenset({(Backend.TRITON, Arch.SM90, v.qualified_uri, Phase.DECODE)})
    )
    sel = select_backend(v, Arch.SM90, Phase.DECODE, evidence=only_triton)
    assert sel.backend is Backend.TRITON and sel.verified is True
    assert "with verified GPU decode" in sel.reason
    assert [str(s) for s in sel.skipped] == [
        "cute_dsl: supported, but no verified GPU decode evidence"
    ]
    # evidence for another phase or arch does not count; the order then decides
    sel = select_backend(v, Arch.SM90, Phase.EXTEND, evidence=only_triton)
    assert sel.backend is Backend.CUTE_DSL and sel.verified is False
    assert "no backend has verified GPU extend evidence" in sel.reason
    assert (
        select_backend(v, Arch.SM100, Phase.DECODE, evidence=only_triton).backend
        is Backend.CUTE_DSL
    )


def test_a_spec_is_served_only_by_its_targets(cute_supported) -> None:
    spec = load_spec(ROOT / "specs/mha/gqa_paged.yaml", ROOT)
    variant = validate(spec)[0]
    sel = select_backend(variant, Arch.SM90, Phase.EXTEND)
    assert sel.backend is Backend.TRITON
    assert "cute_dsl: supported, but spec mha_gqa_paged does not target it" in sel.reason


def test_real_spec_variants_resolve_to_triton() -> None:
    for name in ("gqa_paged", "gpt_oss", "bidirectional"):
        spec = load_spec(ROOT / f"specs/mha/{name}.yaml", ROOT)
        for variant in validate(spec):
            for phase in variant.phases:
                for arch in Arch:
                    assert select_backend(variant, arch, phase).backend is Backend.TRITON


# -- docs ----


def test_support_matrix_documents_selection_from_code() -> None:
    for ext in ("md", "mdx"):
        text = (ROOT / f"generated/docs/support_matrix.{ext}").read_text(encoding="utf-8")
        section = text.split("## Backend selection", 1)[1].split("## Generated variants", 1)[0]
        assert "attngen.selection.select_backend" in section
        speed = load_speed(ROOT)  # the docs select with the recorded speed evidence
        for arch, order in PREFERENCE.items():
            cells = " → ".join(f"`{b.value}`" for b in order)
            assert f"| {arch.value} | {cells} |" in section
        for family in Family:
            for phase in selection.SELECTION_PHASES:
                for arch in Arch:
                    sel = select_backend(base_variant(family), arch, phase, speed=speed)
                    assert sel.reason in section
        mha_row = next(
            r for r in section.splitlines() if r.startswith("| MHA |") and "| decode |" in r
        )
        # sm90 and sm100 decode: CuTe DSL's split-KV decode; sm80: Triton
        assert mha_row.count("`triton` (") == 1 and mha_row.count("`cute_dsl` (") == 2
        # GDN decode: Triton on every arch; extend: the CuTe DSL chunk kernel on sm90
        gdn_rows = [r for r in section.splitlines() if r.startswith("| GDN |")]
        decode = next(r for r in gdn_rows if "| decode |" in r)
        extend = next(r for r in gdn_rows if "| extend |" in r)
        assert decode.count("`triton` (") == len(Arch)
        assert extend.count("`triton` (") == len(Arch) - 1 and extend.count("`cute_dsl` (") == 1
        assert "### Hybrid prefill/decode backends" in section
        assert "make_backend(" in section and "prefill_spec=" in section


def test_docs_hybrid_pairs_are_accepted_by_the_runtime() -> None:
    from attngen.generate import build

    plans = build(ROOT, ROOT / "specs", verbose=False).plans
    pairs = hybrid_pairs(list(plans))
    assert pairs, "the docs example needs at least one generated hybrid pair"
    for pair in pairs:
        key = pair.shared[0]
        head_dim, v_head_dim, group, page_size = (
            key.head_dim,
            key.v_head_dim,
            key.gqa_group,
            key.page_size,
        )
        act, kv = getattr(torch, key.dtype), getattr(torch, key.kv_dtype)
        req_pool, kv_pool = make_pools(
            num_layers=1,
            max_reqs=2,
            max_context_len=32,
            num_pages=4,
            page_size=page_size,
            num_kv_heads=2,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            dtype=kv,
            device="cpu",
        )
        extra = {} if kv is act else {"kv_cache_dtype": kv}
        for arch in pair.archs:
            hybrid = make_backend(
                arch.value,
                pair.decode,
                prefill_spec=pair.prefill,
                num_q_heads=2 * group,
                num_kv_heads=2,
                head_dim=head_dim,
                v_head_dim=v_head_dim,
                page_size=page_size,
                dtype=act,
                device="cpu",
                req_to_token_pool=req_pool,
                kv_pool=kv_pool,
                **extra,
            )
            assert isinstance(hybrid, HybridAttnBackend), pair


def test_docs_hybrid_example_runs_as_written() -> None:
    """The support matrix's make_backend example runs as printed (on the CPU instead of
    "cuda"), given the pools and the batch it names but does not build: imports included."""
    for ext in ("md", "mdx"):
        text = (ROOT / f"generated/docs/support_matrix.{ext}").read_text(encoding="utf-8")
        section = text.split("### Hybrid prefill/decode backends", 1)[1]
        source = section.split("```python\n", 1)[1].split("```", 1)[0]
        call = next(
            n
            for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "make_backend"
        )
        kw = {k.arg: k.value for k in call.keywords}
        shape = {
            name: ast.literal_eval(kw[name]) for name in ("num_kv_heads", "head_dim", "page_size")
        }
        v_head_dim = ast.literal_eval(kw["v_head_dim"]) if "v_head_dim" in kw else None
        kv_dtype = kw.get("kv_cache_dtype", kw["dtype"])
        req_pool, kv_pool = make_pools(
            num_layers=1,
            max_reqs=4,
            max_context_len=64,
            num_pages=8,
            v_head_dim=v_head_dim,
            dtype=getattr(torch, kv_dtype.attr),
            device="cpu",
            **shape,
        )
        batch = PagedBatchBuilder(req_pool, kv_pool).extend([0, 5], [4, 3]).batch
        scope = {"req_to_token_pool": req_pool, "kv_pool": kv_pool, "forward_batch": batch}
        exec(compile(source.replace('"cuda"', '"cpu"'), f"support_matrix.{ext}", "exec"), scope)
        assert isinstance(scope["backend"], HybridAttnBackend)


def test_docs_hybrid_pairs_compute_one_attention() -> None:
    """The matrix's hybrid pairs (and its example) never pair a bidirectional prefill with a
    causal decode: the hooks agree, causal included."""
    from attngen.generate import build

    plans = build(ROOT, ROOT / "specs", verbose=False).plans
    hooks = {p.spec.name: p.hooks for p in plans}
    pairs = hybrid_pairs(list(plans))
    assert pairs
    for pair in pairs:
        assert hooks[pair.prefill].causal == hooks[pair.decode].causal, pair
    assert "mha_bidirectional" not in {p.prefill for p in pairs}
