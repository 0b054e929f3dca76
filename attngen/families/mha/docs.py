"""MHA's part of the support matrix's hybrid section: layer keys and a make_backend example."""

from __future__ import annotations

import dataclasses

from attngen.families.mha.key import MhaKey
from attngen.ir import ModulePlan
from attngen.spec.enums import Arch

EXAMPLE_KV_HEADS = 8


def layer_keys(plan: ModulePlan) -> set[MhaKey]:
    """What one backend instance and its KV pool are built for, per generated variant; the
    speculative topk is the verify kernel's business, not the layer's (set to 0)."""
    return {dataclasses.replace(MhaKey.of_variant(k.variant), spec_topk=0) for k in plan.kernels}


def hybrid_example(prefill: str, decode: str, arch: Arch, key: object) -> str:
    assert isinstance(key, MhaKey)
    lines = [
        "import torch",
        "from attngen.runtime.select import make_backend",
        "",
        "backend = make_backend(",
        f'    "{arch.value}",',
        f'    "{decode}",  # the decode backend (and any phase not overridden)',
        f'    prefill_spec="{prefill}",  # extend-like modes go here',
        f"    num_q_heads={EXAMPLE_KV_HEADS * key.gqa_group},",
        f"    num_kv_heads={EXAMPLE_KV_HEADS},",
        f"    head_dim={key.head_dim},",
    ]
    if key.v_head_dim != key.head_dim:
        lines.append(f"    v_head_dim={key.v_head_dim},")
    lines += [f"    page_size={key.page_size},", f"    dtype=torch.{key.dtype},"]
    if key.kv_dtype != key.dtype:
        lines.append(f"    kv_cache_dtype=torch.{key.kv_dtype},")
    lines += [
        '    device="cuda",',
        "    req_to_token_pool=req_to_token_pool,  # both backends share the pools",
        "    kv_pool=kv_pool,",
        ")",
        "backend.init_forward_metadata(forward_batch)  # EXTEND -> prefill, DECODE -> decode",
    ]
    return "\n".join(lines)
