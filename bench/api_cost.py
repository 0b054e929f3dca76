"""Host cost of attngen's public backend API on the GPU: the ``api`` section of bench/run.py.

One decode layer of spec ``mha_gqa_paged`` on sm90 (32 q / 8 kv heads, head_dim 128, bf16,
page size 64), batches of 1, 8 and 64 requests of 4096 tokens each, the backend built
through ``attngen.runtime.select.make_backend`` only. Per batch:

- ``kernel_graph_us``: ``forward_decode`` captured in a CUDA graph, time per replay (the
  kernel: the K/V write, the decode and its split combine).
- ``forward_decode_eager_us``: the same call eager (after ``init_forward_metadata``), wall
  time per call over back-to-back calls synchronized at the ends only;
  ``host_overhead_us`` = eager - graph (target <= 40 us).
- ``forward_decode_host_us``: the Python call alone: the clock stops before the queued GPU
  work is waited for.
- ``init_forward_metadata_eager_us``: with the default ``validate_slots`` (one host sync),
  and ``..._no_validate_us`` with ``validate_slots = False`` on the instance (<= 150 us).
- ``replay_metadata_us``: ``init_forward_metadata_replay_cuda_graph`` (target <= 50 us).
- ``torch_op_host_us`` (beside them): host time of one tiny torch op, this machine's floor.

Times are medians over REPEATS loops, the garbage collector paused, after warm-up calls
(the first of which compile the kernels). attngen names are imported when a case runs, so a
moved one gives an error row that says which, not a crashed bench.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
ARCH, SPEC = "sm90", "mha_gqa_paged"
HQ, HKV, D = 32, 8, 128
PAGE, CTX = 64, 4096
BATCHES, QUICK_BATCHES = (1, 8, 64), (8,)
ITERS = 100  # calls per timed loop (synchronized at its ends)
HOST_ITERS = 20  # calls per host-only loop: few, so the launch queue never fills and blocks
REPEATS = 9  # loops per figure; the median is reported
WARMUP = 10  # untimed calls before each figure

TARGETS_US = {
    "host_overhead_us": 40.0,
    "init_forward_metadata_eager_us": 150.0,
    "init_forward_metadata_eager_no_validate_us": 150.0,
    "replay_metadata_us": 50.0,
}
HOW = {
    "kernel_graph_us": "graph.replay() of one captured forward_decode, back to back",
    "forward_decode_eager_us": "eager forward_decode, back to back, synchronized at the ends",
    "host_overhead_us": "forward_decode_eager_us - kernel_graph_us",
    "forward_decode_host_us": "eager forward_decode, clock stopped before synchronizing",
    "init_forward_metadata_eager_us": "init_forward_metadata, default validate_slots",
    "init_forward_metadata_eager_no_validate_us": "init_forward_metadata, validate_slots=False",
    "replay_metadata_us": "init_forward_metadata_replay_cuda_graph(..., seq_lens_cpu=)",
}


# -- attngen's public names, imported with a clear error ----


class ApiUnavailable(RuntimeError):
    """A public attngen name this section needs could not be imported."""


def import_names(module: str, *names: str) -> list:
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        raise ApiUnavailable(
            f"api bench: cannot import {module} for {', '.join(names)} "
            f"({type(e).__name__}: {e}); moved?"
        ) from e
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        raise ApiUnavailable(f"api bench: {module} has no {', '.join(missing)}; moved or renamed?")
    return [getattr(mod, n) for n in names]


def load_api() -> SimpleNamespace:
    """make_backend, the runtime batch types, and attngen.testing's helpers when they import
    (``helpers`` says which builder the inputs come from)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # make_backend imports the `generated` package
    [make_backend] = import_names("attngen.runtime.select", "make_backend")
    types = ("AttentionLayer", "ForwardBatch", "ForwardMode", "ReqToTokenPool")
    api = SimpleNamespace(make_backend=make_backend)
    [api.PagedKVPool] = import_names("attngen.runtime.pools", "PagedKVPool")
    for name, value in zip(types, import_names("attngen.runtime.batch", *types)):
        setattr(api, name, value)
    try:
        api.make_pools, api.PagedBatchBuilder = import_names(
            "attngen.testing", "make_pools", "PagedBatchBuilder"
        )
        api.helpers = "attngen.testing"
    except ApiUnavailable as e:
        api.make_pools = api.PagedBatchBuilder = None
        api.helpers = f"own builder over attngen.runtime.batch ({e})"
    return api


# -- inputs: pools, backend, layer, one decode batch ----


def build_inputs(api, batch: int, device: torch.device) -> SimpleNamespace:
    """A backend over fresh random pools, and a DECODE batch of ``batch`` requests of CTX
    tokens (CTX - 1 cached, one new) in shuffled pages, with random q/k/v."""
    dtype = torch.bfloat16
    num_pages = batch * math.ceil(CTX / PAGE) + 1  # page 0 stays free (graph padding)
    if api.make_pools is not None:
        req_pool, kv_pool = api.make_pools(
            num_layers=1,
            max_reqs=batch + 1,
            max_context_len=CTX,
            num_pages=num_pages,
            page_size=PAGE,
            num_kv_heads=HKV,
            head_dim=D,
            dtype=dtype,
            device=device,
        )
        builder = api.PagedBatchBuilder(req_pool, kv_pool)
        fb, seed = builder.decode([CTX] * batch).batch, builder.seed
    else:
        req_pool, kv_pool = own_pools(api, batch, num_pages, device)
        fb, seed = own_decode_batch(api, req_pool, batch, num_pages, device), None
    backend = api.make_backend(
        ARCH,
        SPEC,
        num_q_heads=HQ,
        num_kv_heads=HKV,
        head_dim=D,
        page_size=PAGE,
        dtype=dtype,
        device=device,
        req_to_token_pool=req_pool,
        kv_pool=kv_pool,
    )
    layer = api.AttentionLayer(
        layer_id=0,
        num_q_heads=HQ,
        num_kv_heads=HKV,
        head_dim=D,
        v_head_dim=D,
        scaling=D**-0.5,
    )
    q, k, v = (torch.randn(batch, h, D, dtype=dtype, device=device) for h in (HQ, HKV, HKV))
    return SimpleNamespace(backend=backend, layer=layer, fb=fb, q=q, k=k, v=v, seed=seed)


def own_pools(api, batch: int, num_pages: int, device: torch.device):
    """Fallback for attngen.testing.make_pools: the runtime's pools, K/V random normal."""
    req_pool = api.ReqToTokenPool(batch + 1, CTX, device)
    kv_pool = api.PagedKVPool(
        num_layers=1,
        num_pages=num_pages,
        page_size=PAGE,
        num_kv_heads=HKV,
        head_dim=D,
        dtype=torch.bfloat16,
        device=device,
    )
    for buf in kv_pool.k_buffer + kv_pool.v_buffer:
        buf.normal_()
    return req_pool, kv_pool


def own_decode_batch(api, req_pool, batch: int, num_pages: int, device: torch.device):
    """Fallback for PagedBatchBuilder.decode: request rows 1..batch (row 0 stays free)
    point at shuffled pages 1..num_pages-1; each request's new token is its last one."""
    per_req = math.ceil(CTX / PAGE)
    pages = (torch.randperm(num_pages - 1)[: batch * per_req] + 1).view(batch, per_req)
    pos = torch.arange(CTX)
    slots = pages[:, pos // PAGE] * PAGE + pos % PAGE  # [batch, CTX] token slots
    for b in range(batch):
        req_pool.write(b + 1, 0, slots[b])
    lens = torch.full((batch,), CTX, dtype=torch.int32)
    return api.ForwardBatch(
        batch_size=batch,
        forward_mode=api.ForwardMode.DECODE,
        req_pool_indices=torch.arange(1, batch + 1, device=device),
        seq_lens=lens.to(device),
        seq_lens_cpu=lens,
        out_cache_loc=slots[:, -1].to(device),
    )


# -- timing ----


def sync() -> None:
    torch.cuda.synchronize()


@contextlib.contextmanager
def gc_paused():
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def warm(fn) -> None:
    for _ in range(WARMUP):
        fn()
    sync()


def wall_us(fn, iters: int = ITERS) -> float:
    """Wall time per call of ``iters`` back-to-back calls, synchronized before and after
    the loop only: the median over REPEATS loops, in us."""
    warm(fn)
    samples = []
    for _ in range(REPEATS):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(samples)


def host_us(fn, iters: int = HOST_ITERS) -> float:
    """Time per call of the Python call itself: the clock stops with the GPU work still
    queued, then the loop is synchronized (outside the timing). Median over REPEATS, us."""
    warm(fn)
    samples = []
    for _ in range(REPEATS):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) / iters * 1e6)
        sync()
    return statistics.median(samples)


# -- the measures ----


def measure_eager(api, s: SimpleNamespace) -> dict:
    """Eager forward_decode (wall and host-only) and init_forward_metadata (with and
    without slot validation); ``eager_out`` is one eager output for the graph check."""
    backend = s.backend
    backend.init_forward_metadata(s.fb)
    forward = lambda: backend.forward_decode(s.q, s.k, s.v, s.layer, s.fb)  # noqa: E731
    found = {
        "forward_decode_eager_us": wall_us(forward),
        "forward_decode_host_us": host_us(forward),
        "eager_out": forward().clone(),
    }
    metadata = lambda: backend.init_forward_metadata(s.fb)  # noqa: E731
    found["init_forward_metadata_eager_us"] = wall_us(metadata)
    found["init_forward_metadata_eager_no_validate_us"] = without_validation(backend, metadata)
    return found


def without_validation(backend, metadata) -> float | None:
    """wall_us(metadata) with ``validate_slots = False`` on the instance, then restored;
    None when the backend has no such attribute."""
    if not hasattr(backend, "validate_slots"):
        return None
    before = backend.validate_slots
    backend.validate_slots = False
    try:
        return wall_us(metadata)
    finally:
        backend.validate_slots = before


def capture_decode(api, s: SimpleNamespace):
    """forward_decode for the whole batch captured in a CUDA graph, over static copies of
    the batch's index tensors: (graph, its output, the static batch)."""
    backend, fb, bs = s.backend, s.fb, s.fb.batch_size
    static = api.ForwardBatch(
        batch_size=bs,
        forward_mode=api.ForwardMode.DECODE,
        req_pool_indices=fb.req_pool_indices.clone(),
        seq_lens=fb.seq_lens.clone(),
        seq_lens_cpu=fb.seq_lens_cpu.clone(),
        out_cache_loc=fb.out_cache_loc.clone(),
    )
    backend.init_cuda_graph_state(bs, bs)
    backend.init_forward_metadata_capture_cuda_graph(
        bs, bs, static.req_pool_indices, static.seq_lens, None, api.ForwardMode.DECODE, None
    )
    backend.forward_decode(s.q, s.k, s.v, s.layer, static)  # the graph path, once eagerly
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward_decode(s.q, s.k, s.v, s.layer, static)
    sync()
    return graph, out, static


def measure_graph(api, s: SimpleNamespace, eager_out: torch.Tensor) -> dict:
    """Replay metadata and graph replay times, and the graph's output vs the eager one."""
    graph, out, static = capture_decode(api, s)
    seq_lens_sum = int(static.seq_lens_cpu.sum())

    def replay_metadata():
        s.backend.init_forward_metadata_replay_cuda_graph(
            static.batch_size,
            static.req_pool_indices,
            static.seq_lens,
            seq_lens_sum,
            None,
            api.ForwardMode.DECODE,
            None,
            seq_lens_cpu=static.seq_lens_cpu,
        )

    found = {"replay_metadata_us": wall_us(replay_metadata)}  # leaves the batch loaded
    found["kernel_graph_us"] = wall_us(graph.replay)
    out.fill_(float("nan"))  # an output the graph fails to write shows
    graph.replay()
    sync()
    found["graph_vs_eager"] = compare(out, eager_out)
    return found


def compare(got: torch.Tensor, want: torch.Tensor) -> dict:
    """The same kernels on the same inputs: a loose bound that catches stale or unwritten
    output (NaN fails it), not rounding."""
    diff = (got.float() - want.float()).abs().max().item()
    tol = 1e-3 + 1e-2 * want.float().abs().max().item()
    return {"max_abs_diff": diff, "tol": tol, "ok": bool(diff <= tol)}


def measure_entry(name: str, us: float | None) -> dict:
    target = TARGETS_US.get(name)
    entry = {"us": us, "target_us": target, "how": HOW[name]}
    if us is None:
        entry["status"] = "backend has no validate_slots attribute"
    entry["pass"] = None if target is None or us is None else bool(us <= target)
    return entry


def torch_op_host_us(device: torch.device) -> float:
    """Host time of one tiny torch op on the GPU: this machine's floor for any launch, to
    read the figures above against (it differs between machines and containers)."""
    x = torch.zeros(1, device=device)
    return host_us(lambda: x.add_(1))


def run_case(batch: int) -> dict:
    """One row of the report's "api" list: every measure for a decode batch of ``batch``."""
    api = load_api()
    device = torch.device("cuda", torch.cuda.current_device())
    s = build_inputs(api, batch, device)
    with gc_paused():
        found = measure_eager(api, s)
        found.update(measure_graph(api, s, found.pop("eager_out")))
        floor = torch_op_host_us(device)
    found["host_overhead_us"] = found["forward_decode_eager_us"] - found["kernel_graph_us"]
    measures = {name: measure_entry(name, found[name]) for name in HOW}
    failed = [name for name, m in measures.items() if m["pass"] is False]
    check = found["graph_vs_eager"]
    result = {
        "measures": measures,
        "failed_targets": failed,
        "graph_vs_eager": check,
        "mismatch": [] if check["ok"] else ["graph_vs_eager"],
    }
    return {
        "case": f"B{batch} ctx{CTX}",
        "batch": batch,
        "ctx": CTX,
        "page_size": PAGE,
        "hq": HQ,
        "hkv": HKV,
        "head_dim": D,
        "arch": ARCH,
        "spec": SPEC,
        "uri": getattr(getattr(s.backend, "config", None), "uri", None),
        "inputs_from": api.helpers,
        "seed": s.seed,
        "torch_op_host_us": floor,
        "timing": f"median of {REPEATS} loops of {ITERS} calls ({HOST_ITERS} host-only)",
        "results": {"attngen": result},
        "ratio": {},
    }


# -- printing ----


def summary(row: dict) -> str:
    res = row["results"]["attngen"]
    if "measures" not in res:
        return f"api {row['case']}: {res.get('error', res)}"
    figures = ", ".join(
        f"{n} {m['us']:.1f}" for n, m in res["measures"].items() if m["us"] is not None
    )
    failed = res["failed_targets"]
    floor = f"; one tiny torch op: {row['torch_op_host_us']:.1f} host"
    return f"api {row['case']}: {figures}{floor}" + (f"; over target: {failed}" if failed else "")


def table_lines(rows: list[dict]) -> list[str]:
    lines = [
        "api host cost (us)   measure                                        us  target" "  check"
    ]
    for row in rows:
        res = row["results"]["attngen"]
        if "measures" not in res:
            lines.append(f"{row['case']:<20} err: {res.get('error', '?')}")
            continue
        for i, (name, m) in enumerate(res["measures"].items()):
            us = "       -" if m["us"] is None else f"{m['us']:8.1f}"
            target = "       -" if m["target_us"] is None else f"  <= {m['target_us']:3.0f}"
            check = {True: "ok", False: "OVER", None: "-"}[m["pass"]]
            lines.append(f"{row['case'] if i == 0 else '':<20} {name:<42} {us} {target}  {check}")
        if res.get("mismatch"):
            lines.append(f"{'':<20} graph output vs eager: MISMATCH {res['graph_vs_eager']}")
    return lines
