"""Encoder layers through the transformers integration (CPU, Triton interpreter, fp16).

A SigLIP vision tower (transformers' own modeling code, random weights) runs its attention
layers on attngen's generated non-causal cache-free prefill (``encoder.py``) at head dims
72 (``mha_vision_encoder_siglip``), 64 and 80 (``mha_vision_encoder``). Judged twice:

- every layer's output against a float64 softmax(q k^T * scale) v of the q / k / v that
  layer received, within the kernels' fp16 tolerance (``attngen.testing.tolerance``);
- the tower's last hidden state against the same weights run eagerly in fp32: attngen's
  deviation stays within twice what transformers' own fp16 eager run deviates (the model's
  fp16 rounding outside attention dominates both; a wrong attention is far outside it).

Refused, naming the layer: a non-causal layer that gets a mask (SigLIP's text tower builds
a bidirectional one), and a head dim no encoder spec generates (with the spec to add).
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402
from attngen.integrations.transformers import LayerFeatures, choose  # noqa: E402
from attngen.runtime.checks import AttngenInputError  # noqa: E402

OPTIONS = dict(arch="sm90", backend="triton")  # the interpreter runs Triton only
pytestmark = pytest.mark.xdist_group("transformers-encoder")


@pytest.mark.parametrize("head_dim, heads", [(72, 2), (64, 2), (80, 3)])
def test_siglip_vision_tower_matches_eager(head_dim: int, heads: int) -> None:
    reference = M.siglip_vision_tower(head_dim, heads, seed=head_dim)
    model = copy.deepcopy(reference).half()
    eager_fp16 = copy.deepcopy(reference).half()
    runtime = attngen_tf.enable(model, **OPTIONS)

    calls = M.record_encoder_calls(runtime)
    pixels = torch.randn(3, 3, 40, 40)
    with torch.no_grad():
        want = reference(pixel_values=pixels).last_hidden_state
        got = model(pixel_values=pixels.half()).last_hidden_state
        eager = eager_fp16(pixel_values=pixels.half()).last_hidden_state

    assert len(calls) == 2  # one call a layer, each on attngen's kernel
    M.judge_encoder_tower(calls, got, want, eager, (3, 25, heads, head_dim))


def test_masked_non_causal_layer_is_refused() -> None:
    import transformers

    cfg = transformers.SiglipTextConfig(
        vocab_size=64,
        hidden_size=144,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
    )
    model = transformers.SiglipTextModel(cfg).eval().half()
    attngen_tf.enable(model, **OPTIONS)
    ids = torch.randint(0, 64, (2, 8))
    match = r"\(SiglipAttention\): non-causal attention with a mask"
    with pytest.raises(AttngenInputError, match=match), torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_encoder_head_dim_without_spec_names_the_spec_to_add() -> None:
    features = LayerFeatures(96, 96, 1, None, None, False, causal=False)
    assert features.describe().startswith("bidirectional")
    with pytest.raises(AttngenInputError) as err:
        choose(
            features,
            arch="sm90",
            dtype=torch.float16,
            kv_dtype=torch.float16,
            backend="triton",
            phases=("prefill",),
        )
    text = str(err.value)
    assert "phases: [prefill]" in text and "kind: none" in text and "kv_cache" not in text


def test_encoder_key_of_other_length_is_refused() -> None:
    model = M.siglip_vision_tower(64, 2, seed=1).half()
    runtime = attngen_tf.enable(model, **OPTIONS)
    q = torch.randn(1, 2, 5, 64, dtype=torch.float16)
    k = torch.randn(1, 2, 7, 64, dtype=torch.float16)
    features = LayerFeatures.of_call(q, k, k, None, None, None, causal=False)
    with pytest.raises(AttngenInputError, match=r"key: expected \[1, heads, 5, dim\]"):
        runtime.encoder.attend(q, k, k, scaling=0.125, features=features)
