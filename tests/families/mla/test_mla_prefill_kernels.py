"""The MLA backend's ``prefill_kernels``: the ragged path's causal new tokens go to another
generated module's cache-free prefill (with LSE), its keys joined per head; prefix chunks
stay on the MLA module; a module that cannot serve is refused at construction, by name.

The stand-in prefill module computes with the float64 oracle (the kernel itself is checked
on the GPU: tests/families/mha/gpu and tests/families/mla/gpu)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from attngen.families.mla import reference as ref
from attngen.families.mla.runtime import per_head_keys
from attngen.families.mla.testing import check_close, check_lse, rig_batch
from attngen.hooks import MaskHooks
from attngen.runtime.batch import ForwardMode
from attngen.runtime.checks import AttngenInputError

from test_mla_backend_interpreter import F16, rig  # noqa: I001

SCALE = 192**-0.5


def stand_in(calls: list, **change):
    """A kernels module whose prefill writes the oracle's out and LSE and records its keys."""

    def prefill(q, k, v, cu_seqlens, out, *, max_seq_len, config, sm_scale, lse=None):
        lens = cu_seqlens.diff().tolist()
        calls.append(dict(k=k, config=config, max_seq_len=max_seq_len))
        o, l_ = ref.ragged_mha(q, k[..., :128], k[..., 128:], v, lens, lens, sm_scale, True)
        out.copy_(o)
        lse.copy_(l_)

    wide = types.SimpleNamespace(head_dim=192, v_head_dim=128, gqa_group=1, dtype="float16",
                                 fwd_tile_n=128, uri="wide")  # fmt: skip
    narrow = types.SimpleNamespace(**{**vars(wide), "fwd_tile_n": 64, "uri": "narrow"})
    attrs = dict(PHASES=("prefill", "extend"), HOOKS=MaskHooks(), prefill=prefill,
                 CONFIGS={"narrow": narrow, "wide": wide})  # fmt: skip
    return types.SimpleNamespace(**{**attrs, **change})


def test_new_tokens_run_on_prefill_kernels_and_chunks_do_not():
    torch.manual_seed(8)
    calls: list = []
    r = rig(16, prefill_kernels=stand_in(calls))
    assert r.backend.prefill_config.uri == "wide"  # the widest key tile
    ext, h = [6, 17, 1], 16
    rb = rig_batch(r, [0, 0, 0], ext, ForwardMode.EXTEND, mha_return_lse=True)
    t = sum(ext)
    q, v = torch.randn(t, h, 192).to(F16), torch.randn(t, h, 128).to(F16)
    k = torch.randn(t, h, 192).to(F16)
    r.backend.init_forward_metadata(rb.batch)
    out, lse = r.backend.forward_extend(q, k, v, r.ragged_layer, rb.batch, save_kv_cache=False)
    assert len(calls) == 1 and calls[0]["max_seq_len"] == 17
    assert calls[0]["k"].data_ptr() == k.data_ptr() and torch.equal(calls[0]["k"], k)  # no copy
    want, want_lse = ref.ragged_mha(q, k[..., :128], k[..., 128:], v, ext, ext, SCALE, True)
    check_close(out.view(t, h, 128), want, F16, "new tokens")
    check_lse(lse, want_lse, "new tokens lse")

    k_nope, k_rope = torch.randn(t, h, 128).to(F16), torch.randn(t, 1, 64).to(F16)
    r.backend.forward_extend(
        q, k_nope, v, r.ragged_layer, rb.batch, save_kv_cache=False, k_rope=k_rope
    )
    joined = torch.cat([k_nope, k_rope.expand(-1, h, -1)], dim=-1)
    assert len(calls) == 2 and torch.equal(calls[1]["k"], joined)

    cu = torch.tensor([[0, 0, 0, 0]], dtype=torch.int32)
    rb = rig_batch(r, [0, 0, 0], ext, ForwardMode.EXTEND, prefix_chunk_cu_seq_lens=cu,
                   mha_return_lse=True)  # fmt: skip
    fb = dataclasses.replace(rb.batch, attn_attend_prefix_cache=True, prefix_chunk_idx=0)
    r.backend.init_forward_metadata(fb)
    empty = torch.zeros(0, h, 128).to(F16)
    o_c, lse_c = r.backend.forward_extend(
        q, empty, empty, r.ragged_layer, fb, save_kv_cache=False, k_rope=torch.zeros(0, 1, 64).to(F16)
    )
    assert len(calls) == 2  # a prefix chunk: the MLA module's ragged kernel
    assert torch.isinf(lse_c).all() and torch.equal(o_c.float(), torch.zeros_like(o_c.float()))


@pytest.mark.parametrize(
    "change,says",
    [
        (dict(PHASES=("extend",)), "no cache-free prefill"),
        (dict(prefill=lambda q, k, v, cu, out, *, max_seq_len, config, sm_scale: None),
         "returns no LSE"),
        (dict(HOOKS=MaskHooks(causal=False)), "not plain causal"),
        (dict(HOOKS=MaskHooks(window_left=127)), "not plain causal"),
        (dict(CONFIGS={}), "no config with (head_dim, v_head_dim, gqa_group, dtype) = (192, 128"),
    ],
)
def test_a_module_that_cannot_serve_is_refused(change, says):
    with pytest.raises(AttngenInputError, match="prefill_kernels") as e:
        rig(16, prefill_kernels=stand_in([], **change))
    assert says in str(e.value)


def test_per_head_keys_views_the_halves_of_one_tensor_and_copies_otherwise():
    k = torch.randn(5, 4, 200)
    view = per_head_keys(k[..., :128], k[..., 128:192], 4)
    assert view.data_ptr() == k.data_ptr() and torch.equal(view, k[..., :192])
    nope, rope = torch.randn(5, 4, 128), torch.randn(5, 1, 64)
    joined = per_head_keys(nope, rope, 4)
    assert torch.equal(joined, torch.cat([nope, rope.expand(-1, 4, -1)], -1))
    with pytest.raises(AttngenInputError, match="k_rope"):
        per_head_keys(nope, torch.randn(5, 2, 64), 4)
