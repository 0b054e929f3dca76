"""The engine interface every attention backend offers (SGLang's, as a Protocol).

Generated backends (through :class:`attngen.runtime.backend_base.AttentionBackendBase`,
whose methods carry the full signatures and docs) and
:class:`attngen.runtime.hybrid.HybridAttnBackend` implement it; an engine adapter and the
tests type against it, never against a concrete class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from attngen.runtime.batch import ForwardBatch


class LayerForward(Protocol):
    """One layer's attention: ``forward_extend`` and ``forward_decode`` alike; returns
    ``[tokens, Hq * Dv]``. Extra keywords (``sinks=``) go to the backend."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: Any,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor: ...


@runtime_checkable
class AttentionBackend(Protocol):
    """Per forward: metadata once, then one call per layer; CUDA graphs: state once,
    metadata at capture and before every replay:

    - ``init_forward_metadata_capture_cuda_graph(bs, num_tokens, req_pool_indices,
      seq_lens, encoder_lens, forward_mode, spec_info)``
    - ``init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens,
      seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu=None)``
    """

    forward_extend: LayerForward
    forward_decode: LayerForward
    init_forward_metadata_capture_cuda_graph: Callable[..., None]
    init_forward_metadata_replay_cuda_graph: Callable[..., None]

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None: ...

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None: ...

    def get_cuda_graph_seq_len_fill_value(self) -> int: ...
