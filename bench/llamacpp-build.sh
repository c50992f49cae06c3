#!/usr/bin/env bash
# Builds the reference engine, llama.cpp (CPU), for bench/reference.sh and
# bench/crosscheck.sh; prints the directory of its programs and libraries.
#
#   bench/llamacpp-build.sh            (REF_DIR, default build-reference/)
#
# llama.cpp is not a dependency of spillway and is never linked into it.
# Its source comes from the npm registry, the one code registry this
# machine kind reaches: the node-llama-cpp package carries the llama.cpp
# release it binds as a git bundle. The first run downloads it (~35 MB) and
# builds llama-bench, llama-quantize, llama-server and libllama into $REF_DIR (git-ignored; about ten
# minutes on two cores); later runs only print the path.
#
# The build has every instruction set this CPU offers (AVX2, AVX-512, VNNI,
# BF16) but AMX: ggml's AMX path stops with SIGSEGV in ldtilecfg on this VM.
set -euo pipefail
ref_dir=${REF_DIR:-build-reference}
npm_version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
bin_dir="$ref_dir/src/build/bin"
if [ ! -x "$bin_dir/llama-bench" ] || [ ! -x "$bin_dir/llama-quantize" ] || [ ! -x "$bin_dir/llama-server" ]; then
  for tool in npm git cmake c++; do
    command -v "$tool" >/dev/null || { echo "llamacpp-build.sh: needs $tool" >&2; exit 1; }
  done
  mkdir -p "$ref_dir"
  ref_abs=$(cd "$ref_dir" && pwd)
  echo "llamacpp-build.sh: fetching node-llama-cpp@$npm_version (llama.cpp source) from npm" >&2
  (cd "$ref_abs" && npm pack --silent "node-llama-cpp@$npm_version" >/dev/null)
  tar -xzf "$ref_abs/node-llama-cpp-$npm_version.tgz" -C "$ref_abs" package/llama/gitRelease.bundle
  if [ ! -d "$ref_abs/src/.git" ]; then
    git -c advice.detachedHead=false clone -q "$ref_abs/package/llama/gitRelease.bundle" "$ref_abs/src"
  fi
  echo "llamacpp-build.sh: building llama-bench, llama-quantize, llama-server (CPU, AVX-512) in $ref_dir/src/build" >&2
  cmake -S "$ref_abs/src" -B "$ref_abs/src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON >/dev/null
  cmake --build "$ref_abs/src/build" -j"$(nproc)" --target llama-bench llama-quantize llama-server >/dev/null
fi
printf '%s\n' "$bin_dir"
