"""The Triton MHA plan check's shared-memory floor (``verify.shared_floor``) against what
Triton allocated for every generated MHA kernel (evidence/compile/triton): the floor never
exceeds a compiled kernel's shared memory, so the check cannot refuse a tile that compiles;
and it is not vacuous (it reaches at least a third of the allocation somewhere)."""

from __future__ import annotations

import importlib
import json

import pytest

from attngen.families.mha.triton import verify
from attngen.testing.paths import REPO_ROOT

# evidence kernel name -> the phase whose floor applies to it
KERNEL_PHASE = {
    "extend": "extend",
    "prefill": "prefill",
    "decode_split": "decode",
    "verify": "verify",
}


@pytest.mark.parametrize("arch", ["sm80", "sm90", "sm100"])
def test_floor_is_below_every_compiled_allocation(arch: str) -> None:
    rows = json.loads((REPO_ROOT / "evidence/compile/triton" / f"{arch}.json").read_text())
    checked, closest = 0, 0.0
    for row in rows["kernels"]:
        phase = KERNEL_PHASE.get(row["kernel"])
        if "/mha/" not in row["module"] or phase is None:
            continue
        module = importlib.import_module(row["module"].removesuffix(".py").replace("/", "."))
        config = module.CONFIGS[row["variant"]]
        for what, need in verify.shared_floor(config, (phase,)):
            assert need <= row["shared_bytes"], (row["module"], row["variant"], what, need)
            closest = max(closest, need / max(row["shared_bytes"], 1))
            checked += 1
    assert checked > 50
    assert closest >= 1 / 3, closest


def test_validate_refuses_tiles_over_the_floor(tmp_path, capsys) -> None:
    """Extend tiles no sm90 CTA can hold (256 keys of d256 K and V in each of two buffered
    stages) fail `attngen validate` at the tuning entry, not first at compile time."""
    from attngen.cli import main

    spec = tmp_path / "big.yaml"
    spec.write_text(
        "name: big\ndescription: tiles over the limit\nfamily: mha\nphases: [extend]\n"
        "heads: {head_dim: 256, gqa_group: 2}\nkv_cache: {page_size: 64}\n"
        "targets: {triton: [sm90]}\n"
        "tuning:\n  triton:\n    sm90: {extend_block_n: 256, extend_num_stages: 3}\n"
    )
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    want = (
        "tuning.triton.sm90: d256_g2_ps64_bf16_causal: extend_block_n=256 x "
        "extend_num_stages=3 at head dims 256/256: at least 524288 B of shared memory (the K "
        "and V tiles of the pipeline), over sm90's 232448"
    )
    assert want in err, err
    spec.write_text(spec.read_text().replace("extend_num_stages: 3", "extend_num_stages: 1"))
    assert main(["validate", str(spec)]) == 0  # no buffered stage: the floor is 0
