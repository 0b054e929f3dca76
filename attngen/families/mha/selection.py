"""What a generated backend selects on the host, for MHA and the families whose runtimes
borrow it (MLA, DSA): its config among a kernels module's CONFIGS, and the per-request KV
split counts of a split-KV decode.

Apart from :mod:`attngen.families.mha.runtime` so that a family importing these functions
has this file alone in its runtime identity (``attngen.evidence.runtime_identity`` covers
the files of other families that a family's modules import): an edit to the MHA runtime
leaves the GPU evidence of MLA and DSA standing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch

from attngen.runtime.checks import AttngenInputError


def decode_num_splits(
    seq_lens: torch.Tensor,
    *,
    cap: int,
    min_split_tokens: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-request int32 split counts in ``1..cap``, on the device (no host sync), in three
    ops (into ``out`` when given: a graph replay writes its static buffer in place)."""
    wanted = torch.div(
        seq_lens.int() + (min_split_tokens - 1), min_split_tokens, rounding_mode="floor"
    )
    return torch.clamp(wanted, min=1, max=cap, out=out)


def select_config(configs: Mapping[str, Any], want: Any) -> Any:
    # configs: a generated kernels module's CONFIGS (each has .key and .uri)
    """The one config whose key is ``want`` (a frozen dataclass key: MhaKey, MlaKey, ...);
    else an error listing what was generated.

    Fields of ``want`` set to None are free: a unique match on the rest is taken (so a spec
    that generates one speculative topk needs no ``spec_topk=`` at construction)."""
    ordered = [configs[uri] for uri in sorted(configs)]
    given = {
        f.name: getattr(want, f.name) for f in fields(want) if getattr(want, f.name) is not None
    }
    matches = [c for c in ordered if all(getattr(c.key, k) == v for k, v in given.items())]
    if len(matches) == 1:
        return matches[0]
    available = "; ".join(f"{c.key.describe()} ({c.uri})" for c in ordered) or "none"
    wanted = " ".join(f"{k}={v}" for k, v in given.items())
    if matches:
        free = sorted(k for k in (f.name for f in fields(want)) if k not in given)
        raise AttngenInputError(
            f"several generated configs for {wanted}: pass {' / '.join(free)} to choose; "
            f"available: {available}"
        )
    raise AttngenInputError(f"no generated config for {wanted}; available: {available}")
