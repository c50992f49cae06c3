#!/usr/bin/env python3
"""Load phase of bench/router.sh: the router against the same worker directly.

For each round and each client count, runs `spillway bench http` (max_tokens
1) against the worker's socket and against the router's, in alternating
order between rounds, and records per run:

  - bench http's JSON (req/s, p50/p99/mean of the 2xx answers, errors =
    non-2xx answers + connection errors),
  - CPU time (utime+stime, /proc/PID/stat) of the router and of the worker
    over the run, and of the load generator itself (getrusage of the child),
  - for router runs, the delta of the router's /metrics over the run: the
    histogram spillway_router_queue_wait_seconds (if the router has it) and
    spillway_router_requests_total by outcome.

Then prints the table. Figures, not a test: it asserts nothing and exits 0
unless the load generator itself could not run.

usage: router_load.py BIN WORKER_SOCK WORKER_PID ROUTER_SOCK ROUTER_PID OUT.jsonl
  environment: CLIENTS ("1 32 200 1000"), ROUNDS (3), REQUESTS (1000),
  KEEPALIVE (0), BODY (the JSON body)
"""
import json
import math
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1
QW = "spillway_router_queue_wait_seconds"


def cpu_s(pid):
    """utime+stime of a live process, seconds (children excluded)."""
    with open("/proc/%d/stat" % pid) as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / HZ  # fields 14 and 15


def child_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def get(sock_path, path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock_path)
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    s.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        out, rest = b"", body
        while rest:
            line, _, rest = rest.partition(b"\r\n")
            n = int(line.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return body.decode("utf-8", "replace")


LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(sock_path):
    """{'qw': None | {'buckets': {le: n}, 'count': n, 'sum': s}, 'outcomes': {...}}"""
    try:
        text = get(sock_path, "/metrics")
    except OSError:
        return {"qw": None, "outcomes": {}}
    qw = {"buckets": {}, "count": 0.0, "sum": 0.0}
    seen = False
    outcomes = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        name, labels, v = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(v)
        except ValueError:
            continue
        if name == QW + "_bucket":
            le = re.search(r'le="([^"]*)"', labels)
            if le:
                seen = True
                k = le.group(1)
                qw["buckets"][k] = qw["buckets"].get(k, 0.0) + v
        elif name == QW + "_count":
            seen = True
            qw["count"] += v
        elif name == QW + "_sum":
            qw["sum"] += v
        elif name in ("spillway_router_refusals_total",
                      "spillway_router_worker_refusals_total"):
            r = re.search(r'reason="([^"]*)"', labels)
            w = re.search(r'worker="([^"]*)"', labels)
            k = "refused %s%s" % (r.group(1) if r else "?", "@" + w.group(1) if w else "")
            outcomes[k] = outcomes.get(k, 0.0) + v
        elif name == "spillway_router_requests_total":
            o = re.search(r'outcome="([^"]*)"', labels)
            w = re.search(r'worker="([^"]*)"', labels)
            k = "%s/%s" % (w.group(1) if w else "?", o.group(1) if o else "?")
            outcomes[k] = outcomes.get(k, 0.0) + v
    return {"qw": qw if seen and qw["buckets"] else None, "outcomes": outcomes}


def delta(a, b):
    """b - a of two scrapes."""
    d = {"qw": None, "outcomes": {}}
    if a["qw"] is not None and b["qw"] is not None:
        d["qw"] = {"buckets": {k: v - a["qw"]["buckets"].get(k, 0.0)
                               for k, v in b["qw"]["buckets"].items()},
                   "count": b["qw"]["count"] - a["qw"]["count"],
                   "sum": b["qw"]["sum"] - a["qw"]["sum"]}
    for k, v in b["outcomes"].items():
        x = v - a["outcomes"].get(k, 0.0)
        if x:
            d["outcomes"][k] = x
    return d


def le_value(k):
    return math.inf if k in ("+Inf", "Inf", "inf") else float(k)


def hist_quantile(h, q):
    """Prometheus histogram_quantile: linear inside the bucket. Returns
    (seconds, text)."""
    bs = sorted(((le_value(k), v) for k, v in h["buckets"].items()), key=lambda x: x[0])
    total = bs[-1][1] if bs else 0
    if total <= 0:
        return None, "no obs"
    rank = q * total
    prev_le, prev_n = 0.0, 0.0
    for i, (le, n) in enumerate(bs):
        if n >= rank:
            if math.isinf(le):
                return prev_le, ">%s" % fmt_s(prev_le)
            if i == 0:  # nothing to interpolate from: below the first bound
                return le, "<%s" % fmt_s(le)
            if n == prev_n:
                return le, fmt_s(le)
            x = prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
            return x, fmt_s(x)
        prev_le, prev_n = le, n
    return prev_le, fmt_s(prev_le)


def fmt_s(s):
    if s < 1e-3:
        return "%.0f us" % (s * 1e6)
    if s < 1:
        return ("%.3g ms" % (s * 1e3)) if s < 0.01 else "%.1f ms" % (s * 1e3)
    return "%.2f s" % s


def n_requests(c, base):
    return base if c == 1 else max(2 * base, 10 * c)


def main():
    bin_, wsock, wpid, rsock, rpid, out = sys.argv[1:7]
    wpid, rpid = int(wpid), int(rpid)
    clients = [int(x) for x in os.environ.get("CLIENTS", "1 32 200 1000").split()]
    rounds = int(os.environ.get("ROUNDS", "3"))
    base = int(os.environ.get("REQUESTS", "1000"))
    keepalive = os.environ.get("KEEPALIVE", "0") not in ("", "0")
    body = os.environ.get("BODY", '{"prompt":"Once upon a time","max_tokens":1,"temperature":0}')
    targets = {"direct": "unix:" + wsock, "router": "unix:" + rsock}

    def bench(kind, c, n):
        cmd = [bin_, "bench", "http", "--target", targets[kind], "--clients", str(c),
               "--requests", str(n), "--body", body, "--json"]
        if keepalive:
            cmd.append("--keepalive")
        before = scrape(rsock) if kind == "router" else None
        r0, w0, k0 = cpu_s(rpid), cpu_s(wpid), child_cpu_s()
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.monotonic() - t0
        r1, w1, k1 = cpu_s(rpid), cpu_s(wpid), child_cpu_s()
        after = scrape(rsock) if kind == "router" else None
        try:
            res = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            sys.stderr.write("bench http failed (%s, %d clients): %s\n" % (kind, c,
                                                                          p.stderr.strip()))
            res = {"clients": c, "count": 0, "errors": n, "requests_per_second": 0.0,
                   "p50_ms": None, "p99_ms": None, "mean_ms": None, "failed": True}
        rec = {"kind": kind, "clients": c, "requests": n, "r": res, "wall_s": wall,
               "router_cpu_s": r1 - r0, "worker_cpu_s": w1 - w0, "client_cpu_s": k1 - k0}
        if kind == "router":
            rec["metrics"] = delta(before, after)
        return rec

    # warm-up: each target once at the largest client count
    for kind in ("direct", "router"):
        bench(kind, max(clients), max(clients))
        bench(kind, min(32, max(clients)), 256)

    recs = []
    with open(out, "w") as f:
        for rnd in range(1, rounds + 1):
            for c in clients:
                n = n_requests(c, base)
                order = ("direct", "router") if rnd % 2 else ("router", "direct")
                for kind in order:
                    rec = bench(kind, c, n)
                    rec["round"] = rnd
                    recs.append(rec)
                    f.write(json.dumps(rec) + "\n")
                    r = rec["r"]
                    sys.stderr.write("  round %d, %4d clients, %-6s: %7.0f req/s, p50 %s ms, "
                                     "p99 %s ms, errors %d\n" % (
                                         rnd, c, kind, r["requests_per_second"],
                                         "%.2f" % r["p50_ms"] if r["p50_ms"] is not None else "-",
                                         "%.2f" % r["p99_ms"] if r["p99_ms"] is not None else "-",
                                         r["errors"]))
    report(recs, clients, rounds, keepalive)


def report(recs, clients, rounds, keepalive):
    def runs(kind, c):
        return sorted((x for x in recs if x["kind"] == kind and x["clients"] == c),
                      key=lambda x: x["round"])

    def med(v):
        v = [x for x in v if x is not None]
        return statistics.median(v) if v else None

    def f(v, spec="%.2f"):
        return "-" if v is None else spec % v

    print()
    print("router vs the same worker directly: max_tokens 1, %s; medians of %d rounds "
          "(ratio and added latency: medians of the per-round pairs)"
          % ("keep-alive connections" if keepalive else "one connection per request", rounds))
    hdr = ("%-7s %10s %10s %6s %17s %17s %9s %9s"
           % ("clients", "direct/s", "router/s", "ratio", "direct p50/p99", "router p50/p99",
              "+p50 ms", "+p99 ms"))
    print(hdr)
    print("-" * len(hdr))
    for c in clients:
        d, r = runs("direct", c), runs("router", c)
        pairs = list(zip(d, r))
        ratio = med([b["r"]["requests_per_second"] / a["r"]["requests_per_second"]
                     for a, b in pairs if a["r"]["requests_per_second"]])
        a50 = med([b["r"]["p50_ms"] - a["r"]["p50_ms"] for a, b in pairs
                   if a["r"]["p50_ms"] is not None and b["r"]["p50_ms"] is not None])
        a99 = med([b["r"]["p99_ms"] - a["r"]["p99_ms"] for a, b in pairs
                   if a["r"]["p99_ms"] is not None and b["r"]["p99_ms"] is not None])
        print("%-7d %10s %10s %6s %17s %17s %9s %9s" % (
            c, f(med([x["r"]["requests_per_second"] for x in d]), "%.0f"),
            f(med([x["r"]["requests_per_second"] for x in r]), "%.0f"), f(ratio, "%.2f"),
            "%s / %s" % (f(med([x["r"]["p50_ms"] for x in d])), f(med([x["r"]["p99_ms"] for x in d]))),
            "%s / %s" % (f(med([x["r"]["p50_ms"] for x in r])), f(med([x["r"]["p99_ms"] for x in r]))),
            f(a50, "%+.2f"), f(a99, "%+.2f")))

    print()
    print("router cost and losses (sums over the rounds); CPU: %% of one core over the router "
          "runs' wall time (%d cores = %d%%)" % (NCPU, 100 * NCPU))
    hdr = ("%-7s %12s %11s %11s %14s %14s %16s %13s"
           % ("clients", "router CPU", "queue p50", "queue p99", "lost direct", "lost router",
              "router runs: cpu", "direct: cpu"))
    print(hdr)
    print("%-7s %12s %11s %11s %14s %14s %16s %13s" % ("", "ms/request", "", "", "", "",
                                                     "client/rtr/wkr", "client/wkr"))
    print("-" * len(hdr))
    notes = []
    bounds = ""
    for c in clients:
        d, r = runs("direct", c), runs("router", c)
        nreq = sum(x["requests"] for x in r)
        rcpu = sum(x["router_cpu_s"] for x in r)
        wall = sum(x["wall_s"] for x in r) or 1e-9
        qws = [x["metrics"]["qw"] for x in r]
        if any(q is None for q in qws):
            q50 = q99 = "n/a"
        else:
            h = {"buckets": {}, "count": sum(q["count"] for q in qws),
                 "sum": sum(q["sum"] for q in qws)}
            for q in qws:
                for k, v in q["buckets"].items():
                    h["buckets"][k] = h["buckets"].get(k, 0.0) + v
            q50, q99 = hist_quantile(h, 0.50)[1], hist_quantile(h, 0.99)[1]
            bounds = " ".join(k for k in sorted(h["buckets"], key=le_value))
            if h["count"] > 0:
                notes.append("  %d clients: queue wait observed %d times, mean %s"
                             % (c, h["count"], fmt_s(h["sum"] / h["count"])))
        lost_d = sum(x["r"]["errors"] for x in d)
        lost_r = sum(x["r"]["errors"] for x in r)
        outs = {}
        for x in r:
            for k, v in x["metrics"]["outcomes"].items():
                if not k.endswith("/ok"):
                    outs[k] = outs.get(k, 0) + v
        if outs:
            notes.append("  %d clients: router outcomes other than ok: %s" % (
                c, ", ".join("%s %d" % (k, v) for k, v in sorted(outs.items()))))
        cpu = "%.0f/%.0f/%.0f" % (100 * sum(x["client_cpu_s"] for x in r) / wall,
                                  100 * rcpu / wall,
                                  100 * sum(x["worker_cpu_s"] for x in r) / wall)
        dwall = sum(x["wall_s"] for x in d) or 1e-9
        dcpu = "%.0f/%.0f" % (100 * sum(x["client_cpu_s"] for x in d) / dwall,
                              100 * sum(x["worker_cpu_s"] for x in d) / dwall)
        print("%-7d %12.3f %11s %11s %14s %14s %16s %13s" % (
            c, 1000 * rcpu / max(nreq, 1), q50, q99,
            "%d/%d" % (lost_d, sum(x["requests"] for x in d)), "%d/%d" % (lost_r, nreq), cpu,
            dcpu))
    if notes:
        print()
        print("\n".join(notes))
    print()
    print("lost = non-2xx answers + connection errors as `spillway bench http` counts them.")
    print("queue p50/p99: from the delta of %s_bucket over the router runs, linear inside a "
          "bucket (as histogram_quantile); <B: below the first bound B; n/a: the router has no "
          "such metric%s" % (QW, "; bounds (s): " + bounds if bounds else ""))


if __name__ == "__main__":
    main()
