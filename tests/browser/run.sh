#!/usr/bin/env bash
# run.sh - the real-browser tests, run by CTest (browser_dashboard,
# browser_cors): installs playwright-core (package.json, package-lock.json)
# into the build tree once, then runs TEST.test.js (default: dashboard)
# against a real `spillway serve` with Debian's chromium, headless. Exit 77
# (CTest's skip) with a SKIP: line when node, npm or chromium is missing or
# the npm registry cannot be reached.
#   run.sh BUILD_DIR [TEST]      (SPILLWAY_BIN names the binary)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR [TEST]}
test=${2:-dashboard}
skip() { echo "SKIP: $*"; exit 77; }

chromium=${SPILLWAY_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$chromium" ] || skip "chromium is not installed (scripts/install-deps.sh installs Debian's chromium)"
[ -n "${SPILLWAY_BIN:-}" ] || skip "SPILLWAY_BIN is not set"

# playwright-core, into the build tree
. "$here/../npm-deps.sh"
dir="$build/browser-test"
npm_deps "$here" "$dir" "browser test: playwright-core"

export NODE_PATH="$dir/node_modules"
export SPILLWAY_CHROMIUM="$chromium"
export SPILLWAY_BROWSER_OUT="$dir/out-$test"
rm -rf "$SPILLWAY_BROWSER_OUT"
mkdir -p "$SPILLWAY_BROWSER_OUT"
exec node "$here/$test.test.js"
