#!/usr/bin/env python3
"""pg_restart.py - PostgreSQL stopped and started again under two routers
behind HAProxy (contrib/haproxy/spillway.cfg), clients sending through
HAProxy all along:

- while it is down, plain requests (no key) all get 200, and requests
  with an Idempotency-Key get 503 ledger_unavailable with Retry-After,
  from either router; HAProxy keeps both routers UP (their /health stays
  200, with ledger.reachable false), so nothing else fails;
- once it is back, keyed requests succeed again on each router within a
  few seconds (each reconnects on its own), then through HAProxy without
  a failure, and a key's answer is replayed by both routers.

A cluster of its own (it is stopped), not the pg_scratch fixture's. Skips
(77) without haproxy or PostgreSQL, saying how to get them; fails instead
under CI=true.
"""

import http.client
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import cluster as C  # noqa: E402


def pg(verb, d):
    return subprocess.run(["bash", C.PG_SCRATCH, verb, d], capture_output=True, text=True,
                          timeout=120)


def main():
    C.need(C.find_haproxy(), "haproxy is not installed (scripts/install-deps.sh installs "
           "Debian's haproxy)")
    d = C.tmp_dir("pg-restart")
    pgdir = os.path.join(d, "pg")
    r = pg("start", pgdir)
    C.need(r.returncode != 77, "PostgreSQL is not installed (scripts/install-deps.sh installs "
           "Debian's postgresql): %s" % r.stderr.strip())
    assert r.returncode == 0, "pg-scratch.sh start: %s" % r.stderr
    url = r.stdout.strip().splitlines()[-1]
    try:
        run(d, pgdir, url)
    finally:
        C.stop_all()
        pg("stop", pgdir)


def run(d, pgdir, url):
    model = C.make_model(os.path.join(d, "model.gguf"))
    w = C.Worker(d, "worker", model, max_seqs=16)
    extra = "ledger = %s\nledger-lease-s = 2\n" % url
    r1 = C.Router(d, "r1", model, [w], extra)
    r2 = C.Router(d, "r2", model, [w], extra)
    r1.start()
    r2.start()
    hp = C.HAProxy(d, [r1, r2])
    for name in ("router1", "router2"):
        assert hp.wait_status(name, "UP", 15), "HAProxy never marked %s UP" % name

    phase = ["up"]  # up, down, back
    lock = threading.Lock()
    seen = {}  # (phase, kind, outcome) -> count
    stop = threading.Event()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}

    def note(k):
        with lock:
            seen[k] = seen.get(k, 0) + 1

    def client(i):
        n = 0
        while not stop.is_set():
            n += 1
            keyed = n % 2 == 0
            ph = phase[0]
            h = {"Idempotency-Key": "pgr-%d-%d-%d" % (os.getpid(), i, n)} if keyed else {}
            try:
                a = C.request(hp.addr, "POST", "/v1/chat/completions", body, h, timeout=30)
                code = ((a.json() or {}).get("error") or {}).get("code") if a.status != 200 else ""
                ra = a.header("Retry-After")
                out = "%d %s%s" % (a.status, code or "", " retry-after" if ra else "")
            except (OSError, http.client.HTTPException) as e:
                out = "lost " + type(e).__name__
            if phase[0] == ph:  # an answer across a switch counts for neither
                note((ph, "keyed" if keyed else "plain", out))
            time.sleep(0.01)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    phase[0] = "switching"
    r = pg("stop", pgdir)
    assert r.returncode == 0, "pg-scratch.sh stop: %s" % r.stderr
    time.sleep(1.0)  # the routers find it gone on their next call
    phase[0] = "down"
    time.sleep(3.0)
    ups = hp.servers()
    h1 = C.request(r1.addr, "GET", "/health", timeout=5)
    phase[0] = "switching"
    r = pg("start", pgdir)
    assert r.returncode == 0, "pg-scratch.sh start again: %s" % r.stderr
    # back: a keyed request sent to each router directly has succeeded (each
    # router reconnects on its own, at most once per half second, so the
    # two come back at different moments)
    t_back = time.time()
    pending = [r1.addr, r2.addr]
    while pending and time.time() - t_back < 20:
        for addr in list(pending):
            try:
                a = C.request(addr, "POST", "/v1/chat/completions", body,
                              {"Idempotency-Key": "pgr-probe-%f" % time.time()}, timeout=10)
                if a.status == 200:
                    pending.remove(addr)
            except (OSError, http.client.HTTPException):
                pass
        time.sleep(0.1)
    back_s = time.time() - t_back
    phase[0] = "back"
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join(60)
    for k in sorted(seen):
        C.log("%-6s %-5s %-40s %d" % (k[0], k[1], k[2], seen[k]))
    C.log("keyed requests succeed again on both routers %.2f s after PostgreSQL's start" % back_s)

    def only(ph, kind, want):
        got = {k[2]: n for k, n in seen.items() if k[0] == ph and k[1] == kind}
        assert got and set(got) == {want}, "%s, %s: want only '%s', got %s" % (ph, kind, want, got)

    only("up", "plain", "200 ")
    only("up", "keyed", "200 ")
    only("down", "plain", "200 ")
    only("down", "keyed", "503 ledger_unavailable retry-after")
    only("back", "plain", "200 ")
    only("back", "keyed", "200 ")
    assert all(s[0].startswith("UP") for s in ups.values()), \
        "HAProxy took a router out while PostgreSQL was down: %s" % ups
    hj = h1.json() or {}
    assert h1.status == 200 and (hj.get("ledger") or {}).get("reachable") is False, \
        "a router's /health while PostgreSQL is down: %d %s" % (h1.status, h1.body[:300])
    assert back_s < 15, "keyed requests did not succeed on both routers within 15 s of " \
        "PostgreSQL's start"
    # a key stored after the restart is replayed by both routers
    k = {"Idempotency-Key": "pgr-after-%d" % os.getpid()}
    a0 = C.request(r1.addr, "POST", "/v1/chat/completions", body, k)
    a1 = C.request(r2.addr, "POST", "/v1/chat/completions", body, k)
    assert a0.status == 200 and a1.status == 200 and a1.body == a0.body and \
        a1.header("X-Spillway-Idempotent-Replay") == "true", "the key after the restart"
    r1.term()
    r2.term()
    assert r1.proc.wait(timeout=30) == 0 and r2.proc.wait(timeout=30) == 0, "exit status"
    bad = C.sanitizer_reports([r1.log, r2.log, w.log])
    assert not bad, "sanitizer reports in %s" % bad
    import shutil
    C.stop_all()
    pg("stop", pgdir)
    shutil.rmtree(d, ignore_errors=True)
    C.log("PASS")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        C.log("FAIL: %s" % e)
        C.stop_all()
        sys.exit(1)
