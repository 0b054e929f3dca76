#!/usr/bin/env bash
# The whole GPU suite in two device calls (each under the 600 s limit), evidence spooled to
# OUT, for a change that moves every family's runtime identity. After the wheels' installs
# (.gpuA, .gpuB), each call with carry [".gpuC", ".carry_fla", ".carry_tf"]:
#
#   bash .gpuC/install.sh >/dev/null 2>&1 && bash bench/experimental/gpu_suites.sh $OUT SHA mha
#   bash .gpuC/install.sh >/dev/null 2>&1 && bash bench/experimental/gpu_suites.sh $OUT SHA rest
#
# mha: tests/families/mha/gpu (Triton and CuTe DSL); rest: MLA, DSA, GDN (its CuTe DSL
# extend tests run without xdist: with it the run hung at exit) and the transformers
# integration (fla's wheel carries the tvm-ffi the GDN CuTe module loads; .carry_tf holds
# transformers 5.17 and its pure-Python deps). Workers: 16 on an H200, 12 on an H100 (16
# ran out of its 80 GB). Then, here: tests/gpu_evidence.py merge evidence/gpu/sm90.json
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
  ATTNGEN_EVIDENCE_OUT="$OUT/ev-$name.json" timeout "$limit" python3 -m pytest -q \
    -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? $(tail -1 "$OUT/$name.log")"
}
cute_gdn="gva1_extend or qwen3_next_extend"
if [ "$PART" = mha ]; then
  suite mha 570 -n "$workers" tests/families/mha/gpu
else
  suite rest 420 -n "$workers" tests/families/mla/gpu tests/families/dsa/gpu \
    tests/families/gdn/gpu tests/integrations/transformers/gpu -k "not ($cute_gdn)"
  suite gdn_cute 150 tests/families/gdn/gpu -k "$cute_gdn"
fi
grep -h -E "^(FAILED|ERROR)" "$OUT"/*.log | head -20
