"""Gated delta rule (GDN) linear attention in CuTe DSL: the kernels and launchers every GDN
spec's cute_dsl kernels.py binds (see host/launch.py for layouts and arguments).

- ``extend``: chunked prefill / extend over ragged requests (``chunk_plan`` first), initial
  state from the pool row when the request has one, final state written back; two launches
  (``kernels/prepare_sm90``: gates, norms and fp16 T; ``kernels/chunk_sm90``: the state kept
  on chip for a whole request, the output and the update per chunk), the chunk kernel as
  two launches of segments where few long requests would leave SMs idle;
- ``chunk_plan``: the Triton GDN library's plan with the requests' lengths kept on the host
  (what segments are planned from); ``conv_prefill``: the Triton GDN library's, bound here.

Decode and speculative verify are the Triton GDN library's only. Host code in ``host/``
(``compile``: specializations, the compile cache, AOT arguments; ``launch``: checks and
launches; ``segments``: context parallelism's plan, scratch layout and combine).
"""

from __future__ import annotations

from attngen.families.gdn.cute_dsl.host.compile import compile_specs
from attngen.families.gdn.cute_dsl.host.launch import ChunkPlan, chunk_plan, conv_prefill, extend
from attngen.families.gdn.cute_dsl.source import source_sha256

__all__ = ["ChunkPlan", "chunk_plan", "compile_specs", "conv_prefill", "extend", "source_sha256"]
