"""A kernels module for the interpreter tests, bound in memory to the MHA Triton library.

The library is real Python source (attngen/families/mha/triton/), so a test binds its
configs and mask hooks the way a generated kernels.py does, with no rendering step.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

from attngen.families.mha.triton import library
from attngen.families.mha.triton.config import MhaTraits, MhaTritonConfig
from attngen.hooks import MaskHooks


def module_mask(mask: MaskHooks | None, causal: bool | None) -> MaskHooks:
    """``mask`` (default MaskHooks()), or with ``causal`` alone a convenience MaskHooks(causal)."""
    if causal is not None:
        assert mask is None, "give mask or causal, not both"
        return MaskHooks(causal=causal)
    return MaskHooks() if mask is None else mask


def load_kernels_module(
    configs: list[MhaTritonConfig],
    mask: MaskHooks | None = None,
    *,
    causal: bool | None = None,
    tmp_dir: Path | None = None,
    phases: tuple[str, ...] = ("extend", "decode"),
) -> ModuleType:
    """What a generated kernels.py holds, for ``configs`` and ``mask`` (``tmp_dir`` unused:
    kept so the tests' fixtures read the same)."""
    hooks = module_mask(mask, causal)
    traits = MhaTraits(hooks, phases)
    module = ModuleType("attngen_test_mha_kernels")
    module.LIBRARY_SHA256 = library.SOURCE_SHA256
    module.HOOKS, module.PHASES, module.TRAITS = hooks, phases, traits
    module.CONFIGS = {c.uri: c for c in configs}
    module.DECODE_RESIDENT_CTAS = {}  # as the Triton template: the runtime's TARGET_WAVES rule
    module.decode_workspace = library.decode_workspace
    for name in ("decode", "extend", "verify", "prefill", "compile_specs"):
        setattr(module, name, functools.partial(getattr(library, name), traits=traits))
    return module
