#!/usr/bin/env bash
# One device call for the fused GDN kernel's forms (after the CuTe DSL wheels, fla and
# FlashInfer are installed: see bench/README, "The fused kernel, third steps"):
#   bash bench/experimental/gdn_fused_device.sh OUT [form ...]     (default: c1 c1h c1p c1pd invh)
# Each form's checks run in a process of its own (a form that hangs or faults cannot take
# the others; the harness also ends a case that outlasts --case-timeout), then the bench
# of the forms whose checks passed, then the ablation of the inverse's parts. Results under
# OUT: <form>/gdn_fused.json, bench/gdn_fused.json, ablate/gdn_fused_ablate.json, log.txt.
set -u
out=${1:?usage: gdn_fused_device.sh OUT [form ...]}
shift
forms=("$@")
[ "${#forms[@]}" -gt 0 ] || forms=(c1 c1h c1p c1pd invh)
script=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
log="$out/log.txt"

step() {  # step NAME SECONDS COMMAND...: run, keep its output (filtered) in the log
    local name=$1 limit=$2
    shift 2
    echo "== $name" | tee -a "$log"
    timeout "$limit" "$@" > "$out/step.txt" 2>&1
    local rc=$?
    grep -v Warning "$out/step.txt" | cut -c1-1500 | tee -a "$log"
    echo "== $name: exit $rc" | tee -a "$log"
    return $rc
}

passed=()
for form in "${forms[@]}"; do
    if step "check $form" 200 python3 "$script/gdn_fused_sm90.py" --check --variants "$form" \
        --segments 1 3 --case-timeout 90 --out "$out/$form"; then
        passed+=("$form")
    fi
done
echo "== passed: ${passed[*]:-none}" | tee -a "$log"
if [ "${#passed[@]}" -gt 0 ]; then
    step "bench ${passed[*]}" 300 python3 "$script/gdn_fused_sm90.py" --bench \
        --variants "${passed[@]}" --segments 1 3 --case-timeout 120 --out "$out/bench"
fi
step "ablate invh" 150 python3 "$script/gdn_fused_ablate.py" --variant invh \
    --skip - solve mform diag merge tsplit loads --out "$out/ablate"
# where a chunk's time goes in the one-long-request case: stalls a warp, pipes, occupancy
if command -v ncu > /dev/null; then
    step "ncu c1p 1x32k" 150 ncu --set full -k regex:GdnFused --launch-count 1 \
        -o "$out/ncu-c1p-1x32k" python3 "$script/gdn_fused_ablate.py" --ncu \
        --ncu-case 1x32768x16 --variant c1p
    step "ncu c1p 1x32k details" 60 ncu -i "$out/ncu-c1p-1x32k.ncu-rep" --page details
fi
rm -f "$out/step.txt"
