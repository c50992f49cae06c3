#!/usr/bin/env bash
# Structured-output benchmark: the qwen2 vocabulary's index, the compile
# time of a Kubernetes-sized schema (bench/k8s_deployment.schema.json: a
# Deployment in the shape of apps/v1, 17 definitions and 210 properties,
# with patterns, formats, enums, bounds and free-keyed maps) and of a
# GBNF JSON grammar, and the mask time per token along random walks, as
# wall-clock time and as the thread's CPU time (on a loaded machine the
# wall-clock tail is mostly waiting for a core). BENCH_SLOW_MS=x lists the
# masks slower than x ms (CPU) with the text before them; BENCH_MASK_HASH=1
# prints a hash of each walk's masks (to compare two builds);
# BENCH_REPEAT=r runs each seeded walk r times and keeps each mask's least
# CPU time (the VM counts the moments its CPU is taken away as the
# thread's CPU time, so a single run's worst masks are often those).
# Prints figures; asserts nothing; not part of `make test`.
#
#   bench/constrain.sh [BUILD_DIR]            (default: build)
#   WALKS=20 TOKENS=3000 VOCAB=../shared/vocab/ggml-vocab-qwen2.gguf bench/constrain.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
vocab=${VOCAB:-$here/../../shared/vocab/ggml-vocab-qwen2.gguf}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -std=c11 -o "$work/constrain_bench" "$here/constrain_bench.c" -I"$here/../src" \
  $(cat "$build/spillway-libs.txt") -ljansson -lm -lpthread
"$work/constrain_bench" "$vocab" "$here/k8s_deployment.schema.json" "${WALKS:-20}" "${TOKENS:-3000}"
