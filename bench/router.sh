#!/usr/bin/env bash
# Router benchmark (issue 6). Prints figures; asserts nothing.
#
#  1. Overhead: `spillway bench http` with max_tokens 1 (so the engine's
#     share is small and the router's is visible) against a worker directly
#     and against `spillway serve` with one managed worker of the same
#     settings, at 1 and 32 clients; the added latency is router minus
#     direct, at p50 and p99 (medians of ROUNDS rounds). The router
#     process's own CPU time over its measured runs (utime+stime in
#     /proc/PID/stat, children excluded) and its peak resident memory
#     (VmHWM).
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
#   THREADS=1 REQUESTS=1000 ROUNDS=3 FAILOVERS=5 bench/router.sh build-rbench
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
threads=${THREADS:-1}
requests=${REQUESTS:-1000}
failovers=${FAILOVERS:-5}
rounds=${ROUNDS:-3}
[ -x "$bin" ] || { echo "no $bin (build first)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/spillway

tmp="/tmp/spillway-rbench-$$"
pool="rbench-$$"
mkdir -p "$tmp"
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
  local sock=$1 pid=$2
  for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || return 1
    curl -sf --unix-socket "$sock" http://x/health >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}

"$bin" model make -o "$model" --dim 128 --layers 2 --heads 4 --kv-heads 2 --ffn 256 \
  --vocab 512 >/dev/null
body='{"prompt":"Once upon a time","max_tokens":1,"temperature":0}'
echo "model: dim 128, 2 layers, vocab 512 (f32); workers: $threads thread(s), max-seqs 32"
echo "requests: max_tokens 1, $requests per run (1 client) and $((requests * 2)) (32 clients), $rounds rounds"

# ---- 1. overhead -------------------------------------------------------------
# The direct worker and the router's worker run side by side (idle when not
# measured); each round measures direct then router at 1 and at 32 clients,
# and the figures are the medians over ROUNDS rounds, so a burst of other
# load on the machine moves one round, not the result.
wsock="$tmp/direct.sock"
"$bin" worker --model "$model" --listen "unix:$wsock" --max-seqs 32 --threads "$threads" \
  --ctx-limit 256 >/dev/null 2>"$tmp/direct.log" &
wpid=$!
pids+=("$wpid")
wait_ready "$wsock" "$wpid" || { echo "worker did not start:" >&2; cat "$tmp/direct.log" >&2; exit 1; }

cat >"$tmp/overhead.ini" <<EOF
[server]
listen = unix:$tmp/router.sock
state-dir = $tmp/state-overhead

[model]
path = $model

[worker cpu]
device = cpu
ctx-limit = 256
max-seqs = 32
threads = $threads
EOF
"$bin" serve --config "$tmp/overhead.ini" >"$tmp/router.log" 2>&1 &
rpid=$!
pids+=("$rpid")
wait_ready "$tmp/router.sock" "$rpid" || { echo "router did not start:" >&2; cat "$tmp/router.log" >&2; exit 1; }

run() { # target clients requests -> one JSON line
  "$bin" bench http --target "$1" --clients "$2" --requests "$3" --body "$body" --json || true
}
for t in "unix:$wsock" "unix:$tmp/router.sock"; do run "$t" 32 64 >/dev/null; done # warm-up
tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
now_ns() { date +%s%N; }
ticks=0 router_ns=0
: >"$tmp/overhead.jsonl"
for round in $(seq "$rounds"); do
  for c in 1 32; do
    n=$requests
    [ "$c" = 1 ] || n=$((requests * 2))
    echo "{\"round\":$round,\"kind\":\"direct\",\"r\":$(run "unix:$wsock" "$c" "$n")}" >>"$tmp/overhead.jsonl"
    c0=$(cpu_ticks "$rpid")
    t0=$(now_ns)
    r=$(run "unix:$tmp/router.sock" "$c" "$n")
    t1=$(now_ns)
    c1=$(cpu_ticks "$rpid")
    ticks=$((ticks + c1 - c0))
    router_ns=$((router_ns + t1 - t0))
    echo "{\"round\":$round,\"kind\":\"router\",\"r\":$r}" >>"$tmp/overhead.jsonl"
  done
done
hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$rpid/status")
rss=$(awk '/^VmRSS/ {print $2}' "/proc/$rpid/status")
stop "$rpid"
stop "$wpid"

python3 - "$tmp/overhead.jsonl" "$ticks" "$tck" "$router_ns" "$hwm" "$rss" <<'PYEOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ticks, tck, secs = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) / 1e9
hwm, rss = int(sys.argv[5]), int(sys.argv[6])
def med(kind, c, key):
    return statistics.median(x["r"][key] for x in recs
                             if x["kind"] == kind and x["r"]["clients"] == c)
print()
print("medians of %d rounds" % max(x["round"] for x in recs))
print("%-8s %-8s %9s %9s %9s %10s %7s" % ("clients", "path", "p50 ms", "p99 ms", "mean ms",
                                         "req/s", "errors"))
for c in (1, 32):
    for kind in ("direct", "router"):
        errs = sum(x["r"]["errors"] for x in recs if x["kind"] == kind and x["r"]["clients"] == c)
        print("%-8d %-8s %9.3f %9.3f %9.3f %10.1f %7d" % (c, kind, med(kind, c, "p50_ms"),
              med(kind, c, "p99_ms"), med(kind, c, "mean_ms"), med(kind, c, "requests_per_second"),
              errs))
    print("%-8d %-8s %+9.3f %+9.3f %+9.3f" % (c, "added", med("router", c, "p50_ms") -
          med("direct", c, "p50_ms"), med("router", c, "p99_ms") - med("direct", c, "p99_ms"),
          med("router", c, "mean_ms") - med("direct", c, "mean_ms")))
n = sum(x["r"]["count"] + x["r"]["errors"] for x in recs if x["kind"] == "router")
cpu = ticks / tck
print()
print("router process over its runs (%d requests, %.2f s): CPU %.2f s (%.0f%% of one core, "
      "%.3f ms per request); VmHWM %.1f MiB, VmRSS %.1f MiB" % (n, secs, cpu, 100 * cpu / secs,
      1000 * cpu / n, hwm / 1024, rss / 1024))
PYEOF

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
