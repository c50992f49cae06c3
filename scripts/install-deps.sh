#!/usr/bin/env bash
# Installs the Debian packages spillway needs to build and test.
# Idempotent: packages already present are left alone; apt runs only when
# something is missing. Run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libjansson-dev     # JSON (CLI records, goldens, HTTP API)
  libcmocka-dev      # unit tests
  libevent-dev       # event loop + HTTP (worker, router)
  libsqlite3-dev     # ledger
  libpq-dev          # ledger on PostgreSQL (libpq)
  postgresql         # the ledger's PostgreSQL tests: throw-away clusters (scripts/pg-scratch.sh)
  haproxy            # several routers behind one address (contrib/haproxy, its test)
  libinih-dev        # configuration
  libssl-dev         # TLS to remote upstreams (the router's https:// workers)
  openssl            # test_router_tls makes its certificates with the CLI
  clang              # libFuzzer harnesses (make test-fuzz)
  curl               # bench/worker.sh and bench/router.sh talk to workers over sockets
  python3            # the benchmark scripts summarise JSON records
  python3-jsonschema # the independent validator of structured output (test_json_schema_suite, _generate)
  python3-rfc3987    # lets python3-jsonschema check format uri / uri-reference
  librsvg2-bin       # rsvg-convert: the drill test renders its timeline.svg
)
# The dashboard's browser test (tests/browser): Debian's chromium (about
# 80 MB to download, 360 MB installed with chromium-common), node and npm
# (playwright-core comes from npm into the build tree at test time).
# SPILLWAY_NO_BROWSER=1 leaves them out; the test then skips.
if [ -z "${SPILLWAY_NO_BROWSER:-}" ]; then
  packages+=(chromium nodejs)
  # a nodejs that carries its own npm (NodeSource's) conflicts with
  # Debian's npm package: only where there is no npm
  command -v npm >/dev/null 2>&1 || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq || true
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
