"""Causal layers of models that do not generate, on attngen's cache-free prefill (CPU, Triton
interpreter, fp16).

A model without a generation head (``can_generate()`` False: CLIP's text tower and CLIP
itself, a base ``Qwen3Model``, sequence / token classifiers, reward models) never decodes
with a cache, so ``enable`` serves its plain causal layers (no window, no sinks) as encoder
layers are served: each row's kept tokens are one causal request, any padding pattern (left,
right, holes), and every position equals eager attention: a padded position after kept
tokens attends to the kept keys before it (a bidirectional request over copies of them, on
the layer's GQA group or on group 1 with K/V repeated), one before any gets the mean of the
row's values (eager's uniform softmax over an all-masked row).

Judged per layer against a float64 masked causal softmax at every position, and each
model's output against its own fp32 eager run within twice the deviation of eager fp16.
Refused: a forward over a cache in such a model; right padding where no bidirectional
kernel serves the padded positions (left padding needs none; simulated, since every fp16
causal prefill spec has a bidirectional twin at its head dim).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402
from attngen.runtime.checks import AttngenInputError  # noqa: E402

OPTIONS = dict(arch="sm90", backend="triton")  # the interpreter runs Triton only
pytestmark = pytest.mark.xdist_group("transformers-encoder")
CLIP_TEXT = dict(
    hidden_size=128,  # head dim 64, 2 heads: mha_gqa_prefill (causal), mha_vision_encoder
    num_attention_heads=2,
    num_hidden_layers=2,
    intermediate_size=96,
    vocab_size=100,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _clip_text() -> Any:
    import transformers

    return transformers.CLIPTextModel(transformers.CLIPTextConfig(**CLIP_TEXT))


def _qwen3(model: str, **kw: Any):  # noqa: ANN202
    def make() -> Any:
        import transformers

        cfg = transformers.Qwen3Config(
            **M._common(hidden_size=256, intermediate_size=256, num_attention_heads=4, **kw)
        )
        return getattr(transformers, model)(cfg)

    return make


def _judge(make: Any, inputs: dict[str, torch.Tensor], output: str, keys: Any, layers: int) -> None:
    torch.manual_seed(0)
    reference = make().eval()
    reference.set_attn_implementation("eager")
    run = M.run_against_eager(reference, inputs, output, **OPTIONS)
    assert run.runtime.cache_free
    assert len(run.calls) == layers, f"{len(run.calls)} layer calls on the cache-free path"
    M.judge_encoder_tower(run, keys=keys)


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(3, 100, (batch, seq), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "every_padding"])
def test_clip_text_tower(padded: bool) -> None:
    ids = _ids(6, 11)
    mask = M.padded_rows(6, 11, seed=3) if padded else None
    inputs = dict(input_ids=ids) if mask is None else dict(input_ids=ids, attention_mask=mask)
    _judge(_clip_text, inputs, "last_hidden_state", mask, layers=2)


def test_clip_dual_encoder() -> None:
    """CLIPModel: the vision tower (its own config) on the bidirectional path, the text
    tower causal under right padding; the image-text logits against eager."""
    import transformers

    vision = dict(
        hidden_size=128,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
    )
    cfg = transformers.CLIPConfig(text_config=CLIP_TEXT, vision_config=vision)
    ids = _ids(3, 9)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    inputs = dict(input_ids=ids, attention_mask=mask, pixel_values=pixels)
    torch.manual_seed(0)
    reference = transformers.CLIPModel(cfg).eval()
    reference.set_attn_implementation("eager")
    run = M.run_against_eager(reference, inputs, "logits_per_image", **OPTIONS)
    assert sorted(c[5] for c in run.calls) == [False, False, True, True]
    M.assert_within_eager(run)


@pytest.mark.parametrize(
    "model, output",
    [("Qwen3Model", "last_hidden_state"), ("Qwen3ForSequenceClassification", "logits")],
)
def test_qwen3_without_generation_head(model: str, output: str) -> None:
    """GQA 4 at head dim 64: the padded positions after kept tokens take the group-1
    bidirectional kernel with K/V repeated (no GQA-4 bidirectional spec at 64)."""
    ids = _ids(4, 12)
    mask = M.padded_rows(4, 12, seed=9)
    make = _qwen3(model, num_key_value_heads=1, head_dim=64, num_labels=3)
    _judge(make, dict(input_ids=ids, attention_mask=mask), output, mask, layers=2)


def test_forward_over_a_cache_is_refused() -> None:
    model = _qwen3("Qwen3Model", num_key_value_heads=1, head_dim=64)().eval().half()
    attngen_tf.enable(model, **OPTIONS)
    ids = _ids(2, 6)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        match = r"a forward over 6 cached tokens in Qwen3Model, which does not generate"
        with pytest.raises(AttngenInputError, match=match):
            model(input_ids=ids[:, :1], past_key_values=out.past_key_values)


def test_right_padding_without_a_bidirectional_kernel_is_refused(monkeypatch) -> None:
    """Where no bidirectional config serves the padded positions (here: every bidirectional
    choice refused, as for a head dim only causal specs generate), left padding is still
    served (a padded position before the row's tokens sees none of them) and right padding
    names what it needs."""
    from attngen.integrations.transformers.encoder import EncoderState

    choice = EncoderState.choice

    def causal_only(self, features, dtype, device):  # noqa: ANN001, ANN202
        if not features.causal:
            raise AttngenInputError("no generated MHA config serves a bidirectional layer")
        return choice(self, features, dtype, device)

    monkeypatch.setattr(EncoderState, "choice", causal_only)
    make = _qwen3("Qwen3Model", num_key_value_heads=1, head_dim=64)
    ids = _ids(2, 8)
    left = torch.ones_like(ids)
    left[1, :3] = 0
    _judge(make, dict(input_ids=ids, attention_mask=left), "last_hidden_state", left, layers=2)
    model = make().eval().half()
    attngen_tf.enable(model, **OPTIONS)
    match = (
        r"layer 0 \(Qwen3Attention\): padded positions after a row's first kept token .* no "
        "generated MHA config serves a bidirectional layer"
    )
    with pytest.raises(AttngenInputError, match=match), torch.no_grad():
        model(input_ids=ids, attention_mask=left.flip(1))


def test_layer_without_a_prefill_spec_takes_the_generate_path(monkeypatch) -> None:
    """A causal layer no prefill spec serves (only extend / decode specs generate it, as
    Gemma-2's softcap 50): a left-padded batch goes to the plain-generate path, judged
    against eager; a right-padded one is refused with the prefill path's reason."""
    from attngen.integrations.transformers.encoder import EncoderState

    def no_prefill(self, features, dtype, device):  # noqa: ANN001, ANN202
        raise AttngenInputError("no generated MHA config serves a causal prefill layer")

    monkeypatch.setattr(EncoderState, "choice", no_prefill)
    make = _qwen3("Qwen3ForSequenceClassification", num_key_value_heads=1, head_dim=64)
    torch.manual_seed(0)
    reference = make().eval()
    reference.set_attn_implementation("eager")
    ids = _ids(2, 8)
    left = torch.ones_like(ids)
    left[1, :3] = 0
    inputs = dict(input_ids=ids, attention_mask=left)
    run = M.run_against_eager(reference, inputs, "logits", page_size=16, **OPTIONS)
    assert not run.calls  # every layer on the plain-generate path
    M.assert_within_eager(run)
    model = make().eval().half()
    attngen_tf.enable(model, page_size=16, **OPTIONS)
    match = r"layer 0 \(Qwen3Attention\): no generated MHA config serves a causal prefill"
    with pytest.raises(AttngenInputError, match=match), torch.no_grad():
        model(input_ids=ids, attention_mask=left.flip(1))
