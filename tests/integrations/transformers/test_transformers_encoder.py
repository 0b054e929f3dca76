"""Encoder layers through the transformers integration (CPU, Triton interpreter, fp16).

A SigLIP vision tower (transformers' own modeling code, random weights) runs its attention
layers on attngen's generated non-causal cache-free prefill (``encoder.py``) at head dims
72 (``mha_vision_encoder_siglip``), 64 and 80 (``mha_vision_encoder``). Judged twice:

- every layer's output against a float64 softmax(q k^T * scale) v of the q / k / v that
  layer received, within the kernels' fp16 tolerance (``attngen.testing.tolerance``);
- the tower's last hidden state against the same weights run eagerly in fp32: attngen's
  deviation stays within twice what transformers' own fp16 eager run deviates (the model's
  fp16 rounding outside attention dominates both; a wrong attention is far outside it).

Text encoders with padding: transformers' BERT at head dims 64 and 32
(``mha_text_encoder_d32``) and SigLIP's text tower (72) under padding masks of every kind
(left, right, holes, one kept token, none kept), each layer judged at every position (padded
ones included: transformers' eager attention computes them over the row's kept keys) against
a float64 masked softmax, and the padding's request plan (``RowPlan``) checked on its own.

Refused: a head dim no encoder spec generates (with the spec to add), a key of another
length, a padding mask of another shape.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402
from attngen.integrations.transformers import LayerFeatures, choose  # noqa: E402
from attngen.integrations.transformers.encoder import RowPlan  # noqa: E402
from attngen.runtime.checks import AttngenInputError  # noqa: E402

OPTIONS = dict(arch="sm90", backend="triton")  # the interpreter runs Triton only
pytestmark = pytest.mark.xdist_group("transformers-encoder")


@pytest.mark.parametrize("head_dim, heads", [(72, 2), (64, 2), (80, 3)])
def test_siglip_vision_tower_matches_eager(head_dim: int, heads: int) -> None:
    reference = M.siglip_vision_tower(head_dim, heads, seed=head_dim)
    pixels = dict(pixel_values=torch.randn(3, 3, 40, 40))
    run = M.run_against_eager(reference, pixels, "last_hidden_state", **OPTIONS)
    assert len(run.calls) == 2  # one call a layer, each on attngen's kernel
    M.judge_encoder_tower(run, (3, 25, heads, head_dim))


@pytest.mark.parametrize("head_dim, heads", [(64, 2), (32, 4)])
def test_bert_padded_rows_match_eager(head_dim: int, heads: int) -> None:
    """BERT's bidirectional self-attention under a padding mask of every kind (none, left,
    right, holes, one kept token, none kept): every position, padded ones included, against
    float64 and the tower against eager."""
    reference = M.bert_encoder(head_dim, heads, seed=head_dim)
    ids = torch.randint(1, M.VOCAB, (6, 13), generator=torch.Generator().manual_seed(1))
    mask = M.padded_rows(6, 13, seed=head_dim)
    inputs = dict(input_ids=ids, attention_mask=mask)
    run = M.run_against_eager(reference, inputs, "last_hidden_state", **OPTIONS)
    assert len(run.calls) == 2
    M.judge_encoder_tower(run, (6, 13, heads, head_dim), keys=mask)


def test_siglip_text_tower_with_padding() -> None:
    """SigLIP's text tower builds its bidirectional mask with create_bidirectional_mask."""
    import transformers

    cfg = transformers.SiglipTextConfig(
        vocab_size=64,
        hidden_size=144,  # head dim 72: mha_vision_encoder_siglip
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=16,
    )
    torch.manual_seed(3)
    reference = transformers.SiglipTextModel(cfg).eval()
    reference.set_attn_implementation("eager")
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(2))
    mask = M.padded_rows(3, 11, seed=5)
    inputs = dict(input_ids=ids, attention_mask=mask)
    run = M.run_against_eager(reference, inputs, "last_hidden_state", **OPTIONS)
    M.judge_encoder_tower(run, (3, 11, 2, 72), keys=mask)


def _visible(keys: torch.Tensor, causal: bool) -> list[list[list[int]]]:
    """For each row and position, the kept keys eager attention lets it see (flat)."""
    batch, seq = keys.shape
    return [
        [
            [b * seq + j for j in range(seq) if keys[b, j] and (not causal or j <= s)]
            for s in range(seq)
        ]
        for b in range(batch)
    ]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("seed", range(6))
def test_row_plan_covers_every_position_once(seed: int, causal: bool) -> None:
    """The padding's request plan (no kernel), against the keys each position sees in eager
    attention: a position with kept keys in view is the query of exactly one packed row, in
    a request over exactly those keys (a causal row's kept tokens: one causal request over
    the row's kept keys); the others take the mean of the row's values."""
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 9, (1,), generator=gen))
    seq = int(torch.randint(1, 40, (1,), generator=gen))
    keys = torch.rand(batch, seq, generator=gen) < torch.rand(batch, 1, generator=gen)
    plan = RowPlan.of(keys, batch, seq, causal=causal)
    if bool(keys.all()):
        assert plan is None
        return
    visible = _visible(keys, causal)
    written = torch.zeros(batch * seq, dtype=torch.long)
    for part in (plan.main, plan.pads):
        if part is None:
            continue
        assert torch.equal(part.q_index[part.out_src], part.out_dst)
        written.index_add_(0, part.out_dst, torch.ones_like(part.out_dst))
        cu = part.cu_seqlens.tolist()
        assert cu[0] == 0 and cu[-1] == part.q_index.numel() == part.kv_index.numel()
        assert part.max_len == max(b - a for a, b in zip(cu, cu[1:]))
        request = torch.bucketize(part.out_src, torch.tensor(cu[1:]), right=True)
        for src, dst, r in zip(part.out_src.tolist(), part.out_dst.tolist(), request.tolist()):
            kv = part.kv_index[cu[r] : cu[r + 1]].tolist()
            b, s = divmod(dst, seq)
            if part is plan.main and causal:  # causal over the row's kept keys, in order
                assert kv == (torch.nonzero(keys[b]).flatten() + b * seq).tolist()
                assert kv[: src - cu[r] + 1] == visible[b][s]
            else:
                assert kv == visible[b][s], (b, s, kv)
    written.index_add_(0, plan.mean_dst, torch.ones_like(plan.mean_dst))
    assert (written == 1).all()
    for dst, row in zip(plan.mean_dst.tolist(), plan.mean_rows.tolist()):
        assert dst // seq == row and not visible[row][dst % seq]
    if not causal:
        assert plan.pads is None  # one launch


def test_padding_mask_of_another_shape_is_refused() -> None:
    with pytest.raises(AttngenInputError, match=r"padding mask: expected \[2, 5\]"):
        RowPlan.of(torch.ones(2, 6, dtype=torch.bool), 2, 5, causal=False)


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
