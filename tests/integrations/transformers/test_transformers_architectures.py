"""The transformers integration on architectures beyond the judged cases (CPU, Triton
interpreter, fp16): masks the model builds but does not pass as arguments, and what attngen
must refuse instead of serving as plain causal attention.

- Qwen2-MoE's sliding layers pass no ``sliding_window`` to the attention function (their
  window is in transformers' mask only; PhiMoE's are the same): attngen serves the mask's
  window in plain ``generate`` and the paged cache's in continuous batching, judged as the
  other models (``tf_judge``), with the window switched off moving the logits by more than
  ``SENSITIVITY`` bounds.
- Llama-4's chunked layers (``attention_chunk_size``): served as causal attention while every
  row fits in one chunk (where the two are equal), refused past it.
- Gemma-3's own attention shapes (head dim 256, GQA 2, windows of 4096 and 1024) and other
  released models' head dims and groups (Qwen3-0.6B, Qwen2.5-1.5B / 14B, SmolLM2, Phi-3-mini):
  each layer on the spec generated for it, judged against eager.
- A decoder run bidirectionally (``config.is_causal = False``): its first forward served on
  the encoder path, judged per layer.
- Refused at the first forward with the layer named: bidirectional attention under an
  overlay (Gemma-3's ``use_bidirectional_attention``), packed sequences, a custom
  4-D mask (also on a second call, when attngen's mask function did not run), a mask the
  model computes with (Doge), a ``sliding_window`` the layer's mask does not apply, a head
  dim no generated spec covers; at ``enable``: a model whose attention does not go through
  transformers' AttentionInterface (Falcon).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types

import pytest
import torch

pytest.importorskip("transformers")
import tf_judge  # noqa: E402
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as atf  # noqa: E402
from attngen.integrations.transformers.masks import MaskPattern, classify  # noqa: E402
from attngen.integrations.transformers.paged import layer_window  # noqa: E402
from attngen.runtime.checks import AttngenInputError  # noqa: E402
from attngen.testing.tolerance import assert_close  # noqa: E402

FP16 = dict(arch="sm90", dtype=torch.float16)
VOCAB = 128


def config(name: str, **kw: object) -> object:
    import transformers

    settings = dict(hidden_size=256, intermediate_size=256, vocab_size=VOCAB)
    settings.update(kw)
    return getattr(transformers, name)(**M._common(**settings))


def qwen2_moe_config() -> object:
    cfg = config(
        "Qwen2MoeConfig",
        hidden_size=512,
        num_attention_heads=4,
        num_key_value_heads=1,  # head dim 128, GQA 4: the e2e 64-token window spec
        use_sliding_window=True,
        sliding_window=64,
        max_window_layers=2,
        num_experts=2,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
    )
    assert cfg.layer_types == ["sliding_attention", "full_attention"], cfg.layer_types
    return cfg


QWEN2_MOE = M.Case(
    "qwen2_moe",
    qwen2_moe_config,
    ("sliding_window=64 (in the mask only)",),
    (),
    prompt_lengths=(90, 70),
    switch_off={"sliding_window=64": M._window_off},
    vocab=VOCAB,
)


def test_generate_qwen2_moe_window_from_the_mask_interpreter() -> None:
    """Qwen2-MoE's sliding layer gets its 64-token window from transformers' mask alone;
    attngen serves it (it had served the layer as full causal attention: tokens diverged
    from eager at margins of 10+)."""
    report = tf_judge.check_generate(QWEN2_MOE, 16, torch.float16, 0, "cpu", new_tokens=2, **FP16)
    print(report.line())
    assert not report.failures, "\n".join(report.failures)
    assert report.choices == [
        "triton/mha_e2e_sliding/d128_g4_ps16_fp16_swa63",
        "triton/mha_gqa_paged/d128_g4_ps16_fp16_causal",
    ]
    assert report.sensitivity["sliding_window=64"] > M.SENSITIVITY, report.sensitivity


def test_continuous_batching_qwen2_moe_window_from_the_cache_interpreter() -> None:
    """The same layer in ``generate_batch``: the window transformers' paged cache keeps for
    it (a chunked prefill: 170 tokens over 128-token batches)."""
    report = tf_judge.check_continuous_batching(
        QWEN2_MOE,
        5,
        "cpu",
        new_tokens=3,
        lengths=(70, 80, 20),
        options=FP16,
        dtype=torch.float16,
        use_cuda_graph=False,
        num_blocks=64,
        max_batch_tokens=128,
    )
    print(report.line())
    assert not report.failures, "\n".join(report.failures)
    assert report.equal + len(report.ties) == report.requests


def llama4_config() -> object:
    cfg = config(
        "Llama4TextConfig",
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size_mlp=256,
        num_local_experts=2,
        moe_layers=[],
        attention_chunk_size=16,
        no_rope_layers=[1, 0],  # layer 0: rope, chunked; layer 1: NoPE, full
    )
    assert cfg.layer_types == ["chunked_attention", "full_attention"], cfg.layer_types
    return cfg


LLAMA4 = M.Case(
    "llama4", llama4_config, ("chunks of 16",), (), prompt_lengths=(14, 9, 12), vocab=VOCAB
)


def test_llama4_chunked_layers_served_within_one_chunk_refused_past_it() -> None:
    """Llama-4's chunked layer is causal attention while every row fits in its first chunk
    (14 + 2 tokens, judged against eager); a row of 17 tokens is refused, naming the layer
    (it had been served as plain causal attention: logits off by ~20)."""
    report = tf_judge.check_generate(LLAMA4, 16, torch.float16, 0, "cpu", new_tokens=2, **FP16)
    print(report.line())
    assert not report.failures, "\n".join(report.failures)
    model = M.build(LLAMA4, 0, "cpu")
    atf.enable(model, page_size=16, **FP16)
    ids = torch.randint(1, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0  # the longer row decides
    match = (
        r"layer 0 \(Llama4TextAttention\): chunked attention \(attention_chunk_size=16\): "
        "a row reaches 17 tokens"
    )
    with pytest.raises(AttngenInputError, match=match), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


def qwen3_config(**kw: object) -> object:
    settings = dict(num_attention_heads=4, num_key_value_heads=1, head_dim=64)
    settings.update(kw)
    return config("Qwen3Config", **settings)


def _not_causal() -> object:
    cfg = qwen3_config(num_key_value_heads=4)  # head dim 64, gqa 1: mha_vision_encoder
    cfg.is_causal = False  # transformers' "power feature": decoder with bidirectional masks
    return cfg


def test_bidirectional_decoder_first_forward_served() -> None:
    """``config.is_causal = False`` (a decoder run bidirectionally, as embedding models do):
    its first forward attends within its own tokens under the padding mask and runs on the
    encoder path, every layer judged against float64 at every position (its forwards over
    the cache: test_transformers_encoder_decoder.py)."""
    model = M.build(M.Case("bidirectional", _not_causal, (), (), vocab=VOCAB), 0, "cpu").half()
    runtime = atf.enable(model, page_size=16, backend="triton", **FP16)  # the interpreter's
    calls = M.record_encoder_calls(runtime)
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    assert len(calls) == 2 and torch.isfinite(out.logits).all()
    for layer, (q, k, v, scale, got, causal) in enumerate(calls):
        assert not causal
        want = M.float64_encoder_attention(q, k, v, scale, mask)
        assert_close(got, want, msg=f"layer {layer}")


def _gemma3_bidirectional() -> object:
    return config(
        "Gemma3TextConfig",
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        sliding_window=64,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
    )


def _doge() -> object:
    return config(
        "DogeConfig", hidden_size=512, num_attention_heads=4, num_key_value_heads=1
    )  # head dim 128


def _diffllama() -> object:
    # 8 q / 2 kv heads of 64: two attention calls per layer and forward, V split in halves
    return config("DiffLlamaConfig", hidden_size=512, num_attention_heads=8, num_key_value_heads=2)


def _zamba(name: str, **kw: object):  # noqa: ANN202
    def make() -> object:
        return config(
            name,
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=4,
            mamba_d_state=16,
            use_mamba_kernels=False,
            **kw,
        )  # head dim 64, gqa 1 (and 32 for Zamba's attention over the doubled stream)

    return make


def _window_kwarg(model: object) -> None:
    """Layer 0 passes sliding_window=64 (a generated window) while its mask has none."""
    model.model.layers[0].self_attn.sliding_window = 64


REFUSED = {
    "gemma3_bidirectional": (
        _gemma3_bidirectional,
        None,
        r"layer 0 \(Gemma3Attention\): non-causal attention",
    ),
    "doge_dynamic_mask": (_doge, None, r"computes with the attention mask \(\.dtype\)"),
    "diffllama_two_calls": (
        _diffllama,
        None,
        r"layer 0 \(DiffLlamaAttention\): the attention function ran twice for layer 0 in one "
        "forward",
    ),
    "zamba_shared_block": (
        _zamba("ZambaConfig", num_hidden_layers=6, attn_layer_period=3, attn_layer_offset=2),
        None,
        r"layer None \(ZambaAttention\): the attention module has no layer index of its own "
        r"\(layer_idx=None;",
    ),
    "zamba2_shared_block": (
        _zamba(
            "Zamba2Config",
            n_mamba_heads=8,
            chunk_size=16,
            num_hidden_layers=2,
            layers_block_type=["mamba", "hybrid"],
        ),
        None,
        r"layer -1 \(Zamba2Attention\): the attention module has no layer index of its own "
        r"\(layer_idx=-1;",
    ),
    "window_not_in_mask": (
        lambda: qwen3_config(head_dim=128),
        _window_kwarg,
        r"layer 0 \(Qwen3Attention\): the layer passes sliding_window=64 but transformers "
        "built it a mask without that window",
    ),
    "head_dim_112": (
        lambda: qwen3_config(head_dim=112),
        None,
        r"layer 0 \(Qwen3Attention\): no generated MHA config for sm90 serves a layer with "
        r"causal \(head_dim=112",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_at_the_first_forward_naming_the_layer(name: str) -> None:
    make_config, edit, match = REFUSED[name]
    case = M.Case(name, make_config, (), (), vocab=VOCAB)
    model = M.build(case, 0, "cpu")
    if edit is not None:
        edit(model)
    atf.enable(model, page_size=16, **FP16)
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with pytest.raises(AttngenInputError, match=match), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


def test_continuous_batching_refuses_two_calls_per_layer() -> None:
    """DiffLlama calls the attention function twice per layer and forward (V split in
    halves); in continuous batching the second call overwrote the first call's values in
    the paged cache and the next step read them (transformers' own paged sdpa does the same:
    its tokens differ from eager's). attngen refuses the second call, naming the layer."""
    from transformers import GenerationConfig

    model = M.build(M.Case("diffllama", _diffllama, (), (), vocab=VOCAB), 0, "cpu")
    atf.enable(model, **FP16)
    model.set_attn_implementation(atf.PAGED_NAME)
    gen = GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0)
    cb = tf_judge.cb_config(use_cuda_graph=False, num_blocks=16, max_batch_tokens=64)
    with torch.no_grad():
        out = model.generate_batch(
            [list(range(1, 10))], generation_config=gen, continuous_batching_config=cb
        )
    [result] = out.values()
    assert not result.generated_tokens and result.error is not None, result
    assert "layer 0 (DiffLlamaAttention): the attention function ran twice" in result.error


def bart_causal_config() -> object:
    return config(
        "BartConfig",
        d_model=256,
        encoder_attention_heads=4,
        decoder_attention_heads=4,  # head dim 64, gqa 1
        encoder_layers=1,
        decoder_layers=2,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )


def test_generate_bart_decoder_with_an_unused_cross_attention_mask() -> None:
    """BartForCausalLM (a decoder with cross-attention layers and no encoder) asks every
    forward for a bidirectional cross-attention mask too, of the decoder's query length and
    no cache: attngen restarted its bookkeeping there (a fresh cache at the decode step) and
    refused the self-attention layers as using a mask 'built for an earlier forward'. Masks
    attngen cannot serve no longer touch the forward; only a layer that uses one is
    refused."""
    case = M.Case("bart_causal", bart_causal_config, (), (), prompt_lengths=(12, 7, 9))
    case = dataclasses.replace(case, vocab=VOCAB)
    report = tf_judge.check_generate(case, 16, torch.float16, 0, "cpu", new_tokens=2, **FP16)
    print(report.line())
    assert not report.failures, "\n".join(report.failures)
    assert report.choices == ["triton/mha_gqa_paged/d64_g1_ps16_fp16_causal"]


def test_packed_sequences_and_custom_masks_refused() -> None:
    """Packed sequences (``position_ids`` restarting inside a row, no mask, no cache) and a
    custom 4-D mask were served as one causal sequence per row; the 4-D mask on a second
    call, when attngen's mask function did not run, reran the first call's batch."""
    model = M.build(M.Case("qwen3", qwen3_config, (), (), vocab=VOCAB), 0, "cpu")
    atf.enable(model, page_size=16, **FP16)
    ids = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    packed = torch.cat([torch.arange(6), torch.arange(6)])[None]
    with torch.no_grad():
        with pytest.raises(AttngenInputError, match=r"layer 0 .*a packed-sequence mask"):
            model(input_ids=ids, position_ids=packed, use_cache=False)
        model(input_ids=ids, attention_mask=torch.ones_like(ids))  # served
        custom = torch.zeros(1, 1, 12, 12)
        custom[..., 6:] = torch.finfo(torch.float32).min  # the first 6 keys only
        match = r"layer 0 \(Qwen3Attention\): the layer got an attention mask attngen did not"
        with pytest.raises(AttngenInputError, match=match):
            model(input_ids=ids, attention_mask=custom)


def test_enable_refuses_models_outside_the_attention_interface() -> None:
    """Falcon runs its own attention code: transformers only warns when asked to switch it,
    and attngen never ran (generate gave eager's tokens on eager's kernels)."""
    falcon = lambda: config(  # noqa: E731
        "FalconConfig", num_attention_heads=4, num_kv_heads=1, new_decoder_architecture=True
    )
    model = M.build(M.Case("falcon", falcon, (), (), vocab=VOCAB), 0, "cpu")
    match = "FalconForCausalLM does not run its attention through transformers' Attention"
    with pytest.raises(AttngenInputError, match=match):
        atf.enable(model, **FP16)


def test_classify_reads_transformers_mask_functions() -> None:
    from transformers import masking_utils as mu

    assert classify(mu.causal_mask_function) == MaskPattern()
    assert classify(mu.sliding_window_causal_mask_function(64)) == MaskPattern(window=64)
    chunked = mu.chunked_causal_mask_function(16, torch.tensor([3, 0]))
    assert classify(chunked) == MaskPattern(chunk=16)
    assert classify(mu.bidirectional_mask_function) == MaskPattern(bidirectional=True)
    refused = [
        (mu.or_masks(mu.causal_mask_function, lambda *a: torch.tensor(True)), "or_mask_function"),
        (
            mu.and_masks(
                mu.causal_mask_function,
                mu.packed_sequence_mask_function(torch.zeros(1, 4, dtype=torch.long)),
            ),
            "packed-sequence",
        ),
        (mu.sliding_window_bidirectional_mask_function(8), "custom mask function"),
        (lambda b, h, q, kv: kv <= q, "custom mask function"),
    ]
    for fn, words in refused:
        assert words in (classify(fn).refused or ""), (fn, classify(fn))


def sliding_window_overlay(sliding_window: int):  # noqa: ANN201
    """transformers' name, one key more than transformers' window: a changed primitive."""

    def inner_mask(batch_idx, head_idx, q_idx, kv_idx):  # noqa: ANN001, ANN202
        return kv_idx >= q_idx - sliding_window

    return inner_mask


def test_classify_checks_what_it_read_against_the_function() -> None:
    from transformers import masking_utils as mu

    changed = mu.and_masks(sliding_window_overlay(64), mu.causal_mask_function)
    with pytest.raises(AttngenInputError, match="changed its mask primitives"):
        classify(changed)


def test_layer_window_in_continuous_batching() -> None:
    """The window of a paged layer is the one transformers' paged cache keeps for it."""
    cache = types.SimpleNamespace(sliding_windows={0: 64, 1: 1})
    cfg = types.SimpleNamespace(layer_types=["sliding_attention", "full_attention"])
    layer = lambda i: types.SimpleNamespace(layer_idx=i, config=cfg)  # noqa: E731
    assert layer_window(layer(0), cache, None) == 64  # Qwen2-MoE passes none
    assert layer_window(layer(0), cache, 64) == 64 and layer_window(layer(1), cache, None) is None
    with pytest.raises(AttngenInputError, match="sliding_window=32 but transformers' paged"):
        layer_window(layer(0), cache, 32)
    with pytest.raises(AttngenInputError, match="keeps it as full attention"):
        layer_window(layer(1), cache, 64)
    chunked = types.SimpleNamespace(layer_types=["chunked_attention", "full_attention"])
    with pytest.raises(AttngenInputError, match="a 'chunked_attention' layer"):
        layer_window(types.SimpleNamespace(layer_idx=0, config=chunked), cache, None)


def judged_generate(name: str, make_config, feature: str):  # noqa: ANN201
    """Two short prompts, two new tokens each, on 16-token pages in fp16 (interpreter):
    attngen's run against eager (``tf_judge``); fails on any failure, returns the report."""
    case = M.Case(name, make_config, (feature,), (), prompt_lengths=(21, 14), vocab=VOCAB)
    report = tf_judge.check_generate(case, 16, torch.float16, 0, "cpu", new_tokens=2, **FP16)
    print(report.line())
    assert not report.failures, "\n".join(report.failures)
    return report


def gemma3_config(sliding_window: int) -> object:
    """Gemma-3's attention shapes (transformers' Gemma3TextConfig defaults: 8 q / 4 kv heads
    of dim 256, no logit softcap), a sliding layer then a full one."""
    cfg = config(
        "Gemma3TextConfig",
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
    )
    assert cfg.attn_logit_softcapping is None and cfg.head_dim == 256
    return cfg


@pytest.mark.parametrize(
    "window, spec", [(4096, "mha_gemma3_sliding_4k"), (1024, "mha_gemma3_sliding")]
)
def test_generate_gemma3_attention_shapes_interpreter(window: int, spec: str) -> None:
    """Gemma-3 at its own head dim and GQA group, with transformers' default window (4096)
    and the released checkpoints' (1024): each layer on the spec generated for it (its
    window, and gemma3.yaml's full attention), tokens judged against eager."""
    make = functools.partial(gemma3_config, window)
    report = judged_generate(f"gemma3_w{window}", make, f"sliding_window={window}")
    assert sorted(report.choices) == sorted(
        [
            f"triton/{spec}/d256_g2_ps16_fp16_swa{window - 1}",
            "triton/mha_gemma3/d256_g2_ps16_fp16_causal",
        ]
    )


# Released models' own head dims and GQA groups (small hidden sizes): (transformers config
# class, q heads, kv heads, head dim, the spec that must serve them)
MODEL_SHAPES = {
    "qwen3_0.6b": ("Qwen3Config", 16, 8, 128, "mha_gqa_groups"),
    "qwen2.5_14b": ("Qwen2Config", 40, 8, 128, "mha_gqa_groups"),
    "qwen2.5_1.5b": ("Qwen2Config", 12, 2, 128, "mha_gqa_groups"),
    "smollm2": ("LlamaConfig", 9, 3, 64, "mha_gqa_groups"),
    "phi3_mini": ("Phi3Config", 4, 4, 96, "mha_phi3_mini"),
}


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_generate_released_model_head_shapes_interpreter(name: str) -> None:
    """Each model at its own head dim and GQA group, two layers on the spec generated for
    them, tokens judged against eager."""
    cls, hq, hkv, d, spec = MODEL_SHAPES[name]
    extra = {} if cls == "Phi3Config" else {"head_dim": d}  # Phi-3: hidden / heads
    make = functools.partial(
        config, cls, hidden_size=hq * d, num_attention_heads=hq, num_key_value_heads=hkv, **extra
    )
    report = judged_generate(name, make, f"{hq} q / {hkv} kv heads of dim {d}")
    assert report.choices == [f"triton/{spec}/d{d}_g{hq // hkv}_ps16_fp16_causal"]


def deepseek_v2_config(q_lora_rank: int | None) -> object:
    """DeepSeek-V2 attention at DeepSeek's MLA dims with 16 heads (V2-Lite has no q LoRA, V2
    has one), yarn rope (mscale 0.707); dense MLPs. Its module is DeepseekV2Attention, whose
    rope turns interleaved pairs by complex numbers (``freqs_cis``), where V3's takes cos /
    sin."""
    return config(
        "DeepseekV2Config",
        hidden_size=128,
        n_routed_experts=2,
        num_experts_per_tok=1,
        **M.deepseek_mla(q_lora_rank, 0.707),
    )


@pytest.mark.parametrize("q_lora_rank", [None, 96])
def test_generate_deepseek_v2_mla_interpreter(q_lora_rank: int | None) -> None:
    """DeepSeek-V2(-Lite) on attngen's absorbed MLA (sm80's configs: sm90 runs 16 heads on a
    Gluon kernel the interpreter cannot run), judged against eager."""
    case = M.Case(
        f"deepseek_v2_q{q_lora_rank}",
        functools.partial(deepseek_v2_config, q_lora_rank),
        ("mla absorbed", "complex rope"),
        (),
        prompt_lengths=(9, 5, 7),
        post_init=M._moderate_mla,
        vocab=VOCAB,
    )
    options = dict(FP16, arch="sm80")
    report = tf_judge.check_generate(case, 16, torch.float16, 6, "cpu", new_tokens=2, **options)
    print(report.line())
    assert not report.failures, "\n".join(report.failures)
    assert report.layer_kinds == ["MLA absorbed", "MLA ragged"]
    assert report.choices == ["triton/mla_e2e_deepseek_v3/r512_rope64_h16_ps16_fp16_causal"]


def test_call_is_causal_overrides_the_module_flag() -> None:
    """CLIP's text tower calls its attention with ``is_causal=True`` on a module whose flag
    (shared with CLIP's vision tower) is False: the call's argument decides, as in
    transformers' sdpa attention; without one, the module's flag does."""
    from attngen.integrations.transformers import _non_causal

    clip_text = types.SimpleNamespace(is_causal=False)
    assert not _non_causal(clip_text, {"is_causal": True})
    assert _non_causal(clip_text, {})
    assert _non_causal(types.SimpleNamespace(is_causal=True), {"is_causal": False})
    assert not _non_causal(types.SimpleNamespace(), {})


def test_left_padded_forward_matches_eager_at_every_position() -> None:
    """A left-padded forward of a model that generates (the plain-generate path): the logits
    at every position, pads included, against fp32 eager. A pad position sees no key: eager
    averages the layer's values there (a uniform softmax) and attngen writes the same (with
    sinks, not run here: no fp16 sinks spec, the sink takes the softmax and the row is 0)."""
    model = M.build(M.Case("padded", lambda: qwen3_config(head_dim=128), (), ()), 0, "cpu")
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    inputs = dict(input_ids=ids, attention_mask=mask)
    run = M.run_against_eager(model, inputs, "logits", page_size=16, backend="triton", **FP16)
    assert not run.calls  # every layer on the plain-generate path
    M.assert_within_eager(run)


def test_right_padded_forward_served_cache_free_and_generation_refused() -> None:
    """A first forward of a model that generates, padded other than on the left (right
    padding, a hole: scoring a batch): served cache-free, the logits at every position
    against fp32 eager; generating on from such a batch is refused at its next forward."""
    model = M.build(M.Case("scored", lambda: qwen3_config(head_dim=128), (), ()), 0, "cpu")
    ids = torch.randint(1, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, [3, 4]] = 0
    run = M.run_against_eager(
        model, dict(input_ids=ids, attention_mask=mask), "logits", backend="triton", **FP16
    )
    assert len(run.calls) == 2 and all(call[5] for call in run.calls)  # causal, cache-free
    M.judge_encoder_tower(run, keys=mask)
    attngen = copy.deepcopy(model).half()
    atf.enable(attngen, backend="triton", **FP16)
    match = "this generation's first forward was not left-padded"
    with pytest.raises(AttngenInputError, match=match), torch.no_grad():
        attngen.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
