"""bench/experimental/gdn_fused_sm90.py: its chunk arithmetic (a float64 mirror of the
kernel, the prepare kernel's T included) equals the token-by-token recurrence on ragged
lengths with and without an initial state, and the kernel compiles for sm_90a on CPU with
its wgmmas and cp.async copies and no spill (its numbers are checked on the GPU by
``--check``, against the same recurrence)."""

from __future__ import annotations

import sys
import tempfile

import pytest
import torch

from attngen.families.gdn import reference
from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench.experimental import gdn_fused_sm90 as fused  # noqa: E402

F64 = torch.float64


@pytest.mark.parametrize("length", [1, 64, 65, 300])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_arithmetic_equals_the_recurrence(length, with_state):
    gen = torch.Generator().manual_seed(length + 1000 * with_state)
    kd = vd = 128
    q, k = (torch.randn(length, 1, kd, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(length, 1, vd, generator=gen, dtype=F64)
    a, b = (torch.randn(length, 1, generator=gen) for _ in range(2))
    g, beta = reference.gates(a, b, torch.tensor([1.0]), torch.tensor([0.3]))
    state = torch.randn(1, vd, kd, generator=gen, dtype=F64) if with_state else None
    scale = kd**-0.5
    ref_out, ref_state, _ = reference.gdn_sequence(
        q, k, v, g, beta, state, scale=scale, l2norm_qk=True, keep_steps=False
    )
    s0 = state[0] if with_state else torch.zeros(vd, kd, dtype=F64)
    out, st = fused.chunk_reference(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], s0, scale=scale)
    assert float((out - ref_out[:, 0]).abs().max()) < 1e-10 * float(ref_out.abs().max())
    assert float((st - ref_state[0]).abs().max()) < 1e-10 * float(ref_state.abs().max())


@pytest.mark.slow
def test_fused_kernel_compiles_for_sm90a_without_spills():
    import cutlass.cute as cute

    from attngen.backends.cute_dsl.aot import cubin_resources

    with tempfile.TemporaryDirectory() as dump:
        options = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir {dump}"
        compiled = cute.compile(fused.GdnFusedSm90(1), *fused.fake_args(1), options=options)
        ptx, cubin = compiled.artifacts.PTX, compiled.artifacts.CUBIN
    registers, spills, sass = cubin_resources(cubin)
    assert spills == 0 and registers <= 255
    # P (8 k-steps), S^T K^T and S^T Q^T (8 each), u (4 x 2), O (4 x 2), the update (4 x 2)
    assert ptx.count("wgmma.mma_async") == 48 and sass.count("HGMMA") == 48
    # P and O leave the registers by stmatrix (O transposed into [t, v] rows)
    assert sass.count("STSM") >= 2
    assert ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global") > 0


@pytest.mark.slow
def test_two_consumer_kernel_compiles_for_sm90a():
    """The two-consumer variant (384 threads) builds, with the registers handed over by
    setmaxnreg and the same 48 wgmmas in its code (one copy serves both consumers)."""
    import cutlass.cute as cute

    from attngen.backends.cute_dsl.aot import cubin_resources

    with tempfile.TemporaryDirectory() as dump:
        options = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir {dump}"
        compiled = cute.compile(fused.GdnFusedSm90(1, (), 2), *fused.fake_args(1), options=options)
        cubin = compiled.artifacts.CUBIN
    registers, spills, sass = cubin_resources(cubin)
    assert registers <= 65536 // 384 and sass.count("HGMMA") == 48
    assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY_ALLOC" in sass


def _sm90a(kernel):
    return _sm90a_args(kernel, fused.fake_args(1))


def _setmaxnreg_total(sass: str) -> int:
    """Registers a thread the warpgroups ask for by setmaxnreg, one warpgroup each (the
    CTA's pool, 168 a thread at 384 threads, must cover them: more hangs the alloc)."""
    import re

    return sum(
        int(x, 16) for x in re.findall(r"USETMAXREG\.\w+\.CTAPOOL (?:UP\d, )?0x([0-9a-f]+)", sass)
    )


@pytest.mark.slow
def test_inverse_kernel_compiles_for_sm90a_without_spills():
    """T formed in the kernel: a third warpgroup (K K^T on one more wgmma group), no spill,
    and setmaxnreg's three asks within the pool the CTA launched with."""
    registers, spills, sass = _sm90a(fused.GdnFusedSm90(1, inverse=True))
    assert spills == 0 and registers <= 65536 // 384
    assert sass.count("HGMMA") == 48 + 8
    assert sass.count("USETMAXREG") == 3 and _setmaxnreg_total(sass) <= 3 * (65536 // 384 // 8 * 8)


@pytest.mark.slow
def test_two_consumer_asks_fit_the_pool():
    _, _, sass = _sm90a(fused.GdnFusedSm90(1, (), 2))
    total = _setmaxnreg_total(sass)
    # the producer's decrease counts once, each consumer's increase once (two warpgroups)
    producer, consumer = fused.PRODUCER_REGS, fused.CONSUMER_REGS
    assert total == producer + consumer and producer + 2 * consumer <= 3 * 168


@pytest.mark.slow
@pytest.mark.parametrize("half", [False, True])
def test_mode_bits_do_not_fence_the_wgmmas(half):
    """A branch on a run's mode bits around a wgmma had ptxas fence every wgmma of the
    loop (96 warpgroup arrive / wait instructions against 15; v4's 2.9 us a chunk became
    3.3 on an H100): the kernel forms P and O in every run and branches only around O's
    stores, so the form that reads the bits (context parallelism) keeps the wgmmas as
    pipelined as a request's run."""
    *_, plain = _sm90a(fused.GdnFusedSm90(1, half=half))
    *_, modes = _sm90a(fused.GdnFusedSm90(1, modes=True, half=half))
    assert plain.count("WARPGROUP") < 30 and modes.count("WARPGROUP") < 30


@pytest.mark.slow
@pytest.mark.parametrize("inverse", [False, True])
def test_half_kernel_compiles_with_one_fp16_mma_a_product(inverse):
    """``half``: u = d T^T, O += u P^T and the update each one fp16 wgmma group (4 k-steps;
    the update's N is 128), where the split form runs two bf16 ones; P, S K^T and S Q^T stay
    bf16 (8 each), and K K^T with the inverse; no spill."""
    import re

    import cutlass.cute as cute

    from attngen.backends.cute_dsl.aot import cubin_resources

    with tempfile.TemporaryDirectory() as dump:
        options = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir {dump}"
        kernel = fused.GdnFusedSm90(1, half=True, inverse=inverse)
        compiled = cute.compile(kernel, *fused.fake_args(1), options=options)
        ptx, cubin = compiled.artifacts.PTX, compiled.artifacts.CUBIN
    _, spills, _ = cubin_resources(cubin)
    kinds = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.(\w+)\.(\w+)", ptx)
    assert spills == 0
    assert kinds.count(("m64n64k16", "f16", "f16")) == 8
    assert kinds.count(("m64n128k16", "f16", "f16")) == 4
    assert kinds.count(("m64n64k16", "bf16", "bf16")) == 24 + 8 * inverse


@pytest.mark.slow
@pytest.mark.parametrize("group", [1, 2])
def test_prep_kernel_and_the_fp16_t_form_compile_without_spills(group):
    """gdn_prep_sm90 (gates, norms and fp16 T a chunk and head: K K^T on one wgmma group)
    and the fused kernel's form that loads its T as the operand (c1p: no conversion, half
    the T bytes of the fp32 form's cp.async copies)."""
    from cutlass import Float16

    from bench.experimental import gdn_prep_sm90 as prep

    registers, spills, sass = _sm90a_args(prep.GdnPrepSm90(group), prep.fake_args(group))
    assert spills == 0 and sass.count("HGMMA") == 8
    kernel = fused.GdnFusedSm90(group, **fused.FORMS["c1p"])
    _, spills, sass_p = _sm90a_args(kernel, fused.fake_args(group, Float16))
    _, _, sass_h = _sm90a_args(fused.GdnFusedSm90(group, half=True), fused.fake_args(group))
    assert spills == 0 and sass_p.count("HGMMA") == 36
    assert sass_p.count("LDGSTS") < sass_h.count("LDGSTS")


def _sm90a_args(kernel, args):
    import cutlass.cute as cute

    from attngen.backends.cute_dsl.aot import cubin_resources

    with tempfile.TemporaryDirectory() as dump:
        options = f"--gpu-arch sm_90a --keep-cubin --dump-dir {dump}"
        return cubin_resources(cute.compile(kernel, *args, options=options).artifacts.CUBIN)
