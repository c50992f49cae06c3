#!/usr/bin/env bash
# run.sh - structured output through the SDKs, run by CTest (sdk_structured):
# installs the Vercel AI SDK, LangChain's OpenAI chat model and zod
# (package.json, package-lock.json) into the build tree once, then runs
# structured.test.mjs against a real `spillway serve` of `make run`'s
# configuration (config/demo.ini). Exit 77 (CTest's skip) with a SKIP: line
# when node or npm is missing or the npm registry cannot be reached.
#   run.sh BUILD_DIR      (SPILLWAY_BIN names the binary)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
skip() { echo "SKIP: $*"; exit 77; }

[ -n "${SPILLWAY_BIN:-}" ] || skip "SPILLWAY_BIN is not set"
[ -f "$build/models/demo.gguf" ] || skip "no $build/models/demo.gguf (make demo builds it)"

. "$here/../npm-deps.sh"
dir="$build/sdk-test"
npm_deps "$here" "$dir" "sdk test: ai, @langchain/openai, zod"

# an ES module resolves its imports from where it lies: beside node_modules
cp "$here/structured.test.mjs" "$dir/"
export SPILLWAY_DEMO_INI="$here/../../config/demo.ini"
export SPILLWAY_DEMO_MODEL="$build/models/demo.gguf"
export SPILLWAY_SDK_DIR="$dir"
exec node "$dir/structured.test.mjs"
