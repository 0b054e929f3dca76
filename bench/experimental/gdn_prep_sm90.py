"""The GDN chunk kernel's CuTe DSL prepare launch
(``attngen.families.gdn.cute_dsl.kernels.prepare_sm90``) from the bench harness: ``prepare``
takes the harness's inputs dict and returns the chunk kernel's ``prepared`` tuple (T fp16,
G, beta, qs, kn) through the library's launcher.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attngen.families.gdn.cute_dsl.kernels.prepare_sm90 import (  # noqa: E402
    GdnPrepSm90,
    fake_args,
)

__all__ = ["GdnPrepSm90", "fake_args", "prepare"]


def prepare(x: dict, plan, qsl, cfg, scale: float):
    """(T fp16 ``[N, HV, C]``, G, beta, qs, kn ``[HV, N]`` fp32) for the chunks of ``plan``
    (GPU), ``cfg`` the Triton config of the batch's spec (its shapes are the same)."""
    from attngen.families.gdn.cute_dsl.host.launch import prepare as launch
    from attngen.families.gdn.cute_dsl.lower import tiles
    from attngen.families.gdn.cute_dsl.config import GdnCuteConfig
    from attngen.spec.enums import Arch

    fields = {f: getattr(cfg, f) for f in GdnCuteConfig.__dataclass_fields__ if hasattr(cfg, f)}
    config = GdnCuteConfig(**{**fields, "arch": "sm90", **tiles(Arch.SM90)})
    a, b = x["a"], x["b"]
    A_log, dt_bias = x["A_log"].float(), x["dt_bias"].float()
    hv = x["v"].shape[1]
    return launch(x["q"], x["k"], a, b, A_log, dt_bias, qsl, plan, config, scale, hv)
