#!/usr/bin/env bash
# npm-deps.sh - installs the npm packages of a test (its package.json and
# package-lock.json in SRC) into DEST/node_modules in the build tree (never
# into the source tree), again only when the lock file changed. Sourced by
# the tests' run.sh, which define skip() (exit 77 with a SKIP: line).
#   npm_deps SRC DEST WHAT
npm_deps() {
  local src=$1 dest=$2 what=$3
  command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs nodejs)"
  command -v npm >/dev/null || skip "npm is not installed (scripts/install-deps.sh installs it)"
  mkdir -p "$dest"
  if ! cmp -s "$src/package-lock.json" "$dest/package-lock.json" || [ ! -d "$dest/node_modules" ]; then
    cp "$src/package.json" "$src/package-lock.json" "$dest/"
    local t0
    t0=$(date +%s)
    if ! (cd "$dest" && npm ci --no-audit --no-fund --silent >"$dest/npm.log" 2>&1); then
      tail -5 "$dest/npm.log"
      rm -f "$dest/package-lock.json"
      skip "npm ci failed (is the npm registry reachable?); see $dest/npm.log"
    fi
    echo "$what: installed in $dest in $(( $(date +%s) - t0 )) s ($(du -sh "$dest/node_modules" | cut -f1))"
  fi
}
