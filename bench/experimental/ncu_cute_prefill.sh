#!/usr/bin/env bash
# ncu of FA4's and attngen's sm90 prefill at S 8k (bench/experimental/ncu_cute_prefill.py), on
# the H200 after .gpuA/.gpuB are installed: full sections of one launch each, causal and not,
# and with --source the non-causal launches' per-SASS-instruction counters as CSV. Into $OUT.
# Arguments after the first that is not --source go to ncu_cute_prefill.py, e.g.
# `bash ncu_cute_prefill.sh -- --spec mha_head_dim_256 --head-dim 256 --heads 16/8`; with
# --causal-only the non-causal launches are skipped.
source /tmp/gpusite.env; mkdir -p "$OUT"
[ -d /tmp/fa4 ] && export PYTHONPATH=/tmp/fa4:$PYTHONPATH  # FA4 from .carry_fa4 (bench/README.md)
cases=("" "--noncausal"); source_csv=0
[ "${1:-}" = "--source" ] && { cases=("--noncausal"); source_csv=1; shift; }
[ "${1:-}" = "--causal-only" ] && { cases=(""); shift; }
[ "${1:-}" = "--" ] && shift
for c in "${cases[@]}"; do
  for k in flash_fwd MhaFwdSm90; do
    rep="$OUT/ncu-$k$c"
    ncu --set full --import-source no -k regex:$k --launch-skip 2 --launch-count 1 -f -o "$rep" \
      python3 bench/experimental/ncu_cute_prefill.py 8192 $c "$@" > "$rep.log" 2>&1
    ncu -i "$rep.ncu-rep" --print-details all > "$rep.txt" 2>&1
    if [ "$source_csv" = 1 ]; then
      ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$rep-sass.csv" 2>&1
    fi
    rm -f "$rep.ncu-rep"
    grep -E "Duration|Executed Instructions |Registers Per" "$rep.txt"; tail -1 "$rep.log"
  done
done
