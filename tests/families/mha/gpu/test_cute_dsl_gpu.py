"""GPU tests of what is CuTe DSL's own: kernels loaded from the on-disk compile cache run and
match the oracle (and the freshly compiled kernels, bit for bit); their first-use times, cold
(compile + store) and warm (load), are measured.

The CuTe DSL packages' numerics and CUDA-graph replays (verify, draft extend) are checked by
test_mha_backend_gpu.py, which discovers every backend. With ``ATTNGEN_EVIDENCE_OUT`` set,
the first-use times are written next to it (``cute_compile_cache.json``).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path

import pytest
import torch

from test_mha_backend_gpu import ARCH, Case, make_rig, pages_for, run_eager  # noqa: I001

SPEC = "mha_gqa_prefill"
URI = "d128_g4_ps128_bf16_causal"
# (prefix_lens, extend_lens): no prefix runs the prefill kernel, a prefix the extend kernel
BATCHES = (([0, 0, 0], [300, 77, 1024]), ([100, 513, 0], [50, 300, 7]))


def _backend():
    try:
        module = importlib.import_module(f"generated.{ARCH}.cute_dsl.mha.{SPEC}.backend")
    except ModuleNotFoundError:
        pytest.skip(f"no CuTe DSL package {SPEC} for {ARCH}")
    return module.Backend


def _run_batches(rig) -> tuple[list[torch.Tensor], float]:
    """Outputs of BATCHES (checked against the oracle) and the seconds they took."""
    outs = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for prefix, ext in BATCHES:
        pb = rig.builder.extend(prefix, ext)
        out, want = run_eager(rig, pb, flat=False)
        rig.check(out, want, f"prefix_lens={prefix} extend_lens={ext}")
        outs.append(out)
    torch.cuda.synchronize()
    return outs, time.perf_counter() - start


@pytest.mark.gpu
def test_kernels_loaded_from_the_disk_cache_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attngen.backends.cute_dsl.disk_cache import ENV_DIR
    from attngen.families.mha.cute_dsl.host import compile as host_compile

    backend = _backend()
    case = Case(backend, backend.kernels.CONFIGS[URI], long=False)
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    lens = [p + e for b in BATCHES for p, e in zip(*b)]
    pages = 2 * pages_for(lens, case.config.page_size)
    rig = make_rig(case, max_context_len=max(lens), max_reqs=8, num_pages=pages)
    seed = rig.builder.seed

    monkeypatch.setattr(host_compile, "_COMPILED", {})
    cold, cold_s = _run_batches(rig)  # compiles prefill + extend, stores both
    entries = sorted(tmp_path.glob("*/*.o"))
    assert len(entries) == 2, entries

    monkeypatch.setattr(host_compile, "_COMPILED", {})  # as a new process: disk only

    def no_compile(*_: object) -> None:
        raise AssertionError("compiled again: the disk cache was not used")

    monkeypatch.setattr(host_compile, "compile_fwd", no_compile)
    rig.builder = type(rig.builder)(rig.builder.req_to_token_pool, rig.builder.kv_pool, seed=seed)
    warm, warm_s = _run_batches(rig)  # the same inputs again (same seed): loaded kernels
    for a, b in zip(cold, warm):
        assert torch.equal(a, b), "the loaded kernel differs from the compiled one"
    assert warm_s < cold_s
    result = {"spec": SPEC, "variant": URI, "arch": ARCH, "kernels": 2,
              "cold_first_use_s": round(cold_s, 3), "warm_first_use_s": round(warm_s, 4)}  # fmt: skip
    print(json.dumps(result))
    out = os.environ.get("ATTNGEN_EVIDENCE_OUT")
    if out:
        Path(out).with_name("cute_compile_cache.json").write_text(json.dumps(result, indent=1))
