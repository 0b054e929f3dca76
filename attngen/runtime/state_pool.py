"""A pool of per-request recurrent states, indexed by request slot rather than by token.

Linear-attention layers (a recurrent state per head plus a short-conv window) keep one
fixed-size state per request instead of a KV cache. Per layer: ``temporal[l]`` ``[size + 1,
*temporal_shape]`` and ``conv[l]`` ``[size + 1, *conv_shape]``; slot 0 is padding: kernels
skip it, so it is never written (padded rows of a replayed CUDA graph point at it).
``req_to_slot[r]`` (int32) is the slot of request row ``r``; row 0 is the padding row and
keeps slot 0 (an engine pads replayed batches with request row 0).

With ``verify_shape = (max_bs, T)`` it also holds speculative verify's step buffers per
layer, ``temporal_steps[l] [max_bs, T, *temporal_shape]`` and ``conv_steps[l]``, indexed by
batch row: every draft's state, from which the accepted one is copied back.
"""

from __future__ import annotations

import torch

from attngen.runtime.checks import AttngenInputError, check_at_least, fail


class RequestStatePool:
    """See the module docstring."""

    def __init__(
        self,
        *,
        num_layers: int,
        size: int,
        max_reqs: int,
        temporal_shape: tuple[int, ...],
        temporal_dtype: torch.dtype,
        conv_shape: tuple[int, ...],
        conv_dtype: torch.dtype,
        device: torch.device | str,
        verify_shape: tuple[int, int] | None = None,
    ) -> None:
        for name, value in (("num_layers", num_layers), ("size", size), ("max_reqs", max_reqs)):
            check_at_least(name, value, 1)
        self.size = size
        self.temporal_shape, self.conv_shape = tuple(temporal_shape), tuple(conv_shape)
        zeros = dict(device=device)
        self.temporal = [
            torch.zeros((size + 1, *temporal_shape), dtype=temporal_dtype, **zeros)
            for _ in range(num_layers)
        ]
        self.conv = [
            torch.zeros((size + 1, *conv_shape), dtype=conv_dtype, **zeros)
            for _ in range(num_layers)
        ]
        self.req_to_slot = torch.zeros((max_reqs,), dtype=torch.int32, device=device)
        self.temporal_steps: list[torch.Tensor] = []
        self.conv_steps: list[torch.Tensor] = []
        if verify_shape is not None:
            self.temporal_steps = [
                torch.zeros((*verify_shape, *temporal_shape), dtype=temporal_dtype, **zeros)
                for _ in range(num_layers)
            ]
            self.conv_steps = [
                torch.zeros((*verify_shape, *conv_shape), dtype=conv_dtype, **zeros)
                for _ in range(num_layers)
            ]

    @property
    def num_layers(self) -> int:
        return len(self.temporal)

    @property
    def device(self) -> torch.device:
        return self.req_to_slot.device

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(temporal, conv)`` state tensors of one layer."""
        if not 0 <= layer_id < self.num_layers:
            raise AttngenInputError(f"layer_id: expected 0..{self.num_layers - 1}, got {layer_id}")
        return self.temporal[layer_id], self.conv[layer_id]

    def steps(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(temporal_steps, conv_steps)`` of one layer (verify)."""
        self.layer(layer_id)
        if not self.temporal_steps:
            raise AttngenInputError("state pool: built without verify_shape (no step buffers)")
        return self.temporal_steps[layer_id], self.conv_steps[layer_id]

    def assign(self, req_index: int, slot: int) -> None:
        """Give request row ``req_index`` (>= 1) state slot ``slot`` (1..size)."""
        if not 1 <= req_index < self.req_to_slot.shape[0]:
            fail("req_index", f"1..{self.req_to_slot.shape[0] - 1} (row 0 pads)", req_index)
        if not 1 <= slot <= self.size:
            fail("slot", f"1..{self.size} (slot 0 pads)", slot)
        self.req_to_slot[req_index] = slot

    def slots(self, req_pool_indices: torch.Tensor, out: torch.Tensor | None = None):
        """int32 slots of request rows (no host sync; into ``out`` when given)."""
        return torch.index_select(self.req_to_slot, 0, req_pool_indices.long(), out=out)
