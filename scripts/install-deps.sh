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
  libinih-dev        # configuration
  clang              # libFuzzer harnesses (make test-fuzz)
  curl               # bench/worker.sh and bench/router.sh talk to workers over sockets
  python3            # the benchmark scripts summarise JSON records
  librsvg2-bin       # rsvg-convert: the drill test renders its timeline.svg
)

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
