"""The README's generated-backend example runs as printed (on the CPU instead of "cuda", in
the Triton interpreter, and in fp16 instead of bf16: Triton 3.6's interpreter multiplies
bf16 dot operands as raw bits), given the pools, the batch, q / k / v and the layer it
names but does not build, and its output matches the float64 oracle."""

from __future__ import annotations

import ast

import torch

from attngen.families.mha.testing import oracle_output
from attngen.runtime.batch import AttentionLayer
from attngen.testing import PagedBatchBuilder, make_pools
from attngen.testing.paths import REPO_ROOT
from attngen.testing.tolerance import assert_close


def readme_block(after: str) -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return text.split(after, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_generated_backend_example_runs_as_written() -> None:
    source = readme_block("A generated backend is used like this")
    call = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Backend"
    )
    kw = {k.arg: k.value for k in call.keywords}
    shape = {n: ast.literal_eval(kw[n]) for n in ("num_q_heads", "num_kv_heads", "head_dim")}
    page_size = ast.literal_eval(kw["page_size"])
    assert kw["dtype"].attr == "bfloat16"  # the example's dtype, run here as fp16
    dtype = torch.float16
    req_pool, kv_pool = make_pools(
        num_layers=1,
        max_reqs=3,
        max_context_len=64,
        num_pages=16,
        page_size=page_size,
        num_kv_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"],
        dtype=dtype,
        device="cpu",
    )
    torch.manual_seed(0)
    builder = PagedBatchBuilder(req_pool, kv_pool)
    pb = builder.decode([19, 33])  # ragged contexts over 2 and 3 pages of 16
    hq, hkv, d = shape["num_q_heads"], shape["num_kv_heads"], shape["head_dim"]
    q = torch.randn(2, hq, d, dtype=dtype)
    k, v = torch.randn(2, hkv, d, dtype=dtype), torch.randn(2, hkv, d, dtype=dtype)
    layer = AttentionLayer(0, hq, hkv, d, d, d**-0.5)
    scope = dict(req_to_token_pool=req_pool, kv_pool=kv_pool, forward_batch=pb.batch, q=q, k=k,
                 v=v, layer=layer)  # fmt: skip
    runnable = source.replace('"cuda"', '"cpu"').replace("torch.bfloat16", "torch.float16")
    exec(compile(runnable, "README.md", "exec"), scope)
    out = scope["out"]
    k_cache, v_cache = kv_pool.get_kv_buffer(0)
    want = oracle_output(
        pb, q, k_cache, v_cache, layer.scaling, mask=scope["Backend"].kernels.HOOKS, sinks=None
    )
    assert_close(out.view(want.shape), want, msg="README backend example")
