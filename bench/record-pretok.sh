#!/usr/bin/env bash
# Records llama.cpp's ids for the pre-tokenizers that no vocabulary in
# ../shared/vocab names: the test texts in tests/data/pretok-PRE.inp are tokenized
# by llama.cpp with ../shared/vocab/ggml-vocab-llama-bpe.gguf's pieces and
# merges under tokenizer.ggml.pre = PRE (a key override), into
# tests/data/pretok-PRE.out, for test_tokenizer_bpe (which rewrites the
# vocabulary's pre key to PRE).
#
#   bench/record-pretok.sh [BUILD_DIR]     (default: build; needs the llama.cpp
#                                          that bench/llamacpp-build.sh builds)
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
ref_bin=$(cd "$("$here/llamacpp-build.sh")" && pwd)
ref_src="$ref_bin/../.."
work="$build/pretok"
mkdir -p "$work"
cc -O2 -o "$work/tokenize_llamacpp" "$here/tokenize_llamacpp.c" -I"$ref_src/include" \
  -I"$ref_src/ggml/include" -L"$ref_bin" -lllama -lggml -lggml-base -lm \
  -Wl,-rpath,"$ref_bin"
vocab="$here/../../shared/vocab/ggml-vocab-llama-bpe.gguf"
for pre in gpt-4o; do
  "$work/tokenize_llamacpp" "$vocab" "$here/../tests/data/pretok-$pre.inp" "$pre" \
    >"$here/../tests/data/pretok-$pre.out"
  echo "record-pretok: tests/data/pretok-$pre.out"
done
