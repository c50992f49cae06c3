#!/usr/bin/env bash
# Router benchmark: the router's cost against a worker reached directly.
# Prints figures; asserts nothing.
#
#  1. Load: `spillway bench http` with max_tokens 1 (so the engine's share
#     is small and the router's is visible) against one worker directly and
#     through `spillway serve` in front of that same worker (a url worker),
#     at CLIENTS concurrent clients (default 1 32 200 1000), in ROUNDS
#     alternating rounds (bench/router_load.py). Per client count: req/s of
#     both and their ratio, the router's added p50 and p99 (router minus
#     direct, per round, median), the router process's CPU per request
#     (utime+stime from /proc/PID/stat over its runs, workers excluded),
#     the router's queue wait p50/p99 (delta of the /metrics histogram
#     spillway_router_queue_wait_seconds over the runs; n/a without it),
#     requests lost (non-2xx answers and connection errors), and the CPU
#     the load generator, the router and the worker used (on 2 cores the
#     load generator competes with both). Peak RSS (VmHWM) of the router.
#     The worker gets --max-queue big enough that it refuses nothing
#     directly; the router gets max-connections and queue-size of at least
#     the largest client count (plus a quarter: a client that reconnects at
#     once may arrive before the router counted its last connection gone).
#  1b. PROFILE=1: `perf record -g` of the router at PROFILE_CLIENTS (32)
#     clients and the top symbols (by shared object and by symbol, self
#     time); valgrind --tool=callgrind on a second router when perf cannot
#     record here.
#  2. Failover: a sim-gpu worker on the grow policy whose device
#     allocations fail one KV block after start-up (fault =
#     alloc_fail_after:N), so each stream runs out of memory in decode and
#     is resumed on the CPU worker. Per request: the router's first_error
#     time (from GET /v1/spillway/events) to the client's receipt of the
#     first token the CPU worker produced (the token after the k the GPU
#     sent; k from the router's log line), and to cpu_start_time (when the
#     replay attempt began).
#
#   bench/router.sh [BUILD_DIR]                     (default: build)
#   THREADS=1 REQUESTS=1000 ROUNDS=3 FAILOVERS=5 CLIENTS="1 32 200 1000" bench/router.sh
#   KEEPALIVE=1: clients keep their connections (bench http --keepalive)
#   PROFILE=1 PROFILE_CLIENTS=32 PROFILE_REQUESTS=6000 bench/router.sh
#     (PROFILE_OUT=DIR keeps perf.data there, for perf report -i DIR/perf.data;
#     PROFILE_TOOL=callgrind uses valgrind even where perf works)
#   FAILOVERS=0 skips part 2.
# Requests per run: REQUESTS at 1 client, else max(2*REQUESTS, 10*clients).
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
threads=${THREADS:-1}
requests=${REQUESTS:-1000}
failovers=${FAILOVERS:-5}
rounds=${ROUNDS:-3}
clients=${CLIENTS:-1 32 200 1000}
profile=${PROFILE:-0}
profile_clients=${PROFILE_CLIENTS:-32}
profile_requests=${PROFILE_REQUESTS:-6000}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$bin" ] || { echo "no $bin (build first)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/spillway

maxc=1
for c in $clients; do [ "$c" -gt "$maxc" ] && maxc=$c; done
[ "$maxc" -le 1024 ] || { echo "at most 1024 clients (spillway bench http)" >&2; exit 2; }
conns=$((maxc + maxc / 4 + 16))
[ "$conns" -ge 1000 ] || conns=1000
# descriptors: the load generator holds one per client, the router two per
# client (client + worker connection), the worker one per connection
want_fds=$((4 * maxc + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$want_fds" ]; then
  ulimit -n "$want_fds" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  [ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -ge "$want_fds" ] ||
    echo "warning: ulimit -n is $(ulimit -n), $want_fds wanted for $maxc clients" >&2
fi

tmp="/tmp/spillway-rbench-$$"
pool="rbench-$$"
mkdir -p "$tmp"
# A copy of the binary, so that a rebuild during the run does not mix two
# versions (the router runs its managed workers from /proc/self/exe).
built=$(date -r "$bin" '+%Y-%m-%d %H:%M:%S')
cp "$bin" "$tmp/spillway"
bin="$tmp/spillway"
model="$tmp/model.gguf"
pids=()

cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]+"${pids[@]}"}"; do wait "$p" 2>/dev/null || true; done
  rm -f "/dev/shm/spillway-sim-$pool"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Stops one process we started (SIGTERM, then waits for it).
stop() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=("${keep[@]+"${keep[@]}"}")
}

# Waits until GET /health on a unix socket answers 200 (or the pid exits).
wait_ready() {
  local sock=$1 pid=$2 tries=${3:-600}
  for _ in $(seq "$tries"); do
    kill -0 "$pid" 2>/dev/null || return 1
    curl -sf --unix-socket "$sock" http://x/health >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}

"$bin" model make -o "$model" --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 \
  --vocab 512 >/dev/null
body='{"prompt":"Once upon a time","max_tokens":1,"temperature":0}'
echo "binary: $build/spillway built $built, sha256 $(sha256sum "$bin" | cut -c1-12)"
echo "model: dim 128, 2 layers, vocab 512 (f32); worker: $threads thread(s), max-seqs 32," \
  "max-queue $conns; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "requests: max_tokens 1, clients $clients, $rounds rounds; router max-connections and" \
  "queue-size $conns; ulimit -n $(ulimit -n)"

# ---- 1. load: router vs the same worker directly ------------------------------
# One worker; the router reaches it as a url worker, so "direct" and
# "router" load exactly the same process. Each round measures both at every
# client count (order alternating between rounds), and the figures are
# medians over the rounds, so a burst of other load on the machine moves
# one round, not the result.
wsock="$tmp/direct.sock"
"$bin" worker --model "$model" --listen "unix:$wsock" --max-seqs 32 --threads "$threads" \
  --ctx-limit 256 --max-queue "$conns" >/dev/null 2>"$tmp/direct.log" &
wpid=$!
pids+=("$wpid")
wait_ready "$wsock" "$wpid" || { echo "worker did not start:" >&2; cat "$tmp/direct.log" >&2; exit 1; }

router_ini() { # LISTEN STATE_DIR
  cat <<EOT
[server]
listen = $1
state-dir = $2
max-connections = $conns
queue-size = $conns

[model]
path = $model

[worker cpu]
url = unix:$wsock
max-seqs = 32
EOT
}
router_ini "unix:$tmp/router.sock" "$tmp/state-overhead" >"$tmp/overhead.ini"
"$bin" serve --config "$tmp/overhead.ini" >"$tmp/router.log" 2>&1 &
rpid=$!
pids+=("$rpid")
wait_ready "$tmp/router.sock" "$rpid" || { echo "router did not start:" >&2; cat "$tmp/router.log" >&2; exit 1; }

CLIENTS="$clients" ROUNDS="$rounds" REQUESTS="$requests" BODY="$body" KEEPALIVE="${KEEPALIVE:-0}" \
  python3 "$here/router_load.py" "$bin" "$wsock" "$wpid" "$tmp/router.sock" "$rpid" \
  "$tmp/overhead.jsonl"
hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$rpid/status")
rss=$(awk '/^VmRSS/ {print $2}' "/proc/$rpid/status")
nth=$(awk '/^Threads/ {print $2}' "/proc/$rpid/status")
echo "router process: VmHWM $((hwm / 1024)) MiB, VmRSS $((rss / 1024)) MiB, $nth threads now"

# ---- 1b. PROFILE=1: where the router's time goes ---------------------------------
profile_load() { # TARGET_SOCK
  local ka=()
  [ "${KEEPALIVE:-0}" = 0 ] || ka=(--keepalive)
  "$bin" bench http --target "unix:$1" --clients "$profile_clients" \
    --requests "$profile_requests" --body "$body" "${ka[@]+"${ka[@]}"}" || true
}
if [ "$profile" != 0 ]; then
  echo
  echo "profile: the router at $profile_clients clients, $profile_requests requests"
  perf_ok=0
  tool=${PROFILE_TOOL:-perf}
  if [ "$tool" = perf ] && ! command -v perf >/dev/null 2>&1; then
    apt-get install -y linux-perf >/dev/null 2>&1 || true
  fi
  if [ "$tool" = perf ] && command -v perf >/dev/null 2>&1; then
    perf record -g -F "${PROFILE_FREQ:-2000}" -p "$rpid" -o "$tmp/perf.data" \
      >"$tmp/perf.log" 2>&1 &
    perfpid=$!
    pids+=("$perfpid")
    sleep 0.5
    profile_load "$tmp/router.sock"
    kill -INT "$perfpid" 2>/dev/null || true
    wait "$perfpid" 2>/dev/null || true
    stop "$perfpid"
    if [ -s "$tmp/perf.data" ] &&
       perf report -i "$tmp/perf.data" --stdio --no-children --sort dso -g none \
         >"$tmp/perf.dso" 2>/dev/null && grep -q '%' "$tmp/perf.dso"; then
      perf_ok=1
      [ -z "${PROFILE_OUT:-}" ] || { mkdir -p "$PROFILE_OUT" && cp "$tmp/perf.data" "$PROFILE_OUT/"; }
      grep -m1 '^# Samples' "$tmp/perf.dso" || true
      echo "by shared object (self):"
      grep -v '^#' "$tmp/perf.dso" | grep '%' | head -6
      echo "top symbols (self time, all of the router's threads):"
      perf report -i "$tmp/perf.data" --stdio --no-children --sort dso,symbol -g none \
        --percent-limit 0.5 2>/dev/null | grep -v '^#' | grep '%' | sed 's/ *-  *- *$//' |
        head -"${PROFILE_TOP:-20}"
      echo "samples by what the router was doing (bench/router_profile.py):"
      perf script -i "$tmp/perf.data" -F comm,tid,ip,sym,dso 2>/dev/null |
        python3 "$here/router_profile.py" 10
    else
      echo "perf could not record here:"; tail -5 "$tmp/perf.log"
    fi
  fi
  if [ "$perf_ok" = 0 ]; then
    command -v valgrind >/dev/null 2>&1 || apt-get install -y valgrind >/dev/null 2>&1 || true
    echo "callgrind on a second router (slow: fewer requests)"
    router_ini "unix:$tmp/cg.sock" "$tmp/state-cg" >"$tmp/cg.ini"
    valgrind --tool=callgrind --callgrind-out-file="$tmp/callgrind.out" \
      "$bin" serve --config "$tmp/cg.ini" >"$tmp/cg.log" 2>&1 &
    cgpid=$!
    pids+=("$cgpid")
    if wait_ready "$tmp/cg.sock" "$cgpid" 2400; then
      profile_requests=$((profile_requests / 10)) profile_load "$tmp/cg.sock"
      stop "$cgpid"
      [ -z "${PROFILE_OUT:-}" ] || { mkdir -p "$PROFILE_OUT" && cp "$tmp/callgrind.out" "$PROFILE_OUT/"; }
      echo "top functions by instructions (user space only; callgrind sees no kernel time):"
      callgrind_annotate "$tmp/callgrind.out" 2>/dev/null | sed -n '/PROGRAM TOTALS/,$p' |
        grep -v '^-\|^$' | sed 's|\./[^ ]*/||' | head -"${PROFILE_TOP:-20}"
    else
      echo "the router did not start under valgrind:"; tail -5 "$tmp/cg.log"
    fi
  fi
fi
stop "$rpid"
stop "$wpid"
[ "$failovers" -gt 0 ] || exit 0

# ---- 2. failover latency ------------------------------------------------------
# The device allocations a grow-policy worker makes at start-up with the GPU
# worker's options: the smallest N with which alloc_fail_after:N still
# starts (start-up is deterministic). N+1 lets one KV block (16 tokens)
# through, so a prompt of a few tokens plus 48 new ones fails in decode.
gpu_opts=(--device "sim-gpu:$pool" --sim-capacity 64MiB --max-seqs 2 --threads "$threads"
          --ctx-limit 512 --policy grow)
lo=0 hi=512
while [ "$lo" -lt "$hi" ]; do
  mid=$(((lo + hi) / 2))
  s="$tmp/probe.sock"
  SPILLWAY_FAULT="alloc_fail_after:$mid" "$bin" worker --model "$model" --listen "unix:$s" \
    "${gpu_opts[@]}" >/dev/null 2>&1 &
  p=$!
  pids+=("$p")
  if wait_ready "$s" "$p"; then hi=$mid; else lo=$((mid + 1)); fi
  stop "$p"
  rm -f "$s"
done
rm -f "/dev/shm/spillway-sim-$pool"
[ "$lo" -gt 0 ] && [ "$lo" -lt 512 ] || { echo "could not find the start-up allocations" >&2; exit 1; }

cat >"$tmp/failover.ini" <<EOF
[server]
listen = unix:$tmp/failover.sock
state-dir = $tmp/state-failover
health-interval-ms = 100

[model]
path = $model

[worker gpu]
device = sim-gpu:$pool
sim-capacity = 64MiB
max-seqs = 2
threads = $threads
ctx-limit = 512
policy = grow
fault = alloc_fail_after:$((lo + 1))

[worker cpu]
device = cpu
max-seqs = 2
threads = $threads
ctx-limit = 512
EOF
"$bin" serve --config "$tmp/failover.ini" >"$tmp/failover.log" 2>&1 &
fpid=$!
pids+=("$fpid")
wait_ready "$tmp/failover.sock" "$fpid" || { echo "router did not start:" >&2; cat "$tmp/failover.log" >&2; exit 1; }
echo
echo "failover: gpu on sim-gpu, grow policy, alloc_fail_after:$((lo + 1)) (start-up $lo);" \
  "streams of 48 tokens, $failovers requests"
python3 - "$tmp/failover.sock" "$tmp/failover.log" "$failovers" <<'EOF'
import json, re, socket, sys, time

sock_path, log_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

def http(method, path, body=b"", headers=""):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(120)
    s.connect(sock_path)
    s.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %d\r\n\r\n"
               % (method, path, headers, len(body))).encode() + body)
    return s

def get_json(path):
    s = http("GET", path)
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    s.close()
    return json.loads(buf.split(b"\r\n\r\n", 1)[1])

def gpu():
    return [w for w in get_json("/health")["workers"] if w["name"] == "gpu"][0]

def wait_gpu_ready(min_restarts):
    for _ in range(1200):
        g = gpu()
        if g["state"] == "ready" and g["restarts"] >= min_restarts:
            return g
        time.sleep(0.05)
    raise SystemExit("gpu worker did not come back")

body = json.dumps({"prompt": "Once upon a time", "max_tokens": 48, "stream": True,
                   "ignore_eos": True, "temperature": 0}).encode()
rows = []
restarts = gpu()["restarts"]
for i in range(n):
    wait_gpu_ready(restarts)
    rid = "rbench-%d-%d" % (__import__("os").getpid(), i)
    s = http("POST", "/v1/completions", body,
             "Content-Type: application/json\r\nX-Request-Id: %s\r\n" % rid)
    arrivals = []  # (wall time, token count in the event)
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        t = time.time()
        buf += d
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                line = line.strip()
                if line.startswith(b"data: {"):
                    j = json.loads(line[6:])
                    k = len(j.get("spillway", {}).get("token_ids", []))
                    if k:
                        arrivals.append((t, k))
    s.close()
    evs = [e for e in get_json("/v1/spillway/events")["data"] if e["request_id"] == rid]
    m = re.findall(r"request %s: oom on worker gpu \(phase (\w+), (\d+) tokens sent\)" % rid,
                   open(log_path).read())
    if not evs or not m:
        print("  %s: no failover (event %s, log %s)" % (rid, bool(evs), bool(m)))
        restarts = gpu()["restarts"]
        continue
    e = evs[-1]
    sent = int(m[0][1])
    total, first_cpu = 0, None
    for t, k in arrivals:
        total += k
        if total > sent:
            first_cpu = t
            break
    err_t = e["first_error"]["time"]
    row = (rid, m[0][0], sent, e["decision"], e["replay_worker"], e["tokens"],
           (e["cpu_start_time"] - err_t) * 1000,
           (first_cpu - err_t) * 1000 if first_cpu else float("nan"))
    rows.append(row)
    print("  %s: oom in %s after %d tokens, %s on %s, %d tokens; error -> cpu attempt %.3f ms, "
          "error -> first cpu token %.3f ms" % row)
    restarts += 1
if rows:
    import statistics
    a = [r[6] for r in rows]
    b = [r[7] for r in rows]
    print("error -> first CPU token: median %.3f ms, max %.3f ms (error -> CPU attempt: median "
          "%.3f ms)" % (statistics.median(b), max(b), statistics.median(a)))
EOF
stop "$fpid"
