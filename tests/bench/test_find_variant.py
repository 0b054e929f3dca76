"""bench/run.py picks, for each row, a generated variant that computes what the peers do: no
sliding window, softcap or sinks in any phase. A windowed decode (spec mha_e2e_sliding)
once stood in for the plain one at pages 1 and 64: it read only the window's keys, so it
timed 8-20x "faster" than FA4 and failed its output check."""

from __future__ import annotations

import sys
import types

from attngen.hooks import MaskHooks
from attngen.testing.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import run  # noqa: E402


def fake_variant(name: str, **hooks):
    cfg = types.SimpleNamespace(
        head_dim=run.D, v_head_dim=run.D, gqa_group=run.HQ // run.HKV, page_size=64,
        dtype=run.DTYPE, kv_dtype=run.DTYPE, spec_topk=0, uri=name,
    )  # fmt: skip
    mask = MaskHooks(**{"causal": True, **hooks})
    mod = types.SimpleNamespace(HOOKS=mask, PHASES=("extend", "decode"), __name__=name)
    return f"triton/{name}", mod, cfg


def test_masked_variants_never_stand_in_for_plain_ones() -> None:
    plain = fake_variant("plain")
    for hooks in ({"window_left": 63}, {"logit_softcap": 30.0}, {"sinks": True}):
        masked = fake_variant("masked", **hooks)
        for phase in ("decode", "extend"):
            assert run.find_variant([masked, plain], phase, 64)[0] == "triton/plain", hooks
            assert run.find_variant([masked], phase, 64) is None, hooks


def test_every_generated_pick_is_plain() -> None:
    variants, errors = run.load_attngen()
    assert not errors
    picked = 0
    for phase in ("decode", "extend", "verify"):
        for page in (1, 16, 64, 128):
            for backend in ("triton", "cute_dsl"):
                found = run.find_variant(variants, phase, page, backend=backend)
                if found is not None:
                    picked += 1
                    assert run.plain_mask(found[1]), (phase, page, backend, found[0])
    assert picked >= 8  # decode and extend at pages 1 / 64 / 128 exist in both backends
