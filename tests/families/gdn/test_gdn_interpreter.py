"""GDN Triton kernels called directly (library launchers) against the float64 oracle, in
Triton's interpreter: chunked extend over ragged requests with and without pool states,
chained decode, verify chains and trees with every step's state, the accept copy and the
conv. fp16, small heads; fresh random data; outputs and step buffers start as NaN; pool
slots no request owns (slot 0 included) must come back bit-identical."""

from __future__ import annotations

import random

import pytest
import torch

from attngen.families.gdn import reference as ref
from attngen.families.gdn.testing import check_close, output_bound, state_bound
from attngen.families.gdn.triton import library
from attngen.runtime.checks import AttngenInputError
from gdn_modules import replace, small_config

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

H = 2
DT = torch.float16


def gdn_inputs(n: int, hv: int, dim: int, value_dim: int | None = None):
    q, k = torch.randn(n, H, dim).to(DT), torch.randn(n, H, dim).to(DT)
    v = torch.randn(n, hv, value_dim or dim).to(DT)
    a, b = torch.randn(n, hv).to(DT), torch.randn(n, hv).to(DT)
    return q, k, v, a, b


def gate_params(hv: int):
    return torch.empty(hv).uniform_(0.0, 2.7), torch.randn(hv) * 0.5


@pytest.mark.parametrize(
    "group, lens, chunk, keys, dims",
    [
        (1, [5, 37, 16], 16, "random", (32, 32)),
        (2, [5, 37, 16], 16, "random", (32, 32)),
        (2, [1, 17, 32, 2], 16, "random", (32, 32)),
        (1, [1, 17, 32, 2], 32, "random", (32, 32)),
        (2, [150, 64, 3], 64, "random", (32, 32)),
        (1, [130, 7], 64, "correlated", (32, 32)),
        (2, [40, 3], 16, "fp32-states", (32, 32)),
        (2, [37, 5, 16], 16, "random", (32, 64)),
        (2, [37, 5, 16], 16, "random", (64, 32)),
        (2, [5, 37, 16], 16, "transposed", (32, 32)),
        (1, [150, 64, 3], 64, "transposed", (32, 32)),
        (1, [130, 7], 64, "transposed-correlated", (32, 32)),
        (2, [37, 5, 16], 16, "transposed", (32, 64)),
        (2, [37, 5, 16], 16, "transposed", (64, 32)),
        (2, [40, 3], 16, "transposed-fp32-states", (32, 32)),
    ],
)
def test_extend(group: int, lens: list[int], chunk: int, keys: str, dims: tuple) -> None:
    """Ragged chunked extend; "correlated": nearly equal keys, beta near 1 and slow decay,
    the hard case of the triangular inverse (M's entries near 1 everywhere below the
    diagonal); dims (key, value) unequal too: each keeps its own dim through W, U, u and
    the pool's [V, K] rows. "transposed...": the transposed-state kernel (sm90's default),
    its W / U / KT read through tensor descriptors."""
    torch.manual_seed(len(lens) * 10 + group + chunk + dims[0] + dims[1] - 64)
    dim, vdim = dims
    cfg = replace(small_config(group), chunk_size=chunk, key_dim=dim, value_dim=vdim)
    if keys.startswith("transposed"):
        cfg = replace(cfg, state_transposed=1)
        keys = keys.removeprefix("transposed").removeprefix("-") or "random"
    if keys == "fp32-states":  # per-chunk states in fp32, one value block per program
        cfg = replace(cfg, chunk_state_bits=32, state_block_v_max=16)
    hv, bs = H * group, len(lens)
    q, k, v, a, b = gdn_inputs(sum(lens), hv, dim, vdim)
    A_log, dt_bias = gate_params(hv)
    if keys == "correlated":
        base = torch.randn(1, H, dim)
        k = (base + 0.05 * torch.randn(sum(lens), H, dim)).to(DT)
        b = (4.0 + torch.randn(sum(lens), hv)).to(DT)  # beta ~ 0.98
        A_log, dt_bias = torch.full((hv,), -4.0), torch.full((hv,), -4.0)  # decay ~ 0.9998
    pool = torch.randn(bs + 3, hv, vdim, dim) * 0.1
    slots = torch.randperm(bs + 2)[:bs].to(torch.int32) + 1
    has_init = torch.tensor([i % 2 for i in range(bs)], dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out = torch.full((sum(lens), hv, vdim), float("nan"), dtype=DT)
    before = pool.clone()
    library.extend(
        q,
        k,
        v,
        a,
        b,
        A_log=A_log,
        dt_bias=dt_bias,
        ssm_states=pool,
        cache_indices=slots,
        has_initial_state=has_init,
        query_start_loc=qsl,
        out=out,
        plan=library.chunk_plan(lens, cfg.chunk_size, torch.device("cpu")),
        config=cfg,
        scale=dim**-0.5,
    )
    g, beta = ref.gates(a, b, A_log, dt_bias)
    for i in range(bs):
        s, e = int(qsl[i]), int(qsl[i + 1])
        init = before[slots[i]] if has_init[i] else None
        want, final, _ = ref.gdn_sequence(
            q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], init, scale=dim**-0.5, l2norm_qk=True
        )
        check_close(f"out {i}", out[s:e], want, output_bound(want, DT, dim))
        check_close(f"state {i}", pool[slots[i]], final, state_bound(final, dim))
    untouched = sorted(set(range(bs + 3)) - set(slots.tolist()))
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("dims", [(32, 32), (32, 64), (64, 32)])
def test_decode_chained_with_padding(dims: tuple) -> None:
    """Chained decode steps, one row padding; dims (key, value) unequal too."""
    torch.manual_seed(7)
    dim, vdim = dims
    cfg = replace(small_config(2), key_dim=dim, value_dim=vdim)
    hv = H * 2
    A_log, dt_bias = gate_params(hv)
    pool = torch.zeros(5, hv, vdim, dim)
    slots = torch.tensor([3, 0, 1], dtype=torch.int32)  # row 1 pads
    qsl = torch.arange(4, dtype=torch.int32)
    states = {3: None, 1: None}
    steps = 20
    for step in range(1, steps + 1):
        q, k, v, a, b = gdn_inputs(3, hv, dim, vdim)
        out = torch.full((3, hv, vdim), float("nan"), dtype=DT)
        library.decode(
            q,
            k,
            v,
            a,
            b,
            A_log=A_log,
            dt_bias=dt_bias,
            ssm_states=pool,
            cache_indices=slots,
            query_start_loc=qsl,
            out=out,
            config=cfg,
            scale=dim**-0.5,
        )
        assert not torch.isnan(out).any()
        g, beta = ref.gates(a, b, A_log, dt_bias)
        for i in (0, 2):
            slot, part = int(slots[i]), slice(i, i + 1)
            want, states[slot], _ = ref.gdn_sequence(
                q[part],
                k[part],
                v[part],
                g[part],
                beta[part],
                states[slot],
                scale=dim**-0.5,
                l2norm_qk=True,
            )
            check_close(f"step {step} out", out[part], want, output_bound(want, DT, dim, step))
    for slot, want in states.items():
        check_close(f"state {slot}", pool[slot], want, state_bound(want, dim, steps))
    assert not pool[0].any() and not pool[2].any() and not pool[4].any()


@pytest.mark.parametrize("tree", [False, True])
def test_verify_and_accept(tree: bool) -> None:
    torch.manual_seed(11 + tree)
    rng = random.Random(5)
    n = 4
    cfg = small_config(2, topk=4 if tree else 1, drafts=n)
    hv, dim, bs = H * 2, cfg.key_dim, 3
    conv_dim = 2 * H * dim + hv * dim
    A_log, dt_bias = gate_params(hv)
    pool = torch.randn(6, hv, dim, dim) * 0.1
    conv_pool = torch.randn(6, conv_dim, 3).to(DT)
    slots = torch.tensor([4, 2, 5], dtype=torch.int32)
    qsl = torch.arange(bs + 1, dtype=torch.int32) * n
    trees = [[-1, 0, 0, 1], [-1, -1, 1, 2], [-1, 0, 1, 2]] if tree else None
    parents = torch.tensor(trees, dtype=torch.int32) if tree else None
    q, k, v, a, b = gdn_inputs(bs * n, hv, dim)
    x = torch.randn(bs * n, conv_dim).to(DT)
    weight = (torch.randn(conv_dim, 4) * 0.5).to(DT)
    out = torch.full((bs * n, hv, dim), float("nan"), dtype=DT)
    y = torch.full_like(x, float("nan"))
    steps = torch.full((bs + 1, n, hv, dim, dim), float("nan"))
    conv_steps = torch.full((bs + 1, n, conv_dim, 3), float("nan"), dtype=DT)
    before, conv_before = pool.clone(), conv_pool.clone()
    library.target_verify(
        q,
        k,
        v,
        a,
        b,
        A_log=A_log,
        dt_bias=dt_bias,
        ssm_states=pool,
        cache_indices=slots,
        query_start_loc=qsl,
        out=out,
        steps=steps,
        parents=parents,
        config=cfg,
        scale=dim**-0.5,
    )
    library.conv_update(
        x,
        weight,
        None,
        conv_pool,
        slots,
        qsl,
        y,
        config=cfg,
        steps=conv_steps,
        parents=parents,
        tokens_per_request=n,
    )
    assert torch.equal(pool, before) and torch.equal(conv_pool, conv_before)
    g, beta = ref.gates(a, b, A_log, dt_bias)
    for i in range(bs):
        part, slot, par = slice(i * n, (i + 1) * n), int(slots[i]), trees[i] if tree else None
        want, _, want_steps = ref.gdn_sequence(
            q[part],
            k[part],
            v[part],
            g[part],
            beta[part],
            before[slot],
            scale=dim**-0.5,
            l2norm_qk=True,
            parents=par,
        )
        check_close(f"out {i}", out[part], want, output_bound(want, DT, dim, n))
        check_close(f"steps {i}", steps[i], want_steps, state_bound(want_steps, dim, n))
        y_want, _, windows = ref.conv_sequence(x[part], weight, None, conv_before[slot], par)
        check_close(f"conv {i}", y[part], y_want, output_bound(y_want, DT, dim))
        check_close(f"conv steps {i}", conv_steps[i], windows, 0.0)
    accepted = torch.tensor([rng.randrange(n), -1, rng.randrange(n)], dtype=torch.int32)
    library.accept(pool, conv_pool, steps, conv_steps, slots, accepted)
    for i in range(bs):
        slot, acc = int(slots[i]), int(accepted[i])
        want = (
            (steps[i, acc], conv_steps[i, acc]) if acc >= 0 else (before[slot], conv_before[slot])
        )
        assert torch.equal(pool[slot], want[0]) and torch.equal(conv_pool[slot], want[1])
    for slot in (0, 1, 3):
        assert torch.equal(pool[slot], before[slot]) and torch.equal(
            conv_pool[slot], conv_before[slot]
        )


@pytest.mark.parametrize("bias", [False, True])
def test_conv_decode_and_prefill(bias: bool) -> None:
    torch.manual_seed(13 + bias)
    cfg = small_config(1)
    conv_dim = 100  # not a multiple of the channel block
    weight = (torch.randn(conv_dim, 4) * 0.5).to(DT)
    b = (torch.randn(conv_dim) * 0.1).to(DT) if bias else None
    conv_pool = torch.randn(6, conv_dim, 3).to(DT)
    slots = torch.tensor([2, 0, 5], dtype=torch.int32)
    x = torch.randn(3, conv_dim).to(DT)
    y = torch.full_like(x, float("nan"))
    before = conv_pool.clone()
    library.conv_update(
        x, weight, b, conv_pool, slots, torch.arange(4, dtype=torch.int32), y, config=cfg
    )
    for i in (0, 2):
        want, final, _ = ref.conv_sequence(x[i : i + 1], weight, b, before[slots[i]])
        check_close("conv decode", y[i : i + 1], want, output_bound(want, DT, 1))
        check_close("conv decode state", conv_pool[slots[i]], final, 0.0)
    assert torch.equal(conv_pool[[0, 1, 3, 4]], before[[0, 1, 3, 4]])
    lens = [2, 37, 3]
    qsl = torch.tensor([0, 2, 39, 42], dtype=torch.int32)
    slots = torch.tensor([1, 3, 4], dtype=torch.int32)
    has_init = torch.tensor([1, 1, 0], dtype=torch.int32)
    x = torch.randn(42, conv_dim).to(DT)
    y = torch.full_like(x, float("nan"))
    before = conv_pool.clone()
    library.conv_prefill(
        x, weight, b, conv_pool, slots, has_init, qsl, y, config=cfg, max_len=max(lens)
    )
    for i in range(3):
        s, e = int(qsl[i]), int(qsl[i + 1])
        init = before[slots[i]] if has_init[i] else None
        want, final, _ = ref.conv_sequence(x[s:e], weight, b, init)
        check_close("conv prefill", y[s:e], want, output_bound(want, DT, 1))
        check_close("conv prefill state", conv_pool[slots[i]], final, 0.0)


def test_launcher_errors_name_the_argument() -> None:
    cfg = small_config(2)
    hv, dim = H * 2, cfg.key_dim
    q, k, v, a, b = gdn_inputs(2, hv, dim)
    A_log, dt_bias = gate_params(hv)
    pool = torch.zeros(3, hv, dim, dim)
    kw = dict(
        A_log=A_log,
        dt_bias=dt_bias,
        ssm_states=pool,
        cache_indices=torch.tensor([1, 2], dtype=torch.int32),
        query_start_loc=torch.arange(3, dtype=torch.int32),
        config=cfg,
        scale=1.0,
    )
    out = torch.empty(2, hv, dim, dtype=DT)
    with pytest.raises(AttngenInputError, match="^v: "):
        library.decode(q, k, v[:, :1], a, b, out=out, **kw)
    with pytest.raises(AttngenInputError, match="^ssm_states: "):
        library.decode(q, k, v, a, b, out=out, **dict(kw, ssm_states=pool.to(torch.float16)))
    with pytest.raises(AttngenInputError, match="^cache_indices: "):
        library.decode(q, k, v, a, b, out=out, **dict(kw, cache_indices=torch.tensor([1, 2])))
    with pytest.raises(AttngenInputError, match="^A_log: "):
        library.decode(q, k, v, a, b, out=out, **dict(kw, A_log=A_log.to(DT)))
    with pytest.raises(AttngenInputError, match="extend_lens"):
        library.chunk_plan([3, 0], 16, torch.device("cpu"))


def test_state_kernel_choice_per_batch() -> None:
    """The transposed-state kernel runs where the config allows it and the batch's grid of
    requests x value heads x 64-value blocks reaches state_t_min_programs; else the narrow
    kernel does (a few long requests spread wider on it)."""
    from attngen.families.gdn.triton.host.options import state_transposed_for

    cfg = replace(small_config(2), key_dim=128, value_dim=128)
    allowed = replace(cfg, state_transposed=1, state_t_min_programs=66)
    assert not state_transposed_for(allowed, requests=1, v_heads=32)  # 64 programs
    assert state_transposed_for(allowed, requests=4, v_heads=16)  # 128 programs
    assert not state_transposed_for(replace(allowed, state_transposed=0), 4, 16)
    narrow = replace(allowed, value_dim=32)  # one 32-value block a head
    assert not state_transposed_for(narrow, requests=2, v_heads=32)
    assert state_transposed_for(narrow, requests=3, v_heads=32)
