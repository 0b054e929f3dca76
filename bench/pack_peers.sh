#!/usr/bin/env bash
# Packs the FA4 peer (flash-attn-4 and its CuTe DSL stack) for the H200 into .gpuA/.gpuB
# at the repo root, through ../shared/gpu/pack-wheels.sh. Run from anywhere; needs a
# package index here. einops is not in the GPU machine's base image but
# flash_attn.cute.interface imports it (via flash_attn/cute/testing.py), so it travels too.
# On the H200:  bash .gpuA/install.sh; bash .gpuB/install.sh; source /tmp/gpusite.env
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exec ../shared/gpu/pack-wheels.sh .gpuA .gpuB \
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \
  flash-attn-4==4.0.0b36 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 \
  torch-c-dlpack-ext==0.1.5 einops==0.8.2
