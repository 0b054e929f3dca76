#!/usr/bin/env bash
# One device call for the fused GDN kernel's forms (after the CuTe DSL wheels, fla and
# FlashInfer are installed: see bench/README, "The fused kernel, third steps"):
#   [STEPS="check bench ablate ncu"] bash bench/experimental/gdn_fused_device.sh OUT [form ...]
#   (forms by default: c1 c1p c1pd c2p invh; about 8 minutes for all four steps, so a call
#   of 600 s may want STEPS="check bench" first and "ablate ncu" in the next)
# Each form's checks run in a process of its own (a form that hangs or faults cannot take
# the others; the harness also ends a case that outlasts --case-timeout), then the bench
# of the forms whose checks passed, then the ablation of the inverse's parts. Results under
# OUT: <form>/gdn_fused.json, bench/gdn_fused.json, ablate/gdn_fused_ablate.json, log.txt.
set -u
out=${1:?usage: gdn_fused_device.sh OUT [form ...]}
shift
forms=("$@")
[ "${#forms[@]}" -gt 0 ] || forms=(c1 c1p c1pd c2p invh)
steps=" ${STEPS:-check bench ablate ncu} "
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

passed=("${forms[@]}")
[[ $steps == *" check "* ]] && passed=()
for form in "${forms[@]}"; do
    [[ $steps == *" check "* ]] || break
    if step "check $form" 200 python3 "$script/gdn_fused_sm90.py" --check --variants "$form" \
        --segments 1 3 --case-timeout 90 --out "$out/$form"; then
        passed+=("$form")
    fi
done
echo "== passed: ${passed[*]:-none}" | tee -a "$log"
if [[ $steps == *" bench "* ]] && [ "${#passed[@]}" -gt 0 ]; then
    step "bench ${passed[*]}" 300 python3 "$script/gdn_fused_sm90.py" --bench \
        --variants "${passed[@]}" --segments 1 3 --case-timeout 120 --out "$out/bench"
fi
[[ $steps == *" ablate "* ]] && step "ablate invh" 150 python3 "$script/gdn_fused_ablate.py" --variant invh \
    --skip - solve mform diag merge tsplit loads --out "$out/ablate"
# where a chunk's time goes in the one-long-request case: stalls a warp, pipes, occupancy
if [[ $steps == *" ncu "* ]] && command -v ncu > /dev/null; then
    step "ncu c1p 1x32k" 150 ncu --set full -k regex:GdnFused --launch-count 1 \
        -o "$out/ncu-c1p-1x32k" python3 "$script/gdn_fused_ablate.py" --ncu \
        --ncu-case 1x32768x16 --variant c1p
    step "ncu c1p 1x32k details" 60 ncu -i "$out/ncu-c1p-1x32k.ncu-rep" --page details
fi
rm -f "$out/step.txt"
