#!/usr/bin/env bash
# The cost of a constrained resume on llama-server: writing a schema as
# GBNF (the Kubernetes-sized bench/k8s_deployment.schema.json, with its
# patterns, formats, enums and bounds) and advancing a grammar over the
# text a stream already sent (llama.cpp's json.gbnf shape, and a schema's
# compact form, over JSON texts of 1 to 64 KB). Prints figures; asserts
# nothing; not part of `make test`.
#
#   bench/gbnf-derive.sh [BUILD_DIR]            (default: build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -std=c11 -o "$work/gbnf_derive_bench" "$here/gbnf_derive_bench.c" -I"$here/../src" \
  -I"$here/../tests" $(cat "$build/spillway-libs.txt") -ljansson -lm -lpthread
"$work/gbnf_derive_bench" "$here/k8s_deployment.schema.json"
