"""Encoder-decoder models on the GPU (the CPU twin: ``../test_transformers_encoder_decoder.py``):
the decoder's cross-attention as decode requests over the encoder's kept keys (``cross.py``).

BART (head dim 64, 8 heads) under an encoder padding mask of every kind
(``tf_models.padded_rows``: left, right, holes, one kept token, none kept), 8 rows of up to
300 tokens; Whisper at whisper-tiny's attention shapes (6 heads of 64, 1500 encoder frames,
no mask). bf16 and fp16. Teacher-forced logits against fp32 eager within twice the deviation
of transformers' eager run in the model's dtype; every cross-attention call, teacher-forced
and in greedy generation, against a float64 softmax of what that call received, at every
position.
Passed on an H100 80GB HBM3 on 2026-12-08 (session 24;
bench/results/transformers-gpu-*-2026-12-08-*-h100.log).
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
from attngen.testing.tolerance import assert_close  # noqa: E402

pytestmark = pytest.mark.gpu
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
TOKENS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, vocab_size=M.VOCAB)
# rows, encoder tokens, decoder tokens of the teacher-forced forward
OPTIONS: dict = {}  # as an engine would: the arch and backends detected
BART = dict(rows=8, tokens=300, decoder=20)
WHISPER = dict(rows=4, frames=1500, decoder=8)  # 1500 encoder frames: 3000 mel frames


def _bart() -> Any:
    return M.bart(**M.BART_WIDE).cuda()


def _whisper() -> Any:
    import transformers

    cfg = transformers.WhisperConfig(
        d_model=384, encoder_layers=2, decoder_layers=2, encoder_attention_heads=6,
        decoder_attention_heads=6, encoder_ffn_dim=256, decoder_ffn_dim=256, num_mel_bins=80,
        max_source_positions=WHISPER["frames"], max_target_positions=64, decoder_start_token_id=3,
        begin_suppress_tokens=None, suppress_tokens=None, **TOKENS,
    )  # fmt: skip
    return M.eager_model(transformers.WhisperForConditionalGeneration, cfg, seed=1).cuda()


def _judge(calls: list[tuple], keys: torch.Tensor | None) -> None:
    assert calls, "no layer ran on attngen's cross path"
    for i, (q, k, v, scale, out, kept) in enumerate(calls):
        if keys is not None:
            assert kept is not None and torch.equal(kept, keys.cpu().bool())
        want = M.float64_encoder_attention(q, k, v, scale, kept)
        assert_close(out, want, msg=f"cross call {i}")


def _run(reference: Any, inputs: dict, decoder: torch.Tensor, dtype: torch.dtype, keys: Any):
    model = copy.deepcopy(reference).to(dtype)
    eager = copy.deepcopy(reference).to(dtype)
    runtime = attngen_tf.enable(model, **OPTIONS)
    calls = M.record_cross_calls(runtime)
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        want = reference(**inputs, decoder_input_ids=decoder).logits
        got = model(**cast, decoder_input_ids=decoder).logits
        theirs = eager(**cast, decoder_input_ids=decoder).logits
    M.assert_within_eager(M.EagerRun(want, got, theirs, runtime, []))
    _judge(calls, keys)
    chosen = sorted(c.describe() for c in runtime.cross.choices.values())
    print(f"{type(reference).__name__} {dtype}: cross layers on {chosen}")
    calls.clear()
    with torch.no_grad():
        tokens = model.generate(**cast, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert tokens.shape[1] >= 8
    _judge(calls, keys)


@DTYPES
def test_bart_padded(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    rows, tokens = BART["rows"], BART["tokens"]
    ids = torch.randint(3, M.VOCAB, (rows, tokens), generator=gen).cuda()
    mask = M.padded_rows(rows, tokens, seed=2).cuda()
    decoder = torch.randint(3, M.VOCAB, (rows, BART["decoder"]), generator=gen).cuda()
    _run(_bart(), dict(input_ids=ids, attention_mask=mask), decoder, dtype, mask)


@DTYPES
def test_whisper(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    rows = WHISPER["rows"]
    features = torch.randn(rows, 80, 2 * WHISPER["frames"], generator=gen).cuda()
    decoder = torch.randint(3, M.VOCAB, (rows, WHISPER["decoder"]), generator=gen).cuda()
    _run(_whisper(), dict(input_features=features), decoder, dtype, None)
