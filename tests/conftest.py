"""Test-suite setup shared by every test.

CPU runs (the default, and CI) execute Triton kernels in the interpreter, which must be
switched on before the first ``import triton`` in the process. GPU runs set
``ATTNGEN_GPU=1`` (``make test-gpu``) and run only tests marked ``gpu``.

Layout: tests/spec (loader, bad specs), tests/emit (generation, drift, capabilities and the
docs), tests/runtime (batch, pools, backends over an oracle, hybrids, selection),
tests/families/<family> (interpreter numerics, end-to-end backends; gpu/ on a device),
tests/backends/<backend> (ahead-of-time compile checks). Tolerances: attngen.testing.tolerance.
"""

from __future__ import annotations

import os

import pytest

GPU_RUN = os.environ.get("ATTNGEN_GPU") == "1"
if not GPU_RUN:
    os.environ["TRITON_INTERPRET"] = "1"

# GPU evidence: the `evidence` fixture and the session hooks that write the record
from gpu_evidence import evidence, pytest_sessionfinish, pytest_testnodedown  # noqa: E402,F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="GPU test: run with `make test-gpu` on a CUDA machine")
    skip_cpu = pytest.mark.skip(reason="CPU-only test (interpreter or AOT); skipped in GPU runs")
    for item in items:
        is_gpu = "gpu" in item.keywords
        if is_gpu and not GPU_RUN:
            item.add_marker(skip_gpu)
        elif GPU_RUN and not is_gpu:
            item.add_marker(skip_cpu)


@pytest.fixture
def backends_take_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every registered backend accepts CPU tensors for the test, as Triton does in its
    interpreter: for tests that construct backends only to check what construction decides
    (config selection, hybrid pairing), CuTe DSL's included."""
    import dataclasses

    from attngen import registry

    for backend, info in registry.backends().items():
        allow = dataclasses.replace(info, cpu_limit=lambda dtypes: None)
        monkeypatch.setitem(registry._BACKENDS, backend, allow)
