#!/usr/bin/env bash
# One device call: the transformers integration's GPU tests, then the generate_batch bench.
# Usage (from the repo root): bash bench/tf_gpu_run.sh OUT_DIR COMMIT
set -u
out=${1:?out dir}; commit=${2:-unknown}
python3 -c "import transformers, torch, triton; print('transformers', transformers.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tee "$out/versions.txt"
python3 -c "import xdist" 2>/dev/null && par="-n 8" || par=""
ATTNGEN_GPU=1 timeout 60 python3 -m pytest -q -p no:cacheprovider $par -rA \
  tests/integrations/transformers/gpu > "$out/gpu_tests.log" 2>&1
echo "pytest rc $?" | tee -a "$out/gpu_tests.log"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|OK|FAIL" "$out/gpu_tests.log" | cut -c1-400 | tail -60
timeout 100 python3 bench/transformers_cb.py --commit "$commit" --out "$out" --requests 48 --max-prompt 768 > "$out/bench.log" 2>&1
echo "bench rc $?"; grep -v Warning "$out/bench.log" | grep -v "eos_token_id" | tail -8 | cut -c1-400
timeout 30 python3 examples/transformers_generate.py --batch-size 4 --prompt-tokens 256 \
  --new-tokens 32 --page-size 16 --kv-cache-dtype fp8_e4m3 > "$out/example.log" 2>&1
echo "example rc $?"; grep -v "eos_token_id" "$out/example.log" | tail -8 | cut -c1-300
