"""End-to-end judges: attngen's generate against the model's own eager attention.

:func:`check_generate` runs one model three ways on the same weights and prompts (eager
fp32 greedy; attngen greedy with a per-layer judge; teacher-forced eager forwards over
attngen's tokens, exact and with bf16-emulated attention) and returns a report whose
``failures`` name the layer, the feature and the first diverging step.

The logit bound, per request row: LOGIT_FACTOR x the largest deviation, over all steps of
that row, of the emulated bf16 attention (eager attention on bf16-rounded q/k/v, fp8-rounded
K/V for an fp8 cache, bf16-rounded output) from exact fp32 eager. That is how far a
correctly rounded bf16 attention moves this model's logits; a correct kernel adds about one
more rounding of the same size (P in bf16, fp32 accumulation order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import tf_models as M

NEW_TOKENS = 64


@dataclass
class Report:
    case: str
    page_size: int
    kv_dtype: str
    seed: int
    max_error: float = 0.0
    bound: float = 0.0
    ties: list[str] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)
    # (kernels module, variant uri) of every generated config that served a layer
    served: list[tuple[Any, str]] = field(default_factory=list)
    layer_calls: int = 0  # layer calls the per-layer judges saw
    layer_kinds: list[str] = field(default_factory=list)  # what they saw (features' first part)
    dsa_recall: float | None = None  # share of transformers' fp32 top-k picks attngen kept
    dsa_index_ties: tuple[int, int] = (0, 0)  # rows whose pick differed only at a tie, rows
    margin_ratio: float | None = None  # exact_tokens: min over steps of margin / (2 x bound)

    def line(self) -> str:
        sens = " ".join(f"{k}:{v:.0f}x" for k, v in self.sensitivity.items())
        return (
            f"{self.case:8s} ps={self.page_size:<3d} kv={self.kv_dtype:13s} "
            f"err={self.max_error:.3e} "
            f"bound={self.bound:.3e} ties={len(self.ties)} off/bound[{sens}] "
            + (
                f"dsa[recall of fp32 top-k {self.dsa_recall:.3f}, index ties "
                f"{self.dsa_index_ties[0]}/{self.dsa_index_ties[1]} rows] "
                if self.dsa_recall is not None
                else ""
            )
            + (f"margin/2bound>={self.margin_ratio:.2f} " if self.margin_ratio is not None else "")
            + f"{'OK' if not self.failures else 'FAIL'}"
        )


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def teacher_forced(
    model: Any, impl: str, seqs: torch.Tensor, mask: torch.Tensor, start: int
) -> torch.Tensor:
    """Logits ``[B, steps, V]`` predicting tokens ``start ..`` of ``seqs`` in one forward."""
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model(
            input_ids=seqs, attention_mask=mask, position_ids=_positions(mask), use_cache=False
        )
    return out.logits[:, start - 1 : -1].float()


def check_generate(
    case: M.Case,
    page_size: int,
    kv_dtype: torch.dtype,
    seed: int,
    device: str,
    new_tokens: int = NEW_TOKENS,
    exact_tokens: bool = False,
    **options: Any,
) -> Report:
    """With ``exact_tokens``, the greedy tokens must equal eager fp32's exactly, under a
    precondition that is asserted too: at every step of every row, the reference's top-1 /
    top-2 logit margin exceeds twice the row's logit bound (so a run within the bound, which
    the logit check asserts, cannot pick another token). Without it, a divergence is
    accepted where eager's own margin is within twice the bound (a near-tie) and listed."""
    from attngen.integrations import transformers as atf

    report = Report(case.name, page_size, str(kv_dtype).removeprefix("torch."), seed)
    model = M.build(case, seed, device)
    ids, mask = M.prompts(case, seed, device)
    start = ids.shape[1]
    kw = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=M.PAD,
    )
    dsa = any(type(m).__name__ == "DeepseekV32Attention" for m in model.modules())
    fp8_index = dsa and options.get("dsa_index_dtype") == torch.float8_e4m3fn
    with torch.no_grad():
        # DSA over attngen's fp8 indexer: the reference picks its top-k from DeepSeek-V3.2's
        # fp8 indexer scores (float64 sums), as attngen's indexer does; transformers' own
        # fp32 pick is reported (recall). By default attngen scores in the model's dtype, and
        # the reference is transformers' own indexer.
        act_dtype = options.get("dtype") or torch.bfloat16
        restore = M.fp8_indexer(model, act_dtype) if fp8_index else None
        try:
            ref = model.generate(input_ids=ids, attention_mask=mask, **kw)
        finally:
            if restore is not None:
                restore()
        runtime = atf.enable(model, page_size=page_size, kv_cache_dtype=kv_dtype, **options)
        act = options.get("dtype") or torch.bfloat16
        judge = M.LayerJudge(kv_dtype, act)
        runtime.observers.append(judge)
        mla_judge = M.MlaLayerJudge(kv_dtype, act)
        runtime.mla_observers.append(mla_judge)
        gdn_judge = M.GdnLayerJudge(kv_dtype, act)
        runtime.gdn_observers.append(gdn_judge)
        dsa_judge = M.DsaLayerJudge(kv_dtype, act, quantized=fp8_index)
        runtime.dsa_observers.append(dsa_judge)
        got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    # one list: first failure by step
    judge.records += mla_judge.records + gdn_judge.records + dsa_judge.records
    report.layer_calls = len(judge.records)
    report.layer_kinds = sorted({r.features.split(",")[0] for r in judge.records})
    report.choices = sorted({c.describe() for c in runtime.generate.choices.values()})
    if dsa:
        report.dsa_recall = dsa_judge.recall
        report.dsa_index_ties = (dsa_judge.index_ties, dsa_judge.index_rows)
    served = list(runtime.generate.choices.values())
    for family in (runtime.mla, runtime.gdn, runtime.dsa):
        if family.choice is not None:
            report.choices.append(family.choice.describe())
            served.append(family.choice)
    report.served = [(c.kernels, c.config.uri) for c in served]
    tokens_ref, tokens = ref.sequences[:, start:], got.sequences[:, start:]
    logits = torch.stack(got.logits, dim=1).float()  # [B, steps, V]
    full_mask = torch.cat([mask, torch.ones_like(tokens)], dim=1)
    # DSA: the teacher-forced references attend the keys attngen's indexer picked (judged
    # per layer by DsaLayerJudge); "sparse top-k" off makes them dense
    unreplay = M.replay_dsa(model, dsa_judge) if dsa else (lambda: None)
    try:
        exact = teacher_forced(model, "eager", got.sequences, full_mask, start)
        restore = M.emulate_gdn(model, act)  # GDN layers rounded as attngen's path rounds them
        try:
            emu = teacher_forced(
                model, M.register_emulation(kv_dtype, act), got.sequences, full_mask, start
            )
        finally:
            restore()
        if kv_dtype in FP8 and runtime.mla.choice is not None:
            emu = _emulate_mla_fp8(model, runtime, kv_dtype, act, got.sequences, full_mask, start)
        bound = M.LOGIT_FACTOR * (emu - exact).abs().amax(dim=(1, 2))  # [B]
        error = (logits - exact).abs().amax(dim=2)  # [B, steps]
        report.max_error, report.bound = float(error.max()), float(bound.min())
        _check_logits(report, error, bound, judge)
        if exact_tokens:
            ref_logits = torch.stack(ref.logits, dim=1).float()
            _check_exact_tokens(report, tokens, tokens_ref, ref_logits, bound)
        else:
            _check_tokens(report, tokens, tokens_ref, exact, bound, dsa)
        _check_sensitivity(
            report, case, model, got.sequences, full_mask, start, exact, bound, kv_dtype
        )
    finally:
        unreplay()
    return report


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _emulate_mla_fp8(model, runtime, kv_dtype, act, seqs, mask, start) -> torch.Tensor:
    """The emulated logits of an MLA model over an fp8 latent cache: decode steps expand K/V
    from the latent rounded as the pool stores it (q/k/v/o then rounded to ``act``); the
    prompt's step, under a ragged prefill (which attends the new tokens' unquantized
    values), from the bf16 emulation."""
    restore = M.emulate_mla_latent(model, kv_dtype, runtime.options.kv_scale, act)
    try:
        emu = teacher_forced(model, M.register_emulation(act, act), seqs, mask, start)
    finally:
        restore()
    if runtime.options.mla_prefill == "ragged":
        first = teacher_forced(model, M.register_emulation(act, act), seqs, mask, start)
        emu = torch.cat([first[:, :1], emu[:, 1:]], dim=1)
    return emu


def _check_logits(
    report: Report, error: torch.Tensor, bound: torch.Tensor, judge: M.LayerJudge
) -> None:
    bad = error > bound[:, None]
    bad |= ~torch.isfinite(error)
    layer = judge.first_failure()
    if layer is not None:
        report.failures.append(
            f"layer {layer.layer} ({layer.features}) first exceeds its bound at step {layer.step} "
            f"(0 = prefill): max |attngen - eager| {layer.error:.3e} > {layer.bound:.3e}"
        )
    if bad.any():
        rows, steps = bad.nonzero(as_tuple=True)
        first = int(steps.min())
        b = int(rows[steps == first][0])
        where = (
            f"; per-layer judge: {report.failures[0]}"
            if layer
            else "; every layer within its bound"
        )
        report.failures.append(
            f"logits first diverge at step {first} (row {b}): |attngen - eager fp32| "
            f"{float(error[b, first]):.3e} > bound {float(bound[b]):.3e}{where}"
        )


def _check_tokens(report, tokens, tokens_ref, exact, bound, dsa: bool = False) -> None:
    """A divergence is a tie where eager's margin between the two tokens is within twice
    the bound. DSA: ``exact`` attends attngen's own top-k picks, the greedy reference its
    own (from the fp32 run's hidden states); where ``exact`` prefers attngen's token
    (margin < 0) the two runs picked different keys upstream, a flip of the discontinuous
    top-k between keys whose fp8 scores the bf16 run moved past each other. Such steps are
    listed, not failed: the picks themselves are judged per layer (``DsaLayerJudge``)."""
    for b in range(tokens.shape[0]):
        diff = (tokens[b] != tokens_ref[b]).nonzero()
        if diff.numel() == 0:
            continue
        t = int(diff[0])
        a, r = int(tokens[b, t]), int(tokens_ref[b, t])
        margin = float(exact[b, t, r] - exact[b, t, a])  # same prefix up to t
        note = f"row {b} step {t}: attngen {a}, eager {r}, eager margin {margin:.3e}"
        if dsa and margin < 0:
            report.ties.append(note + " (a top-k selection flip upstream)")
        elif margin <= 2 * float(bound[b]):
            report.ties.append(note + " (a tie within the bound)")
        else:
            report.failures.append(
                f"greedy tokens first diverge at {note} > 2 x bound {float(bound[b]):.3e}"
            )


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` -> top-1 minus top-2 logit ``[...]``."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


FP32_RESOLUTION = 4  # the emulated deviation must exceed this many fp32 ulps of the logits


def _check_exact_tokens(report, tokens, tokens_ref, ref_logits, bound) -> None:
    margin = top2_margin(ref_logits)  # [B, steps]: the reference run's own logits
    # the bound must be a bf16 rounding effect, not fp32 noise: on a model whose attention
    # barely reaches the logits, the emulation moves them by a few fp32 ulps only
    ulp = ref_logits.abs().amax(dim=(1, 2)) * 2.0**-23
    floor = FP32_RESOLUTION * ulp
    if not bool((bound / M.LOGIT_FACTOR > floor).all()):
        b = int((bound / M.LOGIT_FACTOR / floor).argmin())
        report.failures.append(
            f"precondition: row {b}: the emulated bf16 deviation {float(bound[b]) / M.LOGIT_FACTOR:.3e}"
            f" is within {FP32_RESOLUTION} fp32 ulps of the logits ({float(floor[b]):.3e}): "
            "attention barely reaches the logits at this embed scale (choose a smaller one)"
        )
    need = 2 * bound[:, None]
    ratio = margin / need
    report.margin_ratio = float(ratio.min())
    if not bool((ratio > 1).all()):
        b, t = divmod(int(ratio.argmin()), ratio.shape[1])
        report.failures.append(
            f"precondition: row {b} step {t}: eager fp32's top-1/top-2 margin "
            f"{float(margin[b, t]):.3e} <= 2 x bound {float(need[b, 0]):.3e}; this config "
            "cannot show exact token equality (choose another seed / embed scale)"
        )
    for b in range(tokens.shape[0]):
        diff = (tokens[b] != tokens_ref[b]).nonzero()
        if diff.numel():
            t = int(diff[0])
            report.failures.append(
                f"greedy tokens differ at row {b} step {t}: attngen {int(tokens[b, t])}, eager "
                f"fp32 {int(tokens_ref[b, t])} (margin {float(margin[b, t]):.3e}, bound "
                f"{float(bound[b]):.3e})"
            )


def _check_sensitivity(report, case, model, seqs, mask, start, exact, bound, kv_dtype) -> None:
    """Each feature switched off must move the logits by more than SENSITIVITY bounds. Over
    an fp8 KV cache the bound is ~16x a bf16 one (e4m3 keeps 3 mantissa bits): the numbers
    are reported but not required there; the same model's bf16 runs show the power."""
    for feature, switch in case.switch_off.items():
        restore = switch(model)
        try:
            off = teacher_forced(model, "eager", seqs, mask, start)
        finally:
            restore()
        # the logit check fails when any row leaves its own bound, so an implementation that
        # ignored the feature would fail by max over rows of (its deviation / the row's bound)
        moved = float(((off - exact).abs().amax(dim=(1, 2)) / bound).max())
        report.sensitivity[feature] = moved
        if not moved > M.SENSITIVITY and kv_dtype not in FP8:
            report.failures.append(
                f"{feature} switched off moves the logits by only {moved:.1f} bounds "
                f"(< {M.SENSITIVITY}): this model would not catch a wrong {feature}"
            )


# -- continuous batching ----

CB_PROMPTS = (150, 131, 203, 40, 97, 260)


@dataclass
class CbReport:
    case: str
    seed: int
    reference: str = "paged|sdpa"
    requests: int = 0
    equal: int = 0
    ties: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"cb {self.case:8s} vs {self.reference} requests={self.requests} "
            f"same_tokens={self.equal} "
            f"ties={len(self.ties)} {'OK' if not self.failures else 'FAIL'} {'; '.join(self.ties)}"
        )


def cb_config(**overrides: Any) -> Any:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    settings = dict(block_size=16, num_blocks=1024, max_batch_tokens=512, use_cuda_graph=True)
    settings.update(overrides)
    return ContinuousBatchingConfig(**settings)


def run_batch(
    model: Any, impl: str, prompts: list[list[int]], new_tokens: int, **cb: Any
) -> list[list[int]]:
    from transformers import GenerationConfig

    gen = GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=M.PAD
    )
    model.set_attn_implementation(impl)
    out = model.generate_batch(
        prompts, generation_config=gen, continuous_batching_config=cb_config(**cb)
    )
    return [list(out[f"req_{i}"].generated_tokens) for i in range(len(prompts))]


def check_continuous_batching(
    case: M.Case,
    seed: int,
    device: str,
    new_tokens: int = NEW_TOKENS,
    lengths: tuple[int, ...] = CB_PROMPTS,
    options: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    **cb: Any,
) -> CbReport:
    from attngen.integrations import transformers as atf

    report = CbReport(case.name, seed, case.paged_reference, requests=len(lengths))
    model = M.build(case, seed, device).to(dtype)
    gen = torch.Generator().manual_seed(seed + 2)
    prompts = [torch.randint(1, case.vocab, (n,), generator=gen).tolist() for n in lengths]
    with torch.no_grad():
        ref = run_batch(model, case.paged_reference, prompts, new_tokens, **cb)
        atf.enable(model, **(options or {}))
        got = run_batch(model, "paged|attngen", prompts, new_tokens, **cb)
    exact = M.build(case, seed, device)  # the same weights in fp32
    for i, (p, a, r) in enumerate(zip(prompts, got, ref)):
        if len(a) != new_tokens:
            report.failures.append(f"request {i}: attngen gave {len(a)} tokens, not {new_tokens}")
            continue
        diff = [t for t, (x, y) in enumerate(zip(a, r)) if x != y]
        if not diff:
            report.equal += 1
            continue
        t = diff[0]
        seq = torch.tensor([p + a[:t]], device=device)
        logits32 = all_logits(exact, seq)[0, len(p) - 1 :]  # row j predicts token j
        logits16 = all_logits(model, seq)[0, len(p) - 1 :]
        deviation = float((logits16 - logits32).abs().max())
        margin = abs(float(logits32[t, a[t]] - logits32[t, r[t]]))
        peer = case.paged_reference
        note = f"request {i} step {t}: attngen {a[t]}, {peer} {r[t]}, fp32 margin {margin:.3e}"
        if margin <= 2 * deviation:
            report.ties.append(note + f" (<= 2 x bf16 deviation {deviation:.3e})")
        else:
            report.failures.append(
                f"tokens first diverge at {note}, bf16 deviation {deviation:.3e}"
            )
    return report


def all_logits(model: Any, seq: torch.Tensor) -> torch.Tensor:
    """Eager logits of every position of ``seq`` (one unpadded request)."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        return model(input_ids=seq, use_cache=False).logits.float()


# -- continuous batching, exact tokens (fp32 model) ----


@dataclass
class CbExactReport:
    case: str
    seed: int
    reference: str
    requests: int = 0
    equal: int = 0
    margin_ratio: float = float("inf")  # min over requests and steps of margin / (2 bound)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"cb-exact {self.case:14s} vs {self.reference} (fp32) requests={self.requests} "
            f"same_tokens={self.equal} margin/2bound>={self.margin_ratio:.2f} "
            f"{'OK' if not self.failures else 'FAIL'}"
        )


def check_continuous_batching_exact(
    case: M.Case,
    seed: int,
    device: str,
    new_tokens: int = NEW_TOKENS,
    lengths: tuple[int, ...] = CB_PROMPTS,
    options: dict[str, Any] | None = None,
    **cb: Any,
) -> CbExactReport:
    """``generate_batch`` of an fp32 model on ``paged|attngen`` (bf16 kernels on q and K/V cast
    from transformers' fp32 paged cache) against transformers' own paged attention on the
    same model (``case.paged_reference``, fp32): the SAME tokens for every request, under an
    asserted precondition per request and step: the reference's tokens are eager fp32's
    greedy picks (teacher-forced over them, one unpadded request) and eager's top-1/top-2
    margin exceeds twice the request's logit bound (``LOGIT_FACTOR`` x the largest deviation
    of the emulated bf16 attention from exact, as ``check_generate``)."""
    from attngen.integrations import transformers as atf

    opts = dict(options or {})
    act = opts.get("dtype") or torch.bfloat16
    report = CbExactReport(case.name, seed, case.paged_reference, requests=len(lengths))
    model = M.build(case, seed, device)  # fp32
    if getattr(model.config, "_experts_implementation", None) is not None:
        # fp32 experts: transformers' grouped_mm falls back to a loop that copies to the host,
        # which CUDA-graph capture refuses; batched_mm runs every expert without a sync
        # (both runs below use it)
        model.config._experts_implementation = "batched_mm"
    gen = torch.Generator().manual_seed(seed + 2)
    prompts = [torch.randint(1, case.vocab, (n,), generator=gen).tolist() for n in lengths]
    with torch.no_grad():
        ref = run_batch(model, case.paged_reference, prompts, new_tokens, **cb)
        atf.enable(model, **opts)
        got = run_batch(model, "paged|attngen", prompts, new_tokens, **cb)
    emu_name = M.register_emulation(act, act)
    for i, (p, a, r) in enumerate(zip(prompts, got, ref)):
        if len(r) != new_tokens or len(a) != new_tokens:
            report.failures.append(f"request {i}: {len(a)} / {len(r)} tokens, not {new_tokens}")
            continue
        seq = torch.tensor([p + r[:-1]], device=device)
        exact = all_logits(model, seq)[0, len(p) - 1 :]  # row j predicts token j
        model.set_attn_implementation(emu_name)
        with torch.no_grad():
            emu = model(input_ids=seq, use_cache=False).logits.float()[0, len(p) - 1 :]
        bound = M.LOGIT_FACTOR * float((emu - exact).abs().max())
        floor = FP32_RESOLUTION * float(exact.abs().max()) * 2.0**-23
        if not bound / M.LOGIT_FACTOR > floor:
            report.failures.append(
                f"precondition: request {i}: the emulated bf16 deviation "
                f"{bound / M.LOGIT_FACTOR:.3e} is within {FP32_RESOLUTION} fp32 ulps of the "
                f"logits ({floor:.3e}): choose a smaller embed scale"
            )
        picks = exact.argmax(dim=-1).tolist()
        if picks != r:
            t = next(j for j, (x, y) in enumerate(zip(picks, r)) if x != y)
            report.failures.append(
                f"precondition: request {i} step {t}: {case.paged_reference} picked {r[t]}, "
                f"eager fp32 {picks[t]}"
            )
        margin = top2_margin(exact)
        ratio = margin / (2 * bound)
        report.margin_ratio = min(report.margin_ratio, float(ratio.min()))
        if not bool((ratio > 1).all()):
            t = int(ratio.argmin())
            report.failures.append(
                f"precondition: request {i} step {t}: eager fp32 margin {float(margin[t]):.3e} "
                f"<= 2 x bound {2 * bound:.3e} (choose another seed / embed scale)"
            )
        if a == r:
            report.equal += 1
        else:
            t = next(j for j, (x, y) in enumerate(zip(a, r)) if x != y)
            report.failures.append(
                f"request {i}: tokens differ at step {t}: attngen {a[t]}, {case.paged_reference} "
                f"{r[t]} (eager margin {float(margin[t]):.3e}, bound {bound:.3e})"
            )
    return report
