#!/usr/bin/env bash
# pg-scratch.sh - a throw-away PostgreSQL cluster for tests and benchmarks.
#
#   scripts/pg-scratch.sh start DIR    make (first time) and start a cluster in DIR;
#                                      prints postgresql://USER@127.0.0.1:PORT/postgres
#   scripts/pg-scratch.sh stop DIR     stop it (nothing to do when it is not running)
#   scripts/pg-scratch.sh restart DIR  stop and start again on the same port
#   scripts/pg-scratch.sh url DIR      print the URL of a cluster made before
#
# For CTest's pg_scratch fixture (CMakeLists.txt):
#   scripts/pg-scratch.sh fixture-start DIR   start as above, after removing an old DIR;
#                                             without PostgreSQL it says so and succeeds
#                                             (the tests then skip), unless CI=true
#   scripts/pg-scratch.sh fixture-stop DIR    stop it and remove DIR
#
# The cluster listens on 127.0.0.1 at a free port and on a unix socket in
# DIR, with trust authentication (anyone on this machine may connect as its
# superuser: for tests only). DIR holds data/ (the cluster), log, port and
# url (the URL printed by start). Debian's postgresql package provides the
# programs (/usr/lib/postgresql/<version>/bin, not on PATH; PG_BIN chooses
# another directory). initdb refuses to run as root: as root the cluster is
# made and run by the `postgres` system user (or `nobody`), which then owns
# DIR; when a parent of DIR is closed to that user, the cluster's files and
# socket go to a private directory under /tmp instead, which DIR/home
# names. Anyone else runs it as themselves. fixture-stop (or stop, then
# removing DIR and DIR/home's directory) throws the cluster away.
#
# Without PostgreSQL installed, start exits 77 with a message saying how to
# get it (scripts/install-deps.sh); tests use that to skip.
set -euo pipefail

die() { echo "pg-scratch: $*" >&2; exit 1; }

usage() { echo "usage: $0 start|stop|restart|url|fixture-start|fixture-stop DIR" >&2; exit 2; }

[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case "$cmd" in
  fixture-start)
    "$0" fixture-stop "$dir"
    rc=0
    "$0" start "$dir" || rc=$?
    if [ "$rc" -eq 77 ] && [ "${CI:-}" != true ]; then
      echo "pg-scratch: the tests that need PostgreSQL will skip" >&2
      exit 0
    fi
    exit "$rc" ;;
  fixture-stop)
    if [ -d "$dir" ]; then
      "$0" stop "$dir" >/dev/null 2>&1 || true
      if [ -f "$dir/home" ]; then rm -rf "$(cat "$dir/home")"; fi
      rm -rf "$dir"
    fi
    exit 0 ;;
esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

find_bin() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return 0; fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
  return 1
}

if ! bin=$(find_bin); then
  echo "pg-scratch: PostgreSQL is not installed (no initdb): run scripts/install-deps.sh" \
       "(Debian's postgresql package), or set PG_BIN to the directory of initdb and pg_ctl" >&2
  exit 77
fi

# Who runs the cluster: root may not; a system user does.
run_user=""
if [ "$(id -u)" -eq 0 ]; then
  if getent passwd postgres >/dev/null; then run_user=postgres; else run_user=nobody; fi
fi

as_owner() {
  if [ -n "$run_user" ]; then
    if command -v runuser >/dev/null 2>&1; then
      runuser -u "$run_user" -- "$@"
    else
      su -s /bin/sh "$run_user" -c "$(printf '%q ' "$@")"
    fi
  else
    "$@"
  fi
}

db_user() { if [ -n "$run_user" ]; then echo "$run_user"; else id -un; fi; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Where the cluster's files live (data/, log, the unix socket): DIR itself,
# or, when the cluster's user cannot reach DIR (root's checkout under a
# closed /root), a private directory under /tmp that DIR/home names.
home_of() { if [ -f "$dir/home" ]; then cat "$dir/home"; else echo "$dir"; fi; }

running() {
  local home; home=$(home_of)
  [ -f "$home/data/postmaster.pid" ] && as_owner "$bin/pg_ctl" -D "$home/data" status >/dev/null 2>&1
}

write_url() {
  echo "postgresql://$(db_user)@127.0.0.1:$(cat "$dir/port")/postgres" > "$dir/url"
  chmod a+r "$dir/url"
}

init_cluster() {
  local home=$dir
  if [ -n "$run_user" ]; then
    chown "$run_user" "$dir"
    if ! as_owner test -x "$dir"; then
      home=$(mktemp -d "${TMPDIR:-/tmp}/pg-scratch.XXXXXX")
      chown "$run_user" "$home"
      echo "$home" > "$dir/home"
    fi
  fi
  chmod 0700 "$home"
  # the unix socket's path must fit sockaddr_un (107 bytes)
  [ ${#home} -le 90 ] || die "$home is too long for the unix socket in it (at most 90 bytes)"
  as_owner "$bin/initdb" -D "$home/data" -U "$(db_user)" --auth=trust -E UTF8 --locale=C \
    --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  {
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$home'"
    echo "max_connections = 200"
    echo "logging_collector = off"
  } | as_owner tee -a "$home/data/postgresql.conf" >/dev/null
}

start_on() { # port
  local home; home=$(home_of)
  as_owner "$bin/pg_ctl" -D "$home/data" -l "$home/log" -w -t 30 -o "-p $1" start >/dev/null
}

log_tail() { tail -n "$1" "$(home_of)/log" 2>/dev/null || true; }

do_start() {
  if [ ! -f "$(home_of)/data/PG_VERSION" ]; then
    init_cluster
  fi
  if running; then
    write_url
    cat "$dir/url"
    return 0
  fi
  if [ -f "$dir/port" ]; then
    start_on "$(cat "$dir/port")" || { log_tail 20 >&2; die "cannot start"; }
  else
    local tries port
    for tries in 1 2 3 4 5 6 7 8; do
      # below Linux's ephemeral ports (32768 and up), which outgoing
      # connections take: bind would fail on one in use there
      port=$((20000 + RANDOM % 12000))
      port_in_use "$port" && continue
      if start_on "$port"; then
        echo "$port" > "$dir/port"
        break
      fi
      echo "pg-scratch: port $port: $(grep -E 'FATAL|could not' "$(home_of)/log" | tail -n 1);" \
           "trying another" >&2
      port=""
    done
    [ -n "$port" ] || { log_tail 20 >&2; die "cannot start on a free port"; }
  fi
  write_url
  cat "$dir/url"
}

do_stop() {
  if running; then
    as_owner "$bin/pg_ctl" -D "$(home_of)/data" -w -t 30 -m fast stop >/dev/null
  fi
}

case "$cmd" in
  start) do_start ;;
  stop) do_stop ;;
  restart)
    [ -f "$dir/port" ] || die "no cluster in $dir (start it first)"
    do_stop
    start_on "$(cat "$dir/port")" || { log_tail 20 >&2; die "cannot start"; }
    ;;
  url) [ -f "$dir/url" ] || die "no cluster in $dir"; cat "$dir/url" ;;
  *) usage ;;
esac
