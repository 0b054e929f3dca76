"""Encoder-decoder models on attngen (CPU, Triton interpreter, fp16): the encoder on the
cache-free path, the decoder's self-attention on plain generate, its cross-attention on the
cross path (``cross.py``: one decode request per query over the encoder's kept keys, packed
into attngen's pages once per generation).

- BART (encoder padding mask: right padding and a left-padded row; 3 decoder layers over 2
  encoder layers, so the decoder's layer indices pass the config's ``num_hidden_layers``):
  teacher-forced logits against fp32 eager, every cross-attention call against float64
  attention of its own inputs under the encoder mask, at pages of 1 and 16 tokens and with
  as many decoder tokens as encoder tokens; greedy generation equal to fp32 eager's, each
  layer's encoder keys written once.
- Whisper (no encoder mask: the cross layers get none): logits and greedy tokens.
- EncoderDecoderModel (BERT to BERT: the decoder's cross-attention in BERT's modeling code).
- ``CrossState`` alone: GQA 4, keys spanning partial pages, holes in the padding and a row
  that keeps no key (eager's uniform softmax: the mean of its values), every output against
  float64; keys reused when the same tensors come again, written again when modified in
  place or replaced.
- A decoder run bidirectionally (``config.is_causal = False``) past its first forward: its
  queries over the cached keys on the cross path, judged per layer (refused before).
"""

from __future__ import annotations

import copy
import types
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402
from attngen.integrations.transformers.cross import KeyPlan  # noqa: E402
from attngen.integrations.transformers.select import LayerFeatures  # noqa: E402
from attngen.testing.tolerance import assert_close  # noqa: E402

OPTIONS = dict(arch="sm90", backend="triton")  # the interpreter runs Triton only
pytestmark = pytest.mark.xdist_group("transformers-encoder-decoder")
SIZES = dict(d_model=128, encoder_ffn_dim=96, decoder_ffn_dim=96, vocab_size=100)
HEADS = dict(encoder_attention_heads=2, decoder_attention_heads=2)  # head dim 64
TOKENS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)


def _whisper() -> Any:
    import transformers

    cfg = transformers.WhisperConfig(
        encoder_layers=2,
        decoder_layers=2,
        num_mel_bins=16,
        max_source_positions=30,
        max_target_positions=40,
        decoder_start_token_id=3,
        begin_suppress_tokens=None,
        suppress_tokens=None,
        **SIZES,
        **HEADS,
        **TOKENS,
    )
    return M.eager_model(transformers.WhisperForConditionalGeneration, cfg, seed=1)


def _encoder_batch(gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (3, 10), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding
    mask[2, :3] = 0  # a left-padded row
    return dict(input_ids=ids, attention_mask=mask)


def _judge_cross(calls: list[tuple], encoder_mask: torch.Tensor | None) -> None:
    assert calls, "no layer ran on attngen's cross path"
    for layer, (q, k, v, scale, out, keys) in enumerate(calls):
        assert out.shape == (q.shape[0], q.shape[2], q.shape[1], v.shape[3])
        if encoder_mask is not None:
            assert keys is not None and torch.equal(keys, encoder_mask.bool())
        want = M.float64_encoder_attention(q, k, v, scale, keys)
        assert_close(out, want, msg=f"cross call {layer}")


@pytest.mark.parametrize("page_size,decoder_tokens", [(16, 4), (1, 4), (16, 10)])
def test_bart_teacher_forced(page_size: int, decoder_tokens: int) -> None:
    """Logits within twice fp16 eager's deviation from fp32 eager; every cross-attention call
    exact against float64 under the encoder mask (10 decoder tokens: as many as the
    encoder's, the mask function cannot tell cross-attention from self-attention by shape)."""
    gen = torch.Generator().manual_seed(2)
    inputs = _encoder_batch(gen)
    inputs["decoder_input_ids"] = torch.randint(3, 100, (3, decoder_tokens), generator=gen)
    run, cross = _against_eager(M.bart(decoder_layers=3), inputs, page_size)
    # the encoder's 2 self-attention layers on the cache-free path
    assert len(run.calls) == 2 + (3 if decoder_tokens == 10 else 0)
    if decoder_tokens == 10:
        assert not cross  # same lengths: the encoder path, whose plan is the same keys
        M.judge_encoder_tower(run, keys=inputs["attention_mask"])
    else:
        assert len(cross) == 3
        _judge_cross(cross, inputs["attention_mask"])
        M.assert_within_eager(run)


def _against_eager(
    reference: Any, inputs: dict[str, torch.Tensor], page_size: int
) -> tuple[M.EagerRun, list[tuple]]:
    """The logits of ``reference`` (fp32 eager), of an fp16 copy on attngen and of one on
    eager, with the attngen copy's cache-free and cross calls."""
    model = copy.deepcopy(reference).half()
    eager = copy.deepcopy(reference).half()
    runtime = attngen_tf.enable(model, page_size=page_size, **OPTIONS)
    encoder, cross = M.record_encoder_calls(runtime), M.record_cross_calls(runtime)
    cast = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        want, got, theirs = (m(**x).logits for m, x in ((reference, inputs), (model, cast),
                                                        (eager, cast)))  # fmt: skip
    return M.EagerRun(want, got, theirs, runtime, encoder), cross


def test_bart_generate_writes_encoder_keys_once() -> None:
    """Greedy tokens equal fp32 eager's; each decoder layer's encoder keys go into attngen's
    pages once per generation (the steps reuse them), again for the next generation."""
    gen = torch.Generator().manual_seed(3)
    inputs = _encoder_batch(gen)
    reference = M.bart(decoder_layers=3)
    M.moderate_scores(reference)
    model = copy.deepcopy(reference).half()
    runtime = attngen_tf.enable(model, page_size=16, **OPTIONS)
    written: list[int] = []
    write = runtime.cross._write

    def counting(layer_id, pages, key, value, dtype):  # noqa: ANN001, ANN202
        before = runtime.cross.written.get(layer_id)
        write(layer_id, pages, key, value, dtype)
        if runtime.cross.written.get(layer_id) is not before:
            written.append(layer_id)

    runtime.cross._write = counting
    settings = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    with torch.no_grad():
        want = reference.generate(**inputs, **settings)
        got = model.generate(**inputs, **settings)
        assert torch.equal(got, want), (got.tolist(), want.tolist())
        assert sorted(written) == [0, 1, 2]
        model.generate(**inputs, max_new_tokens=1, do_sample=False)
    assert sorted(written) == [0, 0, 1, 1, 2, 2]


def test_whisper_forward_and_generate() -> None:
    """Whisper's cross layers get no mask: every query over all 30 encoder frames."""
    gen = torch.Generator().manual_seed(4)
    features = torch.randn(2, 16, 60, generator=gen)
    decoder = torch.randint(3, 100, (2, 5), generator=gen)
    reference = _whisper()
    inputs = dict(input_features=features, decoder_input_ids=decoder)
    run, cross = _against_eager(reference, inputs, 16)
    M.assert_within_eager(run)
    assert len(cross) == 2 and len(run.calls) == 2  # decoder cross layers, encoder layers
    _judge_cross(cross, None)
    model = copy.deepcopy(reference).half()
    attngen_tf.enable(model, page_size=16, **OPTIONS)
    settings = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    with torch.no_grad():
        want = reference.generate(input_features=features, **settings)
        got = model.generate(input_features=features.half(), **settings)
    assert torch.equal(got, want), (got.tolist(), want.tolist())


def test_bert2bert_forward() -> None:
    """transformers' EncoderDecoderModel (a BERT encoder, a BERT decoder with cross-attention
    layers: another modeling file) under an encoder padding mask."""
    import transformers

    sizes = dict(vocab_size=100, hidden_size=128, num_hidden_layers=2, num_attention_heads=2)
    encoder = transformers.BertConfig(intermediate_size=96, **sizes)
    decoder = transformers.BertConfig(
        intermediate_size=96, is_decoder=True, add_cross_attention=True, **sizes
    )
    cfg = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    cfg.decoder_start_token_id, cfg.pad_token_id = 2, 0
    for c in (cfg, cfg.encoder, cfg.decoder):
        c._attn_implementation = "eager"
    torch.manual_seed(7)
    reference = transformers.EncoderDecoderModel(cfg).eval()
    gen = torch.Generator().manual_seed(8)
    inputs = _encoder_batch(gen)
    inputs["decoder_input_ids"] = torch.randint(3, 100, (3, 4), generator=gen)
    run, cross = _against_eager(reference, inputs, 16)
    assert len(cross) == 2 and len(run.calls) == 2
    _judge_cross(cross, inputs["attention_mask"])
    M.assert_within_eager(run)


def _layer(index: int) -> Any:
    return types.SimpleNamespace(layer_idx=index)


def test_cross_state_padding_and_reuse() -> None:
    """GQA 4 over 37 keys (pages of 16: partial pages), holes, and a row that keeps no key;
    the same tensors again reuse the pages, keys modified in place or replaced are written
    again, and each answer is float64's."""
    gen = torch.Generator().manual_seed(5)
    batch, heads, kv_heads, q_len, kv_len, dim = 3, 8, 2, 5, 37, 64
    q = torch.randn(batch, heads, q_len, dim, generator=gen).half()
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).half()
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=gen).half()
    keys = torch.ones(batch, kv_len, dtype=torch.bool)
    keys[0, 5:9] = False  # a hole
    keys[1] = False  # no key at all
    keys[2, 20:] = False
    runtime = attngen_tf.Runtime(types.SimpleNamespace(num_hidden_layers=2), _options())
    state = runtime.cross
    features = LayerFeatures.of_call(q, k, v, None, None, None, causal=True)
    plan = KeyPlan.of(keys, batch, q_len, kv_len)
    assert plan.counts == (33, 0, 20)

    def check(key: torch.Tensor) -> None:
        got = state.attend(
            _layer(1), q, key, v, scaling=0.125, features=features, plan=plan, sinks=None
        )
        want = M.float64_encoder_attention(q, key, v, 0.125, keys)
        assert_close(got, want)

    check(k)
    held = state.written[1]
    check(k)
    assert state.written[1] is held  # reused
    k.mul_(-1)  # in place: its version moves
    check(k)
    assert state.written[1] is not held
    held = state.written[1]
    check(k.clone())  # another tensor
    assert state.written[1] is not held


def _options() -> Any:
    from attngen.integrations.transformers.options import Options

    return Options(page_size=16, **OPTIONS)


def test_bidirectional_decoder_over_its_cache() -> None:
    """``config.is_causal = False`` past the first forward: each layer's new queries over the
    cached and new keys under the padding mask, on the cross path, against float64."""
    config = M.tiny_qwen3(kv_heads=4)
    config.is_causal = False
    model = M.build(M.Case("bidirectional", lambda: config, (), (), vocab=100), 0, "cpu").half()
    runtime = attngen_tf.enable(model, page_size=16, **OPTIONS)
    cross = M.record_cross_calls(runtime)
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        step = torch.ones(2, 2, dtype=torch.long)
        full = torch.cat([mask, torch.ones_like(step)], 1)
        model(input_ids=step, attention_mask=full, past_key_values=out.past_key_values)
    assert len(cross) == 2
    for q, k, _, _, _, keys in cross:
        assert q.shape[2] == 2 and k.shape[2] == 14 and torch.equal(keys, full.bool())
    _judge_cross(cross, full)
