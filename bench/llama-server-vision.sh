#!/usr/bin/env bash
# Image requests through the router to two real llama-servers with a tiny
# vision projector (not in `make test`: it needs llama.cpp).
#
#   bench/llama-server-vision.sh [BUILD_DIR]        (default: build)
#   REF_DIR=/work/llamacpp-ref MODEL=FILE bench/llama-server-vision.sh
#   KILL_AFTER=N: the mid-stream kill after N events (default 12)
#   LS_ARGS="...": more llama-server arguments for all three (e.g. "-ub 1":
#   a prompt computed one token at a time, the arithmetic of generation)
#
# 1. A projector: bench/make-tiny-mmproj.py writes a random LLaVA-style
#    one (weights mean nothing) whose output width is the model's
#    (MODEL, default ../shared/models/stories260K.gguf, width 64).
# 2. `spillway serve` runs two managed kind = llama-server workers with
#    `mmproj =` (the router adds --mmproj): gpu (-ngl 99) first, cpu
#    (-ngl 0) after it, and a third, text (no projector), first of all.
# 3. Checks: a text chat goes to text; a chat with an image (a PNG data:
#    URL) to gpu, never text; gpu frozen (SIGSTOP) then SIGKILLed while
#    it holds an image stream with nothing sent: the stream is replayed on
#    cpu, one HTTP 200, one [DONE], no error event, its text equal to
#    cpu's llama-server's own greedy answer to the same request (asked
#    directly); gpu SIGKILLed mid-stream (after some tokens) while it
#    streams a greedy image answer: the stream is resumed on cpu (its
#    /completion with the rendered chat and the text sent, and the same
#    image), one HTTP 200, one [DONE], no error event, its text equal to
#    cpu's own uninterrupted greedy answer to the same request; and a
#    sampled image stream killed the same way ends with an error event
#    (no other server can reproduce its random stream, and no spillway
#    worker takes an image). Exit 0 when every check holds.
set -euo pipefail
. "$(dirname "$0")/llama-server-common.sh"
n_embd=$("$bin" model info "$model" 2>/dev/null | awk '$1 == "token_embd.weight" {print $3}')
python3 "$here/make-tiny-mmproj.py" "$dir/mmproj-tiny.gguf" "${n_embd:-64}"
port=$(free_port); gpu_port=$(free_port); cpu_port=$(free_port); text_port=$(free_port)
args="-m {model_path} --host {host} --port {port} -c 1024 -np 2 --threads 1 --metrics --no-webui ${LS_ARGS:-}"
cat > "$dir/router.ini" <<EOF
[server]
listen = 127.0.0.1:$port
state-dir = $dir/state
health-interval-ms = 200
ready-timeout = 120

[model]
path = $model

[worker text]
kind = llama-server
url = http://127.0.0.1:$text_port
command = $server $args -ngl 99

[worker gpu]
kind = llama-server
url = http://127.0.0.1:$gpu_port
command = $server $args -ngl 99
mmproj = $dir/mmproj-tiny.gguf

[worker cpu]
kind = llama-server
url = http://127.0.0.1:$cpu_port
command = $server $args -ngl 0
mmproj = $dir/mmproj-tiny.gguf
EOF
echo "llama-server: $server ($("$server" --version 2>&1 | grep -m1 version || echo '?'))"
echo "model: $model; projector: $dir/mmproj-tiny.gguf (random, tiny)"
ls_start_router

set +e
KILL_AFTER=${KILL_AFTER:-12} PORT=$port CPU_PORT=$cpu_port DIR=$dir python3 - <<'PY'
import http.client, json, os, signal, sys, time

port = int(os.environ["PORT"]); cpu_port = int(os.environ["CPU_PORT"]); d = os.environ["DIR"]
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5Er"
       "kJggg==")

def get(path, p=port):
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"null")

def worker(name):
    return next(w for w in get("/health")[1]["workers"] if w["name"] == name)

for _ in range(600):
    ws = [worker(n) for n in ("text", "gpu", "cpu")]
    if all(w["state"] == "ready" and w["llama_server"].get("images") is not None
           and w["llama_server"]["vocab_checked"] for w in ws):
        break
    time.sleep(0.2)
for n in ("text", "gpu", "cpu"):
    w = worker(n)
    print("%s (llama-server): state %s, pid %d, images %s" % (n, w["state"], w["pid"],
                                                             w["llama_server"].get("images")))

def body(image, stream, n=24):
    content = [{"type": "text", "text": "What is in the picture?"}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}})
    return {"messages": [{"role": "user", "content": content}], "max_tokens": n,
            "temperature": 0, "stream": stream}

def post(b, p=port, path="/v1/chat/completions", on_event=None):
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=120)
    c.request("POST", path, json.dumps(b), {"Content-Type": "application/json"})
    r = c.getresponse()
    if not b.get("stream"):
        return r.status, r.getheader("X-Spillway-Worker"), r.getheader("X-Request-Id"), json.loads(r.read())
    events = []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.rstrip(b"\r\n")
        if line.startswith(b"data: "):
            events.append(line[6:].decode())
            if on_event:
                on_event(events)
    return r.status, r.getheader("X-Spillway-Worker"), r.getheader("X-Request-Id"), events

def stream_text(events):
    t = ""
    for e in events:
        if e == "[DONE]":
            continue
        j = json.loads(e)
        for ch in j.get("choices") or []:
            t += (ch.get("delta") or {}).get("content") or ""
    return t

checks = []
def check(name, cond):
    checks.append(cond)
    print("%-78s %s" % (name, "ok" if cond else "FAILED"))

st, w, _, _ = post(body(False, False))
check("a text chat: 200 from text (the first worker)", st == 200 and w == "text")
st, w, _, ans = post(body(True, False))
check("an image chat: 200 from gpu, not text (no projector)", st == 200 and w == "gpu")
print("  gpu's answer (random projector): %r; usage %s" % (
    ans["choices"][0]["message"]["content"], ans.get("usage")))

# gpu frozen, then killed, holding an image stream with nothing sent
gpu_pid = worker("gpu")["pid"]
os.kill(gpu_pid, signal.SIGSTOP)
killer = {"done": False}
import threading
def kill_later():
    time.sleep(0.5)
    os.kill(gpu_pid, signal.SIGKILL)
    killer["done"] = True
threading.Thread(target=kill_later).start()
st, w, rid, events = post(body(True, True))
errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
check("image stream, gpu killed before its first token: HTTP 200, one [DONE], no error",
      st == 200 and events.count("[DONE]") == 1 and events[-1] == "[DONE]" and not errors)
time.sleep(0.3)
evs = get("/v1/spillway/events")[1]["data"]
fo = [e for e in evs if e.get("request_id") == rid and "first_error" in e]
if fo:
    print("  failover event: decision %s, first_error %s on %s, replay_worker %s, outcome %s" % (
        fo[-1]["decision"], fo[-1]["first_error"]["kind"], fo[-1]["first_error"]["worker"],
        fo[-1].get("replay_worker"), fo[-1]["outcome"]))
check("  the failover event: replayed on cpu (llama-server with a projector), completed",
      bool(fo) and fo[-1]["decision"] == "replay" and fo[-1].get("replay_worker") == "cpu"
      and fo[-1]["outcome"] == "completed")
st2, _, _, direct = post(body(True, False), p=cpu_port)
want = direct["choices"][0]["message"]["content"] if st2 == 200 else None
got = stream_text(events)
print("  the client's text: %r" % got)
print("  cpu's own answer:  %r" % want)
check("  its text equals cpu's llama-server's own greedy answer (same image bytes)", got == want)

def gpu_ready():
    for _ in range(600):
        if worker("gpu")["state"] == "ready" and worker("gpu")["llama_server"].get("images"):
            break
        time.sleep(0.2)
    return worker("gpu")["pid"]

def failover_event(rid):
    time.sleep(0.3)
    evs = get("/v1/spillway/events")[1]["data"]
    fo = [e for e in evs if e.get("request_id") == rid and "first_error" in e]
    return fo[-1] if fo else None

# a greedy image stream, gpu SIGKILLed mid-stream after some tokens:
# resumed on cpu from the text sent, with the same image
N_LONG, CUT = 120, int(os.environ.get("KILL_AFTER") or 12)
gpu_pid = gpu_ready()
def kill_mid_stream(events):
    if len(events) == CUT:
        os.kill(gpu_pid, signal.SIGKILL)
st, w, rid, events = post(body(True, True, N_LONG), on_event=kill_mid_stream)
errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
got = stream_text(events)
print("  mid-stream: %d events, killed after %d; error %s" % (len(events), CUT,
                                                            errors[0] if errors else None))
check("image stream, gpu killed mid-stream: HTTP 200, one [DONE], no error event",
      st == 200 and events.count("[DONE]") == 1 and events[-1] == "[DONE]" and not errors
      and len(events) > CUT)
fo = failover_event(rid)
if fo:
    print("  failover event: decision %s, first_error %s on %s, resumed on %s (%s), %s tokens "
          "in all, outcome %s" % (fo["decision"], fo["first_error"]["kind"],
                                  fo["first_error"]["worker"], fo.get("replay_worker"),
                                  fo.get("replay_worker_kind"), fo.get("tokens"), fo["outcome"]))
    print("  reason: %s" % fo.get("reason"))
check("  the failover event: resumed on cpu (llama-server with a projector), completed",
      bool(fo) and fo["decision"] == "resume" and fo.get("replay_worker") == "cpu"
      and fo["outcome"] == "completed")
st2, _, _, direct = post(body(True, False, N_LONG), p=cpu_port)
want = direct["choices"][0]["message"]["content"] if st2 == 200 else None
print("  the client's text (%d chars): %r" % (len(got), got))
print("  cpu's own answer  (%d chars): %r" % (len(want or ""), want))
check("  its text equals cpu's llama-server's own uninterrupted greedy answer", got == want)

# sampled: no resume, an error event ends it
gpu_pid = gpu_ready()
sampled = body(True, True, N_LONG)
sampled["temperature"] = 0.8
sampled["seed"] = 7
st, w, rid, events = post(sampled, on_event=kill_mid_stream)
errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
fo = failover_event(rid)
print("  sampled: %d events, error %s; decision %s" % (len(events), errors[0] if errors else None,
                                                     fo["decision"] if fo else None))
check("sampled image stream, gpu killed mid-stream: an error event, one [DONE] (no resume)",
      st == 200 and len(errors) == 1 and events.count("[DONE]") == 1)
sys.exit(0 if all(checks) else 1)
PY
status=$?
set -e
[ $status -eq 0 ] && echo "all checks hold" || { echo "a check FAILED (router log: $dir/router.log; KEEP=1 keeps it)"; }
exit $status
