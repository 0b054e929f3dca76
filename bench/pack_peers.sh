#!/usr/bin/env bash
# Packs the FA4 peer (flash-attn-4 and its CuTe DSL stack) for the H200 into .gpuA/.gpuB
# at the repo root, through ../shared/gpu/pack-wheels.sh. Run from anywhere; needs a
# package index here. einops is not in the GPU machine's base image but
# flash_attn.cute.interface imports it (via flash_attn/cute/testing.py), so it travels too.
# On the H200:  bash .gpuA/install.sh; bash .gpuB/install.sh; source /tmp/gpusite.env
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
../shared/gpu/pack-wheels.sh .gpuA .gpuB \
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \
  flash-attn-4==4.0.0b36 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 \
  torch-c-dlpack-ext==0.1.5 einops==0.8.2

# Each folder travels with the working tree (about 12 MB) under one 64 MiB carry: move the
# smallest parts of the heavier folder to the lighter one while that narrows the gap (the
# packer's greedy split left 45 / 54 MB, and 54 + the tree passed the limit on 2026-12-04).
# install.sh counts parts over both folders, so where a part travels does not matter.
size() { du -sb "$1" | cut -f1; }
while :; do
  a=$(size .gpuA); b=$(size .gpuB)
  if [ "$a" -gt "$b" ]; then heavy=.gpuA light=.gpuB; else heavy=.gpuB light=.gpuA; fi
  part=$(ls -S "$heavy"/*.part.* | tail -1)
  s=$(stat -c %s "$part"); gap=$(( a > b ? a - b : b - a ))
  [ $((2 * s)) -lt "$gap" ] || break
  mv "$part" "$light/"
done
du -sh .gpuA .gpuB
