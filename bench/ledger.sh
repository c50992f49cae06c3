#!/usr/bin/env bash
# Ledger benchmark: the ledger's own cost per operation on each backend
# (bench/ledger_bench.c): an idempotent request's writes (look-up and claim
# of a new key, one attempt record, the stored answer), a job's (insert,
# claim, fenced finish) and a tool step's (started, done). SQLite in a
# state directory on the build tree's file system (each commit synced) and,
# when PostgreSQL is installed, a scratch cluster of its own
# (scripts/pg-scratch.sh) over TCP on 127.0.0.1. One connection, one
# thread: latency, not throughput. SQLITE_PARENT puts the SQLite ledger
# elsewhere (/dev/shm: no disk sync, the ledger's CPU cost alone). Prints
# figures; asserts nothing; not part of `make test`.
#
#   bench/ledger.sh [BUILD_DIR]          (default: build)
#   ROUNDS=500 SQLITE_PARENT=/dev/shm bench/ledger.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
rounds=${ROUNDS:-300}
work=$(mktemp -d -p "$build")
chmod 0755 "$work" # the cluster's user (postgres, when run as root) reaches it
pgdir="$work/pg"
cleanup() { "$here/../scripts/pg-scratch.sh" fixture-stop "$pgdir" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
cc -O2 -std=c11 -o "$work/ledger_bench" "$here/ledger_bench.c" -I"$here/../src" \
  $(cat "$build/spillway-libs.txt") $(pkg-config --libs sqlite3 libpq jansson) -lm -lpthread
sqlite_dir=$(mktemp -d -p "${SQLITE_PARENT:-$work}")
"$work/ledger_bench" "$sqlite_dir" "$rounds" sqlite
rm -rf "$sqlite_dir"
if url=$("$here/../scripts/pg-scratch.sh" start "$pgdir"); then
  "$work/ledger_bench" "$url" "$rounds" postgresql
else
  echo "postgresql: not installed (scripts/install-deps.sh); skipped"
fi
