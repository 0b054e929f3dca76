"""Test rig of the GDN family: layers, batches and a backend driven against the float64
oracle (CPU interpreter tests and GPU tests share it), and THE error bounds of GDN tensors.

Bounds (the kernels get the same dtype-rounded inputs as the oracle), per element i of a
tensor whose oracle value is ``ref``:

    |got_i - ref_i| <= REL * |ref_i| + ABS * max|ref|

- outputs (rounded once to the dtype): REL = eps/2, exactly the rounding's own bound; ABS =
  eps/2 (a q/k/v element of the conv output may round 1 ulp apart from the oracle's when
  fp32 and float64 accumulation straddle a tie; it moves an output by at most about eps/2
  of the largest one) + DOT_FACTOR * u_tf32 + steps * STATE_FACTOR * K * u_fp32;
- states (fp32, no output rounding): REL = 0, ABS = DOT_FACTOR * u_tf32 + steps *
  STATE_FACTOR * K * u_fp32; conv states and conv windows are copies of inputs: exact.

Where the terms come from: the chunked kernels run tl.dot on fp32 operands, TF32 on the GPU
(unit roundoff u_tf32 = 2^-11), in chains of up to four products (T, W / U, W S, P u),
each element a sum of products no larger than the largest output / state times O(1):
DOT_FACTOR = 16. One product runs on bf16 operands: Q S0, with S0 (a chunk's initial
state) stored in the activation dtype; its rounding (u_bf16 = 2^-8 of S0) reaches the
output once, not through the state chain, and stays inside the same allowance (a float64
emulation of the kernels' roundings at K = V = 128, 2k tokens, correlated keys measured
0.26 of the output bound; bf16 W, U, u or P instead broke it, so they stay fp32 / TF32). The recurrent kernels run in fp32 (u_fp32 = 2^-24): each step's
reductions over K add <= K u_fp32 of the state's scale, and the step map exp(g) (I - beta k
k^T) is non-expansive for unit k and beta in (0, 1), so n chained steps add at most
linearly: STATE_FACTOR = 2 per step. (The first GPU run measured the largest outputs at
up to ~10x their RMS, so bounds scale with max|ref|, not with the RMS.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from attngen.families.gdn import reference as ref
from attngen.families.gdn.runtime import GdnBackend, GdnLayer, GdnVerifyInfo
from attngen.runtime.batch import ForwardBatch, ForwardMode
from attngen.runtime.state_pool import RequestStatePool

OUT_ROUNDING = 4.0
DOT_FACTOR = 16.0
STATE_FACTOR = 2.0
U_TF32 = 2.0**-11
U_FP32 = 2.0**-24


@dataclass(frozen=True)
class Tol:
    """|got - ref| <= rel * |ref| + abs_, elementwise."""

    rel: float
    abs_: float


def amax(x: torch.Tensor) -> float:
    return float(x.double().abs().max()) if x.numel() else 0.0


def computation_factor(key_dim: int, steps: int) -> float:
    return DOT_FACTOR * U_TF32 + steps * STATE_FACTOR * key_dim * U_FP32


def output_bound(ref_out: torch.Tensor, dtype: torch.dtype, key_dim: int, steps: int = 1) -> Tol:
    eps = torch.finfo(dtype).eps
    return Tol(eps / 2, (eps / 2 + computation_factor(key_dim, steps)) * amax(ref_out))


def state_bound(ref_state: torch.Tensor, key_dim: int, steps: int = 1) -> Tol:
    return Tol(0.0, computation_factor(key_dim, steps) * amax(ref_state))


def check_close(name: str, got: torch.Tensor, want: torch.Tensor, bound: Tol | float) -> float:
    """Assert every element within ``bound`` (a Tol, or an absolute float; no NaN allowed);
    returns the largest error over its allowance (<= 1)."""
    tol = bound if isinstance(bound, Tol) else Tol(0.0, float(bound))
    if torch.isnan(got).any():
        raise AssertionError(f"{name}: {int(torch.isnan(got).sum())} NaN elements (unwritten?)")
    want = want.to(got.device, torch.float64)
    err = (got.double() - want).abs()
    allowed = tol.rel * want.abs() + tol.abs_
    if not bool((err <= allowed).all()):
        i = int((err - allowed).flatten().argmax())
        raise AssertionError(
            f"{name}: error {float(err.flatten()[i]):.3e} > allowed {float(allowed.flatten()[i]):.3e}"
            f" at flat index {i} (ref {float(want.flatten()[i]):.4e}; max error "
            f"{float(err.max()):.3e}, abs part {tol.abs_:.3e})"
        )
    ratio = err / allowed.clamp_min(1e-300)
    return float(ratio.max()) if ratio.numel() else 0.0


def make_layer(
    *,
    num_k_heads: int,
    num_v_heads: int,
    key_dim: int,
    value_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    layer_id: int = 0,
    bias: bool = False,
    slow_decay: bool = False,
) -> GdnLayer:
    """Random layer weights on the scales of a trained Qwen3-Next layer; ``slow_decay``:
    gates whose per-token decay is 0.7 .. 0.999, so a state remembers hundreds of tokens
    (what crosses chunk boundaries)."""
    conv_dim = 2 * num_k_heads * key_dim + num_v_heads * value_dim
    f32 = dict(dtype=torch.float32, device=device)
    return GdnLayer(
        layer_id=layer_id,
        num_k_heads=num_k_heads,
        num_v_heads=num_v_heads,
        head_k_dim=key_dim,
        head_v_dim=value_dim,
        A_log=gate_A_log(num_v_heads, slow_decay, device),
        dt_bias=gate_dt_bias(num_v_heads, slow_decay, device),
        conv_weight=(torch.randn(conv_dim, 4, **f32) * 0.5).to(dtype),
        conv_bias=(torch.randn(conv_dim, **f32) * 0.1).to(dtype) if bias else None,
    )


def gate_A_log(hv: int, slow: bool, device) -> torch.Tensor:
    lo, hi = (-3.0, 1.0) if slow else (0.0, 2.7)  # exp(A_log): 0.05 .. 2.7 or 1 .. 15
    return torch.empty(hv, dtype=torch.float32, device=device).uniform_(lo, hi)


def gate_dt_bias(hv: int, slow: bool, device) -> torch.Tensor:
    base = -3.0 if slow else 0.0  # softplus(-3 + a) ~ 0.05 e^a
    return base + torch.randn(hv, dtype=torch.float32, device=device) * 0.5


@dataclass
class Tracked:
    """The oracle's copy of one request's states (float64)."""

    temporal: torch.Tensor | None = None  # [HV, V, K]
    conv: torch.Tensor | None = None  # [conv_dim, 3]


@dataclass
class GdnRig:
    """A backend, its pool and one layer, and the oracle's states per request row."""

    backend: GdnBackend
    pool: RequestStatePool
    layer: GdnLayer
    dtype: torch.dtype
    device: torch.device
    tracked: dict[int, Tracked] = field(default_factory=dict)
    max_err: dict[str, float] = field(default_factory=dict)

    @property
    def config(self) -> Any:
        return self.backend.config

    def note(self, name: str, err: float) -> None:
        self.max_err[name] = max(err, self.max_err.get(name, 0.0))

    def inputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randn(rows, self.backend.conv_dim, device=self.device).to(self.dtype)
        a = torch.randn(rows, self.backend.num_v_heads, device=self.device).to(self.dtype)
        b = torch.randn(rows, self.backend.num_v_heads, device=self.device).to(self.dtype)
        return x, a, b

    # -- batches ----

    def extend_batch(self, rows: list[int], prefix: list[int], lens: list[int]) -> ForwardBatch:
        return self._batch(ForwardMode.EXTEND, rows, prefix, lens)

    def decode_batch(self, rows: list[int]) -> ForwardBatch:
        return self._batch(ForwardMode.DECODE, rows, [5] * len(rows), None)

    def verify_batch(self, rows: list[int], parents: torch.Tensor | None) -> ForwardBatch:
        n = self.config.num_draft_tokens
        info = GdnVerifyInfo(draft_token_num=n, parents=parents)
        return self._batch(ForwardMode.TARGET_VERIFY, rows, [5] * len(rows), [n] * len(rows), info)

    def _batch(self, mode, rows, prefix, lens, spec_info=None) -> ForwardBatch:
        i32 = dict(dtype=torch.int32, device=self.device)
        extend = lens is not None
        seq = [p + (n if extend else 1) for p, n in zip(prefix, lens or [1] * len(rows))]
        num_new = sum(lens) if extend else len(rows)
        return ForwardBatch(
            batch_size=len(rows),
            forward_mode=mode,
            req_pool_indices=torch.tensor(rows, **i32),
            seq_lens=torch.tensor(seq, **i32),
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int32),
            out_cache_loc=torch.zeros(num_new, dtype=torch.int64, device=self.device),
            extend_prefix_lens=torch.tensor(prefix, **i32) if extend else None,
            extend_seq_lens=torch.tensor(lens, **i32) if extend else None,
            extend_prefix_lens_cpu=list(prefix) if extend else None,
            extend_seq_lens_cpu=list(lens) if extend else None,
            spec_info=spec_info,
        )

    # -- the oracle ----

    def oracle(
        self,
        row: int,
        x: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        fresh: bool,
        parents: list[int] | None = None,
    ) -> tuple[torch.Tensor, Tracked, torch.Tensor, torch.Tensor]:
        """One request's tokens through conv + GDN in float64 from its tracked states
        (``fresh``: zeros). Returns (out [T, HV*V], final states, step states, conv
        windows); the conv output is rounded to the dtype as the kernels store it."""
        layer, t = self.layer, self.tracked.get(row, Tracked())
        y, conv_final, windows = ref.conv_sequence(
            x,
            layer.conv_weight,
            layer.conv_bias,
            None if fresh else t.conv,
            parents=parents,
        )
        y = y.to(self.dtype)
        hk, kd = layer.num_k_heads, layer.head_k_dim
        q = y[:, : hk * kd].view(-1, hk, kd)
        k = y[:, hk * kd : 2 * hk * kd].view(-1, hk, kd)
        v = y[:, 2 * hk * kd :].view(-1, layer.num_v_heads, layer.head_v_dim)
        g, beta = ref.gates(a, b, layer.A_log, layer.dt_bias)
        out, final, steps = ref.gdn_sequence(
            q,
            k,
            v,
            g,
            beta,
            None if fresh else t.temporal,
            scale=kd**-0.5,
            l2norm_qk=self.config.l2norm,
            parents=parents,
            keep_steps=parents is not None or x.shape[0] <= 16,
        )
        return out.reshape(out.shape[0], -1), Tracked(final, conv_final), steps, windows

    # -- one forward, checked against the oracle ----

    def run_extend(self, rows: list[int], lens: list[int], with_prefix: list[bool]) -> None:
        """An EXTEND batch: requests with a prefix continue from their tracked states."""
        fb = self.extend_batch(rows, [5 if p else 0 for p in with_prefix], lens)
        x, a, b = self.inputs(sum(lens))
        self.backend.init_forward_metadata(fb)
        out = self.backend.forward_extend(self.layer, fb, x, a, b)
        kd, offset = self.layer.head_k_dim, 0
        for row, n, prefix in zip(rows, lens, with_prefix):
            part = slice(offset, offset + n)
            want, tracked, _, _ = self.oracle(row, x[part], a[part], b[part], fresh=not prefix)
            bound = output_bound(want, self.dtype, kd)
            self.note(
                "extend", check_close(f"extend row {row} ({n} tokens)", out[part], want, bound)
            )
            self.tracked[row] = tracked
            self.check_states(row)
            offset += n

    def run_decode(self, rows: list[int], step: int = 1) -> torch.Tensor:
        """One DECODE step of ``rows`` (the ``step``-th chained one: the bound grows)."""
        fb = self.decode_batch(rows)
        x, a, b = self.inputs(len(rows))
        self.backend.init_forward_metadata(fb)
        out = self.backend.forward_decode(self.layer, fb, x, a, b)
        self.check_decode(rows, x, a, b, out, step)
        return out

    def check_decode(self, rows, x, a, b, out, step: int = 1) -> None:
        kd = self.layer.head_k_dim
        for i, row in enumerate(rows):
            if row == 0:  # padding
                continue
            part = slice(i, i + 1)
            want, tracked, _, _ = self.oracle(row, x[part], a[part], b[part], fresh=False)
            bound = output_bound(want, self.dtype, kd, steps=step)
            self.note(
                "decode", check_close(f"decode row {row} step {step}", out[part], want, bound)
            )
            self.tracked[row] = tracked

    def run_verify(self, rows: list[int], tree: bool, rng: random.Random) -> None:
        """A TARGET_VERIFY batch: every draft's output and state, the pool untouched; then
        a random accept per request, checked in the pool."""
        n = self.config.num_draft_tokens
        trees = [random_tree(n, rng) if tree else None for _ in rows]
        parents = None
        if tree:
            parents = torch.tensor(trees, dtype=torch.int32, device=self.device)
        fb = self.verify_batch(rows, parents)
        x, a, b = self.inputs(len(rows) * n)
        temporal, conv = self.pool.layer(self.layer.layer_id)
        before = (temporal.clone(), conv.clone())
        self.backend.init_forward_metadata(fb)
        out = self.backend.forward_extend(self.layer, fb, x, a, b)
        if not (torch.equal(before[0], temporal) and torch.equal(before[1], conv)):
            raise AssertionError("verify wrote the state pool")
        steps, conv_steps = self.pool.steps(self.layer.layer_id)
        kd, candidates = self.layer.head_k_dim, []
        for i, row in enumerate(rows):
            part = slice(i * n, (i + 1) * n)
            want, _, want_steps, windows = self.oracle(
                row, x[part], a[part], b[part], fresh=False, parents=trees[i]
            )
            bound = output_bound(want, self.dtype, kd, steps=n)
            self.note("verify", check_close(f"verify row {row}", out[part], want, bound))
            sb = state_bound(want_steps, kd, steps=n)
            self.note("verify_states", check_close(f"steps row {row}", steps[i], want_steps, sb))
            self.note(
                "verify_conv", check_close(f"conv steps row {row}", conv_steps[i], windows, 0.0)
            )
            candidates.append((want_steps, windows))
        accepted = [rng.randrange(-1, n) for _ in rows]
        self.backend.accept(torch.tensor(accepted, dtype=torch.int32, device=self.device))
        for row, acc, (want_steps, windows) in zip(rows, accepted, candidates):
            if acc >= 0:
                self.tracked[row] = Tracked(want_steps[acc], windows[acc])
            if row in self.tracked:
                self.check_states(row, steps=n)

    def slot(self, row: int) -> int:
        return int(self.pool.req_to_slot[row])

    def check_states(self, row: int, steps: int = 1) -> None:
        """The pool's states of request ``row`` against the tracked ones."""
        t = self.tracked[row]
        temporal, conv = self.pool.layer(self.layer.layer_id)
        kd = self.layer.head_k_dim
        s = temporal[self.slot(row)]
        self.note(
            "state",
            check_close(f"state row {row}", s, t.temporal, state_bound(t.temporal, kd, steps)),
        )
        self.note("conv_state", check_close(f"conv row {row}", conv[self.slot(row)], t.conv, 0.0))


def make_rig(
    backend_cls: type[GdnBackend],
    *,
    num_k_heads: int,
    dtype: torch.dtype,
    device: torch.device | str,
    max_reqs: int = 16,
    size: int = 12,
    max_verify_bs: int = 8,
    spec_topk: int | None = None,
    bias: bool = False,
    slow_decay: bool = False,
) -> GdnRig:
    """A backend of ``backend_cls`` (its kernels module's config picked by shape and topk)
    over a fresh pool whose request rows r = 1..max_reqs-1 get slots in shuffled order."""
    configs = list(backend_cls.kernels.CONFIGS.values())
    config = next(c for c in configs if spec_topk is None or c.spec_topk == spec_topk)
    hv = num_k_heads * config.v_heads_per_k_head
    kd, vd = config.key_dim, config.value_dim
    conv_dim = 2 * num_k_heads * kd + hv * vd
    drafts = config.num_draft_tokens
    pool = RequestStatePool(
        num_layers=1,
        size=size,
        max_reqs=max_reqs,
        temporal_shape=(hv, vd, kd),
        temporal_dtype=torch.float32,
        conv_shape=(conv_dim, config.conv_kernel - 1),
        conv_dtype=dtype,
        device=device,
        verify_shape=(max_verify_bs, drafts) if drafts else None,
    )
    slots = list(range(1, size + 1))
    random.shuffle(slots)
    for row, slot in zip(range(1, max_reqs), slots):
        pool.assign(row, slot)
    backend = backend_cls(
        num_k_heads=num_k_heads,
        num_v_heads=hv,
        head_k_dim=kd,
        head_v_dim=vd,
        dtype=dtype,
        device=device,
        state_pool=pool,
        spec_topk=config.spec_topk,
    )
    layer = make_layer(
        num_k_heads=num_k_heads,
        num_v_heads=hv,
        key_dim=kd,
        value_dim=vd,
        dtype=dtype,
        device=device,
        bias=bias,
        slow_decay=slow_decay,
    )
    return GdnRig(backend, pool, layer, dtype, torch.device(device))


def random_tree(n: int, rng: random.Random) -> list[int]:
    """Parents of an n-draft tree in topological order (draft 0 the root's child)."""
    return [-1] + [rng.randrange(-1, i) for i in range(1, n)]


def backend_with_kernels(backend_cls: type[GdnBackend], kernels: ModuleType) -> type[GdnBackend]:
    """``backend_cls`` bound to another kernels module (tests: fp16 configs)."""
    return type(backend_cls.__name__, (backend_cls,), {"kernels": kernels})
