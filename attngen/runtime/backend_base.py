"""The neutral base of every generated attention backend: what is the same whatever the
family and the kernel backend.

- the per-forward metadata skeleton: the forward mode must map to a phase the spec
  generates, the batch is checked (shapes, dtypes, devices, lengths), token slots are
  checked against the pools (one host sync; ``validate_slots``), then the family builds
  its decode or extend metadata (``_decode_metadata`` / ``_extend_metadata``);
- the per-layer guards: the metadata must be of the kind the call needs and built from the
  batch the layer is given (eager forwards), the phase must be generated;
- the CUDA-graph plumbing: capture/replay argument checks, the static buffers per
  capturable mode (``_graph_buffers``), then the family fills them (``_load_graph_rows``).

A family's runtime (e.g. attngen/families/mha/runtime.py) subclasses it; a generated
``backend.py`` subclasses that and sets the class attributes below.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import torch

from attngen import registry
from attngen.arch import arch_for_device
from attngen.arch import facts as arch_facts
from attngen.runtime.batch import ForwardBatch, ForwardMode
from attngen.runtime.checks import AttngenInputError, fail
from attngen.runtime.graph import check_fits, check_graph_call
from attngen.spec.enums import Backend

Metadata = TypeVar("Metadata")

# Modes and the phases of which one must be generated to run them.
MODE_PHASES: dict[ForwardMode, tuple[str, ...]] = {
    ForwardMode.DECODE: ("decode",),
    ForwardMode.EXTEND: ("extend", "prefill"),
    ForwardMode.TARGET_VERIFY: ("verify",),
    ForwardMode.DRAFT_EXTEND: ("draft_extend", "extend"),
}
# Capturable modes and the phase whose static buffers they use.
GRAPH_PHASES: dict[ForwardMode, str] = {
    ForwardMode.DECODE: "decode",
    ForwardMode.TARGET_VERIFY: "verify",
    ForwardMode.DRAFT_EXTEND: "draft_extend",
}


def canonical_device(device: torch.device | str) -> torch.device:
    """``"cuda"`` -> ``cuda:<current>``, so it compares equal to a tensor's ``.device``."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def kernel_device(
    device: torch.device | str, backend: str, arch: str, dtypes: tuple[object, ...] = ()
) -> torch.device:
    """``device`` canonical, once the kernels of ``backend`` generated for ``arch`` can run
    there: a CUDA GPU of one of the arch's compute capabilities, or CPU where the backend
    has a CPU path for ``dtypes`` (the backend's activation and cache dtypes; its registry
    entry's ``cpu_limit``). Anything else is refused naming the device, before a kernel
    launch fails inside the DSL or computes garbage."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise AttngenInputError(f"device: {device!r} is not a torch device ({e})") from None
    facts = arch_facts(arch)
    if dev.type == "cpu":
        names = tuple(str(d).removeprefix("torch.") for d in dtypes)
        reason = registry.backend(Backend(backend)).cpu_limit(names)
        if reason is not None:
            raise AttngenInputError(f"device: cpu: {reason}")
        return dev
    if dev.type != "cuda":
        raise AttngenInputError(f"device: {dev}: attngen's kernels run on CUDA devices")
    if not torch.cuda.is_available():
        raise AttngenInputError(f"device: {dev}: no CUDA device is available to torch")
    if dev.index is not None and not 0 <= dev.index < torch.cuda.device_count():
        raise AttngenInputError(
            f"device: {dev}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    dev = canonical_device(dev)
    major, minor = torch.cuda.get_device_capability(dev)
    if arch_for_device(major, minor) is not facts.arch:
        runs_on = ", ".join(f"{m}.{'x' if n is None else n}" for m, n in facts.device_capabilities)
        raise AttngenInputError(
            f"device: {dev} has compute capability {major}.{minor}; these kernels were "
            f"generated for {arch} ({facts.part}, capability {runs_on}): load the arch "
            "attngen.runtime.select.detect_arch() names for this GPU"
        )
    return dev


class AttentionBackendBase:
    """See the module docstring. Subclasses set ``device``, ``req_to_token_pool``,
    ``kv_pool`` (with ``num_slots``), ``max_context_len`` and ``_graph_buffers``."""

    kernels: ClassVar[ModuleType]  # generated kernels.py: PHASES, CONFIGS and the launchers
    graph: ClassVar[ModuleType]  # generated graph.py: static buffer allocators, NUM_SMS
    spec_name: ClassVar[str]
    arch: ClassVar[str]  # e.g. "sm90"
    backend: ClassVar[str]  # the kernel DSL: a registered Backend value
    num_sms: ClassVar[int]  # SM count of the arch's reference part (split heuristics)
    seq_len_fill_value: ClassVar[int] = 1  # seq_len of padded rows in captured graphs
    validate_slots: ClassVar[bool] = True  # eager metadata checks token slots (one sync)

    device: torch.device
    max_context_len: int
    _graph_buffers: dict[str, Any]  # phase -> static buffers (init_cuda_graph_state)
    _captured: set[tuple[str, int]]  # (phase, bs) of every capture since init_cuda_graph_state

    def _check_generated(self) -> None:
        if getattr(type(self), "kernels", None) is None:
            raise TypeError(f"{type(self).__name__} has no kernels module: use a generated one")

    # -- per-forward metadata ----

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Build the metadata every layer of this forward shares.

        With ``validate_slots`` (default), the token slots the kernels will read (through
        ``req_to_token``) and write (``out_cache_loc``) are checked against the pool here,
        at the cost of one host sync per forward; the CUDA-graph paths skip that check.
        """
        mode = forward_batch.forward_mode
        self.forward_metadata = None  # a refused batch leaves no metadata behind
        self._metadata_batch = None
        if mode is ForwardMode.IDLE:
            return
        phases = MODE_PHASES[mode]
        if not set(phases) & set(self.kernels.PHASES):
            raise AttngenInputError(
                f"forward_mode: {self.spec_name} generates phases "
                f"{', '.join(self.kernels.PHASES)}; {mode.name} needs {' or '.join(phases)}"
            )
        forward_batch.check(device=self.device, max_context_len=self.max_context_len)
        if self.validate_slots:
            self._check_slots(forward_batch)
        if mode is ForwardMode.DECODE:
            self.forward_metadata = self._decode_metadata(forward_batch)
        else:
            self.forward_metadata = self._extend_metadata(forward_batch)
        self._metadata_batch = batch_mark(forward_batch)

    def _decode_metadata(self, fb: ForwardBatch) -> Any:
        raise NotImplementedError

    def _extend_metadata(self, fb: ForwardBatch) -> Any:
        raise NotImplementedError

    def _check_slots(self, fb: ForwardBatch) -> None:
        """Request rows, cached token slots and out_cache_loc inside the pools, the device
        lengths equal to their host copies (:func:`host_mirrors`), and the family's own
        device-side checks (:meth:`_device_checks`): one host sync for all of them."""
        table = self.req_to_token_pool.req_to_token
        num_slots = self.kv_pool.num_slots
        rows, seq_lens, loc = fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc
        longest = int(fb.seq_lens_cpu.max())
        slots = table[rows.clamp(0, table.shape[0] - 1), :longest]
        used = torch.arange(longest, device=self.device) < seq_lens[:, None]
        slots = torch.where(used, slots, 0)  # slot 0 exists: entries past seq_lens pass
        ranges = ((rows, table.shape[0]), (slots, num_slots), (loc, num_slots))
        present = [i for i, (t, _) in enumerate(ranges) if t.numel()]
        extra = self._device_checks(fb)
        mirrors = host_mirrors(fb)
        # each tensor's (min, max), the family's flags, then the mirrored lengths: one sync
        bounds = [x.long() for i in present for x in torch.aminmax(ranges[i][0])]
        parts = [torch.stack(bounds)] if bounds else []
        parts += [torch.stack([flag for flag, _ in extra]).long()] if extra else []
        host = torch.cat([*parts, *(t.long() for _, t, _ in mirrors)]).tolist()
        head = 2 * len(present)
        flags = host[head : head + len(extra)]
        check_mirrors(mirrors, host[head + len(extra) :])
        outside = {
            i for k, i in enumerate(present) if host[2 * k] < 0 or host[2 * k + 1] >= ranges[i][1]
        }

        def first_bad(i: int) -> list[int]:  # only on the error path
            t, limit = ranges[i]
            return [int(x) for x in ((t < 0) | (t >= limit)).nonzero()[0]]

        if 0 in outside:
            (b,) = first_bad(0)
            fail(
                f"forward_batch.req_pool_indices[{b}]",
                f"a row of req_to_token (0..{table.shape[0] - 1})",
                int(rows[b]),
            )
        if 1 in outside:
            b, j = first_bad(1)
            page = getattr(self.kv_pool, "page_size", 1)
            fail(
                f"req_to_token[{int(rows[b])}, {j}] (request {b}, page-table entry {j // page})",
                f"a token slot in 0..{num_slots - 1} (kv_pool: {self.kv_pool.num_pages} pages)",
                int(slots[b, j]),
            )
        if 2 in outside:
            (i,) = first_bad(2)
            fail(f"forward_batch.out_cache_loc[{i}]", f"a slot in 0..{num_slots - 1}", int(loc[i]))
        for flag, (_, report) in zip(flags, extra):
            if flag:
                report()

    def _device_checks(self, fb: ForwardBatch) -> list[tuple[torch.Tensor, Callable[[], None]]]:
        """The family's checks of device values, folded into the one sync of eager
        metadata: (a bool scalar tensor that is True when the input is bad, a function that
        raises the error for it)."""
        return []

    # -- per-layer guards ----

    def _metadata(
        self, kind: type[Metadata], caller: str, forward_batch: ForwardBatch | None = None
    ) -> Metadata:
        meta = self.forward_metadata
        if not isinstance(meta, kind):
            found = "none" if meta is None else type(meta).__name__
            raise AttngenInputError(
                f"{caller}: needs {kind.__name__} from init_forward_metadata (or CUDA-graph "
                f"capture/replay) for this forward; found {found}"
            )
        if forward_batch is not None:
            self._check_same_batch(forward_batch, caller)
        return meta

    def _check_same_batch(self, forward_batch: ForwardBatch, caller: str) -> None:
        """Eager metadata serves the batch it was built from only: another batch (one of the
        same token count would run on the old rows), or the same one with its seq_lens or
        out_cache_loc replaced since, is refused. CUDA-graph capture and replay build
        metadata from their own arguments, not from a batch: nothing to compare."""
        mark = getattr(self, "_metadata_batch", None)
        if mark is not None and not same_batch(mark, forward_batch):
            raise AttngenInputError(
                f"{caller}: forward_batch is not the batch init_forward_metadata was given "
                "(or its seq_lens / out_cache_loc were replaced since): call "
                "init_forward_metadata(forward_batch) before the layers of each forward"
            )

    def _check_phase(self, phase: str, mode: ForwardMode) -> None:
        generated = self.kernels.PHASES
        if phase == "extend" and mode is ForwardMode.DRAFT_EXTEND:
            ok = "draft_extend" in generated or "extend" in generated
        else:
            ok = phase in generated
        if not ok:
            hint = ""
            if phase == "extend" and "prefill" in generated:
                hint = "; prefill runs only when no request has a cached prefix and k, v are given"
            raise AttngenInputError(
                f"{self.spec_name}: phase {phase} is not generated for this spec "
                f"(phases: {', '.join(generated)}){hint}"
            )

    # -- CUDA graphs ----

    def _first_graph_state(self) -> None:
        """``init_cuda_graph_state`` allocates the static buffers every captured graph
        reads: a second call would leave the graphs captured before it reading the old
        buffers while replays fill the new ones. Refused (other sizes: a new backend)."""
        if self._graph_buffers:
            raise AttngenInputError(
                "init_cuda_graph_state: already called for this backend (graphs captured "
                "since read its buffers); build a new backend for other graph sizes"
            )
        self._captured = set()

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
    ) -> None:
        """Fill rows ``0..bs-1`` of the static buffers; the metadata points at them.

        TARGET_VERIFY: ``seq_lens`` count the drafts too (prefix + draft_token_num), and
        ``spec_info`` is a VerifyInfo (trees: its tree_mask packs bs masks back to back).
        DRAFT_EXTEND: ``seq_lens`` count the new tokens, ``spec_info`` is a DraftExtendInfo
        (1 .. num_draft_tokens new tokens per request, rows back to back); num_tokens is
        bs * num_draft_tokens, the room the graph's q/k/v/out rows have.
        """
        self._graph_call("capture", bs, num_tokens, forward_mode, encoder_lens)
        self._metadata_batch = None
        self._load_graph_rows(forward_mode, bs, req_pool_indices, seq_lens, spec_info, None)
        self._captured.add((GRAPH_PHASES[forward_mode], bs))  # once its rows were taken

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> None:
        """Copy a new (padded) batch into the same buffers, in place, before ``replay()``.

        Rows past the real requests carry the caller's padding (req_pool_index 0, seq_len
        ``seq_len_fill_value``); their outputs are junk the caller drops. With
        ``seq_lens_cpu`` (the host copy of ``seq_lens``: the same values, taken on trust,
        since comparing them would cost a sync every replay) only the metadata the longest
        request needs is copied.
        """
        per_request = self._tokens_per_request(forward_mode)
        self._graph_call("replay", bs, bs * per_request, forward_mode, encoder_lens)
        if (GRAPH_PHASES[forward_mode], bs) not in self._captured:
            # the engine replays the graph it captured at this size (a batch is padded up to
            # one): no capture means no graph, and the rows loaded would feed nothing
            raise AttngenInputError(
                f"cuda graph replay: bs {bs} was not captured in {forward_mode.name} "
                "(capture it first, or pad the batch to a captured size)"
            )
        self._metadata_batch = None
        self._load_graph_rows(forward_mode, bs, req_pool_indices, seq_lens, spec_info, seq_lens_cpu)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.seq_len_fill_value

    def _tokens_per_request(self, mode: ForwardMode) -> int:
        """Query rows per request of a capturable mode (speculative modes: the drafts)."""
        return 1

    def _load_graph_rows(self, *args: Any) -> None:
        """(mode, bs, req_pool_indices, seq_lens, spec_info, seq_lens_cpu): fill the mode's
        static buffers for ``bs`` requests and point ``forward_metadata`` at them."""
        raise NotImplementedError

    def _graph_call(
        self, phase: str, bs: int, num_tokens: int, mode: ForwardMode, encoder_lens: Any
    ) -> Any:
        """Check a capture/replay call; returns the mode's static buffers."""
        check_graph_call(
            phase,
            bs=bs,
            num_tokens=num_tokens,
            mode=mode,
            encoder_lens=encoder_lens,
            tokens_per_request=self._tokens_per_request(mode),
        )
        wanted = GRAPH_PHASES[mode]
        bufs = self._graph_buffers.get(wanted)
        if bufs is None:
            if wanted not in self.kernels.PHASES:
                raise AttngenInputError(
                    f"cuda graph {phase}: {self.spec_name} does not generate {wanted}"
                )
            raise AttngenInputError(f"cuda graph {phase}: call init_cuda_graph_state first")
        check_fits(bufs, bs, num_tokens)
        return bufs


def batch_mark(fb: ForwardBatch) -> tuple[Any, ...]:
    """What identifies the batch eager metadata was built from: its seq_lens and
    out_cache_loc tensors, by weak reference (a tensor freed since matches nothing, whatever
    reuses its address), and its size. Not the batch object: a copy of it with other fields
    changed (a backend walking a long prefix in chunks sets its chunk fields on a copy) is
    the same batch."""
    return (weakref.ref(fb.seq_lens), weakref.ref(fb.out_cache_loc), fb.batch_size)


def same_batch(mark: tuple[Any, ...], fb: ForwardBatch) -> bool:
    seq_lens, out_cache_loc, size = mark
    return (
        seq_lens() is fb.seq_lens and out_cache_loc() is fb.out_cache_loc and size == fb.batch_size
    )


def host_mirrors(fb: ForwardBatch) -> list[tuple[str, torch.Tensor, list[int]]]:
    """The batch's device tensors that have a host copy, as (name, tensor, host values):
    ``seq_lens`` and, in extend modes, ``extend_seq_lens`` / ``extend_prefix_lens``. The
    builders take offsets and initial states from the device tensors and row counts and
    grids from the host lists: if they disagree, rows go to the wrong request or unwritten."""
    mirrors = [("seq_lens", fb.seq_lens, fb.seq_lens_cpu.tolist())]
    for name in ("extend_seq_lens", "extend_prefix_lens"):
        lens, host = getattr(fb, name), getattr(fb, f"{name}_cpu")
        if lens is not None and host is not None:
            mirrors.append((name, lens, list(host)))
    return mirrors


def check_mirrors(mirrors: list[tuple[str, torch.Tensor, list[int]]], synced: list[int]) -> None:
    """Refuse the first request whose device value (``synced``: the mirrors' tensors
    concatenated, read in the one sync) differs from its host copy."""
    at = 0
    for name, _, host in mirrors:
        got, at = synced[at : at + len(host)], at + len(host)
        if got != host:
            b = next(i for i, (g, h) in enumerate(zip(got, host)) if g != h)
            what = f"{name}_cpu[{b}] = {host[b]} (the two must agree)"
            fail(f"forward_batch.{name}[{b}]", what, got[b])
