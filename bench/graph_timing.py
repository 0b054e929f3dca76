"""CUDA-graph timing shared by the benches: triton.testing.do_bench_cudagraph, entered only
after everything queued so far has finished.

do_bench_cudagraph runs ``fn`` on a fresh stream, which does not wait for the default
stream: without the synchronize below, the first calls on that stream could read inputs
that the default stream is still writing (a cache being filled, indices being sorted)
and see stale memory. bench/dsa.py's split sweep hit exactly that (stale index words as
slots: an illegal address) after the decode rows had left other data in the allocator's
blocks.
"""

from __future__ import annotations

from typing import Callable


def graph_ms(fn: Callable[[], object], rep: int = 100) -> float:
    """Milliseconds per call of ``fn`` replayed from a CUDA graph, after one eager call and a
    device-wide synchronize."""
    import torch
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=rep)
