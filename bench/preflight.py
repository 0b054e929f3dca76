"""What each GPU bench checks before it starts, so that ``make bench`` can tell a bench that
could not run here (exit code 2, one line saying why) from one that failed (exit code 1)."""

from __future__ import annotations

NOT_RUN = 2


def missing_cuda(bench: str) -> int | None:
    """None with torch and a CUDA device; else print why the bench cannot run and return
    NOT_RUN."""
    try:
        import torch
    except ImportError as e:
        print(f"{bench}: torch is not importable by this python ({e}); run it on the GPU machine")
        return NOT_RUN
    if torch.cuda.is_available():
        return None
    print(f"{bench}: no CUDA device; this benchmark runs on the GPU (the H200)", flush=True)
    return NOT_RUN


def missing_peer(bench: str, package: str, error: Exception, how: str) -> int:
    """Print that the bench's required peer ``package`` does not import (and how to carry it);
    return NOT_RUN."""
    print(
        f"{bench}: its peer {package} is not importable ({type(error).__name__}: {error}); {how}",
        flush=True,
    )
    return NOT_RUN
