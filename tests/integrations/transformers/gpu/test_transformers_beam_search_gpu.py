"""Beam search on attngen on the GPU (the CPU twin: ``../test_transformers_beam_search.py``).

Two oracles. attngen's KV pages of every row, at every self-attention layer call, bitwise
equal to the keys and values transformers hands the layer from its own cache (which
transformers reorders itself): any row left in place fails. And, tie-proof: the logits
each returned beam was chosen from, step by step (``output_logits`` through
``beam_indices``), against a teacher-forced fp32 eager forward
of the returned sequences, within twice the deviation of the same teacher-forced forward in
the model's dtype on eager. A beam that continued from another beam's cache (attngen's rows
left in place when transformers reorders) has logits of another context, far outside it.
Qwen3-style GQA 4 at head dim 128 (left-padded prompts of 40-200 tokens, 4 beams, 16 new
tokens) and BART (an encoder padding mask, cross-attention on the cross path), bf16 and
fp16.
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

pytestmark = pytest.mark.gpu
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
OPTIONS: dict = {}  # as an engine would: the arch and backends detected
SIZES = dict(lengths=(200, 40, 131), beams=4, new=16)


def _step_logits(out: Any, beams: int) -> torch.Tensor:
    """``[R, new, V]``: the logits each returned sequence's tokens were chosen from."""
    steps = len(out.logits)
    index = out.beam_indices[:, :steps].clamp(min=0)  # -1 past a finished beam's end
    stacked = torch.stack(out.logits, 1).float()  # [rows * beams, new, V]
    return torch.stack([stacked[index[:, t], t] for t in range(steps)], 1)


def _forced(model: Any, inputs: dict, sequences: torch.Tensor, new: int) -> torch.Tensor:
    """Teacher-forced logits of the last ``new`` tokens of ``sequences`` (positions from the
    padding mask, as generate counts them)."""
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            logits = model(**inputs, decoder_input_ids=sequences).logits
        else:
            mask = inputs["attention_mask"]
            grown = sequences.shape[1] - mask.shape[1]
            full = torch.cat([mask, mask.new_ones(mask.shape[0], grown)], 1)
            positions = (full.cumsum(-1) - 1).masked_fill(full == 0, 0)
            logits = model(input_ids=sequences, attention_mask=full, position_ids=positions).logits
    return logits[:, -new - 1 : -1].float()


def _judge(reference: Any, inputs: dict, dtype: torch.dtype) -> None:
    beams, new = SIZES["beams"], SIZES["new"]
    model = copy.deepcopy(reference).to(dtype)
    runtime = attngen_tf.enable(model, **OPTIONS)
    checked: list[int] = []
    runtime.observers.append(M.cache_mirror(checked))  # attngen's pages = transformers' cache
    settings = dict(num_beams=beams, num_return_sequences=beams, max_new_tokens=new,
                    min_new_tokens=new, do_sample=False, output_logits=True,
                    return_dict_in_generate=True)  # fmt: skip
    with torch.no_grad():
        out = model.generate(**inputs, **settings)
    got = _step_logits(out, beams)
    expand = lambda x: x.repeat_interleave(beams, 0)  # noqa: E731
    rows = {k: expand(v) for k, v in inputs.items()}
    sequences = out.sequences
    want = _forced(reference, rows, sequences, new)
    eager = copy.deepcopy(reference).to(dtype)
    theirs = _forced(eager, rows, sequences, new)
    ours = (got - want).abs().max().item()
    bound = 2 * (theirs - want).abs().max().item()
    print(f"{type(reference).__name__} {dtype}: beam logits off {ours:.3g}, eager {bound / 2:.3g}")
    assert torch.isfinite(got).all() and ours <= bound, (ours, bound)
    assert len(checked) == 2 * (new + 0), checked  # each decoder layer at every forward


@DTYPES
def test_qwen3_beam_search(dtype: torch.dtype) -> None:
    import transformers

    cfg = transformers.Qwen3Config(
        **M._common(
            hidden_size=1024, intermediate_size=512, vocab_size=M.VOCAB, num_attention_heads=8,
            num_key_value_heads=2, head_dim=128,
        )
    )  # fmt: skip
    case = M.Case("qwen3_beam", lambda: cfg, (), (), prompt_lengths=SIZES["lengths"])
    reference = M.build(case, 0, "cuda")
    ids, mask = M.prompts(case, 0, "cuda")
    _judge(reference, dict(input_ids=ids, attention_mask=mask), dtype)


@DTYPES
def test_bart_beam_search(dtype: torch.dtype) -> None:
    reference = M.bart(**M.BART_WIDE).cuda()
    M.moderate_scores(reference)
    lengths = SIZES["lengths"]
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, M.VOCAB, (len(lengths), max(lengths)), generator=gen)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    _judge(reference, dict(input_ids=ids.cuda(), attention_mask=mask.cuda()), dtype)
