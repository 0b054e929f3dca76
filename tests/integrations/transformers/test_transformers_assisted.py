"""Assisted decoding and prompt lookup on attngen (CPU, Triton interpreter, fp16): each
verification forward runs the prompt's or the step's draft tokens as an extend, and
transformers then crops its cache to the accepted tokens; attngen's rows drop the rejected
ones too (they were refused before, as a cache attngen did not see grow).

Greedy tokens equal to fp32 eager's plain greedy (assisted greedy is exact), with attngen's
KV pages equal to transformers' own cache at every layer call (bitwise, every row:
``tf_models.cache_mirror``), so a kept rejected token or a wrong length fails.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")
import tf_models as M  # noqa: E402

from attngen.integrations import transformers as attngen_tf  # noqa: E402

FP16 = dict(arch="sm90", backend="triton", page_size=16)
pytestmark = pytest.mark.xdist_group("transformers-assisted")


@pytest.mark.parametrize("mode", ["assistant_model", "prompt_lookup"])
def test_assisted_greedy_matches_eager(mode: str) -> None:
    case = M.Case("qwen3", M.tiny_qwen3, (), (), vocab=100)
    reference = M.build(case, 0, "cpu")
    ids = torch.randint(1, 100, (1, 10), generator=torch.Generator().manual_seed(1))
    ids[0, 5:10] = ids[0, 0:5]  # repeated n-grams: prompt lookup drafts from them
    settings = dict(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False
    )
    with torch.no_grad():
        want = reference.generate(**settings)
    model = copy.deepcopy(reference).half()
    runtime = attngen_tf.enable(model, **FP16)
    checked: list[int] = []
    runtime.observers.append(M.cache_mirror(checked))
    crops = M.record_crops(runtime)
    if mode == "assistant_model":
        draft = M.build(M.Case("draft", M.tiny_qwen3, (), (), vocab=100), 1, "cpu").half()
        extra = dict(assistant_model=draft)
    else:
        extra = dict(prompt_lookup_num_tokens=3)
    with torch.no_grad():
        got = model.generate(**settings, **extra)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
    assert checked and crops, (len(checked), crops)  # drafts were rejected and cropped


def test_gdn_refuses_a_cropped_cache() -> None:
    """transformers refuses assisted decoding for stateful models; attngen's GDN path refuses
    a crop too (its recurrent state took the dropped tokens in)."""
    from attngen.integrations.transformers.gdn import GdnGenerate
    from attngen.integrations.transformers.generate import GenerateState
    from attngen.integrations.transformers.options import Options
    from attngen.runtime.checks import AttngenInputError

    state = GenerateState(Options(**FP16), num_layers=1)
    state.begin(torch.ones(1, 4), batch_size=1, q_length=4, q_offset=0, device="cpu")
    state._allocate(state.forward.prefix, state.forward.new, 16)
    state.begin(torch.ones(1, 3), batch_size=1, q_length=1, q_offset=2, device="cpu")
    assert state.cropped
    gdn = GdnGenerate(Options(**FP16), state)
    with pytest.raises(AttngenInputError, match="recurrent state has taken them in"):
        gdn._begin(state.forward, None, torch.float16, torch.device("cpu"), 1)


def test_a_cache_attngen_did_not_build_is_refused() -> None:
    """Continuing another forward's cache (two prompts of the same length, then a step over
    the first one's cache): attngen holds the second prompt's keys; the row lengths agree,
    so only the keys tell, and the step is refused instead of served over the wrong keys."""
    from attngen.runtime.checks import AttngenInputError

    model = M.build(M.Case("qwen3", M.tiny_qwen3, (), (), vocab=100), 0, "cpu").half()
    attngen_tf.enable(model, **FP16)
    gen = torch.Generator().manual_seed(2)
    first, second = (torch.randint(1, 100, (1, 8), generator=gen) for _ in range(2))
    step = torch.randint(1, 100, (1, 1), generator=gen)
    mask = torch.ones(1, 9, dtype=torch.long)
    with torch.no_grad():
        cache_first = model(input_ids=first, use_cache=True).past_key_values
        cache_second = model(input_ids=second, use_cache=True).past_key_values
        with pytest.raises(AttngenInputError, match="does not hold the keys transformers"):
            model(input_ids=step, attention_mask=mask, past_key_values=cache_first)
        model(input_ids=step, attention_mask=mask, past_key_values=cache_second)  # served


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float8_e4m3fn])
def test_cached_key_check_alone(kv_dtype: torch.dtype) -> None:
    """``GenerateState._check_cached`` over a pool written as the backends write it (fp8:
    quantized with the per-tensor scale, some values saturated): the same keys pass, keys
    off by a little (a quantized transformers cache) pass, another history's keys are
    refused; layer 0 of a two-layer model is not compared (its keys depend on their own
    token only)."""
    from attngen.integrations.transformers.generate import GenerateState
    from attngen.integrations.transformers.options import Options
    from attngen.runtime.batch import AttentionLayer, ReqToTokenPool
    from attngen.runtime.checks import AttngenInputError
    from attngen.runtime.pools import PagedKVPool

    scale = 0.05
    state = GenerateState(
        Options(**FP16, kv_cache_dtype=None if kv_dtype == torch.float16 else kv_dtype,
                kv_scale=scale), num_layers=2,
    )  # fmt: skip
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, :3] = False  # row 1 left-padded: 4 tokens
    state.begin(mask, batch_size=2, q_length=7, q_offset=0, device="cpu")
    fwd = state.forward
    slots = state._allocate(fwd.prefix, fwd.new, 16)
    pool = PagedKVPool(num_layers=2, num_pages=4, page_size=16, num_kv_heads=2, head_dim=64,
                       v_head_dim=64, dtype=kv_dtype, device="cpu")  # fmt: skip
    state.pool, state.req_pool = pool, ReqToTokenPool(2, 32, "cpu")
    state._write_req_to_token()
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(2, 2, 7, 64, generator=gen).half()
    key[0, 0, 6, :4] = 40.0  # past the fp8 range at scale 0.05: saturated
    layer = AttentionLayer(1, 4, 2, 64, 64, 0.125, *(torch.tensor([scale]),) * 2)
    rows = torch.tensor([0] * 7 + [1] * 4)
    columns = torch.tensor(list(range(7)) + list(range(3, 7)))
    flat = key[rows, :, columns]
    pool.set_kv_buffer(layer, torch.tensor(slots), flat, flat)
    step = torch.ones(2, 8, dtype=torch.bool)
    step[1, :3] = False
    state.begin(step, batch_size=2, q_length=1, q_offset=7, device="cpu")
    grown = torch.cat([key, torch.randn(2, 2, 1, 64, generator=gen).half()], 2)
    state._check_cached(0, state.forward, grown * 0)  # layer 0: not compared
    assert not state.forward.checked
    state._check_cached(1, state.forward, grown * 1.01)  # within a quarter of the norm
    assert state.forward.checked
    state.forward.checked = False
    other = grown.clone()
    other[1, :, 6] = torch.randn(2, 64, generator=gen).half()  # row 1's history differs
    with pytest.raises(AttngenInputError, match="does not hold the keys transformers"):
        state._check_cached(1, state.forward, other)
