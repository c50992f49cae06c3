#!/usr/bin/env bash
# Shared workers: routers in front of the same workers under a burst.
# Prints figures; asserts nothing.
#
# WORKERS spillway workers (default 2), each of SLOTS slots (4) and
# --max-queue QUEUE (0: the worker takes only what its slots hold and
# refuses the rest at once with 503 worker_full), on the CPU. In front of
# them, as url workers, 1 router and then 2 routers (each its own state
# directory and SQLite ledger). The load: `spillway bench http` on every
# router at once, CLIENTS concurrent clients each (32), REQUESTS requests
# each (600), max_tokens TOKENS (16). Per setup, ROUNDS rounds (3) on
# fresh processes, and the median round is printed:
# - requests answered 2xx and the others (every one should be 2xx: a
#   refusal sends the request back to its router's queue);
# - requests per second, all routers together (each router's count over
#   the longest run);
# - worker-side refusals (the workers' spillway_worker_refusals_total) per
#   1,000 requests, and the routers' own count of them (each refusal is
#   seen by the router whose request it was);
# - the most sequences a worker ran at once and the most requests it held
#   (max_active_seen, max_accepted_seen), against its slots + queue.
#
#   bench/shared-workers.sh [BUILD_DIR]             (default: build)
#   WORKERS=2 SLOTS=4 QUEUE=0 CLIENTS=32 REQUESTS=600 TOKENS=16 ROUNDS=3 HEALTH_MS=1000
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
workers=${WORKERS:-2}
slots=${SLOTS:-4}
queue=${QUEUE:-0}
clients=${CLIENTS:-32}
requests=${REQUESTS:-600}
tokens=${TOKENS:-16}
rounds=${ROUNDS:-3}
health_ms=${HEALTH_MS:-1000}
[ -x "$bin" ] || { echo "no $bin (build first)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/spillway

tmp="/tmp/spillway-shared-$$"
mkdir -p "$tmp"
cp "$bin" "$tmp/spillway" # a rebuild during the run does not mix versions
bin="$tmp/spillway"
model="$tmp/model.gguf"
pids=()

cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]+"${pids[@]}"}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_all() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]+"${pids[@]}"}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

wait_ready() { # SOCK PID
  for _ in $(seq 600); do
    kill -0 "$2" 2>/dev/null || return 1
    curl -sf --unix-socket "$1" http://x/health >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}

# The sum of every series of metric $2 at socket $1.
metric_sum() {
  curl -sf --unix-socket "$1" http://x/metrics |
    awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%d\n", s }'
}

"$bin" model make -o "$model" --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 \
  --vocab 512 >/dev/null
body="{\"prompt\":\"Once upon a time\",\"max_tokens\":$tokens,\"ignore_eos\":true,\"temperature\":0}"
echo "model: dim 128, 2 layers, vocab 512 (f32); $workers worker(s) of $slots slots," \
  "max-queue $queue, 1 thread each; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "load: $clients clients and $requests requests per router, max_tokens $tokens;" \
  "health-interval-ms $health_ms; median of $rounds rounds"

# One round: N routers; prints "ok errors rps refusals router_refusals
# max_active max_accepted".
round() {
  local n=$1 k i
  local socks=() rsocks=()
  for k in $(seq "$workers"); do
    local s="$tmp/w$k.sock"
    "$bin" worker --model "$model" --listen "unix:$s" --max-seqs "$slots" --threads 1 \
      --ctx-limit 256 --max-queue "$queue" >/dev/null 2>"$tmp/w$k.log" &
    pids+=($!)
    wait_ready "$s" $! || { cat "$tmp/w$k.log" >&2; exit 1; }
    socks+=("$s")
  done
  for i in $(seq "$n"); do
    local dir="$tmp/r$i"
    rm -rf "$dir"
    mkdir -p "$dir"
    {
      printf '[server]\nlisten = unix:%s/router.sock\nstate-dir = %s/state\n' "$dir" "$dir"
      printf 'queue-size = %d\nqueue-timeout-ms = 60000\nhealth-interval-ms = %d\n\n' \
        $((clients * 2 + 16)) "$health_ms"
      printf '[model]\npath = %s\n' "$model"
      for k in $(seq "$workers"); do printf '\n[worker w%d]\nurl = unix:%s\n' "$k" "${socks[k-1]}"; done
    } >"$dir/router.ini"
    "$bin" serve --config "$dir/router.ini" >"$dir/log" 2>&1 &
    pids+=($!)
    wait_ready "$dir/router.sock" $! || { cat "$dir/log" >&2; exit 1; }
    rsocks+=("$dir/router.sock")
  done
  local jobs=()
  for i in $(seq "$n"); do
    "$bin" bench http --target "unix:${rsocks[i-1]}" --clients "$clients" \
      --requests "$requests" --body "$body" --json >"$tmp/load$i.json" &
    jobs+=($!)
  done
  for j in "${jobs[@]}"; do wait "$j"; done
  local refused=0 rrefused=0 act=0 acc=0 v
  for s in "${socks[@]}"; do
    refused=$((refused + $(metric_sum "$s" spillway_worker_refusals_total)))
    v=$(metric_sum "$s" spillway_worker_slots_max_active_seen); [ "$v" -gt "$act" ] && act=$v
    v=$(metric_sum "$s" spillway_worker_max_accepted_seen); [ "$v" -gt "$acc" ] && acc=$v
  done
  for s in "${rsocks[@]}"; do
    rrefused=$((rrefused + $(metric_sum "$s" spillway_router_worker_refusals_total)))
  done
  python3 - "$refused" "$rrefused" "$act" "$acc" "$tmp"/load*.json <<'EOT'
import json, sys
refused, rrefused, act, acc = (int(x) for x in sys.argv[1:5])
runs = [json.load(open(p)) for p in sys.argv[5:]]
count = sum(r["count"] for r in runs)
errors = sum(r["errors"] for r in runs)
# all routers together: the requests over the longest run's time
secs = max(r["count"] / r["requests_per_second"] for r in runs if r["requests_per_second"] > 0)
print(count - errors, errors, round(count / secs, 1), refused, rrefused, act, acc)
EOT
  rm -f "$tmp"/load*.json
  stop_all
}

for n in 1 2; do
  results=()
  for _ in $(seq "$rounds"); do results+=("$(round "$n")"); done
  # the median round by requests per second
  med=$(printf '%s\n' "${results[@]}" | sort -k3 -g | sed -n "$(((rounds + 1) / 2))p")
  read -r ok errors rps refused rrefused act acc <<<"$med"
  total=$((ok + errors))
  per_k=$(awk -v r="$refused" -v t="$total" 'BEGIN { printf "%.1f", t ? 1000 * r / t : 0 }')
  echo "$n router(s): $ok of $total answered 2xx ($errors not); $rps req/s;" \
    "worker-side refusals $refused ($per_k per 1,000 requests; routers counted $rrefused);" \
    "max sequences at once $act, max held $acc (slots $slots + queue $queue)"
  echo "  rounds (ok errors req/s refusals router-counted max-active max-held):" \
    "$(printf '[%s] ' "${results[@]}")"
done
