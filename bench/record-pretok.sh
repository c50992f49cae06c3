#!/usr/bin/env bash
# Records llama.cpp's ids for the pre-tokenizers that no vocabulary in
# ../shared/vocab names: the test texts in tests/data/pretok-PRE.inp are tokenized
# by llama.cpp with ../shared/vocab/ggml-vocab-llama-bpe.gguf's pieces and
# merges under tokenizer.ggml.pre = PRE (a key override), into
# tests/data/pretok-PRE.out, for test_tokenizer_bpe (which rewrites the
# vocabulary's pre key to PRE). And a vocabulary whose tokens show the
# cuts (bench/pair_vocab.c: every pair of a few characters a token of its
# own) with the texts tests/data/pretok-pairs-PRE.gguf.inp, into
# tests/data/pretok-pairs-PRE.gguf and .gguf.out.
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
cc -O2 -o "$work/pair_vocab" "$here/pair_vocab.c" -I"$here/../src" \
  $(cat "$build/spillway-libs.txt") -ljansson -lm -lpthread
vocab="$here/../../shared/vocab/ggml-vocab-llama-bpe.gguf"
data="$here/../tests/data"
for pre in gpt-4o; do
  "$work/tokenize_llamacpp" "$vocab" "$data/pretok-$pre.inp" "$pre" >"$data/pretok-$pre.out"
  echo "record-pretok: tests/data/pretok-$pre.out"
  # the pair vocabulary (bench/pair_vocab.c), committed with its vectors
  "$work/pair_vocab" "$vocab" "$pre" "$data/pretok-pairs-$pre.gguf"
  "$work/tokenize_llamacpp" "$data/pretok-pairs-$pre.gguf" "$data/pretok-pairs-$pre.gguf.inp" \
    >"$data/pretok-pairs-$pre.gguf.out"
  echo "record-pretok: tests/data/pretok-pairs-$pre.gguf{,.out}"
done
