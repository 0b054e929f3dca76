#!/usr/bin/env bash
# Several library patches A/B'd against a peer in ONE device call: each patch gets its own
# small tree (the attngen package, the generated sm90 modules and the bench scripts), built and
# generated here, where the generator's dependencies are, and carried to the H200 under .ab/
# (git-ignored: add ".ab/" to .git/info/exclude). A tree is about 4 MB.
#
#   here:    bash bench/experimental/ab_trees.sh prepare NAME PATCH [NAME PATCH ...]
#            (PATCH "none": the tree as it is; a patch is applied with `patch -p1`)
#   H200:    run with carry [".ab"] (and .gpuB, or with /tmp/gpusite already installed):
#            bash bench/experimental/ab_trees.sh run OUTDIR 'NAME|OVERRIDES_JSON|EXTRA ARGS' ...
#            e.g. 'm192|{"t128":{},"t192":{"fwd_tile_m":192}}|--head-dim 64'
#
# Each run row writes OUTDIR/NAME-<i>.jsonl (cute_prefill_tiles.py's rows, or AB_SCRIPT's,
# e.g. AB_SCRIPT=bench/experimental/cute_extend_gather.py: every output checked against
# FA4's, ratios from paired rounds; AB_SCRIPT=bench/experimental/gdn_ab.py: the GDN Triton
# kernels against fla, with /tmp/fla on PYTHONPATH) and prints it; a tree whose sweep fails,
# or runs past AB_TIMEOUT seconds (default 240: a hang), prints why and the next one runs.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
AB="$ROOT/.ab"

prepare() {
    [ -x "$ROOT/.venv/bin/python" ] || { echo "ab_trees: run make generate first (.venv)"; exit 2; }
    while [ $# -ge 2 ]; do
        name=$1 patch=$2
        shift 2
        work=$(mktemp -d)
        (cd "$ROOT" && tar --exclude=__pycache__ -cf - attngen specs generated tests pyproject.toml \
            bench/*.py bench/experimental/*.py) | tar -xf - -C "$work"
        if [ "$patch" != none ]; then
            (cd "$work" && patch -p1 -s --batch < "$ROOT/$patch") || { echo "ab_trees: $patch failed"; exit 1; }
        fi
        (cd "$work" && "$ROOT/.venv/bin/python" -m attngen generate > gen.log 2>&1) ||
            { tail -5 "$work/gen.log"; echo "ab_trees: generate failed for $name"; exit 1; }
        rm -rf "${AB:?}/$name" && mkdir -p "$AB/$name/generated" "$AB/$name/bench"
        cp -r "$work/attngen" "$AB/$name/"
        cp "$work/generated/__init__.py" "$AB/$name/generated/"
        cp -r "$work/generated/sm90" "$AB/$name/generated/"
        cp -r "$work"/bench/*.py "$work/bench/experimental" "$AB/$name/bench/"
        rm -rf "$work"
        echo "ab_trees: .ab/$name ready ($(du -sh "$AB/$name" | cut -f1), patch $patch)"
    done
}

run() {
    out=$1
    shift
    mkdir -p "$out"
    [ -f /tmp/gpusite.env ] && source /tmp/gpusite.env
    i=0
    for row in "$@"; do
        i=$((i + 1))
        IFS='|' read -r name overrides extra <<< "$row"
        echo "== $name $overrides $extra"
        # shellcheck disable=SC2086  # extra: the sweep's own flags, split on purpose
        # a kernel that hangs (a wrong barrier phase) is killed after AB_TIMEOUT seconds
        (cd "$AB/$name" && timeout "${AB_TIMEOUT:-240}" python3 \
            "${AB_SCRIPT:-bench/experimental/cute_prefill_tiles.py}" "$out/$name-$i.jsonl" "$overrides" $extra \
            2>&1 | grep -v Warning | tail -20) || echo "ab_trees: $name failed"
    done
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    run) shift; run "$@" ;;
    *) sed -n 2,16p "$0"; exit 2 ;;
esac
