#!/usr/bin/env python3
"""bench/queue_fairness.py - how long each request waits for a worker
when one of the workers is slow, measured (docs/router.md, Admission and
routing; Shared workers). Asserts nothing.

Two spillway workers (CPU, 1 thread, --max-seqs SLOTS, --max-queue QUEUE),
the first (w0, first in file order: the one the routers try first) started
with SPILLWAY_FAULT=stall_ms:STALL so that each of its decode steps
stalls, behind ROUTERS routers (1; or 2 sharing the workers, where the
workers' 503 worker_full refusals send requests back to their router's
queue), each polling /health every HEALTH_MS. CLIENTS client threads
(spread over the routers) loop completions of max_tokens TOKENS for RUN_S
seconds, one connection per request (KEEPALIVE=1: one per client), and
every request's latency, status, worker (X-Spillway-Worker) and queue wait
(X-Spillway-Queue-Ms) is recorded. Printed per round: the requests and
their statuses, the latency median, p99 and max, the workers' refusals
and the routers' count of them; per router its requests, latency p99 and
max, queue wait p99 and max; the most requests that started after one
request and were answered before it; the three slowest requests.

Usage: bench/queue_fairness.py [BUILD_DIR] (default build)
  ROUTERS=1 CLIENTS=6 RUN_S=4 SLOTS=2 QUEUE=0 STALL=10 TOKENS=8 ROUNDS=1
  QUEUE_TIMEOUT_MS=10000 HEALTH_MS=100 KEEPALIVE=0 STREAM=0 (1: streamed)
"""

import http.client
import json
import os
import shutil
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))
import cluster as C  # noqa: E402

ROUTERS = int(os.environ.get("ROUTERS", "1"))
CLIENTS = int(os.environ.get("CLIENTS", "6"))
RUN_S = float(os.environ.get("RUN_S", "4"))
SLOTS = int(os.environ.get("SLOTS", "2"))
QUEUE = int(os.environ.get("QUEUE", "0"))
STALL = int(os.environ.get("STALL", "10"))
TOKENS = int(os.environ.get("TOKENS", "8"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))
QUEUE_TIMEOUT_MS = int(os.environ.get("QUEUE_TIMEOUT_MS", "10000"))
HEALTH_MS = int(os.environ.get("HEALTH_MS", "100"))
KEEPALIVE = os.environ.get("KEEPALIVE", "0") == "1"
STREAM = os.environ.get("STREAM", "0") == "1"


class Worker:
    def __init__(self, d, name, model, fault=None):
        self.port = C.free_port()
        self.addr = ("127.0.0.1", self.port)
        self.log = os.path.join(d, name + ".log")
        env = {"SPILLWAY_FAULT": fault} if fault else {}
        self.proc = C.spawn([C.spillway_bin(), "worker", "--model", model, "--listen",
                             "127.0.0.1:%d" % self.port, "--threads", "1", "--ctx-limit", "512",
                             "--max-seqs", str(SLOTS), "--max-queue", str(QUEUE),
                             "--no-calibrate"], self.log, env)
        if not C.wait_health(self.addr, 30):
            raise RuntimeError("worker %s did not start (log %s)" % (name, self.log))


def metric(addr, name):
    try:
        text = C.request(addr, "GET", "/metrics", timeout=5).body.decode()
    except (OSError, http.client.HTTPException):
        return -1
    s = 0
    for ln in text.splitlines():
        if ln.startswith(name + " ") or ln.startswith(name + "{"):
            s += float(ln.rsplit(" ", 1)[1])
    return int(s)


def client(ri, addr, t_end, t0, out):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": TOKENS,
                       "ignore_eos": True, "temperature": 0, "stream": STREAM}).encode()
    c = None
    while time.time() < t_end:
        t = time.time()
        status, worker, queue_ms = -1, "", -1
        try:
            if c is None:
                c = http.client.HTTPConnection(*addr, timeout=60)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            status = r.status
            worker = r.getheader("X-Spillway-Worker", "")
            queue_ms = int(r.getheader("X-Spillway-Queue-Ms", "-1"))
            if not KEEPALIVE or r.getheader("Connection", "").lower() == "close":
                c.close()
                c = None
        except (OSError, http.client.HTTPException):
            if c:
                c.close()
            c = None
        out.append((time.time() - t, status, worker, t - t0, queue_ms, ri))
    if c:
        c.close()


def pct(xs, p):
    if not xs:
        return 0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def max_overtaken(results):
    """The most requests that started after one request and ended before
    it (its client's own next requests excluded by construction)."""
    ends = sorted(x[3] + x[0] for x in results)
    rank = {e: i + 1 for i, e in enumerate(ends)}
    tree = [0] * (len(ends) + 1)
    best = 0
    for x in sorted(results, key=lambda x: -x[3]):  # latest start first
        i = rank[x[3] + x[0]] - 1
        n = 0
        while i > 0:  # how many seen so far (started later) ended before it
            n += tree[i]
            i -= i & -i
        best = max(best, n)
        i = rank[x[3] + x[0]]
        while i <= len(ends):
            tree[i] += 1
            i += i & -i
    return best


def one_round(d, model, n):
    workers = [Worker(d, "slow%d" % n, model, "stall_ms:%d" % STALL),
               Worker(d, "fast%d" % n, model)]
    routers = []
    for i in range(ROUTERS):
        r = C.Router(d, "r%d-%d" % (n, i), model, workers,
                     extra="queue-timeout-ms = %d\n" % QUEUE_TIMEOUT_MS)
        # the cluster helper's health interval, as asked
        with open(r.cfg) as f:
            text = f.read().replace("health-interval-ms = 100",
                                    "health-interval-ms = %d" % HEALTH_MS)
        with open(r.cfg, "w") as f:
            f.write(text)
        r.start()
        routers.append(r)
    results = []
    t0 = time.time()
    t_end = t0 + RUN_S
    ths = [threading.Thread(target=client,
                            args=(i % ROUTERS, routers[i % ROUTERS].addr, t_end, t0, results))
           for i in range(CLIENTS)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    refusals = [metric(w.addr, "spillway_worker_refusals_total") for w in workers]
    seen = [metric(r.addr, "spillway_router_worker_refusals_total") for r in routers]
    C.stop_all()
    lat = [x[0] for x in results]
    statuses = {}
    for x in results:
        statuses[x[1]] = statuses.get(x[1], 0) + 1
    med = pct(lat, 0.5)
    print("round %d: %d requests %s; latency median %.3f s, p99 %.3f s, max %.3f s "
          "(max/median %.0f); worker refusals %s, seen by the routers %s"
          % (n, len(results), json.dumps(statuses, sort_keys=True), med, pct(lat, 0.99),
             max(lat) if lat else 0, (max(lat) / med) if med else 0, refusals, seen), flush=True)
    for ri in range(ROUTERS):
        mine = [x for x in results if x[5] == ri]
        q = [x[4] for x in mine if x[4] >= 0]
        print("  router %d: %d requests, latency p99 %.3f s, max %.3f s; queue wait p99 %d ms, "
              "max %d ms" % (ri, len(mine), pct([x[0] for x in mine], 0.99),
                             max([x[0] for x in mine] or [0]), pct(q, 0.99), max(q or [0])),
              flush=True)
    print("  the most later arrivals answered before one request: %d (of %d requests)"
          % (max_overtaken(results), len(results)), flush=True)
    for x in sorted(results, reverse=True)[:3]:
        print("  slowest: %.3f s, status %d, worker %s, started at %.3f s, queued %d ms"
              % (x[0], x[1], x[2] or "-", x[3], x[4]), flush=True)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    os.environ.setdefault("SPILLWAY_BIN", os.path.abspath(os.path.join(build, "spillway")))
    d = C.tmp_dir("queue-fairness")
    model = C.make_model(os.path.join(d, "model.gguf"))
    print("set-up: %d router(s), 2 workers of %d slots and --max-queue %d (one with "
          "stall_ms:%d), %d clients, max_tokens %d, %.0f s, health-interval-ms %d, "
          "queue-timeout-ms %d; %d cores, load average %s"
          % (ROUTERS, SLOTS, QUEUE, STALL, CLIENTS, TOKENS, RUN_S, HEALTH_MS,
             QUEUE_TIMEOUT_MS, os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3])),
          flush=True)
    try:
        for n in range(ROUNDS):
            one_round(d, model, n)
    finally:
        C.stop_all()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
