"""A spec whose speculative.topk is an axis ([1, 4]) generates both configs, and a backend
is built for each of them (the identity key includes the topk)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from attngen.generate import generate
from attngen.runtime.checks import AttngenInputError
from attngen.testing import make_pools
from attngen.testing.paths import REPO_ROOT as ROOT

SPEC = """\
name: mha_topk_axis
family: mha
description: draft chains and trees from one spec
phases: [extend, verify]
heads:
  head_dim: 128
  gqa_group: 4
kv_cache:
  page_size: 1
mask:
  kind: causal
speculative:
  topk: [1, 4]
  num_draft_tokens: 4
targets:
  triton: [sm90]
"""


# construction only (config selection by spec_topk), of bf16 backends on CPU, where the
# Triton interpreter could not run them (tests/runtime/test_kernel_device.py)
pytestmark = pytest.mark.usefixtures("backends_take_cpu")


@pytest.fixture(scope="module")
def backend_cls(tmp_path_factory: pytest.TempPathFactory) -> type:
    root = tmp_path_factory.mktemp("topk")
    (root / "specs").mkdir()
    (root / "specs/topk.yaml").write_text(SPEC, encoding="utf-8")
    generate(ROOT, root / "specs", root / "generated", ("sm90",), check=False)
    sys.path.insert(0, str(root))
    try:
        for name in [m for m in sys.modules if m == "generated" or m.startswith("generated.")]:
            del sys.modules[name]  # the repo's own generated package may be imported already
        module = importlib.import_module("generated.sm90.triton.mha.mha_topk_axis.backend")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "generated" or m.startswith("generated.")]:
            del sys.modules[name]
    return module.Backend


def make(backend_cls: type, **kw: object) -> object:
    dims = dict(num_kv_heads=2, head_dim=128, page_size=1, dtype=torch.bfloat16, device="cpu")
    req_pool, kv_pool = make_pools(
        num_layers=1, max_reqs=2, max_context_len=64, num_pages=64, **dims
    )
    return backend_cls(num_q_heads=8, req_to_token_pool=req_pool, kv_pool=kv_pool, **dims, **kw)


def test_both_topk_configs_are_generated(backend_cls: type) -> None:
    uris = sorted(backend_cls.kernels.CONFIGS)
    assert uris == ["d128_g4_ps1_bf16_causal_topk1", "d128_g4_ps1_bf16_causal_topk4"]


@pytest.mark.parametrize("topk", [1, 4])
def test_a_backend_is_built_for_each_topk(backend_cls: type, topk: int) -> None:
    backend = make(backend_cls, spec_topk=topk)
    assert backend.config.spec_topk == topk
    assert backend.config.uri.endswith(f"topk{topk}")


def test_without_spec_topk_the_error_says_what_to_pass(backend_cls: type) -> None:
    with pytest.raises(AttngenInputError, match="several generated configs.*pass .*spec_topk"):
        make(backend_cls)
