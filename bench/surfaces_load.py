#!/usr/bin/env python3
"""Hundreds of clients on every generation surface at once, the GPU worker
SIGKILLed under them: a `spillway serve` of config/demo.ini (on a port,
pool and state directory of its own), CLIENTS threads each sending
REQUESTS requests in turn from chat completions (streamed, sampled with
temperature 0.8 and top_p 0.95), the Responses API (whole, sampled as
chat is, and streamed), Anthropic's Messages (streamed) and embeddings;
KILL_AFTER seconds in, the gpu worker gets SIGKILL (the router restarts
it). Every answer must be well formed in its own protocol: a 200 with a
whole body, or a stream that ends as its protocol ends one (chat's
[DONE], message_stop or an error event, response.completed /
.incomplete / .failed), or a typed error (4xx/5xx with a JSON error).
Prints the counts per surface; exits 1 when any answer was malformed or
a connection failed.

usage: bench/surfaces_load.py [BUILD_DIR]
  environment: CLIENTS (200), REQUESTS (5), KILL_AFTER (2), TOKENS (48 per answer)
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

build = sys.argv[1] if len(sys.argv) > 1 else 'build'
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
clients = int(os.environ.get('CLIENTS', '200'))
requests = int(os.environ.get('REQUESTS', '5'))
kill_after = float(os.environ.get('KILL_AFTER', '2'))
TOKENS = int(os.environ.get('TOKENS', '48'))
binary = os.path.abspath(os.path.join(build, 'spillway'))
model = os.path.abspath(os.path.join(build, 'models', 'demo.gguf'))

work = tempfile.mkdtemp(prefix='spillway-surfaces-')
ini = open(os.path.join(root, 'config', 'demo.ini')).read()
ini = re.sub(r'^listen = .*$', 'listen = 127.0.0.1:0\nmax-connections = 2048', ini, flags=re.M)
ini = re.sub(r'^state-dir = .*$', f'state-dir = {work}/state', ini, flags=re.M)
ini = re.sub(r'^path = .*demo\.gguf$', f'path = {model}', ini, flags=re.M)
ini = ini.replace('sim-gpu:demo', f'sim-gpu:surfaces-{os.getpid()}')
open(os.path.join(work, 'router.ini'), 'w').write(ini)
log = open(os.path.join(work, 'router.log'), 'w')
router = subprocess.Popen([binary, 'serve', '--config', os.path.join(work, 'router.ini')],
                          stdout=subprocess.PIPE, stderr=log, text=True)
port = None
deadline = time.time() + 60
while time.time() < deadline and port is None:
    line = router.stdout.readline()
    m = re.search(r'listening on 127\.0\.0\.1:(\d+)', line)
    if m:
        port = int(m.group(1))
if port is None:
    print('the router did not start; log in', work)
    sys.exit(1)
threading.Thread(target=lambda: router.stdout.read(), daemon=True).start()
c = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
c.request('GET', '/v1/models')
MODEL = json.loads(c.getresponse().read())['data'][0]['id']
c.close()

PROMPT = 'Once upon a time'
SURFACES = {
    'chat': ('/v1/chat/completions', {'messages': [{'role': 'user', 'content': PROMPT}],
                                      'max_tokens': TOKENS, 'stream': True,
                                      'temperature': 0.8, 'top_p': 0.95}),
    'responses': ('/v1/responses', {'input': PROMPT, 'max_output_tokens': TOKENS,
                                    'temperature': 0.8, 'top_p': 0.95}),
    'responses-stream': ('/v1/responses', {'input': PROMPT, 'max_output_tokens': TOKENS,
                                           'stream': True}),
    'messages-stream': ('/v1/messages', {'model': MODEL, 'max_tokens': TOKENS, 'stream': True,
                                         'messages': [{'role': 'user', 'content': PROMPT}]}),
    'embeddings': ('/v1/embeddings', {'input': [PROMPT, 'The quick brown fox']}),
}
counts = {k: {} for k in SURFACES}
bad = []
errors = {}  # (surface, status) -> one typed error's body
lock = threading.Lock()


def well_formed(name, status, body):
    if status != 200:
        try:
            j = json.loads(body)
            return 'error' in j
        except ValueError:
            return False
    if name == 'chat':
        return body.rstrip().endswith('data: [DONE]')
    if name == 'responses-stream':
        events = re.findall(r'^event: (\S+)', body, flags=re.M)
        return bool(events) and events[0] == 'response.created' and events[-1] in (
            'response.completed', 'response.incomplete', 'response.failed')
    if name == 'messages-stream':
        events = re.findall(r'^event: (\S+)', body, flags=re.M)
        return bool(events) and events[0] == 'message_start' and events[-1] in (
            'message_stop', 'error')
    try:
        j = json.loads(body)
    except ValueError:
        return False
    if name == 'responses':
        return j.get('object') == 'response'
    return j.get('object') == 'list' and len(j.get('data', [])) == 2


def client(i):
    names = list(SURFACES)
    for k in range(requests):
        name = names[(i + k) % len(names)]
        path, body = SURFACES[name]
        try:
            c = http.client.HTTPConnection('127.0.0.1', port, timeout=120)
            c.request('POST', path, json.dumps(body), {'Content-Type': 'application/json'})
            r = c.getresponse()
            text = r.read().decode('utf-8', 'replace')
            status = r.status
            c.close()
        except Exception as e:  # a connection that failed counts as malformed
            status, text = 0, repr(e)
        ok = well_formed(name, status, text)
        with lock:
            key = f'{status}' if ok else f'{status} MALFORMED'
            counts[name][key] = counts[name].get(key, 0) + 1
            if not ok and len(bad) < 5:
                bad.append((name, status, text[-300:]))
            if status != 200 and ok and (name, status) not in errors:
                errors[(name, status)] = text[:160]


def killer():
    time.sleep(kill_after)
    for line in open(os.path.join(work, 'router.log')):
        m = re.search(r'worker gpu: started pid (\d+)', line)
        if m:
            os.kill(int(m.group(1)), signal.SIGKILL)
            print(f'SIGKILL to the gpu worker (pid {m.group(1)}) at {kill_after} s')
            return


t0 = time.time()
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
threading.Thread(target=killer, daemon=True).start()
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.time() - t0
router.send_signal(signal.SIGTERM)
router.wait(timeout=60)
failovers = sum(1 for line in open(os.path.join(work, 'router.log'))
                if re.search(r', ([2-9]|\d\d+) attempt\(s\)', line))
print(f'{clients} clients x {requests} requests in {elapsed:.1f} s; '
      f'answers after more than one attempt: {failovers}')
for name, c in counts.items():
    print(f'  {name:17s} ' + ', '.join(f'{k}: {v}' for k, v in sorted(c.items())))
for (name, status), text in sorted(errors.items()):
    print(f'  {name} {status}: {text}')
for name, status, tail in bad:
    print(f'malformed {name} ({status}): ...{tail!r}')
malformed = sum(v for c in counts.values() for k, v in c.items() if 'MALFORMED' in k)
print('router log:', os.path.join(work, 'router.log'))
sys.exit(1 if malformed else 0)
