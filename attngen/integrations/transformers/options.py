"""What the user chooses when enabling attngen on a transformers model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngen.runtime.checks import AttngenInputError
from attngen.runtime.select import ARCHS, detect_arch

KV_DTYPES = (None, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)
DSA_INDEX_DTYPES = (None, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class Options:
    """``page_size``: tokens per page of attngen's own pool (None: the first generated one of
    ``select.PAGE_SIZE_ORDER`` that serves the first layer); ``kv_cache_dtype``: the pool's
    dtype (None: the kernels' activation dtype; fp8 e4m3/e5m2 with one ``kv_scale`` per
    tensor); ``dtype``: the kernels' activation dtype (None: fp16 for fp16 models, else bf16;
    q/k/v are cast to it and the output back); ``backend``: an attngen kernel backend name
    (None: the arch's preference order); ``arch``: None detects the device's;
    ``initial_tokens``: first size of the pool and of each request row (both grow);
    ``mla_prefill``: how MLA layers run a prompt, ``"ragged"`` (decompressed 192/128 heads
    over the new tokens, SGLang's prefill) or ``"absorbed"`` (the absorbed extend kernel);
    ``dsa_index_dtype``: what DeepSeek-V3.2's lightning indexer scores in (None: the model's
    own dtype, transformers' formula as the model computes it; ``torch.float8_e4m3fn``:
    DeepSeek-V3.2's inference path, q and keys Hadamard-rotated and quantized)."""

    page_size: int | None = None
    kv_cache_dtype: torch.dtype | None = None
    kv_scale: float = 1.0
    dtype: torch.dtype | None = None
    backend: str | None = None
    arch: str | None = None
    initial_tokens: int = 4096
    mla_prefill: str = "ragged"
    dsa_index_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.page_size is not None and self.page_size < 1:
            raise AttngenInputError(f"page_size: expected >= 1 or None, got {self.page_size}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise AttngenInputError(
                f"kv_cache_dtype: expected one of {KV_DTYPES}, got {self.kv_cache_dtype}"
            )
        if self.dtype not in (None, torch.bfloat16, torch.float16):
            raise AttngenInputError(f"dtype: expected bf16, fp16 or None, got {self.dtype}")
        if not self.kv_scale > 0:
            raise AttngenInputError(f"kv_scale: expected > 0, got {self.kv_scale}")
        if self.arch is not None and self.arch not in ARCHS:
            raise AttngenInputError(f"arch: expected one of {ARCHS} or None, got {self.arch}")
        if self.mla_prefill not in ("ragged", "absorbed"):
            raise AttngenInputError(
                f"mla_prefill: expected 'ragged' or 'absorbed', got {self.mla_prefill!r}"
            )
        if self.dsa_index_dtype not in DSA_INDEX_DTYPES:
            raise AttngenInputError(
                f"dsa_index_dtype: expected one of {DSA_INDEX_DTYPES}, got {self.dsa_index_dtype}"
            )
        if self.initial_tokens < 1:
            raise AttngenInputError(f"initial_tokens: expected >= 1, got {self.initial_tokens}")

    def activation_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        return torch.float16 if model_dtype == torch.float16 else torch.bfloat16

    def kv_dtype(self, activation: torch.dtype) -> torch.dtype:
        return activation if self.kv_cache_dtype is None else self.kv_cache_dtype

    def arch_for(self, device: torch.device) -> str:
        return self.arch if self.arch is not None else detect_arch(device)
