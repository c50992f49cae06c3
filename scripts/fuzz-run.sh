#!/usr/bin/env bash
# Runs libFuzzer harnesses for a while each and prints, per harness, the
# executions (in all, per second, per CPU second of the harness), the
# coverage (cov: edges, ft: features), the corpus size and the machine's
# load average (1 minute) at the start and at the end.
#
#   scripts/fuzz-run.sh FUZZ_DIR NAME=SECONDS [NAME=SECONDS ...]
#
# FUZZ_DIR is a `make build-fuzz` tree holding fuzz_NAME. Each harness runs
# on a copy of tests/fuzz/corpus/NAME in FUZZ_DIR/corpus/NAME (the inputs it
# finds stay there; crash files go to FUZZ_DIR/fuzz_NAME-crash-*), never in
# the source tree. The first failing harness stops the run with its log's
# tail; exit status 1. `make test-fuzz` (a few seconds each) and `make
# fuzz-long` (10 minutes each) call it; docs/operations.md, Fuzzing.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 FUZZ_DIR NAME=SECONDS..." >&2
  exit 2
fi
fuzz_dir=$1
shift
src=$(cd "$(dirname "$0")/.." && pwd)
TIMEFORMAT='%U %S' # bash's time: user and system seconds
summary=()
for spec in "$@"; do
  name=${spec%%=*}
  seconds=${spec#*=}
  bin=$fuzz_dir/fuzz_$name
  dir=$fuzz_dir/corpus/$name
  log=$fuzz_dir/fuzz_$name.log
  rm -rf "$dir" && mkdir -p "$dir"
  if [ -d "$src/tests/fuzz/corpus/$name" ]; then
    cp -R "$src/tests/fuzz/corpus/$name/." "$dir/"
  fi
  # Inputs of at most 4096 bytes; 1024 for the three whose cost grows with
  # the input (a pattern's automaton, a grammar's masks), so that their rate
  # does not fall as the corpus grows (docs/operations.md, Fuzzing)
  case $name in
    regex | gbnf | json_schema) max_len=1024 ;;
    *) max_len=4096 ;;
  esac
  echo "fuzz_$name: fuzzing for $seconds s (inputs up to $max_len bytes)"
  load_start=$(cut -d' ' -f1 /proc/loadavg)
  rc=0
  # the harness's CPU seconds (user + system): executions per CPU second
  # do not depend on how many others share the machine, executions per
  # second do
  { time "$bin" -max_total_time="$seconds" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$fuzz_dir/fuzz_$name-" "$dir" >"$log" 2>&1 \
      || rc=$?; } 2>"$log.time"
  if [ "$rc" -ne 0 ]; then
    tail -60 "$log"
    echo "fuzz_$name: FAILED (log: $log)"
    exit 1
  fi
  load_end=$(cut -d' ' -f1 /proc/loadavg)
  cpu=$(awk '{printf "%.0f", $1 + $2}' "$log.time")
  # "#N DONE cov: C ft: F corp: K/..." is the last status line
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  per_cpu=$(awk -v r="${runs:-0}" -v c="$cpu" 'BEGIN { printf "%.0f", (c > 0 ? r / c : 0) }')
  echo "$last"
  summary+=("$(printf '%-20s %5s s %11s execs %7s/s  cpu %5s s %7s/cpu-s  cov %5s  ft %6s  corpus %5s  load %s-%s  crashes 0' \
    "fuzz_$name" "$seconds" "${runs:-?}" "${rate:-?}" "$cpu" "$per_cpu" "${cov:-?}" "${ft:-?}" \
    "${corp:-?}" "$load_start" "$load_end")")
done
echo
echo "fuzzing summary:"
printf '  %s\n' "${summary[@]}"
