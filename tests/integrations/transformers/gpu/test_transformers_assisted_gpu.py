"""Assisted decoding and prompt lookup on attngen on the GPU (the CPU twin:
``../test_transformers_assisted.py``): each verification forward an extend over the cached
prefix, then transformers crops its cache to the accepted drafts and attngen's rows drop
the rejected ones.

Qwen3-style GQA 4 at head dim 128, a 300-token prompt with repeated n-grams (prompt lookup
drafts from them) and a draft model of the same shapes, 32 new tokens, bf16 and fp16.
attngen's KV pages equal to the keys and values transformers passes from its own cache at
every layer call (``tf_models.cache_mirror``: bitwise, every row) and crops seen. Tokens are
not compared with plain greedy: a verification forward's logits come from the extend kernel
rather than step-by-step decodes, and bf16 rounding may break random weights' near-ties
either way. Written on 2026-12-08 (session 24), not yet run.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402

pytestmark = pytest.mark.gpu
OPTIONS: dict = {}  # as an engine would: the arch and backends detected
SIZES = dict(prompt=300, new=32, hidden=1024)


def _config() -> Any:
    import transformers

    return transformers.Qwen3Config(
        **M._common(
            hidden_size=SIZES["hidden"], intermediate_size=512, vocab_size=M.VOCAB,
            num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        )
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mode", ["assistant_model", "prompt_lookup"])
def test_assisted_decoding(mode: str, dtype: torch.dtype) -> None:
    case = M.Case("qwen3_assisted", _config, (), ())
    model = M.build(case, 0, "cuda").to(dtype)
    runtime = attngen_tf.enable(model, **OPTIONS)
    gen = torch.Generator().manual_seed(4)
    half = SIZES["prompt"] // 2
    ids = torch.randint(1, M.VOCAB, (1, half), generator=gen).repeat(1, 2).cuda()
    settings = dict(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=SIZES["new"],
        min_new_tokens=SIZES["new"], do_sample=False,
    )  # fmt: skip
    checked: list[int] = []
    runtime.observers.append(M.cache_mirror(checked))
    crops = M.record_crops(runtime)
    if mode == "assistant_model":
        draft = copy.deepcopy(M.build(case, 1, "cuda")).to(dtype)
        extra: dict[str, Any] = dict(assistant_model=draft)
    else:
        extra = dict(prompt_lookup_num_tokens=4)
    with torch.no_grad():
        got = model.generate(**settings, **extra)
    print(f"{mode} {dtype}: {len(crops)} crops, {len(checked)} layer calls checked")
    assert checked and crops, (len(checked), crops)
    assert got.shape[1] >= ids.shape[1] + SIZES["new"]
