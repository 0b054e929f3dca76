"""The Triton plan checks' shared-memory floors (``verify.shared_floor`` of MHA, MLA, DSA)
against what Triton allocated for every generated kernel they bound (evidence/compile/triton):
a floor never exceeds a compiled kernel's shared memory, so the check cannot refuse a tile
that compiles; and it is not vacuous (it reaches at least a third of the allocation
somewhere)."""

from __future__ import annotations

import importlib
import json

import pytest

from attngen.families.mha.triton import verify
from attngen.families.dsa.triton import verify as dsa_verify
from attngen.families.mla.triton import verify as mla_verify
from attngen.testing.paths import REPO_ROOT

# family -> (its floors, evidence kernel name -> (a phase that launches it, its floor's key))
FLOORS = {
    "mha": (
        verify.shared_floor,
        {
            "extend": ("extend", "extend_block_n"),
            "prefill": ("prefill", "extend_block_n"),
            "decode_split": ("decode", "decode_block_n"),
            "verify": ("verify", "verify_block_n"),
        },
    ),
    "mla": (
        mla_verify.shared_floor,
        {
            "ragged_causal": ("extend", "ragged_block_n"),
            "ragged_prefix": ("extend", "ragged_block_n"),
            "absorbed_rows": ("extend", "decode_block_n"),
            "absorbed_rows_nosplit": ("extend", "decode_block_n"),
            "decode_split": ("decode", "decode_block_n"),
            "verify_tree": ("verify", "decode_block_n"),
        },
    ),
    "dsa": (
        dsa_verify.shared_floor,
        {
            name: ("decode", "sparse_block_n")
            for name in ("sparse", "sparse_lse", "sparse_split", "sparse_split_lse")
        },
    ),
}
NO_KERNELS = {("dsa", "sm80")}  # the fp8 indexer needs sm89+


@pytest.mark.parametrize("family", sorted(FLOORS))
@pytest.mark.parametrize("arch", ["sm80", "sm90", "sm100"])
def test_floor_is_below_every_compiled_allocation(arch: str, family: str) -> None:
    if (family, arch) in NO_KERNELS:
        pytest.skip(f"no {family} kernels on {arch}")
    floors, kernels = FLOORS[family]
    rows = json.loads((REPO_ROOT / "evidence/compile/triton" / f"{arch}.json").read_text())
    checked, closest = 0, 0.0
    for row in rows["kernels"]:
        if f"/{family}/" not in row["module"] or row["kernel"] not in kernels:
            continue
        phase, key = kernels[row["kernel"]]
        module = importlib.import_module(row["module"].removesuffix(".py").replace("/", "."))
        config = module.CONFIGS[row["variant"]]
        ((what, need),) = [f for f in floors(config, (phase,)) if f[0].startswith(key + "=")]
        assert need <= row["shared_bytes"], (row["module"], row["variant"], what, need)
        closest = max(closest, need / max(row["shared_bytes"], 1))
        checked += 1
    assert checked > 20
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
        "extend_num_stages=3 (K and V tiles at head dims 256/256): at least 524288 B of "
        "shared memory, over sm90's 232448"
    )
    assert want in err, err
    spec.write_text(spec.read_text().replace("extend_num_stages: 3", "extend_num_stages: 1"))
    assert main(["validate", str(spec)]) == 0  # no buffered stage: the floor is 0


def test_validate_refuses_latent_tiles_over_the_floor(tmp_path, capsys) -> None:
    """256 latent rows of 576 bf16 values in the absorbed MLA kernel's pipeline (295 KB)
    fail `attngen validate` on sm90 at the tuning entry; 128 rows pass."""
    from attngen.cli import main

    spec = tmp_path / "mla_big.yaml"
    spec.write_text(
        "name: mla_big\ndescription: latent tiles over the limit\nfamily: mla\n"
        "phases: [decode]\nmla: {kv_lora_rank: 512, qk_rope_head_dim: 64, qk_nope_head_dim: "
        "128, v_head_dim: 128, num_heads: 16}\nkv_cache: {page_size: 64}\n"
        "targets: {triton: [sm90]}\ntuning:\n  triton:\n    sm90: {decode_block_n: 256}\n"
    )
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    want = (
        "decode_block_n=256 x decode_num_stages=2 (512 + 64-wide latent rows): at least 294912 "
        "B of shared memory, over sm90's 232448"
    )
    assert want in err, err
    spec.write_text(spec.read_text().replace("decode_block_n: 256", "decode_block_n: 128"))
    assert main(["validate", str(spec)]) == 0


def test_validate_refuses_sparse_tiles_over_the_floor(tmp_path, capsys) -> None:
    """256 selected slots of 576 bf16 latent values in the DSA sparse kernel's pipeline
    (295 KB) fail `attngen validate` on sm90 at the tuning entry; 64 pass."""
    from attngen.cli import main

    spec = tmp_path / "dsa_big.yaml"
    spec.write_text(
        "name: dsa_big\ndescription: sparse tiles over the limit\nfamily: dsa\n"
        "phases: [decode]\nmla: {kv_lora_rank: 512, qk_rope_head_dim: 64, qk_nope_head_dim: "
        "128, v_head_dim: 128, num_heads: 16}\ndsa: {index_heads: 64, index_head_dim: 128, "
        "index_topk: 2048}\nkv_cache: {page_size: 64}\ntargets: {triton: [sm90]}\n"
        "tuning:\n  triton:\n    sm90: {sparse_block_n: 256, sparse_num_stages: 2}\n"
    )
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    want = (
        "sparse_block_n=256 x sparse_num_stages=2 (1152-byte latent rows): at least 294912 B "
        "of shared memory, over sm90's 232448"
    )
    assert want in err, err
    spec.write_text(spec.read_text().replace("sparse_block_n: 256", "sparse_block_n: 64"))
    assert main(["validate", str(spec)]) == 0
