"""transformers' encoder classes on attngen's encoder path (CPU, Triton interpreter, fp16).

Tiny random configs (head dim 64, 2 heads, 2 layers) of the text, vision and audio encoders
whose attention goes through transformers' AttentionInterface: text encoders under a padding
mask (right padding and a left-padded row; every position compared, padded ones included),
vision and audio towers without one (Wav2Vec2 with a padded row). Each model's last hidden
state against its own fp32 eager run, within twice the deviation of transformers' eager run
in fp16 (the model's fp16 rounding outside attention dominates both; a wrong attention is
far outside it), and every attention call on attngen's encoder path.

A vision-language model (Llava): its vision tower (a config of its own: before every
module's config got the runtime, the tower's layers found none) on the encoder path, its
Llama on plain generate, greedy tokens equal to fp32 eager's.

Refused, with what the user reads: models whose attention bypasses the AttentionInterface
(at ``enable``), T5's position bias, BEiT's relative position bias (added to the mask),
ModernBERT's bidirectional sliding-window layers.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch

pytest.importorskip("transformers")
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402
from attngen.runtime.checks import AttngenInputError  # noqa: E402

OPTIONS = dict(arch="sm90", backend="triton")  # the interpreter runs Triton only
pytestmark = pytest.mark.xdist_group("transformers-encoder")
H, HEADS = 128, 2
LAYERS = dict(hidden_size=H, num_attention_heads=HEADS, num_hidden_layers=2, intermediate_size=96)
TEXT = dict(LAYERS, vocab_size=100, max_position_embeddings=64)
IMAGE = dict(LAYERS, image_size=32, patch_size=8, num_channels=3)
AUDIO = dict(
    LAYERS,
    conv_dim=(32, 32),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_feat_extract_layers=2,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)


def _text(gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 100, (3, 10), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    return dict(input_ids=ids, attention_mask=mask)


def _image(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=gen))


def _audio(gen: torch.Generator) -> dict[str, torch.Tensor]:
    mask = torch.ones(2, 400, dtype=torch.long)
    mask[1, 300:] = 0
    return dict(input_values=torch.randn(2, 400, generator=gen), attention_mask=mask)


def _model(model: str, config: str, **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**kw))

    return make


def _whisper_encoder() -> Any:
    import transformers

    cfg = transformers.WhisperConfig(
        d_model=H,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_layers=2,
        decoder_layers=1,
        encoder_ffn_dim=96,
        num_mel_bins=16,
        max_source_positions=16,
    )
    return transformers.WhisperModel(cfg).get_encoder()


def _mel(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return dict(input_features=torch.randn(2, 16, 32, generator=gen))


SERVED = {
    "bert": (_model("BertModel", "BertConfig", **TEXT), _text),
    "roberta": (_model("RobertaModel", "RobertaConfig", pad_token_id=1, **TEXT), _text),
    "xlm_roberta": (
        _model("XLMRobertaModel", "XLMRobertaConfig", pad_token_id=1, **TEXT),
        _text,
    ),
    "electra": (_model("ElectraModel", "ElectraConfig", embedding_size=H, **TEXT), _text),
    "albert": (_model("AlbertModel", "AlbertConfig", embedding_size=H, **TEXT), _text),
    "distilbert": (
        _model(
            "DistilBertModel",
            "DistilBertConfig",
            vocab_size=100,
            dim=H,
            n_heads=HEADS,
            n_layers=2,
            hidden_dim=96,
            max_position_embeddings=64,
        ),
        _text,
    ),
    "siglip_text": (_model("SiglipTextModel", "SiglipTextConfig", **TEXT), _text),
    "vit": (_model("ViTModel", "ViTConfig", **IMAGE), _image),
    "dinov2": (_model("Dinov2Model", "Dinov2Config", **IMAGE), _image),
    "clip_vision": (_model("CLIPVisionModel", "CLIPVisionConfig", **IMAGE), _image),
    "beit": (_model("BeitModel", "BeitConfig", **IMAGE), _image),
    "wav2vec2": (
        _model("Wav2Vec2Model", "Wav2Vec2Config", do_stable_layer_norm=True, **AUDIO),
        _audio,
    ),
    "whisper_encoder": (_whisper_encoder, _mel),
}


def _half(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}


@pytest.mark.parametrize("name", sorted(SERVED))
def test_encoder_class_matches_eager(name: str) -> None:
    make, inputs = SERVED[name]
    torch.manual_seed(0)
    reference = make().eval()
    reference.set_attn_implementation("eager")
    x = inputs(torch.Generator().manual_seed(1))
    run = M.run_against_eager(reference, x, "last_hidden_state", **OPTIONS)
    assert len(run.calls) == 2, f"{len(run.calls)} attention calls on attngen's encoder path"
    M.assert_within_eager(run)


REFUSED = {
    "mpnet": (
        _model("MPNetModel", "MPNetConfig", pad_token_id=1, **TEXT),
        _text,
        "does not run its attention through transformers' AttentionInterface",
    ),
    "t5_encoder": (
        _model(
            "T5EncoderModel",
            "T5Config",
            vocab_size=100,
            d_model=H,
            d_kv=64,
            num_heads=HEADS,
            num_layers=2,
            d_ff=96,
        ),
        _text,
        r"layer 0 \(T5Attention\): an additive position bias",
    ),
    "beit_relative_bias": (
        _model("BeitModel", "BeitConfig", use_relative_position_bias=True, **IMAGE),
        _image,
        "computes with the attention mask",
    ),
    "modernbert": (
        _model("ModernBertModel", "ModernBertConfig", pad_token_id=0, **TEXT),
        _text,
        r"layer 1 \(ModernBertAttention\): non-causal attention under a mask other than",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_encoder_class_refused(name: str) -> None:
    make, inputs, match = REFUSED[name]
    torch.manual_seed(0)
    model = make().eval().half()
    with pytest.raises(AttngenInputError, match=match), torch.no_grad():
        attngen_tf.enable(model, **OPTIONS)
        model(**_half(inputs(torch.Generator().manual_seed(1))))


def test_llava_vision_tower_and_language_model() -> None:
    """A vision-language model (Llava: a CLIP vision tower, its own config, and a Llama):
    the tower on the encoder path, the language model on plain generate; the logits of the
    image + text prompt against eager, and greedy tokens equal to fp32 eager's."""
    import transformers

    vision = transformers.CLIPVisionConfig(**IMAGE)
    text = transformers.LlamaConfig(
        **M._common(hidden_size=256, intermediate_size=256, num_attention_heads=2)
    )
    cfg = transformers.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",  # 17 features an image: 16 patches + CLS
    )
    torch.manual_seed(0)
    reference = transformers.LlavaForConditionalGeneration(cfg).eval()
    reference.set_attn_implementation("eager")
    M.moderate_scores(reference)
    gen = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.full((2, 17), 5), torch.randint(10, 500, (2, 6), generator=gen)], 1)
    pixels = torch.randn(2, 3, 32, 32, generator=gen)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels)
    run = M.run_against_eager(reference, inputs, "logits", page_size=16, **OPTIONS)
    assert [call[5] for call in run.calls] == [False, False]  # the tower's two layers
    M.assert_within_eager(run)
    model = copy.deepcopy(reference).half()
    attngen_tf.enable(model, page_size=16, **OPTIONS)
    greedy = dict(max_new_tokens=3, do_sample=False)
    with torch.no_grad():
        got = model.generate(**dict(inputs, pixel_values=pixels.half()), **greedy)
        want = reference.generate(**inputs, **greedy)
    assert torch.equal(got[:, -3:], want[:, -3:]), (got[:, -3:], want[:, -3:])
