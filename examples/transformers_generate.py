#!/usr/bin/env python3
"""Generate with a transformers model on attngen's kernels, next to transformers' own attention.

    python examples/transformers_generate.py                      # random Llama-3-style model
    python examples/transformers_generate.py --model PATH_OR_ID   # a checkpoint, if reachable
    python examples/transformers_generate.py --page-size 16 --kv-cache-dtype fp8_e4m3
    python examples/transformers_generate.py --config deepseek_v3   # MLA (qwen3_next, qwen3_5: GDN)
    python examples/transformers_generate.py --config deepseek_v32 --prompt-tokens 4096  # DSA

Without ``--model`` (no hub access needed) it builds a random-weight model from a config: the
tokens are noise, the speed is real. Prints tokens/s of ``generate()`` with attngen and with
transformers' ``sdpa``, whether the greedy tokens agree, and (with ``--batch``) of continuous
batching (``generate_batch``, CUDA graphs on) with ``paged|attngen`` and ``paged|sdpa``.
Run from the repository root (the generated backends live in ``generated/``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attngen.integrations import transformers as attngen_tf  # noqa: E402

KV_DTYPES = {"auto": None, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def random_config(name: str):
    """Random-weight configs: Llama-3-style GQA, DeepSeek-V3 (MLA at DeepSeek's dims, 16
    heads per rank, dense MLPs), DeepSeek-V3.2 (the same MLA plus its indexer, 64 heads x
    128, top-2048: sparse once prompts pass 2048 tokens), Qwen3-Next (3 GDN layers of its
    dims per full-attention layer, dense MLPs) and Qwen3.5 (3 GDN layers of Qwen3.5-27B's
    16 key / 48 value heads per full-attention layer of head dim 256, GQA 4)."""
    from transformers import DeepseekV3Config, DeepseekV32Config, LlamaConfig, Qwen3NextConfig
    from transformers import Qwen3_5TextConfig

    common = dict(vocab_size=32000, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    if name in ("deepseek_v3", "deepseek_v32"):
        cls = DeepseekV3Config if name == "deepseek_v3" else DeepseekV32Config
        return cls(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=8,
            first_k_dense_replace=8,
            num_attention_heads=16,
            num_key_value_heads=16,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            **common,
        )
    if name == "qwen3_next":
        return Qwen3NextConfig(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=8,
            layer_types=["linear_attention"] * 3
            + ["full_attention"]
            + ["linear_attention"] * 3
            + ["full_attention"],
            mlp_only_layers=list(range(8)),
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=128,
            **common,
        )
    if name == "qwen3_5":
        return Qwen3_5TextConfig(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=8,
            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
            linear_num_key_heads=16,
            linear_num_value_heads=48,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=256,
            **common,
        )
    return LlamaConfig(  # Llama-3-8B's attention shape, fewer and narrower layers
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        **common,
    )


def load(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda()
    torch.manual_seed(0)
    config = random_config(args.config)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()


def timed_generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> tuple:
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(input_ids=ids[:, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(input_ids=ids, **kw)
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return out[:, ids.shape[1] :], ids.shape[0] * new_tokens / seconds


def timed_batch(model: torch.nn.Module, impl: str, prompts: list, new_tokens: int) -> tuple:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
    # bounded sizes: the warmup captures graphs at the largest batch the cache allows
    cb = ContinuousBatchingConfig(
        use_cuda_graph=True, max_memory_percent=0.3, max_batch_tokens=2048
    )
    model.set_attn_implementation(impl)
    model.generate_batch(prompts[:2], generation_config=gen, continuous_batching_config=cb)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    torch.cuda.synchronize()
    tokens = sum(len(r.generated_tokens) for r in out.values())
    return tokens / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint path or hub id (default: random weights)")
    parser.add_argument(
        "--config",
        choices=("llama", "deepseek_v3", "deepseek_v32", "qwen3_next", "qwen3_5"),
        default="llama",
        help="the random-weight model without --model (deepseek_v3: MLA; deepseek_v32: DSA; "
        "qwen3_next: GDN)",
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=None)
    parser.add_argument("--kv-cache-dtype", choices=sorted(KV_DTYPES), default="auto")
    parser.add_argument(
        "--batch", action="store_true", help="also time generate_batch (MHA models only)"
    )
    args = parser.parse_args()

    print(f"loading {args.model or 'a random-weight ' + args.config + ' model'} ...", flush=True)
    model = load(args)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(1, vocab, (args.batch_size, args.prompt_tokens), device="cuda")

    model.set_attn_implementation("sdpa")
    print("generating with transformers' sdpa ...", flush=True)
    ref, sdpa_rate = timed_generate(model, ids, args.new_tokens)
    runtime = attngen_tf.enable(
        model, page_size=args.page_size, kv_cache_dtype=KV_DTYPES[args.kv_cache_dtype]
    )
    print("generating with attngen (first calls compile its kernels) ...", flush=True)
    got, attngen_rate = timed_generate(model, ids, args.new_tokens)
    served = sorted({c.describe() for c in runtime.generate.choices.values()})
    families = (runtime.mla, runtime.gdn, runtime.dsa)
    served += [f.choice.describe() for f in families if f.choice is not None]
    same = (got == ref).int()
    agree = same.float().mean().item()
    first_diff = same.cumprod(1).sum(1).float()  # equal new tokens before each row's first split
    print(f"generate, batch {args.batch_size} x {args.prompt_tokens} prompt + {args.new_tokens}:")
    print(f"  sdpa     {sdpa_rate:9.1f} tokens/s")
    print(f"  attngen  {attngen_rate:9.1f} tokens/s  ({attngen_rate / sdpa_rate:.2f}x)  {served}")
    print(
        f"  greedy tokens equal to sdpa's: {agree:.1%}; rows agree for their first "
        f"{first_diff.min():.0f}-{first_diff.max():.0f} new tokens",
        flush=True,
    )
    if args.model is None and agree < 1.0:
        print(
            "  (random weights leave near-ties between logits, and bf16 rounding in either "
            "attention breaks them either way; after a row's first different token the two "
            "continue from different text. tests/integrations/transformers checks attngen "
            "against eager fp32 with margins and a derived logit bound.)",
            flush=True,
        )
    if args.batch:
        prompts = ids.tolist()
        for impl in ("paged|sdpa", attngen_tf.PAGED_NAME):
            rate = timed_batch(model, impl, prompts, args.new_tokens)
            print(f"generate_batch {impl:14s} {rate:9.1f} tokens/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
