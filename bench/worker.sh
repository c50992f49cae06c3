#!/usr/bin/env bash
# Worker benchmark: aggregate decode tokens/s with 1, 4 and 8 concurrent
# streams on one `spillway worker` (the "small" preset model, Q8_0), and the
# time to first token of each stream under that load. Each stream asks for
# TOKENS tokens (ignore_eos) after a short prompt; "aggregate" is all
# streams' tokens over the wall time from the first request to the last
# [DONE]. Prints figures; asserts nothing.
#
#   bench/worker.sh [BUILD_DIR]            (default: build)
#   THREADS=2 TOKENS=128 CONCURRENCY="1 4 8" bench/worker.sh build-worker
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
dir="$build/models"
threads=${THREADS:-2}
tokens=${TOKENS:-128}
levels=${CONCURRENCY:-"1 4 8"}
model="$dir/bench-small-q8_0.gguf"
sock="/tmp/spillway-bench-worker-$$.sock"
mkdir -p "$dir"
[ -f "$model" ] || "$bin" model make --preset small --type q8_0 -o "$model" >/dev/null

"$bin" worker --model "$model" --listen "unix:$sock" --max-seqs 8 --threads "$threads" \
  --ctx-limit 1024 >/dev/null 2>"$build/bench-worker.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$sock"' EXIT
for _ in $(seq 100); do
  curl -sf --unix-socket "$sock" http://w/health >/dev/null 2>&1 && break
  sleep 0.1
done

python3 - "$sock" "$tokens" $levels <<'EOF'
import json, re, socket, sys, threading, time

sock_path, tokens, levels = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3:]]
prompts = ["Once upon a time there was a little dog", "The cat sat on the mat",
           "In the morning the sun came up", "She said hello to the boy",
           "A big tree stood in the park", "The bird sang a song",
           "We like to eat apples", "Tom and his friend found a box"]

def stream(i, t0, out):
    body = json.dumps({"prompt": prompts[i % len(prompts)], "max_tokens": tokens,
                       "stream": True, "ignore_eos": True, "temperature": 0}).encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(600)
    s.connect(sock_path)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: w\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    buf, first, n = b"", None, 0
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
        if first is None and re.search(rb'"token_ids":\[[0-9]', buf):
            first = time.monotonic() - t0
    s.close()
    for line in buf.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data: {"):
            try:
                j = json.loads(line[6:])
            except ValueError:
                continue
            n += len(j.get("spillway", {}).get("token_ids", []))
    out[i] = (first if first is not None else float("nan"), n, time.monotonic() - t0)

print("%-8s %10s %12s %12s %12s %12s" % ("streams", "tokens", "wall s", "agg tok/s",
                                         "ttft mean s", "ttft max s"))
for c in levels:
    out = [None] * c
    t0 = time.monotonic()
    th = [threading.Thread(target=stream, args=(i, t0, out)) for i in range(c)]
    for t in th: t.start()
    for t in th: t.join()
    wall = max(o[2] for o in out)
    total = sum(o[1] for o in out)
    ttft = [o[0] for o in out]
    print("%-8d %10d %12.2f %12.1f %12.3f %12.3f" % (c, total, wall, total / wall,
                                                      sum(ttft) / c, max(ttft)))
EOF
curl -s --unix-socket "$sock" http://w/health | python3 -c 'import json,sys; h=json.load(sys.stdin); print("worker-measured: prefill %.0f tok/s, decode %.0f tok/s (threads %s)" % (h["prefill_tokens_per_second"], h["decode_tokens_per_second"], "'"$threads"'"))'
