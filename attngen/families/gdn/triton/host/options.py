"""Constexprs and launch options of each GDN kernel for a config: the launchers and the
ahead-of-time compile specs both take them from here, so they compile what runs."""

from __future__ import annotations

from attngen.families.gdn.triton.config import GdnTritonConfig

STATE_T_BLOCK_V = 64  # rows of S^T per program of the transposed-state kernel


def recurrent_options(
    config: GdnTritonConfig, *, steps: int, verify: bool, tree: bool
) -> dict[str, object]:
    return {
        "T": steps,
        "GROUP": config.v_heads_per_k_head,
        "KEY_DIM": config.key_dim,
        "VALUE_DIM": config.value_dim,
        "BLOCK_V": config.decode_block_v,
        "V_TILES": config.decode_tiles,
        "L2NORM": config.l2norm,
        "WRITE_POOL": not verify,
        "WRITE_STEPS": verify,
        "TREE": tree,
        "num_warps": config.decode_num_warps,
        # decode pipelines its tile loop; verify reads back step states it stored (trees)
        "num_stages": 1 if verify or config.decode_tiles == 1 else 3,
    }


def conv_update_options(
    config: GdnTritonConfig, *, steps: int, verify: bool, tree: bool, has_bias: bool
) -> dict[str, object]:
    return {
        "T": steps,
        "BLOCK_C": config.conv_block_c,
        "HAS_BIAS": has_bias,
        "WRITE_POOL": not verify,
        "WRITE_STEPS": verify,
        "TREE": tree,
        "num_warps": config.conv_num_warps,
        "num_stages": 1,
    }


def conv_prefill_options(config: GdnTritonConfig, *, has_bias: bool) -> dict[str, object]:
    return {
        "BLOCK_T": config.conv_block_t,
        "BLOCK_C": config.conv_block_c,
        "HAS_BIAS": has_bias,
        "num_warps": config.conv_num_warps,
        "num_stages": 1,
    }


def prepare_options(config: GdnTritonConfig) -> dict[str, object]:
    return {
        "GROUP": config.v_heads_per_k_head,
        "KEY_DIM": config.key_dim,
        "CHUNK": config.chunk_size,
        "L2NORM": config.l2norm,
        "num_warps": config.prepare_num_warps,
        "num_stages": 1,
    }


def wu_options(config: GdnTritonConfig) -> dict[str, object]:
    return {
        "GROUP": config.v_heads_per_k_head,
        "KEY_DIM": config.key_dim,
        "VALUE_DIM": config.value_dim,
        "CHUNK": config.chunk_size,
        "num_warps": config.wu_num_warps,
        "num_stages": 1,
    }


def state_blocks(config: GdnTritonConfig) -> list[int]:
    """The state kernel's value blocks, smallest first (each a compiled variant)."""
    blocks, bv = [], config.state_block_v
    while bv <= config.state_block_v_max:
        blocks.append(bv)
        bv *= 2
    return blocks


def state_block_for(config: GdnTritonConfig, requests: int, v_heads: int) -> int:
    """The largest value block whose grid still has ``state_min_programs`` programs (the
    state kernel is sequential over chunks: wider blocks read W and K fewer times, narrower
    ones spread a few long requests over the SMs)."""
    blocks = state_blocks(config)
    for bv in reversed(blocks):
        if requests * v_heads * (config.value_dim // bv) >= config.state_min_programs:
            return bv
    return blocks[0]


def state_options(config: GdnTritonConfig, block_v: int) -> dict[str, object]:
    """The state kernel at one value block: the config's warps up to 32 values, doubled per
    doubling beyond (H200: 64 values took 957 us on 8 warps, 1231 on 4; 32 values 1174 on
    4, 1427 on 8); the config's stages at the smallest block, two at wider ones (three
    stages of W, KT and U overflow sm_90a's shared memory beyond 16 values)."""
    return {
        "KEY_DIM": config.key_dim,
        "VALUE_DIM": config.value_dim,
        "CHUNK": config.chunk_size,
        "BLOCK_V": block_v,
        "num_warps": config.state_num_warps * max(1, block_v // 32),
        "num_stages": config.state_num_stages if block_v == config.state_block_v else 2,
    }


def state_t_block_v(config: GdnTritonConfig) -> int:
    """Rows of S^T per program of the transposed-state kernel."""
    return min(STATE_T_BLOCK_V, config.value_dim)


def state_transposed_for(config: GdnTritonConfig, requests: int, v_heads: int) -> bool:
    """Whether a batch runs the transposed-state kernel: allowed by the config, and its grid
    of requests x value heads x 64-value blocks has ``state_t_min_programs`` programs (it
    steps 64 values at a time, so a few long requests spread wider on the narrow kernel)."""
    blocks = config.value_dim // state_t_block_v(config)
    return bool(config.state_transposed) and requests * v_heads * blocks >= (
        config.state_t_min_programs
    )


def state_t_options(config: GdnTritonConfig) -> dict[str, object]:
    """The transposed-state kernel (``state_transposed``): 64-value blocks (a wgmma's 64
    rows of S^T on one warpgroup), 4 warps, W / U / k two steps ahead."""
    return {
        "GROUP": config.v_heads_per_k_head,
        "KEY_DIM": config.key_dim,
        "VALUE_DIM": config.value_dim,
        "CHUNK": config.chunk_size,
        "BLOCK_V": state_t_block_v(config),
        "num_warps": 4,
        "num_stages": 3,
    }


def state_t_descriptor_blocks(config: GdnTritonConfig) -> dict[str, tuple[str, list[int]]]:
    """The element type and TMA box of each descriptor of the transposed-state kernel: W
    [T, HV, K] (fp32), U [T, HV, V] (fp32) and k [T, H, K] (the activations') by a chunk of
    one head's rows (half of K, a value block, half of K)."""
    c, half = config.chunk_size, config.key_dim // 2
    keys = {"bfloat16": "bf16", "float16": "fp16"}[config.dtype]
    return {
        "W_DESC": ("fp32", [c, 1, half]),
        "U_DESC": ("fp32", [c, 1, state_t_block_v(config)]),
        "K_DESC": (keys, [c, 1, half]),
    }


def output_options(config: GdnTritonConfig) -> dict[str, object]:
    return {
        "GROUP": config.v_heads_per_k_head,
        "KEY_DIM": config.key_dim,
        "VALUE_DIM": config.value_dim,
        "CHUNK": config.chunk_size,
        "BLOCK_V": config.output_block_v,
        "num_warps": config.output_num_warps,
        "num_stages": 1,
    }


ACCEPT_BLOCK = 1024
ACCEPT_OPTIONS = {"BLOCK": ACCEPT_BLOCK, "num_warps": 4, "num_stages": 1}
