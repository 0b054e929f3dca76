"""Beam search on attngen (CPU, Triton interpreter, fp16): transformers reorders its cache
between forwards (row ``b`` continues from row ``beam_idx[b]``); attngen's own caches kept
their rows in place, so the beams continued from other beams' keys and values and the
sequences came out different from eager's, silently. ``enable`` now gives the model a
``_reorder_cache`` that moves attngen's pages (KV, MLA latents, DSA latents and index keys)
and GDN states the same way.

Each model (left-padded prompts of different lengths, 3 beams) against fp32 eager's beam
search: each prompt's returned beams equal (in either order), for Qwen3 attngen's KV pages
equal to transformers' own cache at every layer call (bitwise, every row); and with
attngen's reorder switched off the step is refused (attngen's cached keys differ from
transformers') or, for MLA, the beams differ. ``GenerateState.reorder``
alone: refusals.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402
from attngen.integrations.transformers.generate import GenerateState  # noqa: E402
from attngen.integrations.transformers.options import Options  # noqa: E402
from attngen.runtime.checks import AttngenInputError  # noqa: E402

FP16 = dict(arch="sm90", backend="triton", page_size=16)
pytestmark = pytest.mark.xdist_group("transformers-beam-search")


CASES = {
    "qwen3": (M.Case("qwen3", M.tiny_qwen3, (), (), prompt_lengths=(8, 5), vocab=100), FP16),
    # sm80's configs: sm90 runs 16 MLA heads on a Gluon kernel the interpreter cannot run
    "deepseek_v3": (
        dataclasses.replace(
            M.CASES["deepseek_v3"],
            make_config=lambda: M.deepseek_v3_config(hidden=128, vocab=128),
            prompt_lengths=(7, 4),
            vocab=128,
        ),
        dict(FP16, arch="sm80"),
    ),
    "qwen3_next": (
        dataclasses.replace(
            M.CASES["qwen3_next"],
            make_config=lambda: M.qwen3_next_config(hidden=128, vocab=128),
            prompt_lengths=(9, 6),
            vocab=128,
        ),
        FP16,
    ),
}


def _beam_search(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[list[list[int]]]:
    """Each prompt's 3 returned beams, as a sorted list (beams of near-equal scores may come
    in either order)."""
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, num_beams=3, num_return_sequences=3,
            max_new_tokens=4, min_new_tokens=4, do_sample=False,
        )  # fmt: skip
    rows = out.tolist()
    return [sorted(rows[i : i + 3]) for i in range(0, len(rows), 3)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_beam_search_matches_eager(name: str) -> None:
    case, options = CASES[name]
    reference = M.build(case, 0, "cpu")
    ids, mask = M.prompts(case, 0, "cpu")
    want = _beam_search(reference, ids, mask)
    model = copy.deepcopy(reference).half()
    runtime = attngen_tf.enable(model, **options)
    checked: list[int] = []
    if name == "qwen3":  # attngen's KV pages against transformers' own cache, every layer
        runtime.observers.append(M.cache_mirror(checked))
    assert _beam_search(model, ids, mask) == want
    assert checked or name != "qwen3"
    # attngen's reorder off (transformers' own reorder only): the beams read other rows;
    # where a layer runs on plain generate's KV pages (not MLA's latents) attngen's check of
    # the cached keys against transformers' own refuses the step, else the beams differ
    model._reorder_cache = model._attngen_original_reorder
    runtime.observers.clear()
    if name == "deepseek_v3":
        assert _beam_search(model, ids, mask) != want
    else:
        with pytest.raises(AttngenInputError, match="does not hold the keys transformers"):
            _beam_search(model, ids, mask)


def test_bart_beam_search_matches_eager() -> None:
    """An encoder-decoder model: the decoder's self-attention pages reordered; its
    cross-attention keys come reordered from transformers' cross cache."""
    reference = M.bart()
    M.moderate_scores(reference)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    want = _beam_search(reference, ids, mask)
    model = copy.deepcopy(reference).half()
    attngen_tf.enable(model, **FP16)
    assert _beam_search(model, ids, mask) == want


def test_generate_state_reorder_refusals() -> None:
    state = GenerateState(Options(arch="sm90", page_size=4), num_layers=1)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :4] = False  # row 1: 2 tokens, one page; row 0: 6 tokens, two pages
    state.begin(mask, batch_size=2, q_length=6, q_offset=0, device="cpu")
    state._allocate(state.forward.prefix, state.forward.new, 4)
    assert state.reorder(torch.tensor([0, 1])) is None  # nothing moves
    with pytest.raises(AttngenInputError, match=r"beam_idx: expected 2 row indices"):
        state.reorder(torch.tensor([0, 2]))
    with pytest.raises(AttngenInputError, match=r"moved row 0 \(6 tokens\) into row 1"):
        state.reorder(torch.tensor([0, 0]))
    src, dst = state.reorder(torch.tensor([1, 1]))  # row 0 takes over row 1's one page
    assert src.tolist() == [2] and dst.tolist() == [0] and state.lengths == [2, 2]
