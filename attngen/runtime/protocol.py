"""The engine interface every attention backend offers (SGLang's, as a Protocol).

Generated backends (through :class:`attngen.runtime.backend_base.AttentionBackendBase`) and
:class:`attngen.runtime.hybrid.HybridAttnBackend` implement it; an engine adapter and the
tests type against it, never against a concrete class.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from attngen.runtime.batch import ForwardBatch, ForwardMode


@runtime_checkable
class AttentionBackend(Protocol):
    """Per forward: metadata once, then one call per layer; CUDA graphs: state once,
    metadata at capture and before every replay."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None: ...

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor: ...

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor: ...

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None: ...

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
    ) -> None: ...

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> None: ...

    def get_cuda_graph_seq_len_fill_value(self) -> int: ...
