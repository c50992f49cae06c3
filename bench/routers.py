#!/usr/bin/env python3
"""bench/routers.py - several routers, measured (docs/operations.md,
Several routers):

1. Idempotent requests per second: every request a chat completion of one
   token with an Idempotency-Key of its own (so each one claims a key and
   stores its answer in the ledger), from CLIENTS client threads spread
   over PROCS processes, each keeping its connection. Configurations:
   one router on SQLite, one on PostgreSQL (direct, and through HAProxy),
   two on one PostgreSQL through HAProxy (contrib/haproxy/spillway.cfg).
   Four shared workers (`spillway worker`, 1 thread each) serve them all;
   every configuration runs from the start, and they are measured in
   turns, REPEAT rounds (the median and each round are printed).
2. Take-over time: a job runs on router A (a worker slowed to 20 ms a
   token so it runs for seconds); A is SIGKILLed; router B's GET shows
   the job running again (attempts 2) after T seconds, and succeeded
   after U. For ledger-lease-s 2 and 10.

Usage: bench/routers.py [BUILD_DIR] (default build; haproxy and
PostgreSQL as for the tests: scripts/install-deps.sh). SECONDS_EACH=N for
each throughput run (default 4), REPEAT=N rounds (3), CLIENTS=N (16),
PROCS=N client processes (4).
It prints one line per figure.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))
import cluster as C  # noqa: E402

SECONDS = float(os.environ.get("SECONDS_EACH", "4"))
CLIENTS = int(os.environ.get("CLIENTS", "16"))
REPEAT = int(os.environ.get("REPEAT", "3"))
PROCS = int(os.environ.get("PROCS", "4"))


def psql(url, sql):
    import glob
    import shutil
    p = shutil.which("psql") or sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))[-1]
    subprocess.run([p, "-X", "-q", "-d", url, "-c", sql], check=True, capture_output=True)


# ---- throughput ---------------------------------------------------------------

def proc_main(addr, tag, threads, seconds, q):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                       "temperature": 0}).encode()
    counts = [0] * threads
    errors = [0] * threads
    t_end = time.time() + seconds

    def run(i):
        c = None
        n = 0
        while time.time() < t_end:
            n += 1
            try:
                if c is None:
                    c = http.client.HTTPConnection(*addr, timeout=30)
                c.request("POST", "/v1/chat/completions", body,
                          {"Content-Type": "application/json",
                           "Idempotency-Key": "%s-%d-%d-%d" % (tag, os.getpid(), i, n)})
                r = c.getresponse()
                r.read()
                if r.status == 200:
                    counts[i] += 1
                else:
                    errors[i] += 1
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
                    c = None
            except (OSError, http.client.HTTPException):
                errors[i] += 1
                if c:
                    c.close()
                c = None
    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put((sum(counts), sum(errors)))


def throughput(addr, tag):
    q = multiprocessing.Queue()
    per = max(1, CLIENTS // PROCS)
    ps = [multiprocessing.Process(target=proc_main, args=(addr, tag, per, SECONDS, q))
          for _ in range(PROCS)]
    t0 = time.time()
    for p in ps:
        p.start()
    got = [q.get() for _ in ps]
    for p in ps:
        p.join()
    dt = time.time() - t0
    ok = sum(g[0] for g in got)
    err = sum(g[1] for g in got)
    return ok / dt, err


def bench_throughput(d, model, pg_url):
    """Every configuration started at once, then measured in turns,
    REPEAT rounds: on a busy machine the rounds show the noise."""
    workers = [C.Worker(d, "tw%d" % i, model, max_seqs=16) for i in range(4)]
    common = "queue-size = 256\nmax-connections = 512\nkeepalive-max-requests = 1000000\n"
    pg = "ledger = %s\n" % pg_url
    s1 = C.Router(d, "s1", model, workers, common)
    p1 = C.Router(d, "p1", model, workers, common + pg)
    p2a = C.Router(d, "p2a", model, workers, common + pg)
    p2b = C.Router(d, "p2b", model, workers, common + pg)
    for r in (s1, p1, p2a, p2b):
        r.start()
    hp1 = C.HAProxy(d, [p1, p1])  # both server lines on the one router
    hp2 = C.HAProxy(d, [p2a, p2b])
    for hp in (hp1, hp2):
        for name in ("router1", "router2"):
            hp.wait_status(name, "UP", 15)
    configs = [("1 router, SQLite, direct", s1.addr),
               ("1 router, PostgreSQL, direct", p1.addr),
               ("1 router, PostgreSQL, through HAProxy", hp1.addr),
               ("2 routers, one PostgreSQL, through HAProxy", hp2.addr)]
    got = {label: [] for label, _ in configs}
    errors = {label: 0 for label, _ in configs}
    for rnd in range(REPEAT):
        for label, addr in configs:
            rps, err = throughput(addr, "r%d-%s" % (rnd, label.replace(" ", "")))
            got[label].append(rps)
            errors[label] += err
    out = []
    for label, _ in configs:
        v = sorted(got[label])
        line = "idempotent requests/s, %-44s median %5.0f  (rounds %s; errors %d; %d clients)" % (
            label + ":", v[len(v) // 2], " ".join("%.0f" % x for x in got[label]),
            errors[label], CLIENTS)
        C.log(line)
        out.append(line)
    for p in (hp1.proc, hp2.proc):
        p.kill()
        p.wait()
    for r in (s1, p1, p2a, p2b):
        r.term()
        r.proc.wait(timeout=30)
    return out


# ---- take-over ------------------------------------------------------------------

def get_job(r, jid):
    try:
        a = C.request(r.addr, "GET", "/v1/spillway/jobs/" + jid, timeout=5)
        return a.json() if a.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None


def bench_takeover(d, model, pg_url, lease_s):
    w = C.Worker(d, "slow%d" % lease_s, model, max_seqs=4, fault="stall_ms:20")
    extra = "ledger = %s\nledger-lease-s = %d\n" % (pg_url, lease_s)
    a = C.Router(d, "ta%d" % lease_s, model, [w], extra)
    b = C.Router(d, "tb%d" % lease_s, model, [w], extra)
    a.start()
    ans = C.request(a.addr, "POST", "/v1/spillway/jobs",
                    {"endpoint": "completions",
                     "request": {"prompt": "Once upon a time", "max_tokens": 400,
                                 "temperature": 0}})
    jid = ans.json()["id"]
    while (get_job(a, jid) or {}).get("state") != "running":
        time.sleep(0.02)
    b.start()  # only now: the job is A's
    time.sleep(0.5)
    t_kill = time.time()
    a.kill9()
    t_run = t_done = None
    while time.time() - t_kill < 120:
        j = get_job(b, jid) or {}
        if t_run is None and (j.get("attempts") or 0) >= 2:
            t_run = time.time() - t_kill
        if j.get("state") in ("succeeded", "failed"):
            t_done = time.time() - t_kill
            state, attempts = j["state"], j.get("attempts")
            break
        time.sleep(0.02)
    b.term()
    b.proc.wait(timeout=30)
    w.proc.kill()
    line = ("job take-over, ledger-lease-s %2d: running on the other router %.2f s after the "
            "SIGKILL, %s %.2f s after it (attempts %s)" % (lease_s, t_run or -1, state, t_done or -1,
                                                        attempts))
    C.log(line)
    return line


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "build")
    os.environ.setdefault("SPILLWAY_BIN", os.path.abspath(os.path.join(build, "spillway")))
    os.environ.setdefault("SPILLWAY_TEST_TMP", os.path.abspath(os.path.join(build, "test-tmp")))
    os.makedirs(os.environ["SPILLWAY_TEST_TMP"], exist_ok=True)
    C.need(C.find_haproxy(), "haproxy is not installed (scripts/install-deps.sh)")
    d = C.tmp_dir("bench-routers")
    pgdir = os.path.join(d, "pg")
    r = subprocess.run(["bash", C.PG_SCRATCH, "start", pgdir], capture_output=True, text=True)
    C.need(r.returncode == 0, "PostgreSQL could not be started: %s" % r.stderr.strip())
    base = r.stdout.strip().splitlines()[-1]
    try:
        psql(base, "CREATE DATABASE bench")
        url = base.rsplit("/", 1)[0] + "/bench"
        model = C.make_model(os.path.join(d, "model.gguf"))
        C.log("cpus %d, model: 64-wide 2-layer synthetic, max_tokens 1" % os.cpu_count())
        bench_throughput(d, model, url)
        for lease in (2, 10):
            bench_takeover(d, model, url, lease)
    finally:
        C.stop_all()
        subprocess.run(["bash", C.PG_SCRATCH, "stop", pgdir], capture_output=True)
    import shutil
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
