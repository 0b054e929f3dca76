"""GPU tests of the CuTe DSL split-KV decode at the launcher: every split count, empty
splits, requests with no key, and the mask hooks the decode spec does not generate
(window, softcap, sinks: the split kernel's window skipping, the combine's sinks).

The generated backends' decode (eager, long contexts, 24 CUDA-graph replays, MQA) is
checked by test_mha_backend_gpu.py, which discovers the CuTe DSL packages too. Here each
case runs the launcher on fresh random data (pages shuffled, the output and both split
buffers poisoned with NaN) with num_splits forced to 1, to max_splits (mostly empty splits:
a short request has fewer key tiles than splits) and to random counts, and matches the
float64 oracle (attngen.families.mha.reference.paged_decode_ref) within the kernel
tolerance table; the split counts must also agree with each other.
"""

from __future__ import annotations

import dataclasses
import importlib
import random

import pytest
import torch

from test_mha_backend_gpu import ARCH  # noqa: I001

from attngen.families.mha.reference import paged_decode_ref
from attngen.hooks import MaskHooks
from attngen.testing.tolerance import KERNEL, assert_close

SPEC = "mha_gqa_decode"
HKV = 2
# request lengths: none, one key, a tile and one, long; past the page size and table width
LENS = [0, 1, 65, 129, 700, 4097, 2048]
WINDOW_SOFTCAP_SINKS = MaskHooks(causal=True, window_left=300, logit_softcap=30.0, sinks=True)
CASES = [
    ("d128_g4_ps64_bf16_causal", None),
    ("d128_g4_ps128_bf16_causal", None),
    ("d64_g16_ps1_bf16_causal", None),
    ("d128_g1_ps16_bf16_causal", None),
    ("d128_g16_ps128_bf16_causal", WINDOW_SOFTCAP_SINKS),
    ("d64_g4_ps1_bf16_causal", MaskHooks(causal=True, window_left=100, sinks=True)),
    ("d128_g4_ps16_bf16_causal", MaskHooks(causal=True, logit_softcap=20.0)),
]


def _kernels():
    try:
        return importlib.import_module(f"generated.{ARCH}.cute_dsl.mha.{SPEC}.kernels")
    except ModuleNotFoundError:
        pytest.skip(f"no CuTe DSL package {SPEC} for {ARCH}")


def _paged(lens: list[int], ps: int, d: int, dtype: torch.dtype, rng: random.Random):
    """Shuffled pages holding random K/V for ``lens``: (k_cache, v_cache, page_table)."""
    dev = torch.device("cuda")
    per = [max(1, -(-n // ps)) for n in lens]
    num_pages = sum(per) + 1
    ids = list(range(1, num_pages))
    rng.shuffle(ids)
    table = torch.zeros(len(lens), max(per), dtype=torch.int32)
    used = 0
    for b, n in enumerate(per):
        table[b, :n] = torch.tensor(ids[used : used + n])
        used += n
    k = torch.randn(num_pages, ps, HKV, d, dtype=dtype, device=dev)
    v = torch.randn(num_pages, ps, HKV, d, dtype=dtype, device=dev)
    return k, v, table.to(dev)


@pytest.mark.gpu
@pytest.mark.parametrize("uri,hooks", CASES, ids=[f"{u}-{'spec' if h is None else 'hooks'}"
                                                   for u, h in CASES])  # fmt: skip
def test_decode_split_counts_match_the_oracle(uri: str, hooks: MaskHooks | None) -> None:
    from attngen.families.mha.cute_dsl import library

    kernels = _kernels()
    config = kernels.CONFIGS[uri]
    traits = kernels.TRAITS
    if hooks is not None:
        traits = dataclasses.replace(traits, mask=hooks)
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dev, dtype = torch.device("cuda"), getattr(torch, config.dtype)
    d, hq, batch = config.head_dim, HKV * config.gqa_group, len(LENS)
    k_cache, v_cache, table = _paged(LENS, config.page_size, d, dtype, rng)
    q = torch.randn(batch, hq, d, dtype=dtype, device=dev)
    sinks = torch.randn(hq, device=dev) + 1.0 if traits.mask.sinks else None
    seq_lens = torch.tensor(LENS, dtype=torch.int32, device=dev)
    scale = d**-0.5
    want = paged_decode_ref(q, k_cache, v_cache, table, seq_lens, scale, mask=traits.mask,
                            sinks=sinks)  # fmt: skip
    s = config.max_splits
    outs = []
    for splits in ([1] * batch, [s] * batch, [rng.randint(1, s) for _ in range(batch)]):
        out = torch.full((batch, hq, d), float("nan"), dtype=dtype, device=dev)
        partial_o = torch.full((batch, hq, s, d), float("nan"), device=dev)
        partial_lse = torch.full((batch, hq, s), float("nan"), device=dev)
        library.decode(
            q, k_cache, v_cache, table, seq_lens, torch.tensor(splits, dtype=torch.int32,
            device=dev), out, partial_o, partial_lse, config=config, traits=traits,
            sm_scale=scale, sinks=sinks,
        )  # fmt: skip
        torch.cuda.synchronize()
        what = f"seed {seed}, {uri}, mask {traits.mask}, seq_lens {LENS}, num_splits {splits}"
        assert not out.isnan().any(), f"{what}: unwritten outputs"
        assert_close(out, want, KERNEL, what, dtype=dtype)
        if sinks is None:  # a request with no key gives zeros
            assert torch.all(out[0] == 0), what
        outs.append(out.float())
    for other in outs[1:]:  # split counts change only the fp32 summation order
        assert_close(other, outs[0], KERNEL, f"seed {seed}: split counts disagree", dtype=dtype)


FP8_SPEC = "mha_fp8_kv_decode"
FP8_CASES = [
    ("d128_g8_ps16_bf16_kvfp8_e4m3_causal", None),
    ("d64_g4_ps128_bf16_kvfp8_e4m3_causal", None),
    ("d128_g4_ps64_bf16_kvfp8_e4m3_causal", MaskHooks(causal=True, window_left=300, sinks=True)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("uri,hooks", FP8_CASES, ids=[u for u, _ in FP8_CASES])
def test_fp8_kv_decode_matches_the_oracle_on_dequantized_values(
    uri: str, hooks: MaskHooks | None
) -> None:
    """An e4m3 cache with per-tensor scales (not 1, and different for K and V, so a scale
    folded in the wrong place shows): the oracle reads cache * scale. Stale slots past each
    request's last key are NaN bytes (0x7f), which the kernel must not let through."""
    from attngen.families.mha.cute_dsl import library

    try:
        kernels = importlib.import_module(f"generated.{ARCH}.cute_dsl.mha.{FP8_SPEC}.kernels")
    except ModuleNotFoundError:
        pytest.skip(f"no CuTe DSL package {FP8_SPEC} for {ARCH}")
    config = kernels.CONFIGS[uri]
    traits = kernels.TRAITS if hooks is None else dataclasses.replace(kernels.TRAITS, mask=hooks)
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dev, dtype = torch.device("cuda"), getattr(torch, config.dtype)
    d, hq, batch, ps = config.head_dim, HKV * config.gqa_group, len(LENS), config.page_size
    k16, v16, table = _paged(LENS, ps, d, dtype, rng)
    k_scale = torch.tensor([0.02], device=dev)
    v_scale = torch.tensor([0.05], device=dev)
    k_cache = (k16.float() / 0.02).to(torch.float8_e4m3fn)
    v_cache = (v16.float() / 0.05).to(torch.float8_e4m3fn)
    for b, n in enumerate(LENS):  # NaN bytes in the slots past each sequence
        if n % ps:
            page = int(table[b, n // ps])
            for cache in (k_cache, v_cache):
                cache.view(torch.uint8)[page, n % ps :] = 0x7F
    q = torch.randn(batch, hq, d, dtype=dtype, device=dev)
    sinks = torch.randn(hq, device=dev) + 1.0 if traits.mask.sinks else None
    seq_lens = torch.tensor(LENS, dtype=torch.int32, device=dev)
    scale = d**-0.5
    k_deq = torch.nan_to_num(k_cache.double(), nan=0.0) * 0.02  # stale slots are not read
    v_deq = torch.nan_to_num(v_cache.double(), nan=0.0) * 0.05
    want = paged_decode_ref(q, k_deq, v_deq, table, seq_lens, scale, mask=traits.mask,
                            sinks=sinks)  # fmt: skip
    s = config.max_splits
    for splits in ([1] * batch, [rng.randint(1, s) for _ in range(batch)]):
        out = torch.full((batch, hq, d), float("nan"), dtype=dtype, device=dev)
        partial_o = torch.full((batch, hq, s, d), float("nan"), device=dev)
        partial_lse = torch.full((batch, hq, s), float("nan"), device=dev)
        library.decode(
            q, k_cache, v_cache, table, seq_lens, torch.tensor(splits, dtype=torch.int32,
            device=dev), out, partial_o, partial_lse, config=config, traits=traits,
            sm_scale=scale, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        torch.cuda.synchronize()
        what = f"seed {seed}, {uri}, mask {traits.mask}, seq_lens {LENS}, num_splits {splits}"
        assert not out.isnan().any(), f"{what}: NaN outputs"
        assert_close(out, want, KERNEL, what, dtype=dtype)
