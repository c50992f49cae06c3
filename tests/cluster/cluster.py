"""cluster.py - the pieces of a several-router deployment, for the tests in
tests/cluster: real `spillway worker` and `spillway serve` processes on
loopback TCP ports, HAProxy running contrib/haproxy/spillway.cfg itself
(addresses through its environment variables) and plain HTTP/1.1
clients; the tests start PostgreSQL with scripts/pg-scratch.sh (PG_SCRATCH).
Standard library only.

Every process started here gets SIGKILL when the test process dies
(PR_SET_PDEATHSIG), so a test killed by ctest's time-out leaves nothing
running. Paths come from ctest's environment: SPILLWAY_BIN, SPILLWAY_TEST_TMP.
"""

import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HAPROXY_CFG = os.path.join(SOURCE_DIR, "contrib", "haproxy", "spillway.cfg")
PG_SCRATCH = os.path.join(SOURCE_DIR, "scripts", "pg-scratch.sh")
SKIP = 77


def log(msg):
    print(msg, flush=True)


def need(ok, what):
    """A missing prerequisite: skip (77) with how to get it; under CI=true
    a failure instead, so CI never skips silently."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        log("FAIL: %s (CI=true: this test must run in CI)" % what)
        sys.exit(1)
    log("SKIP: %s" % what)
    sys.exit(SKIP)


def find_haproxy():
    """HAPROXY (a path) when set, else haproxy on PATH or Debian's."""
    if "HAPROXY" in os.environ:
        h = os.environ["HAPROXY"]
        return h if os.access(h, os.X_OK) else None
    return shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")


def spillway_bin():
    b = os.environ.get("SPILLWAY_BIN")
    need(b and os.access(b, os.X_OK), "SPILLWAY_BIN is not set (run it through ctest)")
    return b


def tmp_dir(name):
    base = os.environ.get("SPILLWAY_TEST_TMP") or "/tmp"
    d = os.path.join(base, "%s-%d" % (name, os.getpid()))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_procs = []


def spawn(argv, logfile, env=None):
    """Starts argv, its output appended to logfile. Call it from the main
    thread: PR_SET_PDEATHSIG fires when the *thread* that forked exits."""
    e = dict(os.environ)
    e.pop("SPILLWAY_FAULT", None)
    e.pop("SPILLWAY_SABOTAGE", None)
    e.update(env or {})
    out = open(logfile, "ab")
    p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=e,
                         preexec_fn=_die_with_parent)
    out.close()
    _procs.append(p)
    return p


def sanitizer_reports(logs):
    """The logs (of routers and workers) that hold a sanitizer report."""
    bad = []
    for path in logs:
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError:
            continue
        if b"Sanitizer" in text or b"runtime error:" in text:
            bad.append(path)
    return bad


def stop_all():
    for p in _procs:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---- HTTP ---------------------------------------------------------------


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case names
        self.body = body

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def header(self, name):
        return self.headers.get(name.lower())


def request(addr, method, path, body=None, headers=None, timeout=30):
    """One request on its own connection; raises OSError (and
    http.client's errors) when no whole answer came."""
    host, port = addr
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, raw)
    finally:
        c.close()


def wait_health(addr, timeout, want=200):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if request(addr, "GET", "/health", timeout=2).status == want:
                return True
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.05)
    return False


# ---- the pieces -----------------------------------------------------------


def make_model(path, seed=1):
    subprocess.run([spillway_bin(), "model", "make", "-o", path, "--dim", "64", "--layers", "2",
                    "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "1024",
                    "--type", "f32", "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    return path


class Worker:
    def __init__(self, d, name, model, max_seqs=8, fault=None):
        self.port = free_port()
        self.addr = ("127.0.0.1", self.port)
        self.log = os.path.join(d, name + ".log")
        env = {"SPILLWAY_FAULT": fault} if fault else {}
        self.proc = spawn([spillway_bin(), "worker", "--model", model, "--listen",
                           "127.0.0.1:%d" % self.port, "--threads", "1", "--ctx-limit", "512",
                           "--max-seqs", str(max_seqs), "--no-calibrate"], self.log, env)
        if not wait_health(self.addr, 30):
            raise RuntimeError("worker %s did not start (log %s)" % (name, self.log))


class Router:
    """`spillway serve` on a loopback port with unmanaged workers (urls);
    extra: more [server] lines; rest: more sections."""

    def __init__(self, d, name, model, workers, extra="", rest=""):
        self.name = name
        self.dir = os.path.join(d, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.addr = ("127.0.0.1", self.port)
        self.cfg = os.path.join(self.dir, "router.ini")
        self.log = os.path.join(self.dir, "router.log")
        ws = "".join("[worker w%d]\nurl = http://127.0.0.1:%d\n" % (i, w.port)
                     for i, w in enumerate(workers))
        with open(self.cfg, "w") as f:
            f.write("[server]\nlisten = 127.0.0.1:%d\nstate-dir = %s/state\n"
                    "health-interval-ms = 100\nready-timeout = 30\n%s\n[model]\npath = %s\n%s%s"
                    % (self.port, self.dir, extra, model, ws, rest))
        self.proc = None

    def start(self, timeout=30):
        self.proc = spawn([spillway_bin(), "serve", "--config", self.cfg], self.log)
        if not wait_health(self.addr, timeout):
            raise RuntimeError("router %s did not start (log %s)" % (self.name, self.log))

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def term(self):
        self.proc.send_signal(signal.SIGTERM)


class HAProxy:
    """contrib/haproxy/spillway.cfg as shipped, its addresses from the
    environment."""

    def __init__(self, d, routers):
        self.port = free_port()
        self.addr = ("127.0.0.1", self.port)
        self.sock = os.path.join(d, "haproxy.sock")
        self.log = os.path.join(d, "haproxy.log")
        env = {"SPILLWAY_LISTEN": "127.0.0.1:%d" % self.port, "SPILLWAY_HAPROXY_SOCK": self.sock}
        for i, r in enumerate(routers):
            env["SPILLWAY_ROUTER%d" % (i + 1)] = "127.0.0.1:%d" % r.port
        self.proc = spawn([find_haproxy(), "-db", "-f", HAPROXY_CFG], self.log, env)

    def admin(self, command):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(self.sock)
        s.sendall(command.encode() + b"\n")
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
        s.close()
        return out.decode()

    def servers(self):
        """{server name: (status, total sessions)} from `show stat`."""
        lines = self.admin("show stat").splitlines()
        head = lines[0].lstrip("# ").split(",")
        out = {}
        for ln in lines[1:]:
            f = dict(zip(head, ln.split(",")))
            if f.get("pxname") == "spillway_routers" and f.get("svname") not in ("BACKEND", None):
                out[f["svname"]] = (f["status"], int(f["stot"] or 0))
        return out

    def wait_status(self, server, prefix, timeout):
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                st = self.servers().get(server, ("", 0))[0]
                if st.startswith(prefix):
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False
