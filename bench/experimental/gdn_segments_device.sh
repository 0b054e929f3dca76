#!/usr/bin/env bash
# One device call for context parallelism (2026-12-06): the CuTe DSL GDN module's GPU suite
# (evidence to $1/ev.json; TESTS_S=0 skips it), bench/gdn.py's prefill table beside fla and
# FlashInfer (BENCH_S bounds it, default 220 s), then the decode's pool-slot order run
# (ORDER_S=0 skips it) and the segment sweep (SWEEP_S=0 skips it); the persistent decode's
# forms run in gdn_decode_device.sh. After the wheels' install (see bench/README.md).
# Usage: $0 OUT SHA
set -uo pipefail
OUT=$1; SHA=$2
export ATTNGEN_CUTE_DSL_CACHE_DIR=/tmp/attngen-cute-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'dlpack c api', hasattr(torch.Tensor, '__dlpack_c_exchange_api__'))"
if [ "${TESTS_S:-200}" != 0 ]; then
  ATTNGEN_EVIDENCE_OUT=$OUT/ev.json ATTNGEN_COMMIT=$SHA ATTNGEN_GPU=1 timeout "${TESTS_S:-200}" \
    python3 -m pytest -q -p no:cacheprovider -n 2 tests/families/gdn/gpu \
    -k "gva1_extend or qwen3_next_extend" > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
  tail -3 "$OUT/tests.log"
fi
timeout "${BENCH_S:-220}" python3 bench/gdn.py --only prefill --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -7 "$OUT/bench.log"
# the recurrent decode's pool-slot order (bench/experimental/gdn_decode_order.py)
if [ "${ORDER_S:-90}" != 0 ]; then
  timeout "${ORDER_S:-90}" python3 bench/experimental/gdn_decode_order.py > "$OUT/order.jsonl" \
    2> "$OUT/order.err"
  echo "order rc=$?"; cut -c1-220 "$OUT/order.jsonl"; tail -3 "$OUT/order.err"
fi
if [ "${SWEEP_S:-130}" != 0 ]; then
  timeout "${SWEEP_S:-130}" python3 bench/experimental/gdn_segments_sweep.py --out "$OUT/sweep.json" \
    --segments 1 3 5 > "$OUT/sweep.log" 2>&1; echo "sweep rc=$?"
  python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{'):
        r = json.loads(line)
        print(r['case'], r['segments'], 'eq' if r['equal'] else 'est', r['splits'][0][:3],
              'events %.3f host %.3f bench %.3f' % (r['events_ms'], r['host_ms'], r['do_bench_ms']),
              'diff %.1e %.1e' % (r['out_diff_vs_plain'], r['state_diff_vs_plain']))
" "$OUT/sweep.log"
fi
