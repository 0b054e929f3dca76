"""A generated backend refuses, at construction and naming the device, a device its kernels
cannot run on: CPU without a CPU path (Triton outside its interpreter, CuTe DSL always),
devices that are not CUDA, CUDA when torch sees none, and a GPU of another arch."""

from __future__ import annotations

import pytest
import torch

from attngen.runtime.backend_base import kernel_device
from attngen.runtime.checks import AttngenInputError
from attngen.runtime.select import make_backend
from attngen.testing import make_pools

SPECS = {"triton": "mha_gqa_paged", "cute_dsl": "mha_gqa_decode"}  # both: d128_g4_ps16_bf16


def _build(device: str, backend: str, dtype: torch.dtype = torch.bfloat16) -> object:
    req_pool, kv_pool = make_pools(
        num_layers=1,
        max_reqs=2,
        max_context_len=64,
        num_pages=8,
        page_size=16,
        num_kv_heads=2,
        head_dim=128,
        dtype=dtype,
        device="cpu",
    )
    return make_backend(
        "sm90",
        SPECS[backend],
        backend=backend,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=128,
        page_size=16,
        dtype=dtype,
        device=device,
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
    )


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(AttngenInputError, match=r"device: cpu: .*TRITON_INTERPRET=1"):
        _build("cpu", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _build("cpu", "triton", torch.float16).device == torch.device("cpu")


def test_triton_bf16_on_cpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 3.6's interpreter multiplies bf16 dot operands as raw bits; a bf16 backend on
    CPU would return garbage, so it is refused (this test's kernel shows why)."""
    import triton
    import triton.language as tl

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(AttngenInputError, match=r"device: cpu: .*bfloat16 tl.dot"):
        _build("cpu", "triton", torch.bfloat16)

    @triton.jit
    def dot16(a, b, c):
        i = tl.arange(0, 16)
        tile = i[:, None] * 16 + i[None, :]
        tl.store(c + tile, tl.dot(tl.load(a + tile), tl.load(b + tile)))

    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    c = torch.zeros(16, 16)
    dot16[(1,)](a, b, c)
    if torch.allclose(c, a.float() @ b.float(), atol=1e-3):
        pytest.fail("the interpreter computes bf16 tl.dot now: lift the refusal in cpu_limit")


def test_cute_dsl_never_takes_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # no interpreter path for CuTe DSL
    with pytest.raises(AttngenInputError, match=r"device: cpu: CuTe DSL kernels run on CUDA"):
        _build("cpu", "cute_dsl")


@pytest.mark.parametrize("backend", ["triton", "cute_dsl"])
@pytest.mark.parametrize(
    "device, message",
    [
        ("meta", r"device: meta: attngen's kernels run on CUDA devices"),
        ("not-a-device", r"device: 'not-a-device' is not a torch device"),
    ],
)
def test_other_devices_are_refused(backend: str, device: str, message: str) -> None:
    with pytest.raises(AttngenInputError, match=message):
        _build(device, backend)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message torch gives on CPU")
def test_cuda_without_a_gpu_is_refused() -> None:
    with pytest.raises(AttngenInputError, match=r"device: cuda: no CUDA device is available"):
        kernel_device("cuda", "triton", "sm90")


def test_gpu_of_another_arch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(AttngenInputError, match=r"capability 8.0; .* generated for sm90"):
        kernel_device("cuda", "cute_dsl", "sm90")
    with pytest.raises(AttngenInputError, match=r"torch sees 1 CUDA device"):
        kernel_device("cuda:3", "triton", "sm80")
    assert kernel_device("cuda", "triton", "sm80") == torch.device("cuda", 0)
