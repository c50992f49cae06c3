#!/usr/bin/env bash
# llama-server killed mid-stream, the stream resumed on a spillway CPU
# worker (not in `make test`: it needs llama.cpp).
#
#   bench/llama-server-failover.sh [BUILD_DIR]        (default: build)
#   REF_DIR=/work/llamacpp-ref MODEL=FILE MAX_TOKENS=400 KILL_AFTER=8 bench/llama-server-failover.sh
#
# 1. llama-server from bench/llamacpp-build.sh (REF_DIR; built when
#    missing), run by `spillway serve` as a managed kind = llama-server
#    worker (command =), beside a spillway CPU worker of the same GGUF
#    (MODEL, default ../shared/models/stories260K.gguf, which both load).
# 2. Once the router says llama-server is ready and resumable (its
#    /tokenize gave the model's ids), one greedy completion stream through
#    the router; when the client has KILL_AFTER tokens, llama-server gets
#    SIGKILL. k, the tokens it sent, is the router's log line ("N tokens
#    sent; resuming").
# 3. Prints the client's one stream (k tokens from llama-server, then the
#    CPU worker's), and checks: HTTP 200 once, one [DONE], no error event,
#    MAX_TOKENS token ids in all, the first k llama-server's; the rest
#    equal to what the CPU worker gives when asked directly to resume
#    from those k tokens; the router's failover event (decision resume,
#    replay_worker cpu); llama-server restarted by the router. Exit 0
#    when every check holds.
#
# The continuation is the CPU worker's, not what llama-server would have
# written (the same greedy text only where both engines agree).
set -euo pipefail
. "$(dirname "$0")/llama-server-common.sh"
max_tokens=${MAX_TOKENS:-400}
kill_after=${KILL_AFTER:-8}
ctx=${CTX:-512}
port=$(free_port)
cat > "$dir/router.ini" <<EOF
[server]
listen = 127.0.0.1:$port
state-dir = $dir/state
health-interval-ms = 200
ready-timeout = 120

[model]
path = $model

[worker gpu]
kind = llama-server
; its CPU build here; on a GPU machine, its CUDA build with -ngl 99
command = $server -m {model_path} --host {host} --port {port} -c $ctx -np 1 --threads 1 --metrics --no-webui

[worker cpu]
threads = 1
ctx-limit = $ctx
calibrate = false
EOF
echo "llama-server: $server ($("$server" --version 2>&1 | grep -m1 version || echo '?'))"
echo "model: $model"
echo "router: $dir/router.ini (llama-server first, the CPU worker after it)"
ls_start_router

set +e
PORT=$port DIR=$dir MAX_TOKENS=$max_tokens KILL_AFTER=$kill_after python3 - <<'PY'
import http.client, json, os, re, signal, socket, sys, time

port = int(os.environ["PORT"]); d = os.environ["DIR"]
max_tokens = int(os.environ["MAX_TOKENS"]); kill_after = int(os.environ["KILL_AFTER"])

def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"null")

def worker(name):
    return next(w for w in get("/health")[1]["workers"] if w["name"] == name)

for _ in range(600):
    g, c = worker("gpu"), worker("cpu")
    if g["state"] == "ready" and c["state"] == "ready" and g.get("llama_server", {}).get("vocab_checked"):
        break
    time.sleep(0.2)
g = worker("gpu")
print("gpu (llama-server): state %s, pid %d, resumable %s, slots %d, ctx_limit %d" % (
    g["state"], g["pid"], g["llama_server"]["resumable"], g["llama_server"]["slots"], g["ctx_limit"]))
ok = g["state"] == "ready" and g["llama_server"]["resumable"]
pid = g["pid"]

body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True}
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
served_by = r.getheader("X-Spillway-Worker"); rid = r.getheader("X-Request-Id")
events, ids, texts, killed_at, buf = [], [], [], None, b""
while True:
    line = r.readline()
    if not line:
        break
    line = line.rstrip(b"\r\n")
    if not line.startswith(b"data: "):
        continue
    payload = line[6:].decode()
    events.append(payload)
    if payload == "[DONE]":
        continue
    j = json.loads(payload)
    for t in j.get("spillway", {}).get("token_ids", []):
        ids.append(t)
    ch = (j.get("choices") or [{}])[0]
    texts.append((len(ids), ch.get("text", "")))
    if killed_at is None and len(ids) >= kill_after:
        os.kill(pid, signal.SIGKILL)
        killed_at = len(ids)
print("stream: HTTP %d, X-Spillway-Worker %s, request %s; SIGKILL to llama-server pid %d when the client had %s tokens"
      % (r.status, served_by, rid, pid, killed_at))

time.sleep(0.5)
log = open(os.path.join(d, "router.log")).read()
m = re.search(r"request %s: worker_crash on worker gpu \(phase (\w+), (\d+) tokens sent\); resuming" % re.escape(rid), log)
k = int(m.group(2)) if m else None
print("router log: %s" % (m.group(0) if m else "no resume line for this request"))
errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
text = "".join(t for _, t in texts)
if k is not None:
    # the text at the switch: the chunks up to the k-th token are llama-server's
    head = "".join(t for n, t in texts if n <= k)
    print("\n--- the client's stream (%d tokens; [[ marks where the CPU worker takes over after k = %d) ---" % (len(ids), k))
    print(head + "[[" + text[len(head):])
    print("---")

checks = []
def check(name, cond):
    checks.append(cond)
    print("%-72s %s" % (name, "ok" if cond else "FAILED"))

check("HTTP 200, served first by gpu (llama-server)", r.status == 200 and served_by == "gpu")
check("one [DONE], at the end", events.count("[DONE]") == 1 and events[-1] == "[DONE]")
check("no error event", not errors)
check("%d token ids in all" % max_tokens, len(ids) == max_tokens)
check("llama-server killed mid-stream (0 < k < %d)" % max_tokens, k is not None and 0 < k < max_tokens)

# the CPU worker's own resume from the k tokens llama-server sent
if k is not None:
    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(os.path.join(d, "state", "cpu.sock"))
    u = Unix("cpu", timeout=120)
    rb = dict(body, max_tokens=max_tokens - k, resume={"tokens": ids[:k]})
    u.request("POST", "/v1/completions", json.dumps(rb), {"Content-Type": "application/json"})
    want = []
    for line in u.getresponse().read().split(b"\n"):
        if line.startswith(b"data: {"):
            want += json.loads(line[6:]).get("spillway", {}).get("token_ids", [])
    check("the %d tokens after k = the CPU worker's own resume from those k" % (max_tokens - k), ids[k:] == want)

evs = get("/v1/spillway/events")[1]["data"]
fo = [e for e in evs if e.get("request_id") == rid and "first_error" in e]
if fo:
    e = fo[-1]
    print("failover event: decision %s, first_error %s on %s (phase %s), replay_worker %s, outcome %s, tokens %d" % (
        e["decision"], e["first_error"]["kind"], e["first_error"]["worker"], e["first_error"]["phase"],
        e.get("replay_worker"), e["outcome"], e["tokens"]))
check("failover event: decision resume, replay_worker cpu, completed",
      bool(fo) and fo[-1]["decision"] == "resume" and fo[-1].get("replay_worker") == "cpu" and fo[-1]["outcome"] == "completed")

for _ in range(300):
    g = worker("gpu")
    if g["state"] == "ready" and g["pid"] != pid:
        break
    time.sleep(0.2)
print("gpu after: state %s, pid %d, restarts %d" % (g["state"], g["pid"], g["restarts"]))
check("llama-server restarted by the router (a new pid, ready)", g["state"] == "ready" and g["pid"] != pid)

# for comparison only (not a check): llama-server's own greedy stream of the
# same request, from the restarted process
m = re.findall(r"worker gpu: started pid %d \([^,]*, at http://([\d.]+):(\d+)\)" % g["pid"], log + open(os.path.join(d, "router.log")).read())
if m and k is not None:
    h2 = http.client.HTTPConnection(m[-1][0], int(m[-1][1]), timeout=60)
    h2.request("POST", "/completion", json.dumps({"prompt": body["prompt"], "n_predict": max_tokens, "temperature": 0,
                                                  "ignore_eos": True, "return_tokens": True}))
    own = json.loads(h2.getresponse().read()).get("tokens", [])
    same = next((i for i, (a, b) in enumerate(zip(own, ids)) if a != b), min(len(own), len(ids)))
    print("llama-server's own greedy tokens agree with the client's stream for the first %d of %d "
          "(the first k = %d are its own; after them the CPU worker's continuation)" % (same, len(ids), k))
sys.exit(0 if all(checks) and ok else 1)
PY
rc=$?
set -e
echo "router log: $dir/router.log (KEEP=1 keeps $dir)"
[ $rc -eq 0 ] && echo "llama-server-failover: all checks hold" || { echo "llama-server-failover: FAILED"; tail -30 "$dir/router.log"; }
exit $rc
