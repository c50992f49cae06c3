#!/usr/bin/env bash
# Records the greedy goldens of `model make` presets with the reference
# engine (llama.cpp), into tests/data/PRESET.golden.json, for the engine's
# tests (test_arch_golden) to check against without llama.cpp at test
# time. The model is not kept: the tests make it again from the preset
# (the generator is deterministic) and check its sha256 against the one
# recorded here, so a changed generator shows as a stale golden, not as a
# wrong engine.
#
#   bench/record-goldens.sh [BUILD_DIR]    (default: build; needs the llama.cpp
#                                          that bench/llamacpp-build.sh builds)
#   RECORD_PRESETS="qwen3moe-tiny" bench/record-goldens.sh ...   only those presets
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
ref_bin=$(cd "$("$here/llamacpp-build.sh")" && pwd)
ref_src="$ref_bin/../.."
work="$build/goldens"
mkdir -p "$work"
cc -O2 -o "$work/golden_llamacpp" "$here/golden_llamacpp.c" -I"$ref_src/include" \
  -I"$ref_src/ggml/include" -L"$ref_bin" -lllama -lggml -lggml-base -ljansson -lm \
  -Wl,-rpath,"$ref_bin"
npm_version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
release=$(tar -xzOf "$ref_src/../node-llama-cpp-$npm_version.tgz" package/llama/llama.cpp.info.json |
  jq -r .tag)
engine="llama.cpp $release (node-llama-cpp $npm_version's bundle), CPU, 2 threads, F16 KV cache"
# Prompts in the built-in vocabulary's words (whole-word tokens), a number
# and a non-ASCII one (byte tokens).
prompts=("Once upon a time there was a little" "The king said to the people" "water, fire, earth"
         "1, 2, 3, 4," "Ünïcödé café")
for preset in ${RECORD_PRESETS:-qwen3-tiny phi3-tiny gemma3-tiny qwen3moe-tiny gpt-oss-tiny}; do
  f="$work/$preset.gguf"
  "$build/spillway" model make --preset "$preset" -o "$f" >/dev/null
  sha=$(sha256sum "$f" | cut -d' ' -f1)
  "$work/golden_llamacpp" "$f" 32 "$engine" "${prompts[@]}" |
    jq --indent 1 --arg p "$preset" --arg s "$sha" \
      '{model, engine, model_make: {preset: $p, sha256: $s}, tokenize, greedy}' \
      >"$here/../tests/data/$preset.golden.json"
  echo "record-goldens: tests/data/$preset.golden.json ($f, sha256 $sha)"
done
