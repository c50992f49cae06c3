#!/usr/bin/env python3
"""kill_test.py - two routers on one PostgreSQL ledger behind HAProxy
(contrib/haproxy/spillway.cfg), two shared workers, and a tool server,
while one router is SIGKILLed every few seconds and started again.

64 clients, each a thread, send for RUN_S seconds, one after another:
- a chat completion with an Idempotency-Key (temperature 0.8 and no seed,
  so two generations would differ: the seed is in the answer);
- a job (POST /v1/spillway/jobs with an Idempotency-Key), then GET it
  until it is done;
- an agent run with an Idempotency-Key that must call `book`, a tool that
  is not idempotent; the tool server records every call it gets.
They do what docs/operations.md, Several routers, tells clients to do: a
lost connection, a 502/503 from HAProxy or the router's 503s and a 409
(after its Retry-After) are retried with the same key and body.

Then, with both routers up again:
1. nothing lost: every client operation got a final answer;
2. every job completed exactly once: state succeeded and finish_writes 1
   in the ledger, and no job was made twice (one row per job key);
3. every key has one generation and the same answer from both routers:
   the same request with the same key, sent to each router directly, is a
   replay (X-Spillway-Idempotent-Replay: true) from both, with the same
   body and X-Request-Id as each other and as the client's final answer;
4. every tool action ran at most once: no (request id, step) reached the
   tool server twice, and an agent run's answer carries the result of the
   one call made for its request id.
Each check prints its counts; the test fails if any check fails.

Needs haproxy and PostgreSQL (scripts/install-deps.sh): skips (77) saying
so without them, fails instead under CI=true. PostgreSQL: the ctest
pg_scratch fixture's cluster (SPILLWAY_PG_URL_FILE), else one of its own.
"""

import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(__file__))
import cluster as C  # noqa: E402

CLIENTS = int(os.environ.get("KILL_CLIENTS", "64"))
RUN_S = float(os.environ.get("KILL_RUN_S", "24"))
KILL_EVERY_S = 3.0
LEASE_S = 2
FINAL_WAIT_S = 60  # after RUN_S: the longest an operation may take to end

TOOL_PARAMS = json.dumps({"type": "object", "properties": {"name": {"type": "string",
                          "maxLength": 8}}, "required": ["name"]})


# ---- the tool server ------------------------------------------------------

class ToolLog:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []  # (idempotency key, request id, body)

    def add(self, key, rid, body):
        with self.lock:
            self.calls.append((key, rid, body))
            return len(self.calls)


def tool_server(log):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - http.server's name
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n).decode("utf-8", "replace")
            k = log.add(self.headers.get("Idempotency-Key"), self.headers.get("X-Request-Id"),
                        body)
            out = ("BOOKED-%d" % k).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# ---- PostgreSQL -------------------------------------------------------------

def psql_bin():
    import glob
    import shutil
    return shutil.which("psql") or (sorted(glob.glob("/usr/lib/postgresql/*/bin/psql")) or
                                    [None])[-1]


def psql(url, sql):
    r = subprocess.run([psql_bin(), "-X", "-q", "-A", "-t", "-F", "\t", "-d", url, "-c", sql],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("psql %s: %s" % (sql[:60], r.stderr))
    return [ln.split("\t") for ln in r.stdout.splitlines() if ln]


def database(d):
    """A database of its own on the fixture's cluster or a cluster of its
    own: (its URL, the cluster dir to stop at the end or None)."""
    own = None
    base = None
    f = os.environ.get("SPILLWAY_PG_URL_FILE")
    if f and os.path.exists(f):
        base = open(f).read().strip()
    if not base:
        own = os.path.join(d, "pg")
        r = subprocess.run(["bash", C.PG_SCRATCH, "start", own], capture_output=True, text=True,
                           timeout=120)
        C.need(r.returncode != 77, "PostgreSQL is not installed (scripts/install-deps.sh installs "
               "Debian's postgresql): %s" % r.stderr.strip())
        if r.returncode != 0:
            raise RuntimeError("pg-scratch.sh start: %s" % r.stderr)
        base = r.stdout.strip().splitlines()[-1]
    name = "kill_%d" % os.getpid()
    psql(base, "CREATE DATABASE %s" % name)
    return base.rsplit("/", 1)[0] + "/" + name, base, own


# ---- the clients ------------------------------------------------------------

class Op:
    """One client operation: its key, kind and body, and the final answer."""

    def __init__(self, kind, key, path, body):
        self.kind, self.key, self.path, self.body = kind, key, path, body
        self.final = None      # C.Answer
        self.tries = 0
        self.retried = {}      # why -> count
        self.job = None        # a job's final GET body (dict)
        self.last = None       # a job's last GET: status and state


def retry_why(a):
    """Why an answer is to be retried (None: it is final)."""
    if a.status == 409:
        return "409"
    if a.status in (502, 503, 504):
        j = a.json()
        code = ((j or {}).get("error") or {}).get("code") if isinstance(j, dict) else None
        if a.status == 502 and code == "unsafe_to_retry":
            return None  # the router's stored answer: final
        return "%d %s" % (a.status, code or "haproxy")
    return None


def send(hp, op, deadline):
    """Sends op (and its retries) until a final answer or the deadline."""
    while time.time() < deadline:
        op.tries += 1
        try:
            a = C.request(hp.addr, "POST", op.path, op.body,
                          {"Idempotency-Key": op.key}, timeout=30)
        except (OSError, http.client.HTTPException) as e:
            why = "lost: " + type(e).__name__
            op.retried[why] = op.retried.get(why, 0) + 1
            time.sleep(0.2)
            continue
        why = retry_why(a)
        if why is None:
            op.final = a
            return True
        op.retried[why] = op.retried.get(why, 0) + 1
        ra = a.header("Retry-After")
        time.sleep(min(float(ra), 2.0) if ra and ra.isdigit() else 0.2)
    return False


def poll_job(hp, op, deadline):
    jid = (op.final.json() or {}).get("id")
    if not jid:
        return False
    while time.time() < deadline:
        try:
            a = C.request(hp.addr, "GET", "/v1/spillway/jobs/" + jid, timeout=10)
        except (OSError, http.client.HTTPException):
            time.sleep(0.2)
            continue
        j = a.json() if a.status == 200 else None
        op.last = "%d %s" % (a.status, (j or {}).get("state") if j else a.body[:100])
        if j and j.get("state") in ("succeeded", "failed"):
            op.job = j
            return True
        time.sleep(0.2)
    return False


def client(hp, idx, ops, stop_at, deadline):
    rnd = random.Random(idx)
    n = 0
    while time.time() < stop_at:
        n += 1
        key = "kill-%d-%d-%d" % (os.getpid(), idx, n)
        kind = ("chat", "job", "agent")[(idx + n) % 3]
        msg = [{"role": "user", "content": "Tell me about %s" % rnd.choice(
            ["rivers", "owls", "maps", "tea", "snow", "bells"])}]
        if kind == "chat":
            op = Op(kind, key, "/v1/chat/completions",
                    {"messages": msg, "max_tokens": 8, "temperature": 0.8})
        elif kind == "job":
            op = Op(kind, key, "/v1/spillway/jobs",
                    {"endpoint": "chat", "request": {"messages": msg, "max_tokens": 8,
                                                     "temperature": 0.8}})
        else:
            op = Op(kind, key, "/v1/chat/completions",
                    {"messages": msg, "max_tokens": 64, "temperature": 0.8,
                     "tool_execution": "server",
                     "tool_choice": {"type": "function", "function": {"name": "book"}}})
        ops.append(op)
        if send(hp, op, deadline) and kind == "job" and op.final.status == 202:
            poll_job(hp, op, deadline)


# ---- the run ----------------------------------------------------------------

def kill_loop(routers, until, log):
    """SIGKILLs r1, r2, r1 ... every KILL_EVERY_S until `until`, starting
    each again at once. On the main thread: a process started here dies
    with the thread that started it (PR_SET_PDEATHSIG)."""
    k = 0
    while time.time() + KILL_EVERY_S < until:
        time.sleep(KILL_EVERY_S)
        r = routers[k % 2]
        k += 1
        t0 = time.time()
        r.kill9()
        try:
            r.start()
        except RuntimeError as e:
            log.append("restart failed: %s" % e)
            return
        log.append("SIGKILL %s, back in %.2f s" % (r.name, time.time() - t0))
    time.sleep(max(0.0, until - time.time()))


def check(name, ok, detail):
    C.log("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail))
    return ok


def main():
    C.need(C.find_haproxy(), "haproxy is not installed (scripts/install-deps.sh installs "
           "Debian's haproxy)")
    C.need(psql_bin(), "PostgreSQL's psql is not installed (scripts/install-deps.sh installs "
           "Debian's postgresql)")
    d = C.tmp_dir("kill")
    url, base, own_pg = database(d)
    model = C.make_model(os.path.join(d, "model.gguf"))
    workers = [C.Worker(d, "w%d" % i, model, max_seqs=16) for i in range(2)]
    tlog = ToolLog()
    tsrv = tool_server(tlog)
    tools = ("[tool book]\ndescription = Books a table\nurl = http://127.0.0.1:%d/book\n"
             "parameters = %s\nidempotent = false\ntimeout-ms = 3000\n"
             % (tsrv.server_address[1], TOOL_PARAMS))
    extra = ("ledger = %s\nledger-lease-s = %d\njob-workers = 4\nmax-tool-steps = 1\n"
             "queue-size = 256\nmax-connections = 512\n" % (url, LEASE_S))
    routers = [C.Router(d, "r%d" % i, model, workers, extra, tools) for i in (1, 2)]
    for r in routers:
        r.start()
    hp = C.HAProxy(d, routers)
    for name in ("router1", "router2"):
        assert hp.wait_status(name, "UP", 15), "HAProxy never marked %s UP" % name

    ops, kills = [], []
    t0 = time.time()
    stop_at, deadline = t0 + RUN_S, t0 + RUN_S + FINAL_WAIT_S
    threads = [threading.Thread(target=client, args=(hp, i, ops, stop_at, deadline))
               for i in range(CLIENTS)]
    for t in threads:
        t.start()
    kill_loop(routers, stop_at, kills)
    for t in threads:
        t.join(FINAL_WAIT_S + 30)
    run_s = time.time() - t0
    for ln in kills:
        C.log(ln)
    for r in routers:
        if not r.running():
            r.start()

    by_kind = {}
    for op in ops:
        by_kind.setdefault(op.kind, []).append(op)
    retries = {}
    for op in ops:
        for why, n in op.retried.items():
            retries[why] = retries.get(why, 0) + n
    C.log("%d clients, %.1f s, %d router kills; operations: %s; retries: %s" % (
        CLIENTS, run_s, len([k for k in kills if k.startswith("SIGKILL")]),
        {k: len(v) for k, v in by_kind.items()}, retries))
    ok = True

    # 1. nothing lost
    lost = [op for op in ops if op.final is None or (op.kind == "job" and op.final.status == 202
                                                     and op.job is None)]
    finals = {}
    for op in ops:
        if op.final is not None:
            s = "%s %d" % (op.kind, op.final.status)
            finals[s] = finals.get(s, 0) + 1
    ok &= check("nothing lost", not lost and len(kills) >= 3,
                "%d operations, %d without a final answer %s; final answers %s; kills %d" % (
                    len(ops), len(lost), [(o.kind, o.key, o.retried, o.last,
                                                 o.final and (o.final.json() or {}).get("id"))
                                                for o in lost[:3]], finals,
                    len(kills)))

    # 2. jobs exactly once
    jobs = [op for op in by_kind.get("job", []) if op.final is not None]
    ids = [(op.final.json() or {}).get("id") for op in jobs if op.final.status == 202]
    rows = {r[0]: r for r in psql(url, "SELECT id, state, finish_writes, attempts FROM jobs")}
    bad = [(i, rows.get(i)) for i in ids if not rows.get(i) or rows[i][1] != "succeeded"
           or rows[i][2] != "1"]
    not_202 = [(op.key, op.final.status, op.final.body[:120]) for op in jobs
               if op.final.status != 202]
    multi = sum(1 for i in ids if rows.get(i) and int(rows[i][3]) > 1)
    ok &= check("jobs exactly once",
                not bad and not not_202 and len(set(ids)) == len(ids) and len(rows) == len(ids),
                "%d jobs (%d ledger rows), %d not succeeded once %s, %d answers not 202 %s; "
                "%d taken over (attempts > 1)" % (len(ids), len(rows), len(bad), bad[:3],
                                                  len(not_202), not_202[:2], multi))

    # 3. one generation per key, the same answer from both routers
    keyed = [op for op in ops if op.final is not None and op.kind in ("chat", "agent", "job")]
    mism = []
    for op in keyed:
        got = []
        for r in routers:
            try:
                a = C.request(r.addr, "POST", op.path, op.body, {"Idempotency-Key": op.key},
                              timeout=30)
            except (OSError, http.client.HTTPException) as e:
                got.append(("error", repr(e)))
                continue
            got.append(a)
        problems = []
        for r, a in zip(routers, got):
            if isinstance(a, tuple):
                problems.append("%s: %s" % (r.name, a[1]))
            elif a.header("X-Spillway-Idempotent-Replay") != "true":
                problems.append("%s: not a replay (%d)" % (r.name, a.status))
        if not problems:
            a1, a2 = got
            if a1.body != a2.body or a1.header("X-Request-Id") != a2.header("X-Request-Id"):
                problems.append("the routers answer differently")
            elif a1.body != op.final.body or a1.status != op.final.status:
                problems.append("the client's answer differs from the stored one")
            elif op.final.header("X-Request-Id") != a1.header("X-Request-Id"):
                problems.append("another X-Request-Id than the client's")
        if problems:
            mism.append((op.kind, op.key, problems))
    ok &= check("one answer per key from both routers", not mism,
                "%d keys asked of both routers, %d differ %s" % (len(keyed), len(mism), mism[:3]))

    # 4. tool actions at most once
    seen, twice = {}, []
    for key, rid, body in tlog.calls:
        if key in seen:
            twice.append(key)
        seen[key] = rid
    agents = [op for op in by_kind.get("agent", []) if op.final is not None]
    unmatched, unsafe = [], 0
    for op in agents:
        if op.final.status == 502:
            unsafe += 1
            continue
        j = op.final.json() or {}
        steps = (j.get("spillway") or {}).get("tool_steps") or []
        rid = op.final.header("X-Request-Id")
        for st in steps:
            res = st.get("result", "")
            n = int(res.split("-")[1]) if res.startswith("BOOKED-") else 0
            if not (1 <= n <= len(tlog.calls)) or tlog.calls[n - 1][1] != rid:
                unmatched.append((op.key, res))
    ok &= check("tool actions at most once", not twice and not unmatched,
                "%d calls to the tool, %d (request id, step) called twice %s; %d agent runs "
                "(%d answered 502 unsafe_to_retry), %d results not from their own call %s" % (
                    len(tlog.calls), len(twice), twice[:3], len(agents), unsafe, len(unmatched),
                    unmatched[:3]))

    for r in routers:
        r.term()
        r.proc.wait(timeout=30)
    C.stop_all()
    tsrv.shutdown()
    if ok:
        try:
            psql(base, "DROP DATABASE IF EXISTS kill_%d" % os.getpid())
        except RuntimeError:
            pass
    if own_pg:
        subprocess.run(["bash", C.PG_SCRATCH, "stop", own_pg], capture_output=True, timeout=60)
    bad = C.sanitizer_reports([r.log for r in routers] + [w.log for w in workers])
    ok &= check("no sanitizer report", not bad, "%s" % (bad or "none"))
    if not ok:
        C.log("FAIL: the logs are in %s; the ledger: %s%s" % (
            d, url, " (scripts/pg-scratch.sh start %s)" % own_pg if own_pg else ""))
        sys.exit(1)
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    C.log("PASS")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, RuntimeError) as e:
        C.log("FAIL: %s" % e)
        C.stop_all()
        sys.exit(1)
    finally:
        C.stop_all()
