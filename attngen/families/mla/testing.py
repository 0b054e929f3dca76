"""Test and bench helpers of the MLA family: random paged latent caches and the derived
error bound (CPU interpreter tests, GPU tests and benches share them)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

# -- error bounds ----
# A kernel output in dtype vs the float64 oracle on the same (dtype-rounded) inputs. Per
# element, the output's own rounding costs <= eps/2 * |o| (<= 2 eps * rms(o) for |o| <= 4
# rms), rounding the softmax weights P to dtype before the P.V product costs about
# eps / (2 sqrt 3) * rms(o) per element (<= 1.5 eps * rms(o) at 5 sigma), fp32 accumulation
# and exp2 far less: 3.5 eps * rms(o), doubled for margin.
OUT_RMS_FACTOR = 8.0
EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def error_bound(expected: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest absolute error allowed on a kernel output of ``dtype``."""
    rms = expected.double().pow(2).mean().sqrt().item()
    return OUT_RMS_FACTOR * EPS[dtype] * rms


def check_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str):
    """Every element written (no NaN left from the poisoned output) and within the bound;
    returns (max error, bound)."""
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    assert not torch.isnan(actual).any(), f"{what}: unwritten (NaN) elements remain"
    err = (actual - expected).abs().max().item()
    bound = error_bound(expected, dtype)
    assert err <= bound, f"{what}: max error {err:.3e} > bound {bound:.3e}"
    return err, bound


def check_lse(actual: torch.Tensor, expected: torch.Tensor, what: str, atol: float = 1e-3):
    """LSE (fp32 throughout, natural log): -inf exactly where the oracle's is, else within
    ``atol`` (fp32 scores of |s| <~ 30 and the exp2/log2 approximations: ~1e-5)."""
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    assert not torch.isnan(actual).any(), f"{what}: NaN LSE"
    inf_a, inf_e = torch.isinf(actual), torch.isinf(expected)
    assert torch.equal(inf_a, inf_e), f"{what}: -inf LSE where the oracle differs"
    err = (actual[~inf_e] - expected[~inf_e]).abs().max().item() if (~inf_e).any() else 0.0
    assert err <= atol, f"{what}: LSE error {err:.3e} > {atol}"
    return err


@dataclass
class LatentBatch:
    """A random paged latent cache and the requests laid out in it."""

    cache: torch.Tensor  # [pages, page_size, 1, width], fresh randn (never zeros)
    page_table: torch.Tensor  # [B, max pages] int32
    seq_lens: list[int]
    slots: list[torch.Tensor]  # per request: token slots of its tokens, in order


def latent_batch(
    seq_lens: list[int],
    *,
    page_size: int,
    width: int = 576,
    dtype: torch.dtype,
    device: str | torch.device,
    spare_pages: int = 2,
    seed: int = 0,
) -> LatentBatch:
    """Requests of ``seq_lens`` tokens on shuffled physical pages (page 0 reserved)."""
    rng = random.Random(seed)
    pages_per = [-(-n // page_size) for n in seq_lens]
    num_pages = 1 + sum(pages_per) + spare_pages
    order = list(range(1, num_pages))
    rng.shuffle(order)
    cache = torch.randn(num_pages, page_size, 1, width, device=device).to(dtype)
    width_pt = max(1, max(pages_per, default=1))
    page_table = torch.zeros(len(seq_lens), width_pt, dtype=torch.int32)
    slots, used = [], 0
    for b, (n, np_) in enumerate(zip(seq_lens, pages_per)):
        pages = order[used : used + np_]
        used += np_
        page_table[b, :np_] = torch.tensor(pages, dtype=torch.int32)
        pos = torch.arange(n)
        slots.append(
            torch.tensor(pages, dtype=torch.int64)[pos // page_size] * page_size + pos % page_size
        )
    return LatentBatch(cache, page_table.to(device), list(seq_lens), slots)
