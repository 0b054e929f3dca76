#!/usr/bin/env bash
# One device call for the GDN decode (2026-12-07): the whole GDN GPU suite (Triton and CuTe DSL
# modules; evidence to $1/ev.json; TESTS_S bounds it, 0 skips it), bench/gdn.py's decode table
# beside fla (BENCH_S), then the persistent decode's forms (PERSIST_S). After the wheels'
# install (see bench/README.md). Usage: $0 OUT SHA
set -uo pipefail
OUT=$1; SHA=$2
export ATTNGEN_CUTE_DSL_CACHE_DIR=/tmp/attngen-cute-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
if [ "${TESTS_S:-330}" != 0 ]; then
  # records spooled as they pass: a suite cut short by its time still leaves them
  export ATTNGEN_EVIDENCE_OUT=$OUT/ev.json ATTNGEN_COMMIT=$SHA ATTNGEN_EVIDENCE_SPOOL=/tmp/gdn-spool
  ATTNGEN_GPU=1 timeout "${TESTS_S:-330}" \
    python3 -m pytest -q -p no:cacheprovider -n 2 tests/families/gdn/gpu > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/tests.log"
  [ -f "$OUT/ev.json" ] || ATTNGEN_GPU=1 python3 tests/gpu_evidence.py
  unset ATTNGEN_EVIDENCE_OUT ATTNGEN_EVIDENCE_SPOOL
fi
timeout "${BENCH_S:-90}" python3 bench/gdn.py --only decode --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -4 "$OUT/bench.log" | cut -c1-400
if [ "${PERSIST_S:-120}" != 0 ]; then
  timeout "${PERSIST_S:-120}" python3 bench/experimental/gdn_decode_persistent.py \
    > "$OUT/persistent.jsonl" 2> "$OUT/persistent.err"
  echo "persistent rc=$?"; cut -c1-200 "$OUT/persistent.jsonl"; tail -3 "$OUT/persistent.err"
fi
