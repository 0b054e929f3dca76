#!/usr/bin/env bash
# The whole GPU suite over several device calls (each under the 600 s limit), for a change
# that moves every family's runtime identity. After the wheels' installs (.gpuA, .gpuB),
# one call per part, with carry [".gpuC", ".carry_fla", ".carry_tf"]:
#
#   bash .gpuC/install.sh >/dev/null 2>&1 && bash bench/experimental/gpu_suites.sh $OUT SHA PART
#
# PART: mha (tests/families/mha/gpu, Triton and CuTe DSL: 183 s on an H100 at -n 12),
# mla_dsa, gdn (its CuTe DSL extend tests run without xdist: with it the run hung at exit;
# fla's wheel carries the tvm-ffi that module loads) or tf (the transformers integration;
# .carry_tf holds transformers 5.17 and its pure-Python deps). On 2026-12-07 MLA, DSA, GDN
# and transformers together reached 37% in 420 s on an H100, hence the split. Every record
# is spooled as it passes (ATTNGEN_EVIDENCE_SPOOL), and a part cut off by its limit still
# writes OUT/ev-PART.json from the spool. Workers: 16 on an H200, 12 on an H100 (16 ran
# out of its 80 GB). Then, here: tests/gpu_evidence.py merge evidence/gpu/sm90.json
# OUT/ev-*.json && make generate.
set -uo pipefail
OUT=$1; SHA=$2; PART=$3
mkdir -p "$OUT"
source /tmp/gpusite.env
for c in fla tf; do
  [ -d ".carry_$c" ] && python3 -m pip install -q --no-index --no-deps --target "/tmp/$c" \
    ".carry_$c"/*.whl > /dev/null 2>&1
done
export PYTHONPATH=/tmp/fla:/tmp/tf:$PYTHONPATH ATTNGEN_GPU=1 ATTNGEN_COMMIT=$SHA
export ATTNGEN_CUTE_DSL_CACHE_DIR=/tmp/attngen-cute-cache
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu" | tee "$OUT/gpu-$PART.txt"
case "$gpu" in *H200*) workers=16 ;; *) workers=12 ;; esac
suite() {  # suite NAME SECONDS PYTEST_ARGS...
  local name=$1 limit=$2
  shift 2
  export ATTNGEN_EVIDENCE_OUT="$OUT/ev-$name.json" ATTNGEN_EVIDENCE_SPOOL="$OUT/spool-$name"
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? $(tail -1 "$OUT/$name.log")"
  [ -f "$ATTNGEN_EVIDENCE_OUT" ] || PYTHONPATH=$PWD:$PYTHONPATH python3 tests/gpu_evidence.py
  [ -f "$ATTNGEN_EVIDENCE_OUT" ] && rm -rf "$ATTNGEN_EVIDENCE_SPOOL"  # else keep it
}
cute_gdn="gva1_extend or qwen3_next_extend"
case "$PART" in
  mha) suite mha 570 -n "$workers" tests/families/mha/gpu ;;
  mla_dsa) suite mla_dsa 570 -n "$workers" tests/families/mla/gpu tests/families/dsa/gpu ;;
  gdn)
    suite gdn 420 -n "$workers" tests/families/gdn/gpu -k "not ($cute_gdn)"
    suite gdn_cute 150 tests/families/gdn/gpu -k "$cute_gdn" ;;
  tf) suite tf 570 -n "$workers" tests/integrations/transformers/gpu ;;
  *) echo "PART: mha, mla_dsa, gdn or tf" >&2; exit 2 ;;
esac
grep -h -E "^(FAILED|ERROR)" "$OUT"/*.log | head -20
