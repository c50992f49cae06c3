#!/usr/bin/env python3
"""first_token.py - how soon a streamed completion's tokens reach the client
from a `spillway worker`: the time from the request to its first token's
chunk, to the middle one's and to the last one's, over ROUNDS
streams of TOKENS tokens (greedy, ignore_eos, a different prompt each time
and the prefix cache off, so every prompt is computed whole). Prints the
medians; asserts nothing.

  bench/first_token.py [BUILD_DIR [MODEL]]
  THREADS=2 TOKENS=8 ROUNDS=5 bench/first_token.py build

MODEL defaults to a model of Qwen3-0.6B's shape (random weights, Q8_0) in
BUILD_DIR/models, made as bench/sampling.sh makes it (MODELS=q06b).
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import time

build = sys.argv[1] if len(sys.argv) > 1 else 'build'
binary = os.path.join(build, 'spillway')
model = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    build, 'models', 'bench-qwen3-0.6b-shape-q8_0.gguf')
threads = os.environ.get('THREADS', '2')
tokens = int(os.environ.get('TOKENS', '8'))
rounds = int(os.environ.get('ROUNDS', '5'))

if not os.path.exists(model):
    os.makedirs(os.path.dirname(model), exist_ok=True)
    subprocess.run([binary, 'model', 'make', '--arch', 'qwen3', '--dim', '1024', '--layers', '28',
                    '--heads', '16', '--kv-heads', '8', '--head-dim', '128', '--ffn', '3072',
                    '--vocab', '151936', '--rope-base', '1000000', '--tied', '--type', 'q8_0',
                    '-o', model], check=True, stdout=subprocess.DEVNULL)

sock = '/tmp/spillway-first-token-%d.sock' % os.getpid()
worker = subprocess.Popen([binary, 'worker', '--model', model, '--listen', 'unix:' + sock,
                           '--threads', threads, '--ctx-limit', '1024', '--no-prefix-cache'],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class UnixConn(http.client.HTTPConnection):
    def __init__(self):
        super().__init__('w', timeout=600)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(600)
        self.sock.connect(sock)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


try:
    deadline = time.monotonic() + 120
    while True:
        if worker.poll() is not None or time.monotonic() > deadline:
            sys.exit('first_token.py: the worker did not start')
        try:
            c = UnixConn()
            c.request('GET', '/health')
            r = c.getresponse()
            r.read()
            if r.status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    firsts, mids, lasts = [], [], []
    for i in range(rounds):
        body = {'prompt': 'Once upon a time there were %d little dogs' % (i + 2),
                'max_tokens': tokens, 'ignore_eos': True, 'stream': True, 'temperature': 0}
        c = UnixConn()
        t0 = time.monotonic()
        c.request('POST', '/v1/completions', json.dumps(body),
                  {'Content-Type': 'application/json'})
        seen = [time.monotonic() - t0 for line in c.getresponse() if line.startswith(b'data: {')]
        if len(seen) < 2:
            sys.exit('first_token.py: a stream sent %d chunks' % len(seen))
        firsts.append(seen[0])
        mids.append(seen[len(seen) // 2])
        lasts.append(seen[-1])
    print('%s, %s threads: first token %.1f ms, token %d %.1f ms, last %.1f ms (medians of %d '
          'streams of %d tokens)' % (os.path.basename(model), threads, median(firsts) * 1e3,
                                     tokens // 2 + 1, median(mids) * 1e3, median(lasts) * 1e3,
                                     rounds, tokens))
finally:
    worker.terminate()
    worker.wait()
