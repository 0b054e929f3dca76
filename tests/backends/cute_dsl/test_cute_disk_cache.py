"""The on-disk compile cache of CuTe DSL kernels (attngen.backends.cute_dsl.disk_cache), on
CPU: keys, store then load, disabled, unreadable entries, processes racing on one key, and
the MHA launchers' path (a kernel compiled from the launchers' argument types on the first
use is loaded, not compiled, by the next process). Running a loaded kernel needs a GPU:
tests/families/mha/gpu/test_cute_dsl_gpu.py does that."""

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attngen.backends.cute_dsl import disk_cache
from attngen.backends.cute_dsl.disk_cache import ENV_DIR, cache_key, key_inputs, load_or_compile

pytest.importorskip("cutlass")
import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

IDENTITY = {"kernel": "tests.add_one", "source_sha256": "0" * 64, "args": "fake/1"}
TARGET = "sm_90a"


@cute.kernel
def _add_one_kernel(x: cute.Tensor):
    i = cute.arch.block_idx()[0] * 128 + cute.arch.thread_idx()[0]
    if i < cute.size(x):
        x[i] = x[i] + cutlass.Float32(1.0)


@cute.jit
def _add_one(x: cute.Tensor, stream: cuda.CUstream):
    grid = ((cute.size(x) + 127) // 128, 1, 1)
    _add_one_kernel(x).launch(grid=grid, block=(128, 1, 1), stream=stream)


def _compile_add_one(target: str = TARGET):
    """A tiny kernel (x[i] += 1) compiled on fake tensors: ~0.1 s."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    x = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int32(),), assumed_align=16)
    return cute.compile(_add_one, x, make_fake_stream(), options=f"--gpu-arch {target}")


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cute_cache"
    monkeypatch.setenv(ENV_DIR, str(root))
    return root


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.o"))


def test_key_covers_identity_target_and_dsl_version(monkeypatch: pytest.MonkeyPatch) -> None:
    base = cache_key(key_inputs(IDENTITY, TARGET))
    assert base == cache_key(key_inputs(dict(reversed(list(IDENTITY.items()))), TARGET))
    for changed in (
        key_inputs({**IDENTITY, "source_sha256": "1" * 64}, TARGET),
        key_inputs({**IDENTITY, "args": "fake/2"}, TARGET),
        key_inputs(IDENTITY, "sm_100a"),
    ):
        assert cache_key(changed) != base
    monkeypatch.setattr(disk_cache, "dsl_version", lambda: "0.0.0")
    assert cache_key(key_inputs(IDENTITY, TARGET)) != base


def test_location_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "x"))
    assert disk_cache.cache_dir() == tmp_path / "x"
    monkeypatch.setenv(ENV_DIR, "off")
    assert disk_cache.cache_dir() is None
    monkeypatch.delenv(ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert disk_cache.cache_dir() == tmp_path / "xdg" / "attngen" / "cute_dsl"


def test_miss_stores_then_hit_loads_without_compiling(cache_root: Path) -> None:
    calls = []

    def compile_fn():
        calls.append(1)
        return _compile_add_one()

    first = load_or_compile(IDENTITY, TARGET, compile_fn)
    assert (first.status, len(calls)) == ("miss", 1)
    assert _entries(cache_root) == [first.path]
    assert first.path.with_suffix(".json").exists()
    assert not list(cache_root.glob("*/.tmp-*")), "temporary export directories left behind"
    second = load_or_compile(IDENTITY, TARGET, compile_fn)
    assert (second.status, len(calls), second.path) == ("hit", 1, first.path)
    # the loaded function is the exported one: same launch signature as the compiled one
    want = first.function.execution_args.signature
    assert str(second.function.execution_args.signature) == str(want)
    other = load_or_compile({**IDENTITY, "args": "fake/2"}, TARGET, compile_fn)
    assert (other.status, len(calls)) == ("miss", 2)
    assert len(_entries(cache_root)) == 2


def test_tvm_ffi_functions_are_stored_and_loaded_as_such(cache_root: Path) -> None:
    """A kernel compiled for TVM FFI calls round-trips through its own entry (a key apart
    from the plain export's); the loaded function takes torch tensors and checks them."""
    pytest.importorskip("tvm_ffi")
    import torch
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    def compile_fn():
        x = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int32(),), assumed_align=16)
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        options = f"--gpu-arch {TARGET} --enable-tvm-ffi"
        return cute.compile(_add_one, x, stream, options=options)

    first = load_or_compile(IDENTITY, TARGET, compile_fn, tvm_ffi=True)
    second = load_or_compile(IDENTITY, TARGET, compile_fn, tvm_ffi=True)
    assert (first.status, second.status, second.path) == ("miss", "hit", first.path)
    assert first.path != load_or_compile(IDENTITY, TARGET, _compile_add_one).path
    with pytest.raises(ValueError, match="device_type=cuda"):  # a CPU tensor: refused
        second.function(torch.zeros(8))


def test_disabled_cache_writes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_DIR, "off")
    monkeypatch.chdir(tmp_path)
    found = load_or_compile(IDENTITY, TARGET, _compile_add_one)
    assert (found.status, found.path) == ("off", None)
    assert not list(tmp_path.rglob("*.o"))


def test_unreadable_entry_is_recompiled_and_replaced(cache_root: Path) -> None:
    first = load_or_compile(IDENTITY, TARGET, _compile_add_one)
    good = first.path.read_bytes()
    first.path.write_bytes(good[: len(good) // 3])  # truncated
    with pytest.warns(disk_cache.CacheWarning, match="recompiling"):
        again = load_or_compile(IDENTITY, TARGET, _compile_add_one)
    assert again.status == "miss" and again.path.read_bytes() == good
    assert load_or_compile(IDENTITY, TARGET, _compile_add_one).status == "hit"


def test_unwritable_cache_still_returns_the_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(ENV_DIR, str(blocker / "cache"))
    with pytest.warns(disk_cache.CacheWarning, match="could not cache"):
        found = load_or_compile(IDENTITY, TARGET, _compile_add_one)
    assert found.status == "unstored" and found.function is not None


RACER = """
import sys, time
sys.path.insert(0, {tests!r})
from test_cute_disk_cache import IDENTITY, TARGET, _compile_add_one
from attngen.backends.cute_dsl.disk_cache import load_or_compile
start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.001)
found = load_or_compile(IDENTITY, TARGET, _compile_add_one)
print(found.status, found.function.execution_args.signature)
"""


def test_processes_racing_on_one_key(cache_root: Path) -> None:
    """Three processes start together on an empty cache: every one gets a working kernel,
    one entry remains, no temporary files."""
    script = RACER.format(tests=str(Path(__file__).parent))
    env = {**os.environ, ENV_DIR: str(cache_root)}
    start = time.time() + 6.0  # after the imports of all three
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(start)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]  # fmt: skip
    results = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert out.split()[0] in ("miss", "hit"), out
    assert len(_entries(cache_root)) == 1
    assert not list(cache_root.glob("*/.tmp-*"))
    assert load_or_compile(IDENTITY, TARGET, _compile_add_one).status == "hit"


def test_mha_launch_path_compiles_once_per_machine(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launchers' first use of a kernel compiles and stores it; a later process (here:
    the in-process table emptied) loads it without compiling, with the same signature."""
    from attngen.families.mha.cute_dsl.host import compile as host_compile
    from attngen.families.mha.cute_dsl.testing import fake_cuda, fake_launch
    from attngen.testing.paths import REPO_ROOT

    sys.path.insert(0, str(REPO_ROOT))
    from generated.sm90.cute_dsl.mha.mha_gqa_prefill import kernels

    config = kernels.CONFIGS["d64_g4_ps64_bf16_causal"]
    monkeypatch.setattr(host_compile, "_COMPILED", {})
    with fake_cuda():
        arch, shape, args = fake_launch(config, kernels.TRAITS, "extend")
        t0 = time.perf_counter()
        cold = host_compile.compiled_fwd(arch, shape, args)
        t1 = time.perf_counter()
    assert len(_entries(cache_root)) == 1
    monkeypatch.setattr(host_compile, "_COMPILED", {})

    def no_compile(*_: object) -> None:
        raise AssertionError("compiled again: the disk cache was not used")

    monkeypatch.setattr(host_compile, "compile_fwd", no_compile)
    with fake_cuda():
        t2 = time.perf_counter()
        warm = host_compile.compiled_fwd(arch, shape, args)
        t3 = time.perf_counter()
    assert isinstance(warm, host_compile._FirstCallOfLoaded)  # until its first call returns
    assert str(warm.fn.execution_args.signature) == str(cold.execution_args.signature)
    assert t3 - t2 < t1 - t0, (t1 - t0, t3 - t2)
    print(f"first use: cold {t1 - t0:.3f} s (compile + store), warm {t3 - t2:.4f} s (load)")


def test_a_loaded_kernel_that_fails_its_first_call_is_recompiled(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attngen.families.mha.cute_dsl.host import compile as host_compile

    calls = []
    key = ("sm90", "shape")
    monkeypatch.setattr(host_compile, "_COMPILED", {})
    monkeypatch.setattr(host_compile, "compile_fwd", lambda *a: calls.append(a) or (lambda *x: 7))

    def broken(*_: object) -> None:
        raise TypeError("argument 3: wrong type")

    guard = host_compile._FirstCallOfLoaded(key, broken, "entry.o")
    with pytest.warns(disk_cache.CacheWarning, match="entry.o failed"):
        assert guard(1, 2) == 7
    assert calls == [("sm90", "shape", (1, 2))] and host_compile._COMPILED[key](0) == 7
    ok = host_compile._FirstCallOfLoaded(key, lambda *x: 5, "entry.o")
    assert ok(1) == 5 and host_compile._COMPILED[key] is ok.fn  # the guard steps aside


@pytest.mark.parametrize(
    "module,uri,phase",
    [
        ("mha_gqa_prefill_page1", "d64_g4_ps1_bf16_causal", "extend"),  # cp.async gathers
        ("mha_spec_tree", "d64_g8_ps1_bf16_custom_topk4", "verify"),  # + tree masks (uint8)
    ],
)
def test_a_loaded_mha_kernel_takes_the_launchers_arguments(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, module: str, uri: str, phase: str
) -> None:
    """Called with the launchers' argument types, a kernel loaded from the cache converts
    every argument and gets as far as the CUDA runtime: on a machine without a driver, the
    only error is the missing driver (an ABI mismatch would fail in argument conversion)."""
    import torch

    from attngen.families.mha.cute_dsl.host import compile as host_compile
    from attngen.families.mha.cute_dsl.testing import fake_cuda, fake_launch
    from attngen.testing.paths import REPO_ROOT

    if torch.cuda.is_available():
        pytest.skip("would launch on fake (null) tensors: the GPU suite runs loaded kernels")
    sys.path.insert(0, str(REPO_ROOT))
    kernels = importlib.import_module(f"generated.sm90.cute_dsl.mha.{module}.kernels")
    config = kernels.CONFIGS[uri]
    monkeypatch.setattr(host_compile, "_COMPILED", {})
    with fake_cuda():
        arch, shape, args = fake_launch(config, kernels.TRAITS, phase)
        assert shape.gather and shape.tree == (phase == "verify")
        host_compile.compiled_fwd(arch, shape, args)  # compile + store
        monkeypatch.setattr(host_compile, "_COMPILED", {})
        loaded = host_compile.compiled_fwd(arch, shape, args)
        assert isinstance(loaded, host_compile._FirstCallOfLoaded)
        with pytest.raises(Exception, match="cudaErrorInsufficientDriver"):
            loaded.fn(*args)
