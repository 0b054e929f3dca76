"""GPU numerics and CUDA-graph tests of every generated GDN backend, against the float64
oracle (which runs on the GPU too: one request, token by token).

Discovery: every ``generated/<ARCH>/<backend>/gdn/<spec>/backend.py`` and every config of
its kernels module (a phase its module does not generate is skipped: the CuTe DSL modules
run extend only). Checks (bounds: attngen.families.gdn.testing, derived in its docstring):

- ``extend``: the chunked kernels over ragged batches with lengths 1 .. 32k, half of the
  requests starting from a pool state, key heads such that the value heads are 16 and 32
  (GVA of the spec; the nearest multiples below where the GVA divides neither: 15 and 30
  at GVA 3), slowly decaying gates (states remember across chunks); then the
  backend end to end (conv + GDN) on mixed batches;
- ``decode``: 200 chained decode steps through the backend, after a prefill, every output
  and the final states checked (the bound grows with the step);
- ``verify``: chains or trees (the config's topk), every draft's output, state and conv
  window; the accept step's copies; then decode continues from the accepted states;
- ``cuda_graph`` / ``cuda_graph_verify``: captured once at MAX_BS, replayed on 24 / 20
  batches of fewer real rows (padded with request row 0 -> slot 0), each checked against
  the oracle; slot 0 is never written.

Outputs are poisoned with NaN before graph replays; eager outputs are fresh tensors whose
every element the checks read (NaN fails).
"""

from __future__ import annotations

import dataclasses

import importlib
import os
import random
from dataclasses import dataclass

import pytest
import torch

from attngen.families.gdn import reference as ref
from attngen.families.gdn.runtime import GdnBackend
from attngen.families.gdn.testing import (
    GdnRig,
    check_close,
    gate_A_log,
    gate_dt_bias,
    make_rig,
    output_bound,
    state_bound,
)
from attngen.runtime.batch import ForwardMode
from attngen.testing.paths import REPO_ROOT

ARCH = os.environ.get("ATTNGEN_GPU_ARCH", "sm90")
DEV = "cuda"
MAX_BS = 8
DECODE_STEPS = 200
REPLAYS = 24
VERIFY_REPLAYS = 20
# ragged extend batches: (lengths, with a pool state?) -- 1 .. 32k, chunk edges around 64
LONG_BATCH = ([32768, 1, 63, 64, 65, 1000], [False, True, False, True, True, False])
SHORT_BATCH = ([4096, 129, 2, 777, 64], [True, False, True, False, True])


def discover() -> list[type[GdnBackend]]:
    root = REPO_ROOT / "generated" / ARCH
    return [
        importlib.import_module(
            f"generated.{ARCH}.{p.parents[2].name}.gdn.{p.parent.name}.backend"
        ).Backend
        for p in sorted(root.glob("*/gdn/*/backend.py"))
    ]


@dataclass(frozen=True)
class Case:
    backend: type[GdnBackend]
    uri: str

    @property
    def config(self):
        return self.backend.kernels.CONFIGS[self.uri]


def cases() -> list:
    params = [
        pytest.param(Case(cls, uri), id=f"{cls.spec_name}-{uri}")
        for cls in discover()
        for uri in sorted(cls.kernels.CONFIGS)
    ]
    return params or [pytest.param(None, id="no-generated-backends")]


CASES = cases()


def require(case: Case | None, phase: str) -> Case:
    if case is None:
        pytest.skip("no generated GDN backends")
    if phase not in case.backend.kernels.PHASES:
        pytest.skip(f"{case.backend.spec_name} does not generate {phase}")
    return case


def rig_for(case: Case, num_k_heads: int = 4, **kw) -> GdnRig:
    dtype = getattr(torch, case.config.dtype)
    return make_rig(
        case.backend,
        num_k_heads=num_k_heads,
        dtype=dtype,
        device=DEV,
        spec_topk=case.config.spec_topk,
        max_reqs=MAX_BS * 2 + 1,
        size=MAX_BS * 2 + 2,
        max_verify_bs=MAX_BS,
        **kw,
    )


# -- extend: the chunked kernels at length, then the backend ----


def kernel_extend(
    case: Case,
    num_v_heads: int,
    lens: list[int],
    init: list[bool],
    correlated: bool = False,
    padding: int = -1,
    changes: dict | None = None,
    segmented: bool | None = None,
) -> dict:
    """library.extend on one ragged batch vs the oracle; returns the worst errors / bounds.
    ``correlated``: nearly equal keys, beta near 1, decay near 1 (M's entries near 1 below
    the diagonal: the hard case of the triangular inverse). ``padding``: that request's
    slot is 0 (a padding request: outputs from a zero state, no pool row touched).
    ``changes``: config fields replaced (tuning keys); ``segmented``: whether the CuTe DSL
    library must have run the batch as segments (context parallelism) or not."""
    cfg, kernels = case.config, case.backend.kernels
    if changes:
        cfg = dataclasses.replace(cfg, **changes)
    dtype, kd, vd = getattr(torch, cfg.dtype), cfg.key_dim, cfg.value_dim
    hk = num_v_heads // cfg.v_heads_per_k_head
    assert hk * cfg.v_heads_per_k_head == num_v_heads, "value heads: a multiple of the group"
    n, bs = sum(lens), len(lens)
    q = torch.randn(n, hk, kd, device=DEV).to(dtype)
    k = torch.randn(n, hk, kd, device=DEV).to(dtype)
    v = torch.randn(n, num_v_heads, vd, device=DEV).to(dtype)
    a = torch.randn(n, num_v_heads, device=DEV).to(dtype)
    b = torch.randn(n, num_v_heads, device=DEV).to(dtype)
    A_log, dt_bias = gate_A_log(num_v_heads, True, DEV), gate_dt_bias(num_v_heads, True, DEV)
    if correlated:
        base = torch.randn(1, hk, kd, device=DEV)
        k = (base + 0.05 * torch.randn(n, hk, kd, device=DEV)).to(dtype)
        b = (4.0 + torch.randn(n, num_v_heads, device=DEV)).to(dtype)
        A_log = torch.full((num_v_heads,), -4.0, device=DEV)
        dt_bias = torch.full((num_v_heads,), -4.0, device=DEV)
    pool = torch.randn(bs + 2, num_v_heads, vd, kd, device=DEV) * 0.1
    slots = (torch.randperm(bs + 1, device=DEV)[:bs] + 1).to(torch.int32)
    if padding >= 0:
        slots[padding] = 0
    has_init = torch.tensor(init, dtype=torch.int32, device=DEV)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    out = torch.full((n, num_v_heads, vd), float("nan"), dtype=dtype, device=DEV)
    before = pool.clone()
    plan = kernels.chunk_plan(lens, cfg.chunk_size, torch.device(DEV))
    kernels.extend(
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
        plan=plan,
        config=cfg,
        scale=kd**-0.5,
    )
    if segmented is not None:
        took = any(s is not None for s in plan.schedules.values())
        assert took == segmented, f"segments taken: {took}, expected {segmented}"
    g, beta = ref.gates(a, b, A_log, dt_bias)
    worst = {"out": 0.0, "state": 0.0}
    for i, length in enumerate(lens):
        s, e = int(qsl[i]), int(qsl[i + 1])
        want, final, _ = ref.gdn_sequence(
            q[s:e],
            k[s:e],
            v[s:e],
            g[s:e],
            beta[s:e],
            before[slots[i]] if init[i] and i != padding else None,
            scale=kd**-0.5,
            l2norm_qk=cfg.l2norm,
            keep_steps=False,
        )
        ob, sb = output_bound(want, dtype, kd), state_bound(final, kd)
        what = f"H{num_v_heads} len {length} init {init[i]}"
        worst["out"] = max(worst["out"], check_close(f"{what} out", out[s:e], want, ob))
        if i != padding:
            state = check_close(f"{what} state", pool[slots[i]], final, sb)
            worst["state"] = max(worst["state"], state)
    owned = {int(slot) for i, slot in enumerate(slots.tolist()) if i != padding}
    untouched = sorted(set(range(bs + 2)) - owned)  # slot 0 among them
    assert torch.equal(pool[untouched], before[untouched]), "a slot no request owns changed"
    return worst


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_extend(case: Case | None, evidence) -> None:
    case = require(case, "extend")
    torch.manual_seed(1)
    worst = {}
    group = case.config.v_heads_per_k_head
    few, many = (group * (heads // group) for heads in (16, 32))  # 16, 32 (GVA 3: 15, 30)
    for hv, batch in ((few, LONG_BATCH), (many, SHORT_BATCH)):
        worst[hv] = kernel_extend(case, hv, *batch)
    worst["corr"] = kernel_extend(
        case, few, [2000, 64, 3], [True, False, True], correlated=True, padding=1
    )
    if hasattr(case.config, "segments_max"):  # the CuTe DSL library's context parallelism
        # the long batch above ran as segments (its 32k request, at the default estimate);
        # here the plain launch at length, then many segments on slow decays (the combine's
        # products matter) with the segmented request a padding one
        worst["plain"] = kernel_extend(
            case, few, [5000, 3, 64], [True, False, True], changes={"segments_max": 1},
            segmented=False,
        )  # fmt: skip
        worst["seg"] = kernel_extend(
            case, group * (8 // group), [6000, 700, 1, 2500], [True, True, False, True],
            correlated=True, padding=0, changes={"segments_overhead_chunks": 0},
            segmented=True,
        )  # fmt: skip
    rig = rig_for(case, bias=True, slow_decay=True)
    rig.run_extend([1, 2, 3, 4], [300, 1, 64, 129], [False] * 4)
    rig.run_extend([2, 5, 1], [77, 64, 1], [True, False, True])
    detail = " ".join(
        f"H{hv}: out {w['out']:.2f} state {w['state']:.2f}" for hv, w in worst.items()
    )
    evidence.record(case.backend.kernels, case.uri, "extend", detail=f"error/bound {detail}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_decode(case: Case | None, evidence) -> None:
    """200 chained decode steps; the bound grows linearly with the step (fp32 state)."""
    case = require(case, "decode")
    torch.manual_seed(2)
    rig = rig_for(case, slow_decay=True)
    rows = list(range(1, MAX_BS + 1))
    rig.run_extend(rows[:4], [100, 1, 64, 700], [False] * 4)
    for step in range(1, DECODE_STEPS + 1):
        rig.run_decode(rows, step)
    for row in rows:
        rig.check_states(row, steps=DECODE_STEPS)
    temporal, conv = rig.pool.layer(0)
    assert not temporal[0].any() and not conv[0].any(), "slot 0 (padding) was written"
    evidence.record(case.backend.kernels, case.uri, "decode")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_verify(case: Case | None, evidence) -> None:
    case = require(case, "verify")
    torch.manual_seed(3)
    rng = random.Random(3)
    rig = rig_for(case, bias=True, slow_decay=True)
    rows = list(range(1, MAX_BS + 1))
    rig.run_extend(rows, [rng.randint(1, 300) for _ in rows], [False] * len(rows))
    tree = case.config.spec_topk > 1
    for _ in range(3):
        chosen = rng.sample(rows, rng.randint(1, MAX_BS))
        rig.run_verify(chosen, tree=tree, rng=rng)
        rig.run_decode(chosen, 2)
    evidence.record(case.backend.kernels, case.uri, "verify")


# -- CUDA graphs ----


def capture(rig: GdnRig, mode: ForwardMode, rows_per_request: int):
    """Capture one forward at MAX_BS padded requests (row 0 -> slot 0: nothing written)."""
    backend, n = rig.backend, rows_per_request
    backend.init_cuda_graph_state(MAX_BS, MAX_BS * n)
    x, a, b = rig.inputs(MAX_BS * n)
    req = torch.zeros(MAX_BS, dtype=torch.int32, device=DEV)
    seq = torch.ones(MAX_BS, dtype=torch.int32, device=DEV)
    info = None
    if mode is ForwardMode.TARGET_VERIFY:
        parents = torch.full((MAX_BS, n), -1, dtype=torch.int32, device=DEV)
        info = rig.verify_batch([1] * MAX_BS, parents if rig.config.spec_topk > 1 else None)
        info = info.spec_info
    fb = rig.decode_batch([1] * MAX_BS) if mode is ForwardMode.DECODE else None
    fb = fb or rig.verify_batch([1] * MAX_BS, getattr(info, "parents", None))
    backend.init_forward_metadata_capture_cuda_graph(MAX_BS, MAX_BS * n, req, seq, None, mode, info)
    forward = backend.forward_decode if mode is ForwardMode.DECODE else backend.forward_extend
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward(rig.layer, fb, x, a, b)  # warm-up (compiles), padded rows only
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward(rig.layer, fb, x, a, b)
    return graph, out, (x, a, b), fb, info


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_cuda_graph(case: Case | None, evidence) -> None:
    case = require(case, "decode")
    torch.manual_seed(4)
    rng = random.Random(4)
    rig = rig_for(case, slow_decay=True)
    temporal, conv = rig.pool.layer(0)
    graph, out, (x, a, b), _, _ = capture(rig, ForwardMode.DECODE, 1)
    assert not temporal.any() and not conv.any(), "capture wrote the pool"
    pool_rows = list(range(1, MAX_BS * 2 + 1))
    for step in range(REPLAYS):
        real = MAX_BS if step % 5 == 0 else rng.randint(1, MAX_BS - 1)
        rows = rng.sample(pool_rows, real)
        xn, an, bn = rig.inputs(real)
        x.zero_(), a.zero_(), b.zero_()
        x[:real], a[:real], b[:real] = xn, an, bn
        padded = rows + [0] * (MAX_BS - real)
        req = torch.tensor(padded, dtype=torch.int32, device=DEV)
        seq = torch.ones(MAX_BS, dtype=torch.int32, device=DEV)
        rig.backend.init_forward_metadata_replay_cuda_graph(
            MAX_BS, req, seq, MAX_BS, None, ForwardMode.DECODE, None
        )
        out.fill_(float("nan"))
        graph.replay()
        rig.check_decode(rows, xn, an, bn, out[:real], step + 1)
        for row in rows:
            rig.check_states(row, steps=step + 1)
    assert not temporal[0].any() and not conv[0].any(), "slot 0 (padding) was written"
    evidence.record(case.backend.kernels, case.uri, "cuda_graph")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_cuda_graph_verify(case: Case | None, evidence) -> None:
    case = require(case, "verify")
    torch.manual_seed(5)
    rng = random.Random(5)
    rig = rig_for(case)
    n, tree = case.config.num_draft_tokens, case.config.spec_topk > 1
    rows_all = list(range(1, MAX_BS + 1))
    rig.run_extend(rows_all, [rng.randint(1, 100) for _ in rows_all], [False] * MAX_BS)
    graph, out, (x, a, b), fb, info = capture(rig, ForwardMode.TARGET_VERIFY, n)
    steps, conv_steps = rig.pool.steps(0)
    for step in range(VERIFY_REPLAYS):
        real = MAX_BS if step % 4 == 0 else rng.randint(1, MAX_BS - 1)
        rows = rng.sample(rows_all, real)
        trees = [[-1] + [rng.randrange(-1, i) for i in range(1, n)] if tree else None for _ in rows]
        xn, an, bn = rig.inputs(real * n)
        x.zero_(), a.zero_(), b.zero_()
        x[: real * n], a[: real * n], b[: real * n] = xn, an, bn
        req = torch.tensor(rows + [0] * (MAX_BS - real), dtype=torch.int32, device=DEV)
        seq = torch.full((MAX_BS,), n, dtype=torch.int32, device=DEV)
        spec = info
        if tree:
            parents = torch.full((MAX_BS, n), -1, dtype=torch.int32, device=DEV)
            parents[:real] = torch.tensor(trees, dtype=torch.int32, device=DEV)
            spec = type(info)(draft_token_num=n, parents=parents)
        rig.backend.init_forward_metadata_replay_cuda_graph(
            MAX_BS, req, seq, MAX_BS * n, None, ForwardMode.TARGET_VERIFY, spec
        )
        out.fill_(float("nan"))
        steps.fill_(float("nan"))
        graph.replay()
        kd, accepted = rig.layer.head_k_dim, []
        for i, row in enumerate(rows):
            part = slice(i * n, (i + 1) * n)
            want, _, want_steps, windows = rig.oracle(
                row, xn[part], an[part], bn[part], fresh=False, parents=trees[i]
            )
            check_close(
                f"replay {step} row {row}", out[part], want, output_bound(want, rig.dtype, kd, n)
            )
            check_close(
                f"replay {step} steps", steps[i], want_steps, state_bound(want_steps, kd, n)
            )
            check_close(f"replay {step} conv steps", conv_steps[i], windows, 0.0)
            accepted.append((rng.randrange(-1, n), want_steps, windows))
        acc = [x[0] for x in accepted] + [-1] * (MAX_BS - real)
        rig.backend.accept(torch.tensor(acc, dtype=torch.int32, device=DEV))
        for row, (choice, want_steps, windows) in zip(rows, accepted):
            if choice >= 0:
                rig.tracked[row] = type(rig.tracked[row])(want_steps[choice], windows[choice])
            rig.check_states(row, steps=n)
    temporal, conv = rig.pool.layer(0)
    assert not temporal[0].any() and not conv[0].any(), "slot 0 (padding) was written"
    evidence.record(case.backend.kernels, case.uri, "cuda_graph_verify")
