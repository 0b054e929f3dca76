"""The generated GDN backend end to end on CPU (interpreter, fp16, small heads): conv +
gated delta rule through GdnBackend's own launches, against the float64 oracle, with the
states of every request checked in the pool after every forward."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from attngen.families.gdn.testing import check_close, make_rig, output_bound, state_bound
from attngen.runtime.batch import ForwardMode
from attngen.runtime.checks import AttngenInputError
from gdn_modules import backend_class, small_config

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


@pytest.mark.parametrize("group", [1, 2, 3])  # 3: Qwen3.5-27B's 48 value heads over 16
def test_extend_decode_verify(group: int) -> None:
    torch.manual_seed(group)
    rng = random.Random(group)
    cls = backend_class([small_config(group, topk=4, drafts=4)])
    rig = make_rig(cls, num_k_heads=2, dtype=torch.float16, device="cpu", spec_topk=4, bias=True)
    rig.run_extend([1, 2, 3], [5, 37, 16], [False, False, False])
    rig.run_extend([2, 4, 1], [20, 3, 1], [True, False, True])
    for step in range(1, 4):
        rig.run_decode([4, 2, 1, 3], step)
    rig.run_verify([3, 1], tree=True, rng=rng)
    rig.run_decode([1, 3], 4)
    temporal, conv = rig.pool.layer(0)
    assert not temporal[0].any() and not conv[0].any(), "slot 0 (padding) was written"


def test_verify_chain_then_accept() -> None:
    torch.manual_seed(3)
    cls = backend_class([small_config(2, topk=1, drafts=3)])
    rig = make_rig(cls, num_k_heads=1, dtype=torch.float16, device="cpu", spec_topk=1)
    rig.run_extend([5, 6], [9, 2], [False, False])
    rig.run_verify([6, 5], tree=False, rng=random.Random(3))
    rig.run_decode([5, 6], 2)


def test_bad_inputs_are_named() -> None:
    cls = backend_class([small_config(2)])
    rig = make_rig(cls, num_k_heads=1, dtype=torch.float16, device="cpu", spec_topk=0)
    with pytest.raises(AttngenInputError, match=r"req_pool_indices\[1\]"):
        rig.backend.init_forward_metadata(rig.decode_batch([1, 0]))
    # two requests on one state slot would race on it
    with pytest.raises(AttngenInputError, match=r"\(request 2\): expected a state slot of its"):
        rig.backend.init_forward_metadata(rig.decode_batch([1, 2, 1]))
    # the device prefix decides whether a request reads its pooled state
    ext = rig.extend_batch([1, 2], [0, 4], [3, 2])
    stale = dataclasses.replace(ext, extend_prefix_lens=torch.tensor([0, 0], dtype=torch.int32))
    with pytest.raises(AttngenInputError, match=r"extend_prefix_lens\[1\]: expected .* = 4"):
        rig.backend.init_forward_metadata(stale)
    rig.backend.init_forward_metadata(ext)
    fb = rig.decode_batch([1])
    rig.backend.init_forward_metadata(fb)
    x, a, b = rig.inputs(1)
    with pytest.raises(AttngenInputError, match="mixed_qkv"):
        rig.backend.forward_decode(rig.layer, fb, x.float(), a, b)
    with pytest.raises(AttngenInputError, match="^b: "):
        rig.backend.forward_decode(rig.layer, fb, x, a, b[:, :1])
    with pytest.raises(AttngenInputError, match="no generated config"):
        cls(
            num_k_heads=1,
            num_v_heads=3,
            head_k_dim=32,
            head_v_dim=32,
            dtype=torch.float16,
            device="cpu",
            state_pool=rig.pool,
        )


def test_tree_parents_and_accepted_drafts_are_range_checked() -> None:
    """Eager verify refuses a parent that is not an earlier draft of the request (it would
    read another request's step states), and accept a draft index past the drafts (it
    would copy another request's state into the pool), naming the element."""
    torch.manual_seed(5)
    n = 3
    cls = backend_class([small_config(2, topk=4, drafts=n)])
    rig = make_rig(cls, num_k_heads=1, dtype=torch.float16, device="cpu", spec_topk=4)
    rig.run_extend([1, 2], [4, 6], [False, False])
    for bad, where in (([[-1, 0, 0], [-1, 2, 1]], r"parents\[1, 1\]"),
                       ([[-1, 0, 1], [-1, 0, -2]], r"parents\[1, 2\]"),
                       ([[-1, 0, 5], [-1, 0, 1]], r"parents\[0, 2\]")):  # fmt: skip
        parents = torch.tensor(bad, dtype=torch.int32)
        with pytest.raises(AttngenInputError, match=where + ": expected an earlier draft"):
            rig.backend.init_forward_metadata(rig.verify_batch([1, 2], parents))
    good = torch.tensor([[-1, 0, 0], [-1, 0, 1]], dtype=torch.int32)
    fb = rig.verify_batch([1, 2], good)
    rig.backend.init_forward_metadata(fb)
    x, a, b = rig.inputs(2 * n)
    rig.backend.forward_extend(rig.layer, fb, x, a, b)
    temporal = rig.pool.layer(0)[0].clone()
    for accepted in ([0, n], [-2, 0]):
        with pytest.raises(AttngenInputError, match=r"accepted\[\d\]: expected a draft"):
            rig.backend.accept(torch.tensor(accepted, dtype=torch.int32))
    assert torch.equal(rig.pool.layer(0)[0], temporal)  # nothing copied
    rig.backend.accept(torch.tensor([n - 1, -1], dtype=torch.int32))


def test_a_layer_call_of_another_mode_than_the_metadata_is_refused() -> None:
    """GDN has one metadata type for every mode: forward_decode on a TARGET_VERIFY forward's
    metadata (eager or graph replay) ran the decode kernels over the drafts and wrote them
    into the pool, which verify never does; forward_extend on DECODE metadata failed with
    a raw AttributeError. Both are refused by name, the pool untouched."""
    torch.manual_seed(7)
    n = 3
    cls = backend_class([small_config(2, topk=1, drafts=n)])
    rig = make_rig(cls, num_k_heads=1, dtype=torch.float16, device="cpu", spec_topk=1)
    backend = rig.backend
    rig.run_extend([1, 2], [4, 6], [False, False])
    pool = [t.clone() for t in rig.pool.layer(0)]
    verify = rig.verify_batch([1, 2], None)
    backend.init_forward_metadata(verify)
    with pytest.raises(AttngenInputError, match="forward_decode: .* TARGET_VERIFY"):
        backend.forward_decode(rig.layer, verify, *rig.inputs(2 * n))
    backend.init_cuda_graph_state(2, 2 * n)
    rows, i32 = torch.tensor([1, 2], dtype=torch.int32), dict(dtype=torch.int32)
    zeros = torch.zeros(2, **i32)  # graphs of bs 2 captured first (padding rows only)
    for mode, tokens, spec in (
        (ForwardMode.TARGET_VERIFY, 2 * n, verify.spec_info),
        (ForwardMode.DECODE, 2, None),
    ):
        capture = backend.init_forward_metadata_capture_cuda_graph
        capture(2, tokens, zeros, zeros + 1, None, mode, spec)
    backend.init_forward_metadata_replay_cuda_graph(
        2, rows, torch.full((2,), 9, **i32), 18, None, ForwardMode.TARGET_VERIFY, verify.spec_info
    )
    with pytest.raises(AttngenInputError, match="forward_decode: .* TARGET_VERIFY"):
        backend.forward_decode(rig.layer, rig.decode_batch([1, 2]), *rig.inputs(2 * n))
    assert all(torch.equal(a, b) for a, b in zip(pool, rig.pool.layer(0))), "pool written"
    decode = rig.decode_batch([1, 2])
    backend.init_forward_metadata(decode)
    with pytest.raises(AttngenInputError, match="forward_extend: .* DECODE"):
        backend.forward_extend(rig.layer, decode, *rig.inputs(2))
    backend.init_forward_metadata_replay_cuda_graph(
        2, rows, torch.full((2,), 6, **i32), 12, None, ForwardMode.DECODE, None
    )
    with pytest.raises(AttngenInputError, match="forward_extend: .* DECODE"):
        backend.forward_extend(rig.layer, decode, *rig.inputs(2))
    assert all(torch.equal(a, b) for a, b in zip(pool, rig.pool.layer(0))), "pool written"
    rig.run_decode([1, 2])  # and the backend still serves the right call


@pytest.mark.parametrize("topk", [1, 4])
def test_graph_metadata_paths(topk: int) -> None:
    """The CUDA-graph metadata paths on CPU (no graph: each "replay" runs the forward on
    the static buffers): capture with padding rows only writes nothing; replays of padded
    decode and verify batches match the oracle; slot 0 stays zero."""
    torch.manual_seed(20 + topk)
    rng = random.Random(topk)
    n, max_bs = 3, 4
    cls = backend_class([small_config(2, topk=topk, drafts=n)])
    rig = make_rig(cls, num_k_heads=1, dtype=torch.float16, device="cpu", spec_topk=topk)
    backend = rig.backend
    backend.init_cuda_graph_state(max_bs, max_bs * n)
    i32 = dict(dtype=torch.int32)
    for mode, per in ((ForwardMode.DECODE, 1), (ForwardMode.TARGET_VERIFY, n)):
        parents = torch.full((max_bs, n), -1, **i32) if topk > 1 else None
        info = rig.verify_batch([1] * max_bs, parents).spec_info
        spec = info if mode is ForwardMode.TARGET_VERIFY else None
        zeros = torch.zeros(max_bs, **i32)
        backend.init_forward_metadata_capture_cuda_graph(
            max_bs, max_bs * per, zeros, zeros + 1, None, mode, spec
        )
        fb = rig.decode_batch([1] * max_bs) if per == 1 else rig.verify_batch([1] * max_bs, parents)
        x, a, b = rig.inputs(max_bs * per)
        forward = backend.forward_decode if per == 1 else backend.forward_extend
        forward(rig.layer, fb, x, a, b)
        temporal, conv = rig.pool.layer(0)
        assert not temporal.any() and not conv.any(), "padding rows wrote the pool"
    for step in range(4):
        real = rng.randint(1, max_bs - 1)
        rows = rng.sample(range(1, 10), real)
        req = torch.tensor(rows + [0] * (max_bs - real), **i32)
        xn, an, bn = rig.inputs(max_bs)
        backend.init_forward_metadata_replay_cuda_graph(
            max_bs, req, torch.ones(max_bs, **i32), max_bs, None, ForwardMode.DECODE, None
        )
        out = backend.forward_decode(rig.layer, rig.decode_batch([1] * max_bs), xn, an, bn)
        rig.check_decode(rows, xn[:real], an[:real], bn[:real], out[:real], step + 1)
        trees = [[-1] + [rng.randrange(-1, i) for i in range(1, n)] for _ in rows]
        parents = torch.full((max_bs, n), -1, **i32)
        parents[:real] = torch.tensor(trees, **i32)
        spec = type(info)(draft_token_num=n, parents=parents if topk > 1 else None)
        backend.init_forward_metadata_replay_cuda_graph(
            max_bs,
            req,
            torch.full((max_bs,), n, **i32),
            max_bs * n,
            None,
            ForwardMode.TARGET_VERIFY,
            spec,
        )
        xv, av, bv = rig.inputs(max_bs * n)
        out = backend.forward_extend(rig.layer, rig.verify_batch([1] * max_bs, None), xv, av, bv)
        steps, conv_steps = rig.pool.steps(0)
        for i, row in enumerate(rows):
            part = slice(i * n, (i + 1) * n)
            want, _, want_steps, _ = rig.oracle(
                row,
                xv[part],
                av[part],
                bv[part],
                fresh=False,
                parents=trees[i] if topk > 1 else None,
            )
            check_close("verify replay", out[part], want, output_bound(want, torch.float16, 32, n))
            check_close("verify steps", steps[i], want_steps, state_bound(want_steps, 32, n))
    temporal, conv = rig.pool.layer(0)
    assert not temporal[0].any() and not conv[0].any()
