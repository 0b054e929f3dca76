"""Every head dim the Triton MHA capability model accepts lowers on every arch: the tile
tables are keyed by padded head dims, and a dim the capability model gained without a
table entry crashed ``validate`` with a KeyError (head dim 32, before the 64-tile floor)."""

from __future__ import annotations

import pytest

from attngen.cli import main
from attngen.families.mha.triton.capability import HEAD_DIMS

SPEC = """name: head_dims_{qk}
family: mha
description: every phase at one head dim
phases: [prefill, extend, decode, verify, draft_extend]
dtype: [bf16, fp16]
heads:
  head_dim: {qk}
  gqa_group: [1, 8]
kv_cache:
  page_size: [1, 16]
  dtype: [auto, fp8_e5m2]
  scale: per_tensor
mask:
  kind: causal
speculative:
  topk: 1
  num_draft_tokens: 4
targets:
  triton: [sm80, sm90, sm100]
"""


@pytest.mark.parametrize("qk", sorted(HEAD_DIMS))
def test_each_accepted_head_dim_lowers_on_every_arch(tmp_path, qk, capsys):
    path = tmp_path / f"head_dims_{qk}.yaml"
    path.write_text(SPEC.format(qk=qk))
    assert main(["validate", str(path)]) == 0, capsys.readouterr()
    assert "ok (" in capsys.readouterr().out
