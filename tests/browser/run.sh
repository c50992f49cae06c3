#!/usr/bin/env bash
# run.sh - the dashboard's real-browser test, run by CTest (browser_dashboard):
# installs playwright-core (package.json, package-lock.json) into the build
# tree once, then runs dashboard.test.js against a real `spillway serve` with
# Debian's chromium, headless. Exit 77 (CTest's skip) with a SKIP: line when
# node, npm or chromium is missing or the npm registry cannot be reached.
#   run.sh BUILD_DIR      (SPILLWAY_BIN names the binary)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR}
skip() { echo "SKIP: $*"; exit 77; }

command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs nodejs)"
command -v npm >/dev/null || skip "npm is not installed (scripts/install-deps.sh installs it)"
chromium=${SPILLWAY_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$chromium" ] || skip "chromium is not installed (scripts/install-deps.sh installs Debian's chromium)"
[ -n "${SPILLWAY_BIN:-}" ] || skip "SPILLWAY_BIN is not set"

# playwright-core, into the build tree (never into the source tree); again
# only when the lock file changed
dir="$build/browser-test"
mkdir -p "$dir"
if ! cmp -s "$here/package-lock.json" "$dir/package-lock.json" || [ ! -d "$dir/node_modules/playwright-core" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$dir/"
  t0=$(date +%s)
  if ! (cd "$dir" && npm ci --no-audit --no-fund --silent >"$dir/npm.log" 2>&1); then
    tail -5 "$dir/npm.log"
    rm -f "$dir/package-lock.json"
    skip "npm ci failed (is the npm registry reachable?); see $dir/npm.log"
  fi
  echo "browser test: playwright-core installed in $dir in $(( $(date +%s) - t0 )) s ($(du -sh "$dir/node_modules" | cut -f1))"
fi

export NODE_PATH="$dir/node_modules"
export SPILLWAY_CHROMIUM="$chromium"
export SPILLWAY_BROWSER_OUT="$dir/out"
rm -rf "$SPILLWAY_BROWSER_OUT"
mkdir -p "$SPILLWAY_BROWSER_OUT"
exec node "$here/dashboard.test.js"
