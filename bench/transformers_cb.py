#!/usr/bin/env python3
"""Throughput of transformers' ``generate_batch`` (continuous batching, CUDA graphs on) on
attngen (``paged|attngen``) against transformers' own paged attention (``paged|sdpa``, and
``paged|flash_attention_2`` when flash-attn is installed), in one run, same model, same
prompts. Also plain ``generate()``: attngen against ``sdpa``.

The model is a random-weight Llama-3-style decoder (bf16; GQA 32 q / 8 kv heads of dim 128),
sized by the flags. Each timed call follows an untimed small call of the same implementation
(Triton compiles attngen's kernels there); the timed call includes its own CUDA-graph warmup,
as a user's call would. Writes ``bench/results/transformers-<utc>-<commit>.json``.

    python bench/transformers_cb.py --commit $(git rev-parse --short HEAD)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(args: argparse.Namespace):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 128,
        num_key_value_heads=args.hidden // 512,
        head_dim=128,
        max_position_embeddings=8192,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model.to("cuda").eval(), cfg


def cb_config(args: argparse.Namespace):
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    return ContinuousBatchingConfig(
        block_size=args.block_size,
        use_cuda_graph=True,
        max_memory_percent=0.4,
        max_batch_tokens=args.max_batch_tokens,
    )


def time_batch(model, impl: str, prompts, args) -> dict:
    from transformers import GenerationConfig

    gen = GenerationConfig(
        max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    model.set_attn_implementation(impl)
    small = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    model.generate_batch(
        prompts[:4], generation_config=small, continuous_batching_config=cb_config(args)
    )
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate_batch(
        prompts, generation_config=gen, continuous_batching_config=cb_config(args)
    )
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = [list(out[f"req_{i}"].generated_tokens) for i in range(len(prompts))]
    generated = sum(len(t) for t in tokens)
    return dict(
        seconds=seconds, generated_tokens=generated, tokens_per_s=generated / seconds, tokens=tokens
    )


def time_generate(model, impl: str, args) -> dict:
    torch.manual_seed(1)
    ids = torch.randint(1, 32000, (args.generate_batch, args.generate_prompt), device="cuda")
    kw = dict(
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    if impl == "attngen":
        from attngen.integrations import transformers as atf

        atf.enable(model)
    else:
        model.set_attn_implementation(impl)
    with torch.no_grad():
        model.generate(input_ids=ids[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(input_ids=ids, **kw)
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    generated = args.generate_batch * args.new_tokens
    return dict(
        seconds=seconds,
        generated_tokens=generated,
        tokens_per_s=generated / seconds,
        tokens=out[:, args.generate_prompt :].tolist(),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=128)
    parser.add_argument("--max-prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--generate-batch", type=int, default=16)
    parser.add_argument("--generate-prompt", type=int, default=512)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()

    from attngen.integrations import transformers as atf

    model, cfg = build(args)
    atf.enable(model)  # registers paged|attngen and gives the model its runtime
    gen = torch.Generator().manual_seed(2)
    lengths = torch.randint(args.min_prompt, args.max_prompt + 1, (args.requests,), generator=gen)
    prompts = [torch.randint(1, 32000, (int(n),), generator=gen).tolist() for n in lengths]
    results: dict = {"continuous_batching": {}, "generate": {}}
    impls = ["paged|sdpa", "paged|attngen"]
    try:
        import flash_attn  # noqa: F401

        impls.insert(1, "paged|flash_attention_2")
    except ImportError:
        results["flash_attention_2"] = "not installed on this machine"
    for impl in impls:
        try:
            results["continuous_batching"][impl] = time_batch(model, impl, prompts, args)
        except Exception as error:  # a peer that fails here is recorded, not fatal
            results["continuous_batching"][impl] = {"error": f"{type(error).__name__}: {error}"}
    for impl in ("sdpa", "attngen"):
        try:
            results["generate"][impl] = time_generate(model, impl, args)
        except Exception as error:
            results["generate"][impl] = {"error": f"{type(error).__name__}: {error}"}
    report = summarize(results, args, cfg)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    path = Path(args.out) / f"transformers-{stamp}-{args.commit}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    for line in report["table"]:
        print(line)
    print("wrote", path)
    return 0


def summarize(results: dict, args: argparse.Namespace, cfg) -> dict:
    table = []
    for section, rows in results.items():
        if not isinstance(rows, dict):
            continue
        base = rows.get("paged|sdpa" if section == "continuous_batching" else "sdpa", {})
        for impl, row in rows.items():
            if "error" in row:
                table.append(f"{section:20s} {impl:26s} ERROR {row['error'][:300]}")
                continue
            ratio = row["tokens_per_s"] / base["tokens_per_s"] if "tokens_per_s" in base else 0.0
            same = row["tokens"] == base.get("tokens")
            row["same_tokens_as_sdpa"] = same
            row["speed_vs_sdpa"] = ratio
            table.append(
                f"{section:20s} {impl:26s} {row['tokens_per_s']:9.1f} tok/s"
                f"  {row['seconds']:7.2f} s"
                f"  x{ratio:.2f} vs sdpa  same tokens as sdpa: {same}"
            )
        for row in rows.values():
            row.pop("tokens", None)  # kept out of the JSON
    versions = {p: importlib.metadata.version(p) for p in ("torch", "triton", "transformers")}
    return dict(
        commit=args.commit,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name(),
        versions=versions,
        model=dict(
            layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            q_heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            vocab=cfg.vocab_size,
            dtype="bfloat16",
            weights="random",
        ),
        workload=dict(
            requests=args.requests,
            prompt_tokens=[args.min_prompt, args.max_prompt],
            new_tokens=args.new_tokens,
            block_size=args.block_size,
            max_batch_tokens=args.max_batch_tokens,
            cuda_graphs=True,
            generate_batch=args.generate_batch,
            generate_prompt=args.generate_prompt,
        ),
        results=results,
        table=table,
    )


if __name__ == "__main__":
    raise SystemExit(main())
