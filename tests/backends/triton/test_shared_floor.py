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
            "absorbed_rows": ("extend", "decode_block_h"),
            "absorbed_rows_nosplit": ("extend", "decode_block_h"),
            "decode_split": ("decode", "decode_block_h"),
            "verify_tree": ("verify", "decode_block_h"),
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


MLA_DIMS = (
    "mla: {kv_lora_rank: 512, qk_rope_head_dim: 64, qk_nope_head_dim: 128, v_head_dim: 128, "
    "num_heads: 16}\n"
)
# (what, family and shape lines, tuning over the floor, the refusal, the tuning that passes)
OVER_THE_FLOOR = {
    # 256 keys of d256 K and V in each of two buffered extend stages; no buffered stage: 0
    "mha extend tiles": (
        "family: mha\nphases: [extend]\nheads: {head_dim: 256, gqa_group: 2}\n",
        "extend_block_n: 256, extend_num_stages: 3",
        "tuning.triton.sm90: d256_g2_ps64_bf16_causal: extend_block_n=256 x "
        "extend_num_stages=3 (K and V tiles at head dims 256/256): at least 524288 B of "
        "shared memory, over sm90's 232448",
        "extend_block_n: 256, extend_num_stages: 1",
    ),
    # 256 latent rows of 576 bf16 values in the absorbed MLA kernel's pipeline (295 KB),
    # beside the 16 heads of q (18 KB)
    "mla latent tiles": (
        "family: mla\nphases: [decode]\n" + MLA_DIMS,
        "decode_block_n: 256",
        "decode_block_h=16 heads of q + decode_block_n=256 x decode_num_stages=2 latent rows "
        "(512 + 64 wide): at least 313344 B of shared memory, over sm90's 232448",
        "decode_block_n: 64",  # (sm90 runs it on the Gluon kernels: 64 rows)
    ),
    # 256 selected slots of 576 bf16 latent values in the DSA sparse kernel's pipeline
    "dsa sparse tiles": (
        "family: dsa\nphases: [decode]\n" + MLA_DIMS + "dsa: {index_heads: 64, "
        "index_head_dim: 128, index_topk: 2048}\n",
        "sparse_block_n: 256, sparse_num_stages: 2",
        "sparse_block_n=256 x sparse_num_stages=2 (1152-byte latent rows): at least 294912 B "
        "of shared memory, over sm90's 232448",
        "sparse_block_n: 64, sparse_num_stages: 2",
    ),
}


@pytest.mark.parametrize("case", sorted(OVER_THE_FLOOR))
def test_validate_refuses_tiles_over_the_floor(case: str, tmp_path, capsys) -> None:
    """Tiles no sm90 CTA can hold fail `attngen validate` at the tuning entry, not first at
    compile time; smaller ones of the same spec pass."""
    from attngen.cli import main

    family, over, want, fits = OVER_THE_FLOOR[case]
    spec = tmp_path / "big.yaml"
    for tuning, code in ((over, 1), (fits, 0)):
        spec.write_text(
            f"name: big\ndescription: {case} over the limit\n{family}"
            "kv_cache: {page_size: 64}\ntargets: {triton: [sm90]}\n"
            f"tuning:\n  triton:\n    sm90: {{{tuning}}}\n"
        )
        assert main(["validate", str(spec)]) == code, capsys.readouterr().err
        err = capsys.readouterr().err
        assert (want in err) == (code == 1), err
