"""transformers model code on attngen's generated backends, judged by the model's own eager
attention (issue 13), on the GPU.

- ``test_generate``: plain ``model.generate()`` with attngen's own paged cache for tiny
  random-weight Llama-3-style GQA, Qwen2 (64-token sliding window on layer 1), Gemma-2
  (softcap 1.0, alternating 64-token windows, scaling 1/16) and gpt-oss (sinks, 128-token
  windows, MoE) models, several page sizes and fp8 KV for Llama: a left-padded batch of 3
  prompts (131..203 tokens, longer than every window), 64 greedy tokens. The model runs in
  fp32, attngen's kernels in bf16 (q/k/v cast, output cast back). Judged: the logits of
  every step against teacher-forced eager fp32 within the bound of ``tf_judge`` (derived
  from the emulated bf16 attention), every layer call against the model's eager attention
  on the same inputs, greedy tokens against eager fp32 generation (a divergence is accepted
  only where eager's own top-2 margin is within twice the bound), and each feature switched
  off must move the logits by more than 3 bounds (the test can see it).
  Also DeepSeek-V3 (MLA: 16 heads of DeepSeek's dims, q LoRA, yarn scaling, interleaved
  rope; attngen's absorbed MLA over its latent pool, page sizes 64 and 1) and Qwen3-Next
  (a GDN layer on attngen's conv + chunked/recurrent delta rule over its state pool, prompts
  of 2-4 chunks; a gated full-attention layer on attngen's MHA), judged the same way with
  their own per-layer judges (``tf_models.MlaLayerJudge`` / ``GdnLayerJudge``).
- ``test_continuous_batching``: ``generate_batch`` with CUDA graphs on, bf16 models,
  ``paged|attngen`` against transformers' own paged attention on its own paged cache
  (``paged|sdpa``; ``paged|eager`` for gpt-oss, which has no sdpa in 5.17): the same
  tokens, or a first divergence where fp32 eager's margin between the two tokens is within
  twice the bf16 model's own logit deviation from fp32.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tf_judge  # noqa: E402
import tf_models as M  # noqa: E402

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")

RUNS = [(name, ps, kv) for name, case in M.CASES.items() for ps, kv in case.runs]
SEED = int(os.environ.get("ATTNGEN_SEED", random.randrange(1 << 20)))


@pytest.mark.parametrize(
    "name,page_size,kv_dtype", RUNS, ids=[f"{n}-ps{p}-{str(k)[6:]}" for n, p, k in RUNS]
)
def test_generate(name: str, page_size: int, kv_dtype: torch.dtype) -> None:
    report = tf_judge.check_generate(M.CASES[name], page_size, kv_dtype, SEED, "cuda")
    print(
        f"seed {SEED}", report.line(), "|", "; ".join(report.choices), "|", "; ".join(report.ties)
    )
    assert not report.failures, f"seed {SEED}: " + "\n".join(report.failures)


CB_CASES = ["llama", "qwen2", "gemma2", "gpt_oss"]


@pytest.mark.parametrize("name", CB_CASES)
def test_continuous_batching(name: str) -> None:
    result = tf_judge.check_continuous_batching(M.CASES[name], SEED, "cuda")
    print(f"seed {SEED}", result.line())
    assert not result.failures, f"seed {SEED}: " + "\n".join(result.failures)
