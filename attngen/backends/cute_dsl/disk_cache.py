"""An on-disk cache of compiled CuTe DSL kernels: each kernel is compiled once per machine.

``cute.compile`` of an attention kernel costs about a second of host time per variant (more
on a busy host); an engine that starts many processes, or restarts, would pay it for every
kernel in every process. A kernel compiled here is exported (``export_to_c``: an object file
holding the host launch code and the cubin) under a key derived from

- the caller's identity of the kernel (what it is specialized for, the sha256 of the source
  that builds it, how its arguments are typed),
- the cubin target it was compiled for (``sm_90a``, ...),
- the nvidia-cutlass-dsl version, the host machine and this cache's format,

and later processes load it (``cute.runtime.load_module``: milliseconds) instead of compiling.
Functions compiled for TVM FFI calls (``--enable-tvm-ffi``: torch tensors passed as they are)
are stored and loaded as such (``tvm_ffi=True``; part of the key).

Location: ``$ATTNGEN_CUTE_DSL_CACHE_DIR`` if set (``off`` disables the cache), else
``$XDG_CACHE_HOME/attngen/cute_dsl``, else ``~/.cache/attngen/cute_dsl``. Entries are
``<key[:2]>/<key>.o`` plus a ``.json`` that spells the key's inputs (for people; never read).

Concurrency: an entry is written into a private temporary directory inside the cache, then
moved into place with ``os.replace`` (atomic on one filesystem), so a reader sees either no
entry or a whole one, and processes racing on one key each write a whole file, the last
rename winning (compiles are deterministic: the files are the same). A file that fails to
load (truncated by a crash outside this protocol, another version's format) is compiled
again and replaced, with a warning. Failing to write the cache never fails the kernel: the
compiled function is returned and a warning says why it was not stored.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_DIR = "ATTNGEN_CUTE_DSL_CACHE_DIR"
DISABLED = "off"
FORMAT = 1  # bump when the entry layout or the export protocol changes
DSL_DISTRIBUTION = "nvidia-cutlass-dsl"


class CacheWarning(UserWarning):
    """The cache could not store or load an entry; the kernel was compiled instead."""


def cache_dir() -> Path | None:
    """Where entries live, or None when the cache is off."""
    configured = os.environ.get(ENV_DIR)
    if configured is not None:
        return None if configured.strip().lower() == DISABLED else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attngen" / "cute_dsl"


def dsl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DSL_DISTRIBUTION)
    except PackageNotFoundError:  # a source checkout of the DSL: key on its module version
        import cutlass

        return str(getattr(cutlass, "__version__", "unknown"))


def key_inputs(identity: Mapping[str, str], target: str, tvm_ffi: bool = False) -> dict[str, str]:
    """Everything an entry's key is derived from (the identity's fields first, sorted)."""
    inputs = {f"identity.{k}": str(v) for k, v in sorted(identity.items())}
    inputs.update(
        target=target,
        dsl=f"{DSL_DISTRIBUTION}=={dsl_version()}",
        machine=platform.machine(),
        format=str(FORMAT),
    )
    if tvm_ffi:
        inputs["call"] = "tvm_ffi"
    return inputs


def cache_key(inputs: Mapping[str, str]) -> str:
    """sha256 over the key inputs (sorted, JSON): the entry's file name."""
    return hashlib.sha256(json.dumps(dict(inputs), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Lookup:
    """What :func:`load_or_compile` did: ``status`` is "hit" (loaded), "miss" (compiled and
    stored), "off" (compiled; cache disabled) or "unstored" (compiled; storing failed)."""

    function: Any
    status: str
    path: Path | None


_RUNTIME_LOCK = threading.Lock()
_RUNTIME_LOADED: set[bool] = set()  # tvm_ffi values whose runtime libraries are loaded


def _load_dsl_runtime_globally(tvm_ffi: bool = False) -> None:
    """``export_to_c`` links the host launch code against the DSL's runtime library (and
    TVM FFI's): its symbols must be visible process-wide (the DSL loads it privately
    otherwise)."""
    with _RUNTIME_LOCK:
        if tvm_ffi in _RUNTIME_LOADED:
            return
        from cutlass.runtime import find_runtime_libraries

        for path in find_runtime_libraries(enable_tvm_ffi=tvm_ffi):
            if Path(path).exists():
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        _RUNTIME_LOADED.add(tvm_ffi)


def symbol_prefix(key: str) -> str:
    """The exported function's symbol prefix: a C identifier unique per entry."""
    return f"attngen_{key[:24]}"


def load_entry(path: Path, key: str, tvm_ffi: bool = False) -> Any:
    """The compiled function stored at ``path`` (raises if it cannot be loaded)."""
    from cutlass.cute.runtime import load_module

    module = load_module(str(path), enable_tvm_ffi=tvm_ffi)
    return getattr(module, symbol_prefix(key))


def store_entry(
    function: Any, root: Path, key: str, inputs: Mapping[str, str], tvm_ffi: bool = False
) -> Path:
    """Export ``function`` and move it into place atomically; returns the entry's path."""
    _load_dsl_runtime_globally(tvm_ffi)
    final = root / key[:2] / f"{key}.o"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        if tvm_ffi:  # (its exporter takes the object file's path and the symbol's name)
            function.export_to_c(str(tmp / "kernel.o"), symbol_prefix(key))
        else:
            function.export_to_c(str(tmp), "kernel", symbol_prefix(key))
        (tmp / "kernel.json").write_text(json.dumps(dict(inputs), indent=1, sort_keys=True))
        os.replace(tmp / "kernel.json", final.with_suffix(".json"))
        os.replace(tmp / "kernel.o", final)  # last: the entry exists once this is done
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_or_compile(
    identity: Mapping[str, str],
    target: str,
    compile_fn: Callable[[], Any],
    *,
    tvm_ffi: bool = False,
) -> Lookup:
    """The kernel of ``identity`` for ``target``: loaded from the cache, else compiled with
    ``compile_fn()`` and stored. ``identity`` must determine the compiled kernel entirely
    (its specialization, its source's hash, how its arguments are typed); ``tvm_ffi``: the
    function is compiled for TVM FFI calls (``--enable-tvm-ffi``)."""
    root = cache_dir()
    if root is None:
        return Lookup(compile_fn(), "off", None)
    inputs = key_inputs(identity, target, tvm_ffi)
    key = cache_key(inputs)
    path = root / key[:2] / f"{key}.o"
    if path.exists():
        try:
            return Lookup(load_entry(path, key, tvm_ffi), "hit", path)
        except Exception as e:  # noqa: BLE001 - any unreadable entry is recompiled
            warnings.warn(f"attngen: recompiling cached CuTe DSL kernel {path}: {e}", CacheWarning)
    function = compile_fn()
    try:
        return Lookup(function, "miss", store_entry(function, root, key, inputs, tvm_ffi))
    except Exception as e:  # noqa: BLE001 - the kernel works without its cache entry
        warnings.warn(f"attngen: could not cache CuTe DSL kernel in {root}: {e}", CacheWarning)
        return Lookup(function, "unstored", None)
