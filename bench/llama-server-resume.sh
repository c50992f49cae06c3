#!/usr/bin/env bash
# Two llama-servers as the only workers, the first SIGKILLed mid-stream,
# the stream resumed on the second (not in `make test`: it needs
# llama.cpp).
#
#   bench/llama-server-resume.sh [BUILD_DIR]        (default: build)
#   REF_DIR=/work/llamacpp-ref MODEL=FILE MAX_TOKENS=200 KILL_AFTER=20 bench/llama-server-resume.sh
#   SCHEMA=1 bench/llama-server-resume.sh          (a constrained stream)
#
# 1. llama-server from bench/llamacpp-build.sh (REF_DIR; built when
#    missing), twice, as the both-tiers recipe of docs/engines.md: worker
#    gpu with -ngl 99 first, worker cpu with -ngl 0 after it, the same
#    GGUF (MODEL, default ../shared/models/stories260K.gguf), both run by
#    `spillway serve` as managed kind = llama-server workers. On a build
#    without a GPU backend -ngl 99 is ignored and both run on the CPU.
# 2. Once the router says both are ready and resumable, one greedy
#    completion stream through the router (CHAT=1: a chat stream); when
#    the client has KILL_AFTER tokens, gpu's llama-server gets SIGKILL.
# 3. Prints the client's one stream (k tokens from gpu, then cpu's from
#    its /completion with the token prompt) and checks: HTTP 200 once, one
#    [DONE], no error event, MAX_TOKENS token ids; the failover event
#    (decision resume, first_error on gpu, a llama-server, replay_worker
#    cpu, a llama-server, completed); the text equal to llama-server's
#    own greedy answer to the same request (the same body, not streamed,
#    to cpu's llama-server directly), and the ids equal to its
#    /completion's. Exit 0 when every check holds.
#
# SCHEMA=1: the stream is constrained by a response_format json_schema
# (an object with a bounded string, an integer in 0..120, an enum, a
# date (format) and an array of at most 3 bounded strings), which the router sends each llama-server as
# spillway's GBNF form of the schema, and cpu's continuation as that
# grammar advanced over the text sent. It ends at the end of the JSON (no
# ignore_eos). Checked instead of the token count and the direct answer:
# the text and ids equal to llama-server's own greedy answer under the
# same grammar (the same request through the router once gpu is back,
# uninterrupted), and the text valid under the schema (python3
# jsonschema). Also printed, not checked: whether llama-server's own
# reading of the schema (its /completion json_schema, its own grammar,
# which allows spaces) gives the same text.
set -euo pipefail
. "$(dirname "$0")/llama-server-common.sh"
max_tokens=${MAX_TOKENS:-200}
kill_after=${KILL_AFTER:-20}
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
command = $server -m {model_path} --host {host} --port {port} -ngl 99 -c $ctx -np 1 --threads 1 --metrics --no-webui

[worker cpu]
kind = llama-server
command = $server -m {model_path} --host {host} --port {port} -ngl 0 -c $ctx -np 1 --threads 1 --metrics --no-webui
EOF
echo "llama-server: $server ($("$server" --version 2>&1 | grep -m1 version || echo '?'))"
echo "model: $model"
echo "router: $dir/router.ini (llama-server gpu -ngl 99 first, llama-server cpu -ngl 0 after it)"
ls_start_router

set +e
PORT=$port DIR=$dir MAX_TOKENS=$max_tokens KILL_AFTER=$kill_after CHAT=${CHAT:-} SCHEMA=${SCHEMA:-} python3 - <<'PY'
import http.client, json, os, re, signal, sys, time

port = int(os.environ["PORT"]); d = os.environ["DIR"]
max_tokens = int(os.environ["MAX_TOKENS"]); kill_after = int(os.environ["KILL_AFTER"])
chat = bool(os.environ.get("CHAT"))
schema = None
if os.environ.get("SCHEMA"):
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 12},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120},
                             "mood": {"enum": ["happy", "sad", "sleepy"]},
                             "born": {"type": "string", "format": "date"},
                             "friends": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                         "maxItems": 3}},
              "required": ["name", "age", "mood", "born", "friends"]}

def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"null")

def worker(name):
    return next(w for w in get("/health")[1]["workers"] if w["name"] == name)

def up(w):
    return w["state"] == "ready" and w.get("llama_server", {}).get("vocab_checked")

for _ in range(600):
    if up(worker("gpu")) and up(worker("cpu")):
        break
    time.sleep(0.2)
ok = True
for name in ("gpu", "cpu"):
    w = worker(name)
    print("%s (llama-server): state %s, pid %d, resumable %s, slots %d, ctx_limit %d" % (
        name, w["state"], w["pid"], w["llama_server"]["resumable"], w["llama_server"]["slots"],
        w["ctx_limit"]))
    ok = ok and w["state"] == "ready" and w["llama_server"]["resumable"]
pid = worker("gpu")["pid"]

if chat:
    path = "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
else:
    path = "/v1/completions"
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
if schema:
    # constrained: it ends where the JSON does
    del body["ignore_eos"]
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}}

def plain_stream(body):
    """A stream through the router, not interrupted: its ids, text, worker."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    ids, text = [], ""
    for line in r.read().split(b"\n"):
        if not line.startswith(b"data: ") or line[6:] == b"[DONE]":
            continue
        j = json.loads(line[6:])
        ids += j.get("spillway", {}).get("token_ids", [])
        ch = (j.get("choices") or [{}])[0]
        text += (ch.get("delta", {}).get("content") or "") if chat else (ch.get("text") or "")
    return r.status, ids, text, r.getheader("X-Spillway-Worker")

t0 = time.time()
c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
served_by = r.getheader("X-Spillway-Worker"); rid = r.getheader("X-Request-Id")
events, ids, texts, killed_at, t_kill = [], [], [], None, None
t_ids = []  # the arrival time of each token id
usage = None
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
    usage = j.get("usage") or usage
    new = j.get("spillway", {}).get("token_ids", [])
    ids += new
    t_ids += [time.time()] * len(new)
    ch = (j.get("choices") or [{}])[0]
    texts.append((len(ids), ch.get("delta", {}).get("content", "") if chat else ch.get("text", "")))
    if killed_at is None and len(ids) >= kill_after:
        os.kill(pid, signal.SIGKILL)
        killed_at = len(ids); t_kill = time.time()
t_total = time.time() - t0
print("stream: HTTP %d, X-Spillway-Worker %s, request %s; SIGKILL to gpu's llama-server pid %d when the client had %s tokens"
      % (r.status, served_by, rid, pid, killed_at))

time.sleep(0.5)
log = open(os.path.join(d, "router.log")).read()
m = re.search(r"request %s: worker_crash on worker gpu \(phase (\w+), (\d+) tokens sent\); resuming" % re.escape(rid), log)
k = int(m.group(2)) if m else None
print("router log: %s" % (m.group(0) if m else "no resume line for this request"))
errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
text = "".join(t for _, t in texts)
if k is not None:
    head = "".join(t for n, t in texts if n <= k)
    print("\n--- the client's stream (%d tokens; [[ marks where cpu's llama-server takes over after k = %d) ---" % (len(ids), k))
    print(head + "[[" + text[len(head):])
    print("---")
if k is not None and k < len(ids):
    # the tokens gpu had sent before it died reach the client after the
    # SIGKILL too: the gap is to the first of cpu's
    print("figures: %d tokens in %.2f s; SIGKILL to cpu's first token (the %d-th) %.1f ms" % (
        len(ids), t_total, k + 1, (t_ids[k] - t_kill) * 1000))

checks = []
def check(name, cond):
    checks.append(cond)
    print("%-76s %s" % (name, "ok" if cond else "FAILED"))

check("HTTP 200, served first by gpu (llama-server)", r.status == 200 and served_by == "gpu")
check("one [DONE], at the end", events.count("[DONE]") == 1 and events[-1] == "[DONE]")
check("no error event", not errors)
if schema:
    check("token ids for all the text, as many as usage says",
          bool(usage) and len(ids) == usage.get("completion_tokens") and 0 < len(ids) <= max_tokens)
else:
    check("%d token ids in all" % max_tokens, len(ids) == max_tokens)
check("gpu killed mid-stream (0 < k < %d)" % len(ids), k is not None and 0 < k < len(ids))

evs = get("/v1/spillway/events")[1]["data"]
fo = [e for e in evs if e.get("request_id") == rid and "first_error" in e]
if fo:
    e = fo[-1]
    print("failover event: decision %s, first_error %s on %s (%s, phase %s), replay_worker %s (%s), outcome %s, tokens %d" % (
        e["decision"], e["first_error"]["kind"], e["first_error"]["worker"],
        e["first_error"].get("worker_kind"), e["first_error"]["phase"], e.get("replay_worker"),
        e.get("replay_worker_kind"), e["outcome"], e["tokens"]))
    print("  reason: %s" % e["reason"])
check("failover event: resume from gpu (llama-server) on cpu (llama-server), completed",
      bool(fo) and fo[-1]["decision"] == "resume" and fo[-1]["first_error"].get("worker_kind") == "llama-server"
      and fo[-1].get("replay_worker") == "cpu" and fo[-1].get("replay_worker_kind") == "llama-server"
      and fo[-1]["outcome"] == "completed")

m = re.findall(r"worker cpu: started pid \d+ \([^,]*, at http://([\d.]+):(\d+)\)", log)
if schema:
    # llama-server's own greedy answer under the same grammar: the same
    # request through the router once gpu is back, uninterrupted
    for _ in range(600):
        if up(worker("gpu")) and up(worker("cpu")):
            break
        time.sleep(0.2)
    st, ref_ids, ref_text, ref_worker = plain_stream(body)
    print("reference: the same request, uninterrupted, on %s: HTTP %d, %d tokens" % (ref_worker, st, len(ref_ids)))
    print("  %s" % ref_text)
    check("the text = llama-server's own greedy answer under the same grammar", text == ref_text)
    check("the ids = its ids", ids == ref_ids)
    try:
        import jsonschema
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
        valid = True
    except Exception as ex:
        print("  not valid: %s" % ex)
        valid = False
    check("the text is JSON valid under the schema", valid)
    if m:
        h, p = m[-1][0], int(m[-1][1])
        prompt = body["prompt"] if not chat else None
        if prompt is not None:
            h4 = http.client.HTTPConnection(h, p, timeout=300)
            h4.request("POST", "/completion", json.dumps({"prompt": prompt, "n_predict": max_tokens,
                       "temperature": 0, "json_schema": schema}))
            own = json.loads(h4.getresponse().read()).get("content", "")
            print("llama-server's own reading of the schema (its json_schema): %s\n  %s (not checked)" % (
                "the same text" if own == text else "another text", own))
    sys.exit(0 if all(checks) and ok else 1)

# llama-server's own greedy answer to the same request, from cpu's server
m = re.findall(r"worker cpu: started pid \d+ \([^,]*, at http://([\d.]+):(\d+)\)", log)
if m:
    h, p = m[-1][0], int(m[-1][1])
    own_body = dict(body, stream=False)
    del own_body["stream_options"]
    h2 = http.client.HTTPConnection(h, p, timeout=300)
    h2.request("POST", path, json.dumps(own_body), {"Content-Type": "application/json"})
    a = json.loads(h2.getresponse().read())
    ch = a["choices"][0]
    own_text = ch["message"]["content"] if chat else ch["text"]
    print("usage: the stream's %s; llama-server's own %s" % (usage, a.get("usage")))
    check("usage: the same prompt_tokens, completion_tokens %d" % max_tokens,
          bool(usage) and usage.get("prompt_tokens") == a.get("usage", {}).get("prompt_tokens")
          and usage.get("completion_tokens") == max_tokens)
    check("the text = llama-server's own greedy answer to the same request", own_text == text)
    if own_text != text:
        same = next((i for i, (x, y) in enumerate(zip(own_text, text)) if x != y), min(len(own_text), len(text)))
        print("  they part at byte %d of %d / %d" % (same, len(own_text), len(text)))
    if not chat:
        h3 = http.client.HTTPConnection(h, p, timeout=300)
        h3.request("POST", "/completion", json.dumps({"prompt": body["prompt"], "n_predict": max_tokens,
                   "temperature": 0, "ignore_eos": True, "return_tokens": True}))
        own = json.loads(h3.getresponse().read()).get("tokens", [])
        check("the ids = its /completion's own greedy tokens", own == ids)
else:
    check("cpu's llama-server address in the router log", False)
sys.exit(0 if all(checks) and ok else 1)
PY
rc=$?
set -e
echo "router log: $dir/router.log (KEEP=1 keeps $dir)"
[ $rc -eq 0 ] && echo "llama-server-resume: all checks hold" || { echo "llama-server-resume: FAILED"; tail -30 "$dir/router.log"; }
exit $rc
