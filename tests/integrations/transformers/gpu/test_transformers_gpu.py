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
  their own per-layer judges (``tf_models.MlaLayerJudge`` / ``GdnLayerJudge``); DeepSeek-V3
  also over an fp8 e4m3 latent cache. And DeepSeek-V3.2 (DSA: the same MLA plus its
  indexer, 64 heads x 128, top-64 of prompts of 131..203 + 64 tokens, spec
  ``dsa_e2e_deepseek_v32``): attngen's fp8 indexer and sparse MLA with the module's own
  weights. ``DsaLayerJudge`` checks every indexer pick against the float64 top-k of
  transformers' formula on DeepSeek-V3.2's fp8 inputs (equal up to ties at the kernel's
  rounding) and reports how many of transformers' own fp32 picks attngen keeps; the sparse
  attention against eager attention masked to attngen's picks; the teacher-forced
  references replay attngen's picks, and dense attention in their place must move the
  logits by more than 3 bounds. The greedy reference picks from the fp8 scores too.
  Each passing run records ``decode`` evidence (detail ``via=transformers-<model>``) for
  every generated config that served one of its layers: the ``*_e2e_*`` specs the
  integration picks are verified by the models they serve (their prompts run extend with
  no cached prefix, less than the ``extend`` check asks, so that is not recorded).
  The seed is random per session (``ATTNGEN_SEED`` fixes it). Qwen3-Next at seed 12
  failed (2026-12-06, H100, at a93415d and cc60ca5 alike), its logits 1.15x the bound at
  step 55 of row 2 with every layer within its own bound: the integration hands attngen's
  conv its weight and bias in bf16 and the emulation kept them fp32. Rounded as run
  (``GdnLayerJudge._reference``), the Qwen3 tests pass at seed 12 (56693a2, H100).
- ``test_greedy_tokens_exact``: the acceptance's token equality, made exact: for every
  model, a fixed seed and an input-embedding scale (``tf_models.margin_case``: the residual
  stream dominated by the current token's embedding, every feature still on) for which eager
  fp32's top-1/top-2 margin exceeds twice the logit bound at all 64 steps of every row. The
  test ASSERTS that precondition (it fails loudly, not vacuously, if a config stops
  satisfying it) and then requires attngen's greedy tokens to equal eager fp32's exactly;
  the logit, per-layer and power checks of ``test_generate`` apply as well. The rule that
  chose the (scale, seed) pairs, applied once on CPU (fp32 eager margins over the emulated
  bf16 bound, ``EXACT``): the seed with the largest min margin / (2 x bound) among seeds
  0-3 (0-2 for DeepSeek-V3 and Qwen3-Next: slow on CPU) at scale 1e4, or at 3e4 if that
  is below 4; and (asserted too) the emulated bf16 deviation must exceed 4 fp32 ulps of
  the logits, so that the bound measures bf16 rounding and not fp32 noise: Gemma-2, which
  multiplies its embeddings by sqrt(hidden) and normalizes every block's output, reached
  that floor at 1e4 (its bf16 and fp16 emulations moved the logits by the same 1-2 ulps),
  so it uses the largest of 1e3 / 300 that clears it (300). DeepSeek-V3.2 joined on
  2026-12-05 with its indexer in the model's dtype (not yet run on the GPU then; see
  ``EXACT``).
- ``test_continuous_batching_exact``: the same rule for ``generate_batch`` with CUDA graphs:
  an fp32 model on ``paged|attngen`` (bf16 kernels on K/V cast from transformers' fp32
  paged cache) against transformers' own paged attention on the same fp32 model; the
  reference's tokens must be eager fp32's picks with margins above twice the bound
  (asserted), and attngen's tokens must equal the reference's exactly.
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
def test_generate(name: str, page_size: int, kv_dtype: torch.dtype, evidence) -> None:
    report = tf_judge.check_generate(M.CASES[name], page_size, kv_dtype, SEED, "cuda")
    print(
        f"seed {SEED}", report.line(), "|", "; ".join(report.choices), "|", "; ".join(report.ties)
    )
    assert not report.failures, f"seed {SEED}: " + "\n".join(report.failures)
    # every config that served a layer decoded 64 steps inside the model, judged against
    # its eager attention: decode evidence. (Its prompts ran the extend path without a
    # cached prefix, less than the extend check asks, so no extend evidence.)
    for module, uri in report.served:
        evidence.record(module, uri, "decode", via=f"transformers-{name}")


CB_CASES = ["llama", "qwen2", "gemma2", "gpt_oss"]


@pytest.mark.parametrize("name", CB_CASES)
def test_continuous_batching(name: str) -> None:
    result = tf_judge.check_continuous_batching(M.CASES[name], SEED, "cuda")
    print(f"seed {SEED}", result.line())
    assert not result.failures, f"seed {SEED}: " + "\n".join(result.failures)


# (input-embedding scale, seed) per model: see the module docstring for the rule
# CPU margin ratios at the choice: llama 52.7, qwen2 11.8 (1e4: <= 1.7), gemma2 49.1,
# gpt_oss 17.7, deepseek_v3 24.6, qwen3_next 51.7 (1e4: <= 2.7), deepseek_v32 5.29 (seeds
# 0-3 at 1e4: 5.29, 2.73, 5.24, 0.33; 2026-12-05, with the model's own fp32 indexer, which
# attngen's default indexer matches: its top-k is discontinuous, but with the residual
# stream dominated by the embedding the bf16 attention of an earlier layer moves a later
# indexer's inputs far less than at scale 1, where two greedy steps flipped a pick).
EXACT = {
    "llama": (1e4, 1, 1),  # (scale, seed, page size)
    "qwen2": (3e4, 2, 16),
    "gemma2": (300, 2, 64),
    "gpt_oss": (1e4, 1, 16),
    "deepseek_v3": (1e4, 2, 64),
    "qwen3_next": (3e4, 2, 16),
    "deepseek_v32": (1e4, 0, 64),
}


@pytest.mark.parametrize("name", list(EXACT))
def test_greedy_tokens_exact(name: str) -> None:
    scale, seed, page_size = EXACT[name]
    case = M.margin_case(M.CASES[name], scale)
    report = tf_judge.check_generate(
        case, page_size, torch.bfloat16, seed, "cuda", exact_tokens=True
    )
    print(f"seed {seed}", report.line(), "|", "; ".join(report.choices))
    assert not report.failures, f"seed {seed}: " + "\n".join(report.failures)


# (input-embedding scale, seed): the first of seeds 0-3 at scale 3e4 whose min margin /
# (2 x bound) over the 6 requests on CPU (fp32 eager, emulated bf16 bound) was >= 4:
# llama 51.7 (seed 0: 0.6), qwen2 16.1 (seed 0: 0.26), gemma2 14.6 (at 300, see above),
# gpt_oss 133.
CB_EXACT = {"llama": (3e4, 1), "qwen2": (3e4, 1), "gemma2": (300, 0), "gpt_oss": (3e4, 0)}


@pytest.mark.parametrize("name", list(CB_EXACT))
def test_continuous_batching_exact(name: str) -> None:
    scale, seed = CB_EXACT[name]
    case = M.margin_case(M.CASES[name], scale)
    report = tf_judge.check_continuous_batching_exact(case, seed, "cuda")
    print(f"seed {seed}", report.line())
    assert not report.failures, f"seed {seed}: " + "\n".join(report.failures)
