"""The CuTe DSL GDN lowering on the CPU: what it says it runs, the chunk kernel's form rule,
the kernels a module compiles, and the launcher's refusals before any launch (the kernels'
numerics are the GPU suite's, tests/families/gdn/gpu; their sm_90a compile is
tests/backends/cute_dsl/test_cute_aot_compile.py's)."""

from __future__ import annotations

import dataclasses

import pytest

from attngen.capabilities import Status, supports
from attngen.families.gdn import base_variant
from attngen.families.gdn.cute_dsl.config import GdnCuteTraits
from attngen.families.gdn.cute_dsl.host.compile import ChunkShape, chunk_shape, compile_specs
from attngen.families.gdn.cute_dsl.lower import kernel_config
from attngen.spec.enums import Arch, Backend, DType, Phase

EXTEND = dataclasses.replace(base_variant(), phases=(Phase.EXTEND,))


def shape(**kw):
    return dataclasses.replace(EXTEND.shape, **kw)


def test_extend_on_sm90_is_lowered() -> None:
    assert supports(EXTEND, Backend.CUTE_DSL, Arch.SM90).ok


@pytest.mark.parametrize(
    "change, arch, reason",
    [
        ({}, Arch.SM100, "sm100 is not lowered"),
        ({}, Arch.SM80, "sm80"),
        (dict(phases=(Phase.EXTEND, Phase.DECODE)), Arch.SM90, "phase decode"),
        (dict(dtype=DType.FP16), Arch.SM90, "activation dtype fp16"),
        (dict(shape=shape(key_dim=64, value_dim=64)), Arch.SM90, "head dims 64/64"),
        (dict(shape=shape(chunk_size=32)), Arch.SM90, "chunk_size 32"),
        (dict(shape=shape(qk_l2norm=False)), Arch.SM90, "L2 norm"),
        (dict(shape=shape(state_dtype=DType.BF16)), Arch.SM90, "bf16 temporal state"),
    ],
)
def test_not_lowered_says_why(change: dict, arch: Arch, reason: str) -> None:
    verdict = supports(dataclasses.replace(EXTEND, **change), Backend.CUTE_DSL, arch)
    assert verdict.status is not Status.SUPPORTED
    assert reason in verdict.reason


def test_form_by_request_heads() -> None:
    """One consumer warpgroup (64 value rows a CTA) below an SM's worth of (request, value
    head) pairs, two (a head's 128 rows) from it on; the group rides along."""
    config = kernel_config(EXTEND, Arch.SM90)
    assert config.two_consumers_min_heads == 132  # sm90's SM count
    assert chunk_shape(config, 16) == ChunkShape(1, 1, early_d=True)
    assert chunk_shape(config, 131) == ChunkShape(1, 1, early_d=True)
    assert chunk_shape(config, 132) == ChunkShape(1, 2)
    assert chunk_shape(config, 256).form == {
        "consumers": 2, "half": True, "t16": True, "early_d": False, "modes": False
    }  # fmt: skip
    assert chunk_shape(config, 16).form["early_d"]
    plain = dataclasses.replace(config, chunk_early_d=0)
    assert not chunk_shape(plain, 16).form["early_d"]


def test_compile_specs_are_the_forms_a_batch_can_take() -> None:
    config = kernel_config(EXTEND, Arch.SM90)
    extend = GdnCuteTraits(("extend",))
    names = [s.name for s in compile_specs(config, traits=extend)]
    assert names == ["prepare", "chunk_c1", "chunk_c2", "chunk_c1_segments"]
    # segments run the one-consumer form, reading each run's mode bits
    segmented = compile_specs(config, traits=extend)[-1].shape
    assert segmented.form == {**chunk_shape(config, 1).form, "modes": True}
    always_two = dataclasses.replace(config, two_consumers_min_heads=1)
    assert [s.name for s in compile_specs(always_two, traits=extend)] == ["prepare", "chunk_c2"]
    no_segments = dataclasses.replace(config, segments_max=1)
    assert [s.name for s in compile_specs(no_segments, traits=extend)] == names[:3]
    assert compile_specs(config, traits=GdnCuteTraits(("decode",))) == []


@pytest.fixture
def batch():
    torch = pytest.importorskip("torch")
    from attngen.families.gdn.cute_dsl.host.launch import chunk_plan

    n, h, dim = 70, 2, 128
    bf16 = dict(dtype=torch.bfloat16)
    i32 = dict(dtype=torch.int32)
    return dict(
        q=torch.randn(n, h, dim, **bf16), k=torch.randn(n, h, dim, **bf16),
        v=torch.randn(n, h, dim, **bf16), a=torch.randn(n, h, **bf16),
        b=torch.randn(n, h, **bf16), A_log=torch.zeros(h), dt_bias=torch.zeros(h),
        ssm_states=torch.zeros(3, h, dim, dim), cache_indices=torch.tensor([1, 2], **i32),
        has_initial_state=torch.zeros(2, **i32),
        query_start_loc=torch.tensor([0, 60, 70], **i32),
        out=torch.empty(n, h, dim, **bf16),
        plan=chunk_plan([60, 10], 64, torch.device("cpu")),
        config=kernel_config(EXTEND, Arch.SM90), scale=dim**-0.5,
    )  # fmt: skip


@pytest.mark.parametrize(
    "change, names",
    [
        (lambda b, t: dict(q=b["q"].to(t.float16)), "q"),
        (lambda b, t: dict(v=b["v"][:, :1]), "v"),
        (lambda b, t: dict(ssm_states=b["ssm_states"][:, :, :64]), "ssm_states"),
        (lambda b, t: dict(cache_indices=b["cache_indices"].long()), "cache_indices"),
        (lambda b, t: dict(out=b["out"][:, :, :64]), "out"),
        ({}, "CUDA tensor"),  # every argument right, on the CPU: no CPU path
    ],
)
def test_launcher_refuses_with_the_argument_named(batch, change, names) -> None:
    import torch

    from attngen.families.gdn.cute_dsl.host.launch import extend
    from attngen.runtime.checks import AttngenInputError

    args = {**batch, **(change(batch, torch) if callable(change) else change)}
    with pytest.raises(AttngenInputError, match=names):
        extend(*[args.pop(n) for n in ("q", "k", "v", "a", "b")], **args)


def test_launcher_refuses_more_requests_than_the_grid_takes() -> None:
    torch = pytest.importorskip("torch")
    from attngen.families.gdn.cute_dsl.host.launch import MAX_RUNS, chunk_plan, extend
    from attngen.runtime.checks import AttngenInputError

    bs, dim = MAX_RUNS + 1, 128  # one token a request, one head
    bf16, i32 = dict(dtype=torch.bfloat16), dict(dtype=torch.int32)
    q, k, v, out = (torch.zeros(bs, 1, dim, **bf16) for _ in range(4))
    a, b = (torch.zeros(bs, 1, **bf16) for _ in range(2))
    with pytest.raises(AttngenInputError, match=f"at most {MAX_RUNS} requests"):
        extend(
            q, k, v, a, b, A_log=torch.zeros(1), dt_bias=torch.zeros(1),
            ssm_states=torch.zeros(2, 1, dim, dim), cache_indices=torch.ones(bs, **i32),
            has_initial_state=torch.zeros(bs, **i32),
            query_start_loc=torch.arange(bs + 1, **i32), out=out,
            plan=chunk_plan([1] * bs, 64, torch.device("cpu")),
            config=kernel_config(EXTEND, Arch.SM90), scale=dim**-0.5,
        )  # fmt: skip


def test_identity_leaves_the_mha_forward_out() -> None:
    """The GDN CuTe kernels borrow the MHA package's shared helpers (``common.py``,
    ``fragments.py``: ``wgmma_group``), not its forward kernel: an edit of
    ``fwd_sm90.py`` must keep the GDN kernels' identity, and their evidence."""
    from pathlib import Path

    from attngen.evidence import imported_family_files, library_source_files
    from attngen.families.gdn.cute_dsl.source import PACKAGE_DIR

    own = library_source_files(PACKAGE_DIR)
    borrowed = {Path(p).name for p in imported_family_files(own, "gdn", PACKAGE_DIR)}
    assert {"common.py", "fragments.py"} <= borrowed
    assert not {"fwd_sm90.py", "fwd_sm100.py", "decode_sm90.py"} & borrowed
