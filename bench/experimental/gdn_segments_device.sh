#!/usr/bin/env bash
# One device call for context parallelism (2026-12-06): the CuTe DSL GDN module's segment
# sweep, its GPU suite (evidence to $1/ev.json), then bench/gdn.py's prefill table beside
# fla and FlashInfer. After the wheels' install (see bench/README.md). Usage: $0 OUT SHA
set -uo pipefail
OUT=$1; SHA=$2
export ATTNGEN_CUTE_DSL_CACHE_DIR=/tmp/attngen-cute-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
timeout 200 python3 bench/experimental/gdn_segments_sweep.py --out "$OUT/sweep.json" \
  > "$OUT/sweep.log" 2>&1; echo "sweep rc=$?"
ATTNGEN_EVIDENCE_OUT=$OUT/ev.json ATTNGEN_COMMIT=$SHA ATTNGEN_GPU=1 timeout 240 \
  python3 -m pytest -q -p no:cacheprovider -n 2 tests/families/gdn/gpu \
  -k "gva1_extend or qwen3_next_extend" > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
[ "${STEPS:-all}" = all ] && { timeout 150 python3 bench/gdn.py --only prefill --out "$OUT" \
  > "$OUT/bench.log" 2>&1; echo "bench rc=$?"; }
grep -h '"segments"' "$OUT/sweep.log" | cut -c1-220
tail -3 "$OUT/tests.log"; tail -8 "$OUT/bench.log" 2>/dev/null
