#!/usr/bin/env bash
# run.sh - the SDK tests, run by CTest (sdk_*): installs the SDKs
# (package.json, package-lock.json: OpenAI's, Anthropic's, the Vercel AI SDK,
# LangChain's OpenAI chat model, zod) into the build tree once, then runs one
# test file of this directory (structured.test.mjs unless named) against a
# real `spillway serve` of `make run`'s configuration (config/demo.ini).
# Exit 77 (CTest's skip) with a SKIP: line when node or npm is missing or
# the npm registry cannot be reached.
#   run.sh BUILD_DIR [TEST.mjs]      (SPILLWAY_BIN names the binary)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
skip() { echo "SKIP: $*"; exit 77; }

[ -n "${SPILLWAY_BIN:-}" ] || skip "SPILLWAY_BIN is not set"
[ -f "$build/models/demo.gguf" ] || skip "no $build/models/demo.gguf (make demo builds it)"

. "$here/../npm-deps.sh"
dir="$build/sdk-test"
npm_deps "$here" "$dir" "sdk test: openai, @anthropic-ai/sdk, ai, @langchain/openai, zod"

# an ES module resolves its imports from where it lies: beside node_modules
test=${2:-structured.test.mjs}
[ -f "$here/$test" ] || { echo "run.sh: no $here/$test" >&2; exit 2; }
cp "$here/$test" "$here/demo_router.mjs" "$dir/"
export SPILLWAY_DEMO_INI="$here/../../config/demo.ini"
export SPILLWAY_DEMO_MODEL="$build/models/demo.gguf"
export SPILLWAY_SDK_DIR="$dir"
exec node "$dir/$test"
