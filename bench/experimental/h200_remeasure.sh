#!/usr/bin/env bash
# One device call that re-measures what issues 10 and 11 still need on the card they name
# (the H200), for a session that gets one late: after the wheels' installs (.gpuA, .gpuB,
# then this call with carry [".gpuC", ".carry_fa4", ".carry_fla", ".carry_flashinfer"]):
#
#   bash .gpuC/install.sh >/dev/null 2>&1 && bash bench/experimental/h200_remeasure.sh $OUT SHA
#
# Each part runs under its own time limit (seconds, 0 skips it; the defaults add up to ~540,
# inside one 600 s call), writes its own file into OUT and prints its summary:
#   GDN_S     bench/gdn.py prefill (CuTe DSL and Triton modules beside fla and FlashInfer)
#   DECODE_S  bench/gdn.py decode (B64 / B256 in CUDA graphs beside fla)
#   PREFILL_S the CuTe MHA cache-free prefill, paired rounds beside FA4, hd 128 and hd 64
#             (hd 64's non-causal rows run the hd 128 spec's config with the head dim swapped:
#             128-row tiles; its causal rows are the generated 192-row config)
#   FP8_S     bench/cute_mha_check.py --decode (fp8 / bf16 sequences per second, FA4 decode)
set -uo pipefail
OUT=$1; SHA=$2
mkdir -p "$OUT"
source /tmp/gpusite.env
for c in fla flashinfer fa4; do
  [ -d ".carry_$c" ] && python3 -m pip install -q --no-index --no-deps --target "/tmp/$c" \
    ".carry_$c"/*.whl > /dev/null 2>&1
done
export PYTHONPATH=/tmp/fla:/tmp/flashinfer:/tmp/fa4:$PYTHONPATH FLA_FLASH_QLA=0
export PYTHONUNBUFFERED=1 ATTNGEN_COMMIT=$SHA ATTNGEN_CUTE_DSL_CACHE_DIR=/tmp/attngen-cute-cache
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"

part() {  # part NAME SECONDS COMMAND...: run COMMAND under the limit, log into OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  [ "$limit" = 0 ] && return
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"
}

part gdn_prefill "${GDN_S:-170}" python3 bench/gdn.py --only prefill --out "$OUT"
sed -n '/case | attngen/,$p' "$OUT/gdn_prefill.log" | head -12
part gdn_decode "${DECODE_S:-80}" python3 bench/gdn.py --only decode --out "$OUT"
tail -4 "$OUT/gdn_decode.log"
part prefill_hd128 "${PREFILL_S:-100}" python3 bench/experimental/cute_prefill_tiles.py \
  "$OUT/prefill-hd128.jsonl" '{"base":{}}'
part prefill_hd64 "${PREFILL_S:-100}" python3 bench/experimental/cute_prefill_tiles.py \
  "$OUT/prefill-hd64.jsonl" '{"base":{}}' --head-dim 64
cat "$OUT"/prefill-hd*.jsonl 2>/dev/null | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['head_dim'], 'causal' if r['causal'] else 'non-causal', r['seq'], r['ratio'],
          r['ratio_iqr'], 'ok' if r['ok'] else 'OUTPUT MISMATCH')"
part fp8_decode "${FP8_S:-90}" python3 bench/cute_mha_check.py --decode --out "$OUT/fp8"
tail -12 "$OUT/fp8_decode.log"
