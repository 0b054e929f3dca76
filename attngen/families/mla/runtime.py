"""The MLA runtime: absorbed decode / extend / verify over the latent pool and the
non-absorbed ragged path (new tokens and prefix chunks as MHA with qk 192 / v 128, with
LSE), with SGLang's MLA backend signature.

A generated ``backend.py`` subclasses :class:`PagedMlaBackend` and sets class attributes
only. Per layer call the backend tells the two paths apart by the layer's head dim:

- ``layer.head_dim == kv_lora_rank + qk_rope_head_dim`` (576), ``v_head_dim ==
  kv_lora_rank``: absorbed. q ``[T, H, 576]`` or q ``[T, H, 512]`` + ``q_rope [T, H, 64]``;
  k is the new tokens' latent ``[T, 1, 512]`` (or ``[T, 512]``) and ``k_rope [T, 1, 64]``
  (or k ``[T, 1, 576]`` with k_rope None); v is ignored. The new latent rows are written
  with ``kv_pool.set_mla_kv_buffer`` (save_kv_cache) and every row attends its request's
  keys causally: decode the whole sequence, extend / chain verify up to itself.
- ``layer.head_dim == qk_nope_head_dim + qk_rope_head_dim`` (192): the ragged MHA path of
  EXTEND. q ``[T, H, 192]``, k ``[Tk, H, 192]`` (or k_nope ``[Tk, H, 128]`` + ``k_rope
  [Tk, 1, 64]``), v ``[Tk, H, 128]``. Without ``attn_attend_prefix_cache`` the keys are the
  new tokens themselves (causal); with it, prefix chunk ``prefix_chunk_idx`` whose per
  request key offsets are ``prefix_chunk_cu_seq_lens[prefix_chunk_idx]`` (no mask). It
  writes no cache (the caller writes the latent, as SGLang's DeepSeek model does) and
  returns ``(out, lse)`` when ``mha_return_lse``; ``merge_state`` combines two of them.
  With ``prefill_kernels`` (a generated MHA kernels module whose cache-free ``prefill``
  returns the LSE, e.g. spec ``mha_mla_prefill`` on CuTe DSL) the causal new-token calls
  run on it (k_nope and a shared k_rope are first joined into per-head keys); prefix
  chunks stay on the MLA module's ragged kernel.

Nothing on the decode, verify and draft-extend paths reads device values on the host, so
all three are CUDA-graph capturable (draft extend: room for num_draft_tokens rows per
request, the real rows back to back, the rest see no key).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import torch

from attngen.families.mha.selection import decode_num_splits, select_config
from attngen.families.mla.key import MlaKey
from attngen.families.mla.pool import MlaLatentPool
from attngen.runtime.backend_base import GRAPH_PHASES, AttentionBackendBase, kernel_device
from attngen.runtime.batch import (
    AttentionLayer,
    DraftExtendInfo,
    ForwardBatch,
    ForwardMode,
    ReqToTokenPool,
    VerifyInfo,
    tree_mask_bytes,
)
from attngen.runtime.checks import AttngenInputError, check_at_least, check_tensor, fail
from attngen.runtime.graph import (
    DecodeGraphBuffers,
    DecodeMetadata,
    check_graph_host_lens,
    check_graph_rows,
)

MIN_SPLIT_TOKENS = 256  # a KV split below this many latent rows costs more than it gains


@dataclass(frozen=True)
class MlaForwardBatch(ForwardBatch):
    """A ForwardBatch with SGLang's chunked-prefix fields (an engine's own batch with the
    same attribute names works too: the backend reads them with defaults)."""

    attn_attend_prefix_cache: bool = False  # this call attends a prefix chunk (no mask)
    prefix_chunk_idx: int = -1
    prefix_chunk_cu_seq_lens: torch.Tensor | None = None  # [chunks, B + 1] int32 key offsets
    prefix_chunk_max_seq_lens: list[int] | None = None
    mha_return_lse: bool = False  # ragged path: return (out, lse)


def split_cap(*, programs_per_split: int, num_sms: int, waves: int, max_splits: int) -> int:
    """Most KV splits for a grid of ``programs_per_split`` programs: ``waves`` x SMs programs
    in all (rounded down: a compute-bound tile at one wave keeps one split until the batch
    alone falls below a wave), within 1 .. max_splits (host ints only)."""
    return max(1, min(max_splits, waves * num_sms // max(programs_per_split, 1)))


@dataclass(frozen=True)
class MlaExtendMetadata:
    """Extend / verify metadata: the absorbed rows (one per new token) and the ragged
    path's row offsets."""

    batch_size: int
    num_tokens: int
    page_table: torch.Tensor  # [B, pages] int32
    qo_indptr: torch.Tensor  # [B + 1] int32
    row_req: torch.Tensor  # [T] int32: request of each new token
    row_lens: torch.Tensor  # [T] int32: keys each new token sees (causal)
    num_splits: torch.Tensor | None  # [T] int32, or None (one split per row)
    workspace: tuple[torch.Tensor, ...]  # absorbed partials (empty without splits)
    max_extend_len: int
    verify: bool = False
    out: torch.Tensor | None = None  # static output rows (graph mode)
    tree_mask: torch.Tensor | None = None  # tree verify: bit-packed uint8 masks
    tree_mask_indptr: torch.Tensor | None = None  # [B + 1] int32 byte offsets


@dataclass(frozen=True)
class MlaVerifyGraphBuffers:
    """Verify metadata for up to ``max_bs`` requests of ``draft_token_num`` rows each, at
    fixed addresses: row t is request t // n's draft t % n (trees: request b's mask bytes
    at b * mask bytes)."""

    draft_token_num: int
    page_table: torch.Tensor  # [max_bs, max_pages] int32
    qo_indptr: torch.Tensor  # [max_bs + 1] int32: b * n
    row_req: torch.Tensor  # [max_bs * n] int32: t // n
    row_offset: torch.Tensor  # [max_bs * n] int32: t % n + 1 - n
    row_lens: torch.Tensor  # [max_bs * n] int32
    num_splits: torch.Tensor  # [max_bs * n] int32
    workspace: tuple[torch.Tensor, ...]
    out: torch.Tensor  # [max_bs * n, H, LORA]
    tree_mask: torch.Tensor | None = None  # [max_bs * mask bytes] uint8 (trees)
    tree_mask_indptr: torch.Tensor | None = None  # [max_bs + 1] int32: b * mask bytes

    @property
    def max_bs(self) -> int:
        return int(self.page_table.shape[0])

    def metadata(self, bs: int) -> MlaExtendMetadata:
        n = self.draft_token_num
        rows = bs * n
        return MlaExtendMetadata(
            batch_size=bs,
            num_tokens=rows,
            page_table=self.page_table[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            row_req=self.row_req[:rows],
            row_lens=self.row_lens[:rows],
            num_splits=self.num_splits[:rows],
            workspace=tuple(w[:rows] for w in self.workspace),
            max_extend_len=n,
            verify=True,
            out=self.out[:rows],
            tree_mask=self.tree_mask,
            tree_mask_indptr=None if self.tree_mask is None else self.tree_mask_indptr[: bs + 1],
        )


@dataclass(frozen=True)
class MlaDraftExtendGraphBuffers:
    """Draft-extend metadata for up to ``max_bs`` requests of 1 .. ``max_tokens`` new tokens,
    at fixed addresses: the grid has ``bs * max_tokens`` rows, request b's rows follow
    request b-1's and the rows past the last request see no key (zeros)."""

    max_tokens: int
    page_table: torch.Tensor  # [max_bs, max_pages] int32
    qo_indptr: torch.Tensor  # [max_bs + 1] int32: cumulative new tokens
    row_ids: torch.Tensor  # [max_bs * max_tokens] int32: 0, 1, 2, ...
    row_req: torch.Tensor  # [max_bs * max_tokens] int32
    row_lens: torch.Tensor  # [max_bs * max_tokens] int32
    num_splits: torch.Tensor  # [max_bs * max_tokens] int32
    workspace: tuple[torch.Tensor, ...]
    out: torch.Tensor  # [max_bs * max_tokens, H, LORA]

    @property
    def max_bs(self) -> int:
        return int(self.page_table.shape[0])

    def load_rows(self, bs: int, seq_lens: torch.Tensor, extend_lens: torch.Tensor) -> int:
        """Rows of ``bs`` requests (seq_lens count the new tokens; extend_lens in 1 ..
        max_tokens, not checked on the host); returns the grid's row count."""
        rows = bs * self.max_tokens
        ends = self.qo_indptr[1 : bs + 1]
        torch.cumsum(extend_lens.to(torch.int32), dim=0, dtype=torch.int32, out=ends)
        t = self.row_ids[:rows]
        req = torch.searchsorted(ends, t, right=True, out_int32=True)
        real = req < bs
        req.clamp_(max=bs - 1)
        self.row_req[:rows].copy_(req)
        reqs = req.long()
        within = t - self.qo_indptr[reqs]  # new token `within` of its request
        prefix = (seq_lens.to(torch.int32) - extend_lens.to(torch.int32))[reqs]
        lens = torch.where(real, (prefix + within + 1).clamp_(min=0), 0)
        self.row_lens[:rows].copy_(lens)
        return rows

    def metadata(self, bs: int) -> MlaExtendMetadata:
        rows = bs * self.max_tokens
        return MlaExtendMetadata(
            batch_size=bs,
            num_tokens=rows,
            page_table=self.page_table[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            row_req=self.row_req[:rows],
            row_lens=self.row_lens[:rows],
            num_splits=self.num_splits[:rows],
            workspace=tuple(w[:rows] for w in self.workspace),
            max_extend_len=self.max_tokens,
            out=self.out[:rows],
        )


def per_head_keys(k_nope: torch.Tensor, k_rope: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Keys ``[T, H, nope + rope]`` for an MHA kernel: ``k_nope [T, H, nope]`` beside
    ``k_rope [T, 1 or H, rope]`` (a shared rope head is repeated); the joined view of one
    tensor when they already are its two halves."""
    t, nope, rope = k_nope.shape[0], k_nope.shape[-1], k_rope.shape[-1]
    check_tensor("k_rope", k_rope, shape=[t, None, rope], dtype=k_nope.dtype, device=k_nope.device)
    if k_rope.shape[1] not in (1, num_heads):
        fail("k_rope", f"[{t}, 1 or {num_heads}, {rope}]", tuple(k_rope.shape))
    if (
        k_rope.shape[1] == num_heads
        and k_rope.stride() == k_nope.stride()
        and k_nope.stride(-1) == 1
        and k_rope.data_ptr() == k_nope.data_ptr() + nope * k_nope.element_size()
        and k_nope.stride(1) >= nope + rope
        and k_nope.stride(0) >= num_heads * k_nope.stride(1)
    ):  # k_nope and k_rope are the halves of one [T, H, >= nope + rope] tensor: its view
        return k_nope.as_strided((t, num_heads, nope + rope), k_nope.stride())
    keys = torch.empty((t, num_heads, nope + rope), dtype=k_nope.dtype, device=k_nope.device)
    keys[..., :nope].copy_(k_nope)
    keys[..., nope:].copy_(k_rope.expand(t, num_heads, rope))
    return keys


def _dtype_name(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


class PagedMlaBackend(AttentionBackendBase):
    """MLA attention through one generated kernels module (see the module docstring)."""

    LAYER_ATTRS: ClassVar[tuple[str, ...]] = ("num_heads", "page_size", "dtype")
    OPTIONAL_LAYER_ATTRS: ClassVar[tuple[str, ...]] = ("kv_cache_dtype",)

    def __init__(
        self,
        *,
        num_heads: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: MlaLatentPool,
        kv_lora_rank: int = 512,
        qk_rope_head_dim: int = 64,
        qk_nope_head_dim: int = 128,
        v_head_dim: int = 128,
        kv_cache_dtype: torch.dtype | None = None,
        spec_topk: int | None = None,
        prefill_kernels: ModuleType | None = None,
    ) -> None:
        self._check_generated()
        self.num_heads = num_heads
        self.page_size = page_size
        self.dtype = dtype
        self.kv_cache_dtype = dtype if kv_cache_dtype is None else kv_cache_dtype
        dtypes = (dtype, self.kv_cache_dtype)
        self.device = kernel_device(device, self.backend, self.arch, dtypes)
        self.config = select_config(
            self.kernels.CONFIGS,
            MlaKey(
                num_heads=num_heads,
                kv_lora_rank=kv_lora_rank,
                qk_rope_head_dim=qk_rope_head_dim,
                qk_nope_head_dim=qk_nope_head_dim,
                v_head_dim=v_head_dim,
                page_size=page_size,
                dtype=_dtype_name(dtype),
                kv_dtype=_dtype_name(self.kv_cache_dtype),
                spec_topk=spec_topk,  # type: ignore[arg-type]
            ),
        )
        for name, want in (
            ("page_size", page_size),
            ("kv_lora_rank", kv_lora_rank),
            ("qk_rope_head_dim", qk_rope_head_dim),
            ("dtype", self.kv_cache_dtype),
            ("device", self.device),
        ):
            if getattr(kv_pool, name) != want:
                fail(f"kv_pool.{name}", f"{want} (as the backend)", getattr(kv_pool, name))
        if req_to_token_pool.device != self.device:
            fail("req_to_token_pool.device", f"{self.device}", req_to_token_pool.device)
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool
        self.prefill_kernels = prefill_kernels
        self.prefill_config = None if prefill_kernels is None else self._prefill_config()
        self.max_context_len = req_to_token_pool.max_context_len
        self.max_pages = -(-self.max_context_len // page_size)
        self.forward_metadata: DecodeMetadata | MlaExtendMetadata | None = None
        self._graph_buffers: dict[str, Any] = {}

    def _prefill_config(self) -> Any:
        """The config of ``prefill_kernels`` the new tokens' ragged attention runs on: qk
        nope + rope and v dims, one kv head per q head, the backend's dtype, a plain causal
        mask, a cache-free prefill that returns the LSE; among several, the widest key tile
        (the page size does not matter without a cache)."""
        module, c = self.prefill_kernels, self.config
        want = (c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim, 1, _dtype_name(self.dtype))
        problems = []
        prefill = getattr(module, "prefill", None)
        if "prefill" not in getattr(module, "PHASES", ()) or prefill is None:
            problems.append("it generates no cache-free prefill")
        elif "lse" not in inspect.signature(prefill).parameters:
            problems.append("its prefill returns no LSE")
        hooks = getattr(module, "HOOKS", None)
        plain = hooks is not None and hooks.causal and hooks.window_left is None
        if not plain or hooks.logit_softcap or hooks.sinks or hooks.tree:
            problems.append(f"its mask is not plain causal ({hooks})")
        fits = [
            cfg
            for _, cfg in sorted(getattr(module, "CONFIGS", {}).items())
            if (cfg.head_dim, cfg.v_head_dim, cfg.gqa_group, cfg.dtype) == want
        ]
        if not fits:
            problems.append(
                "no config with (head_dim, v_head_dim, gqa_group, dtype) = %s" % (want,)
            )
        if problems:
            name = getattr(module, "__name__", type(module).__name__)
            fail("prefill_kernels", "a kernels module for the ragged path's new tokens",
                 f"{name}: {'; '.join(problems)}")  # fmt: skip
        return max(fits, key=lambda cfg: getattr(cfg, "fwd_tile_n", 0))

    # -- per-forward metadata ----

    @property
    def _head_blocks(self) -> int:
        """Programs per (row, split): head blocks times latent column parts."""
        return -(-self.num_heads // self.config.decode_block_h) * self.config.decode_lora_parts

    def _split_cap(self, rows: int) -> int:
        return split_cap(
            programs_per_split=rows * self._head_blocks,
            num_sms=self.num_sms,
            waves=self.config.decode_waves,
            max_splits=self.config.max_splits,
        )

    def _num_splits(
        self, row_lens: torch.Tensor, cap: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        min_tokens = max(MIN_SPLIT_TOKENS, self.config.decode_block_n)
        return decode_num_splits(row_lens, cap=cap, min_split_tokens=min_tokens, out=out)

    def _workspace(self, rows: int) -> tuple[torch.Tensor, ...]:
        return self.kernels.absorbed_workspace(self.config, rows=rows, device=self.device)

    def _decode_metadata(self, fb: ForwardBatch) -> DecodeMetadata:
        bs = fb.batch_size
        seq_lens = fb.seq_lens.to(torch.int32).contiguous()  # the kernels read it packed
        cap = self._split_cap(bs)
        split = cap > 1  # one split per request: no partials, no combine, no workspace
        return DecodeMetadata(
            batch_size=bs,
            page_table=self._page_table(fb.req_pool_indices, self._pages_for(fb.seq_lens_cpu)),
            seq_lens=seq_lens,
            num_splits=self._num_splits(seq_lens, cap) if split else None,
            workspace=self._workspace(bs) if split else (None, None),
            out=None,
        )

    def _extend_metadata(self, fb: ForwardBatch) -> MlaExtendMetadata:
        assert fb.extend_seq_lens is not None and fb.extend_seq_lens_cpu is not None
        assert fb.extend_prefix_lens is not None
        bs, rows = fb.batch_size, sum(fb.extend_seq_lens_cpu)
        verify = fb.forward_mode is ForwardMode.TARGET_VERIFY
        tree_mask = tree_indptr = None
        if verify:
            tree_mask, tree_indptr = self._verify_masks(fb.spec_info, bs)
        ext = fb.extend_seq_lens.to(torch.int32)
        qo_indptr = torch.zeros((bs + 1,), dtype=torch.int32, device=self.device)
        torch.cumsum(ext, dim=0, dtype=torch.int32, out=qo_indptr[1:])
        row_req = torch.repeat_interleave(
            torch.arange(bs, dtype=torch.int32, device=self.device), ext, output_size=rows
        )
        within = (
            torch.arange(rows, dtype=torch.int32, device=self.device) - qo_indptr[row_req.long()]
        )
        if tree_mask is not None:  # every draft row spans the prefix and all the drafts
            row_lens = fb.seq_lens.to(torch.int32)[row_req.long()]
        else:  # causal: new token i sees the prefix and new tokens 0..i
            prefix = fb.extend_prefix_lens.to(torch.int32)[row_req.long()]
            row_lens = (prefix + within + 1).to(torch.int32)
        cap = self._split_cap(rows)
        split = cap > 1
        return MlaExtendMetadata(
            batch_size=bs,
            num_tokens=rows,
            page_table=self._page_table(fb.req_pool_indices, self._pages_for(fb.seq_lens_cpu)),
            qo_indptr=qo_indptr,
            row_req=row_req,
            row_lens=row_lens,
            num_splits=self._num_splits(row_lens, cap) if split else None,
            workspace=self._workspace(rows) if split else (),
            max_extend_len=max(fb.extend_seq_lens_cpu),
            verify=verify,
            tree_mask=tree_mask,
            tree_mask_indptr=tree_indptr,
        )

    def _verify_masks(self, info: Any, bs: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Check a verify's spec_info; the tree mask tensors (trees) or None (chains)."""
        if not isinstance(info, VerifyInfo):
            fail("forward_batch.spec_info", "a VerifyInfo (TARGET_VERIFY)", type(info).__name__)
        n = self.config.num_draft_tokens
        if info.draft_token_num != n:
            fail("spec_info.draft_token_num", f"{n} (the spec's)", info.draft_token_num)
        if self.config.spec_topk <= 1:
            if info.tree_mask is not None:
                fail("spec_info.tree_mask", "None (this spec verifies draft chains)", "a tensor")
            return None, None
        check_tensor(
            "spec_info.tree_mask",
            info.tree_mask,
            dtype=torch.uint8,
            shape=[None],
            device=self.device,
        )
        check_tensor(
            "spec_info.tree_mask_indptr",
            info.tree_mask_indptr,
            dtype=torch.int32,
            shape=[bs + 1],
            device=self.device,
            contiguous=True,
        )
        want = bs * tree_mask_bytes(n)
        if info.tree_mask.numel() != want:
            fail(
                "spec_info.tree_mask",
                f"{want} bytes ({bs} requests x {n}x{n} bits, see " "pack_tree_masks)",
                f"{info.tree_mask.numel()} bytes",
            )
        return info.tree_mask, info.tree_mask_indptr

    def _device_checks(self, fb: ForwardBatch) -> list[tuple[torch.Tensor, Any]]:
        """A tree verify's mask offsets: request b's mask starts at byte b * mask bytes."""
        info = fb.spec_info
        if not (fb.forward_mode.is_target_verify() and self.config.spec_topk > 1):
            return []
        if not isinstance(info, VerifyInfo) or info.tree_mask_indptr is None:
            return []  # the metadata builder names what is missing
        per = tree_mask_bytes(self.config.num_draft_tokens)
        want = torch.arange(fb.batch_size + 1, device=self.device, dtype=torch.int32) * per
        indptr = info.tree_mask_indptr
        if indptr.shape != want.shape or indptr.device != want.device:
            return []  # _verify_masks reports the shape or device

        def report() -> None:
            got = indptr.tolist()
            b = next(i for i, (g, w) in enumerate(zip(got, want.tolist())) if g != w)
            fail(f"spec_info.tree_mask_indptr[{b}]", f"{b * per} (b x {per} mask bytes)", got[b])

        return [((indptr != want).any(), report)]

    def _pages_for(self, seq_lens_cpu: torch.Tensor) -> int:
        longest = int(seq_lens_cpu.max()) if seq_lens_cpu.numel() else 0
        return max(1, -(-longest // self.page_size))

    def _page_table(
        self, req_pool_indices: torch.Tensor, width: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, width]`` int32 physical pages (the slot of each page's first token // ps)."""
        ps = self.page_size
        first_slots = self.req_to_token_pool.req_to_token[:, ::ps][:, :width]
        gathered = torch.index_select(first_slots, 0, req_pool_indices)
        if ps == 1:
            return gathered if out is None else out.copy_(gathered)
        return torch.div(gathered, ps, rounding_mode="floor", out=out)

    # -- per-layer forward ----

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        q_rope: torch.Tensor | None = None,
        k_rope: torch.Tensor | None = None,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Absorbed decode: one row per request over its whole latent sequence; returns
        ``[B, H * 512]`` (and the LSE ``[B, H]`` fp32 with ``return_lse``)."""
        self._check_phase("decode", forward_batch.forward_mode)
        meta = self._metadata(DecodeMetadata, "forward_decode", forward_batch)
        rows = meta.batch_size
        q, q_rope, out, launch = self._absorbed_call(
            meta.out, q, k, q_rope, k_rope, layer, forward_batch, rows, save_kv_cache
        )
        lse = self._new_lse(rows) if return_lse else None
        self.kernels.absorbed(
            q,
            q_rope,
            self.kv_pool.get_key_buffer(layer.layer_id),
            meta.page_table,
            meta.seq_lens,
            meta.num_splits,
            out,
            *meta.workspace,
            lse=lse,
            **launch,
        )
        flat = out.view(rows, self.num_heads * self.config.kv_lora_rank)
        return (flat, lse) if return_lse else flat

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        q_rope: torch.Tensor | None = None,
        k_rope: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Extend / draft extend / chain verify: absorbed or ragged by the layer's head dim
        (module docstring)."""
        meta = self._metadata(MlaExtendMetadata, "forward_extend", forward_batch)
        if layer.head_dim == self.config.qk_nope_head_dim + self.config.qk_rope_head_dim:
            return self._ragged(q, k, v, layer, forward_batch, meta, save_kv_cache, k_rope)
        self._check_phase("verify" if meta.verify else "extend", forward_batch.forward_mode)
        rows = meta.num_tokens
        q, q_rope, out, launch = self._absorbed_call(
            meta.out, q, k, q_rope, k_rope, layer, forward_batch, rows, save_kv_cache
        )
        self.kernels.absorbed(
            q,
            q_rope,
            self.kv_pool.get_key_buffer(layer.layer_id),
            meta.page_table,
            meta.row_lens,
            meta.num_splits,
            out,
            *(meta.workspace or (None, None)),
            row_req=meta.row_req,
            tree_mask=meta.tree_mask,
            tree_mask_indptr=meta.tree_mask_indptr,
            **launch,
        )
        return out.view(rows, self.num_heads * self.config.kv_lora_rank)

    def _absorbed_call(
        self,
        static_out: torch.Tensor | None,
        q: torch.Tensor,
        k: torch.Tensor | None,
        q_rope: torch.Tensor | None,
        k_rope: torch.Tensor | None,
        layer: AttentionLayer,
        fb: ForwardBatch,
        rows: int,
        save_kv_cache: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, dict[str, Any]]:
        """Check the layer and q, write the new latent rows; returns q, q_rope, the output
        rows and the launch keywords."""
        c = self.config
        width = c.kv_lora_rank + c.qk_rope_head_dim
        want = (self.num_heads, width, c.kv_lora_rank)
        got = (layer.num_q_heads, layer.head_dim, layer.v_head_dim)
        if got != want:
            fail(
                f"layer {layer.layer_id} (q heads, head_dim, v_head_dim)",
                f"{want} for the absorbed path",
                got,
            )
        kv_scale = self.kv_pool.layer_scale(layer)  # before any write
        last = c.kv_lora_rank if q_rope is not None else width
        check_tensor(
            "q", q, dtype=self.dtype, shape=[rows, self.num_heads, last], device=self.device
        )
        if save_kv_cache:
            latent, k_rope = self._split_k(k, k_rope, rows)
            self.kv_pool.set_mla_kv_buffer(layer, fb.out_cache_loc, latent, k_rope)
        out = self._new_out(rows) if static_out is None else static_out
        launch = dict(config=c, sm_scale=layer.scaling, kv_scale=kv_scale, trusted_metadata=True)
        launch["kv_block_scales"] = self.kv_pool.get_block_scales(layer.layer_id)
        return q, q_rope, out, launch

    def _split_k(
        self, k: torch.Tensor | None, k_rope: torch.Tensor | None, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lora, rope = self.config.kv_lora_rank, self.config.qk_rope_head_dim
        if k_rope is None:
            k = check_tensor("k", k, shape=[rows, None, lora + rope], device=self.device)
            return k[..., :lora], k[..., lora:]
        return k, k_rope  # shapes checked by the pool

    def _ragged(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        fb: ForwardBatch,
        meta: MlaExtendMetadata,
        save_kv_cache: bool,
        k_rope: torch.Tensor | None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        if fb.forward_mode is not ForwardMode.EXTEND or meta.verify:
            raise AttngenInputError(
                f"forward_extend: the ragged (qk {layer.head_dim}) path serves EXTEND only; "
                f"{fb.forward_mode.name} runs absorbed (layer head_dim "
                f"{c.kv_lora_rank + c.qk_rope_head_dim})"
            )
        self._check_phase("extend", fb.forward_mode)
        if save_kv_cache:
            raise AttngenInputError(
                "forward_extend: the ragged path writes no latent cache; write it with "
                "kv_pool.set_mla_kv_buffer and pass save_kv_cache=False"
            )
        want = (self.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim)
        got = (layer.num_q_heads, layer.head_dim, layer.v_head_dim)
        if got != want:
            fail(
                f"layer {layer.layer_id} (q heads, head_dim, v_head_dim)",
                f"{want} for the ragged path",
                got,
            )
        rows = meta.num_tokens
        check_tensor("q", q, shape=[rows, None, None])
        if k_rope is None:
            k = check_tensor("k", k, shape=[None, self.num_heads, want[1]])
            k_nope, k_rope = k[..., : c.qk_nope_head_dim], k[..., c.qk_nope_head_dim :]
        else:
            k_nope = k
        chunk = bool(getattr(fb, "attn_attend_prefix_cache", False))
        if chunk:
            kv_indptr, max_q = self._chunk_indptr(fb), meta.max_extend_len
        else:
            kv_indptr, max_q = meta.qo_indptr, meta.max_extend_len
        out = torch.empty(
            (rows, self.num_heads, c.v_head_dim), dtype=self.dtype, device=self.device
        )
        lse = self._new_lse(rows)
        if not chunk and self.prefill_kernels is not None:  # its launcher checks q, k, v
            self.prefill_kernels.prefill(
                q,
                per_head_keys(k_nope, k_rope, self.num_heads),
                v,
                meta.qo_indptr,
                out,
                max_seq_len=max_q,
                config=self.prefill_config,
                sm_scale=layer.scaling,
                lse=lse,
            )
        else:
            self.kernels.ragged(
                q,
                k_nope,
                k_rope,
                v,
                meta.qo_indptr,
                kv_indptr,
                out,
                lse,
                max_q_len=max_q,
                causal=not chunk,
                config=c,
                sm_scale=layer.scaling,
                trusted_metadata=not chunk,
            )
        flat = out.view(rows, self.num_heads * c.v_head_dim)
        return (flat, lse) if getattr(fb, "mha_return_lse", False) else flat

    def _chunk_indptr(self, fb: ForwardBatch) -> torch.Tensor:
        idx = getattr(fb, "prefix_chunk_idx", -1)
        cu = check_tensor(
            "forward_batch.prefix_chunk_cu_seq_lens",
            getattr(fb, "prefix_chunk_cu_seq_lens", None),
            dtype=torch.int32,
            shape=[None, fb.batch_size + 1],
            device=self.device,
        )
        if not 0 <= idx < cu.shape[0]:
            fail("forward_batch.prefix_chunk_idx", f"0..{cu.shape[0] - 1}", idx)
        return cu[idx].contiguous()

    def merge_state(
        self, o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Combine two ragged results over disjoint keys (``[T, H * V]`` or ``[T, H, V]``
        outputs, ``[T, H]`` LSEs) into new tensors."""
        h = self.num_heads
        shaped = [x.view(x.shape[0], h, -1) for x in (o_a, o_b)]
        out = torch.empty_like(shaped[0])
        lse = torch.empty_like(lse_a)
        self.kernels.merge_state(shaped[0], lse_a, shaped[1], lse_b, out, lse)
        return out.view(o_a.shape), lse

    def _new_out(self, rows: int) -> torch.Tensor:
        shape = (rows, self.num_heads, self.config.kv_lora_rank)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def _new_lse(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, self.num_heads), dtype=torch.float32, device=self.device)

    # -- CUDA graphs (decode, chain verify) ----

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static buffers of decode and chain verify. Verify's absorbed partials take
        ``max_bs * num_draft_tokens * H * max_splits * 2 KiB``."""
        self._first_graph_state()
        check_at_least("max_bs", max_bs, 1)
        c = self.config
        if "decode" in self.kernels.PHASES:
            buffers = self.graph.allocate_decode_buffers(
                max_bs=max_bs,
                max_pages=self.max_pages,
                num_q_heads=self.num_heads,
                max_splits=c.max_splits,
                kv_lora_rank=c.kv_lora_rank,
                device=self.device,
            )
            self._graph_buffers["decode"] = DecodeGraphBuffers.allocate(
                buffers,
                max_num_tokens=max_num_tokens,
                num_q_heads=self.num_heads,
                v_head_dim=c.kv_lora_rank,
                dtype=self.dtype,
            )
        if "verify" in self.kernels.PHASES and c.num_draft_tokens:
            self._graph_buffers["verify"] = self._verify_buffers(max_bs)
        if "draft_extend" in self.kernels.PHASES and c.num_draft_tokens:
            self._graph_buffers["draft_extend"] = self._draft_extend_buffers(max_bs)

    def _draft_extend_buffers(self, max_bs: int) -> MlaDraftExtendGraphBuffers:
        n, rows = self.config.num_draft_tokens, max_bs * self.config.num_draft_tokens
        i32 = dict(dtype=torch.int32, device=self.device)
        return MlaDraftExtendGraphBuffers(
            max_tokens=n,
            page_table=torch.zeros((max_bs, self.max_pages), **i32),
            qo_indptr=torch.zeros((max_bs + 1,), **i32),
            row_ids=torch.arange(rows, **i32),
            row_req=torch.zeros((rows,), **i32),
            row_lens=torch.zeros((rows,), **i32),
            num_splits=torch.ones((rows,), **i32),
            workspace=self._workspace(rows),
            out=self._new_out(rows),
        )

    def _verify_buffers(self, max_bs: int) -> MlaVerifyGraphBuffers:
        n, rows = self.config.num_draft_tokens, max_bs * self.config.num_draft_tokens
        i32 = dict(dtype=torch.int32, device=self.device)
        t = torch.arange(rows, **i32)
        tree = self.config.spec_topk > 1
        per = tree_mask_bytes(n)
        return MlaVerifyGraphBuffers(
            draft_token_num=n,
            page_table=torch.zeros((max_bs, self.max_pages), **i32),
            qo_indptr=torch.arange(max_bs + 1, **i32) * n,
            row_req=t // n,
            # chains: row t sees seq_len - n + t % n + 1 keys; trees: all seq_len of them
            row_offset=torch.zeros((rows,), **i32) if tree else t % n + 1 - n,
            row_lens=torch.ones((rows,), **i32),
            num_splits=torch.ones((rows,), **i32),
            workspace=self._workspace(rows),
            out=self._new_out(rows),
            tree_mask=(
                torch.zeros((max_bs * per,), dtype=torch.uint8, device=self.device)
                if tree
                else None
            ),
            tree_mask_indptr=torch.arange(max_bs + 1, **i32) * per if tree else None,
        )

    def _tokens_per_request(self, mode: ForwardMode) -> int:
        speculative = (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)
        return self.config.num_draft_tokens if mode in speculative else 1

    def _load_graph_rows(
        self,
        mode: ForwardMode,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None,
    ) -> None:
        width = self.max_pages
        if seq_lens_cpu is not None:
            width = self._pages_for(check_graph_host_lens(seq_lens_cpu, bs, self.max_context_len))
        req_pool_indices = check_graph_rows("req_pool_indices", req_pool_indices, bs, self.device)
        seq_lens = check_graph_rows("seq_lens", seq_lens, bs, self.device)
        bufs = self._graph_buffers[GRAPH_PHASES[mode]]
        self._page_table(req_pool_indices, width, out=bufs.page_table[:bs, :width])
        if mode is ForwardMode.DECODE:
            bufs.seq_lens[:bs].copy_(seq_lens)
            cap = self._split_cap(bs)
            self._num_splits(bufs.seq_lens[:bs], cap, out=bufs.num_splits[:bs])
            self.forward_metadata = bufs.metadata(bs)
            return
        if mode is ForwardMode.DRAFT_EXTEND:
            if not isinstance(spec_info, DraftExtendInfo):
                fail("spec_info", "a DraftExtendInfo (DRAFT_EXTEND)", type(spec_info).__name__)
            lens = check_graph_rows("spec_info.extend_lens", spec_info.extend_lens, bs, self.device)
            rows = bufs.load_rows(bs, seq_lens, lens)
            self._num_splits(
                bufs.row_lens[:rows], self._split_cap(rows), out=bufs.num_splits[:rows]
            )
            self.forward_metadata = bufs.metadata(bs)
            return
        tree_mask, _ = self._verify_masks(spec_info, bs)
        if tree_mask is not None:  # graph replays trust the offsets: b * mask bytes
            bufs.tree_mask[: tree_mask.numel()].copy_(tree_mask)
        rows = bs * bufs.draft_token_num
        # row t of request b sees its seq_len (prefix + n drafts) - n + (t % n) + 1 keys
        lens = torch.index_select(seq_lens.to(torch.int32), 0, bufs.row_req[:rows])
        torch.add(lens, bufs.row_offset[:rows], out=bufs.row_lens[:rows])
        bufs.row_lens[:rows].clamp_(min=0)
        self._num_splits(bufs.row_lens[:rows], self._split_cap(rows), out=bufs.num_splits[:rows])
        self.forward_metadata = bufs.metadata(bs)
