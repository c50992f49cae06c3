// dashboard.test.js - /dashboard in a real browser (Debian's chromium,
// headless, driven by playwright-core; run.sh sets it up). Two real
// `spillway serve` routers on 127.0.0.1 with two managed workers each:
// "gpu" on a sim-gpu pool whose worker crashes after 2 tokens
// (fault = abort_after_tokens:2), "cpu" that takes the replay.
//
// 1. With api-keys: the page asks for the key, refuses a wrong one,
//    accepts the right one; every worker gets its row (state, device,
//    memory bar); a request that fails over appears on the live timeline
//    within 2 s of its answer (the stream pushes it: the stats poll is
//    every 2 s and is not what is waited for), and clicking it shows its
//    record. The page requests nothing from any other host. A screenshot
//    goes to $SPILLWAY_BROWSER_OUT/dashboard.png.
// 2. Without keys: no prompt, the workers at once.
// 3. Every kind of event (failover, capacity fallback, remote route,
//    workers on demand) drawn as its kind: no "? → none" row, no red dot
//    but for a failed failover; a remote worker's memory drawn as a remote
//    service's, not host memory.
//
// Each step has its own time-out; the whole run is bounded (90 s), and
// the routers are stopped (SIGTERM, then SIGKILL) on any failure.
'use strict';

const { chromium } = require('playwright-core');
const { spawn, execFileSync } = require('child_process');
const fs = require('fs');
const http = require('http');
const path = require('path');

const BIN = process.env.SPILLWAY_BIN;
const OUT = process.env.SPILLWAY_BROWSER_OUT;
const CHROMIUM = process.env.SPILLWAY_CHROMIUM;
const KEY = 'browser-test-key-1';
const routers = [];
let browser = null;
let failures = 0;

function log(...a) { console.log('browser test:', ...a); }
function check(ok, what) {
  if (ok) { console.log('  ok   ' + what); return; }
  console.log('  FAIL ' + what);
  failures++;
}

// Starts a router; resolves with its base URL once it printed its port.
function startRouter(name, withKeys) {
  const dir = path.join(OUT, name);
  fs.mkdirSync(dir, { recursive: true });
  const pool = `browser-${process.pid}-${name}`;
  const ini = path.join(dir, 'router.ini');
  fs.writeFileSync(ini, [
    '[server]', 'listen = 127.0.0.1:0', `state-dir = ${dir}/state`,
    'health-interval-ms = 100', 'ready-timeout = 30', withKeys ? `api-keys = ${KEY}` : '',
    '[model]', `path = ${path.join(OUT, 'model.gguf')}`,
    '[worker gpu]', `device = sim-gpu:${pool}`, 'sim-capacity = 64MiB', 'max-seqs = 2',
    'threads = 1', 'ctx-limit = 512', 'fault = abort_after_tokens:2',
    '[worker cpu]', 'threads = 1', 'ctx-limit = 512', ''].join('\n'));
  const logFile = fs.openSync(path.join(dir, 'router.log'), 'w');
  const proc = spawn(BIN, ['serve', '--config', ini], { stdio: ['ignore', 'pipe', logFile] });
  const r = { name, proc, pool, url: null, exited: false };
  routers.push(r);
  proc.on('exit', () => { r.exited = true; });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`${name}: no "listening on" in 40 s`)), 40000);
    proc.stdout.on('data', (d) => {
      out += d;
      fs.appendFileSync(path.join(dir, 'router.log'), d);
      const m = /listening on (127\.0\.0\.1:\d+)/.exec(out);
      if (m && !r.url) {
        r.url = `http://${m[1]}`;
        clearTimeout(timer);
        resolve(r);
      }
    });
    proc.on('exit', (code) => { if (!r.url) { clearTimeout(timer); reject(new Error(`${name} exited ${code}`)); } });
  });
}

function stopRouter(r) {
  return new Promise((resolve) => {
    if (r.exited) { resolve(r.proc.exitCode); return; }
    const kill = setTimeout(() => r.proc.kill('SIGKILL'), 15000);
    r.proc.on('exit', (code) => { clearTimeout(kill); resolve(code); });
    r.proc.kill('SIGTERM');
  });
}

function post(r, body, headers) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request(r.url + '/v1/completions', {
      method: 'POST',
      headers: Object.assign({ 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) }, headers),
      timeout: 30000,
    }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: text }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

async function withKeys(page) {
  log('router with api-keys');
  const r = await startRouter('keys', true);
  const foreign = [];
  page.on('request', (q) => {
    const u = q.url();
    if (!u.startsWith(r.url + '/') && !u.startsWith('blob:') && !u.startsWith('data:')) foreign.push(u);
  });
  await page.goto(r.url + '/dashboard');
  await page.waitForSelector('#key-dialog.open', { timeout: 10000 });
  check(true, 'the page asks for a key');
  check(await page.locator('#workers tr').count() === 0, 'no worker is shown before the key');
  await page.fill('#key-input', 'wrong-key-123');
  await page.click('#key-submit');
  await page.waitForFunction(() => document.querySelector('#key-dialog.open') &&
    /refused/.test(document.querySelector('#key-error').textContent), null, { timeout: 10000 });
  check(true, 'a wrong key is refused and asked for again');
  await page.fill('#key-input', KEY);
  await page.click('#key-submit');
  await page.waitForSelector('#workers tr[data-worker="gpu"]', { timeout: 10000 });
  await page.waitForSelector('#workers tr[data-worker="cpu"]', { timeout: 10000 });
  check(!(await page.isVisible('#key-dialog')), 'the right key closes the prompt');
  const gpuRow = page.locator('#workers tr[data-worker="gpu"]');
  check(/sim-gpu:/.test(await gpuRow.textContent()), 'the gpu row names its device');
  check(await gpuRow.locator('.bar').count() === 1, 'the gpu row has a memory bar');
  check(/not counted/.test(await page.locator('#workers tr[data-worker="cpu"]').textContent()),
        'the cpu row says its memory is not counted');
  await page.waitForFunction(() => document.getElementById('stream-state').textContent === 'events: live',
                             null, { timeout: 10000 });
  check(true, 'the event stream is live');

  // the failover: the gpu worker crashes, the cpu worker replays it
  const rid = `browser-fo-${process.pid}`;
  const res = await post(r, { prompt: 'Once upon a time', max_tokens: 6, temperature: 0 },
                         { Authorization: `Bearer ${KEY}`, 'X-Request-Id': rid });
  const answered = Date.now();
  check(res.status === 200 && res.headers['x-spillway-worker'] === 'cpu' &&
        res.headers['x-spillway-attempts'] === '2', 'the request failed over to the cpu worker');
  const item = page.locator(`#failovers li[data-request-id="${rid}"]`);
  let seen = true;
  try { await item.waitFor({ timeout: 2000 }); } catch (e) { seen = false; }
  check(seen, `the failover is on the timeline within 2 s of the answer (${Date.now() - answered} ms)`);
  if (seen) {
    check(/worker_crash/.test(await item.textContent()), 'the timeline entry says worker_crash');
    check(await page.locator('#timeline-axis circle.dot').count() >= 1, 'a dot on the 10-minute axis');
    await item.click();
    const rec = await page.locator('#record').textContent();
    let parsed = null;
    try { parsed = JSON.parse(rec); } catch (e) { /* checked below */ }
    check(parsed && parsed.request_id === rid && parsed.first_error.kind === 'worker_crash' &&
          parsed.replay_worker === 'cpu', 'clicking it shows its record');
  }
  // the stats poll catches up: the ring's failover count on the card
  await page.waitForFunction(() => Number(document.getElementById('fo-count').textContent) >= 1,
                             null, { timeout: 10000 });
  check(true, 'the failover count of the last 10 minutes');
  const shot = path.join(OUT, 'dashboard.png');
  await page.screenshot({ path: shot, fullPage: true });
  check(fs.statSync(shot).size > 1000, `screenshot written: ${shot}`);
  check(foreign.length === 0, 'no request to any other host' + (foreign.length ? ': ' + foreign.join(' ') : ''));
  check(await stopRouter(r) === 0, 'the router exits 0 with the dashboard still open');
}

async function withoutKeys(page) {
  log('router without api-keys');
  const r = await startRouter('nokeys', false);
  await page.goto(r.url + '/dashboard');
  await page.waitForSelector('#workers tr[data-worker="cpu"]', { timeout: 10000 });
  check(!(await page.isVisible('#key-dialog')), 'no key prompt without api-keys');
  check(await page.locator('#workers tr').count() === 2, 'every worker has its row');
  check(await stopRouter(r) === 0, 'the router exits 0');
}

// Each kind of event as the page draws it. The router's stream is real in
// withKeys (a failover); here the page's stream request is answered with
// one record of each kind, as the router writes them (`event: TYPE`), so
// every kind is on the page at once.
async function eventKinds(page) {
  log('every kind of event on the timeline');
  const r = await startRouter('kinds', false);
  const t = Date.now() / 1000 - 30;
  const recs = [
    ['failover', { type: 'failover', request_id: 'k-fo', received_time: t, decision: 'replay',
      first_error: { worker: 'gpu', kind: 'oom', time: t }, replay_worker: 'cpu', outcome: 'completed' }],
    ['capacity_fallback', { type: 'capacity_fallback', request_id: 'k-fb', received_time: t + 1, time: t + 1,
      from_model: 'big', to_model: 'small', reason: 'deadline', route: 'capacity' }],
    ['remote_route', { type: 'remote_route', request_id: 'k-rr', time: t + 2, worker: 'cloud',
      model: 'big', route: 'routine' }],
    ['worker_starting', { type: 'worker_starting', worker: 'late', model: 'big', reason: 'demand', time: t + 3 }],
    ['worker_ready', { type: 'worker_ready', worker: 'late', model: 'big', reason: 'demand', time: t + 4,
      start_seconds: 1.5 }],
    ['worker_stopped', { type: 'worker_stopped', worker: 'late', model: 'big', reason: 'evicted',
      for_worker: 'other', time: t + 5 }],
  ];
  const sse = ': spillway events\nretry: 2000\n\n' +
    recs.map(([kind, rec], i) => `id: ${i + 1}\nevent: ${kind}\ndata: ${JSON.stringify(rec)}\n\n`).join('');
  await page.route('**/v1/spillway/events/stream', (route) =>
    route.fulfill({ status: 200, headers: { 'Content-Type': 'text/event-stream' }, body: sse }));
  // the router's real stats, its gpu worker shown as a remote service's
  await page.route('**/v1/spillway/stats', async (route) => {
    const resp = await route.fetch();
    const j = await resp.json();
    const w = j.workers.find((x) => x.name === 'gpu');
    if (w) { w.device = 'remote'; w.memory = { counted: false }; }
    await route.fulfill({ response: resp, json: j });
  });
  await page.goto(r.url + '/dashboard');
  await page.waitForFunction(() => document.querySelectorAll('#failovers li').length >= 6, null, { timeout: 10000 });
  const text = async (kind) => (await page.locator(`#failovers li[data-kind="${kind}"]`).textContent()) || '';
  check(/oom/.test(await text('failover')) && /gpu → cpu/.test(await text('failover')), 'a failover: its error and workers');
  check(/fallback/.test(await text('capacity_fallback')) && /model big → small/.test(await text('capacity_fallback')),
        'a capacity fallback: the two models');
  const rr = await text('remote_route');
  check(/remote/.test(rr) && /model big → cloud/.test(rr) && /routine/.test(rr) && !/\?|none/.test(rr),
        `a remote route: the model, the worker, the route (${rr})`);
  const ws = await text('worker_starting');
  check(/starting/.test(ws) && /worker late/.test(ws) && !/\?|none/.test(ws), `a worker starting on demand (${ws})`);
  check(/in 1\.5 s/.test(await text('worker_ready')), 'a worker ready on demand, with its start time');
  check(/for other/.test(await text('worker_stopped')), 'a worker stopped for another');
  const all = await page.locator('#failovers').textContent();
  check(!/\? →|→ none/.test(all), 'no row with an unknown worker or "none"');
  // only a failover that failed would be red; routing and workers are not
  const fills = await page.locator('#timeline-axis circle.dot').evaluateAll((cs) => cs.map((c) => c.getAttribute('fill')));
  check(fills.length === 6 && !fills.includes('#c62828'), `six dots, none red (${fills.join(' ')})`);
  await page.waitForSelector('#workers tr[data-worker="gpu"]', { timeout: 10000 });
  const gpuRow = await page.locator('#workers tr[data-worker="gpu"]').textContent();
  check(/remote service \(not counted\)/.test(gpuRow) && !/host memory/.test(gpuRow),
        `a remote worker's memory is a remote service's (${gpuRow})`);
  check(/host memory \(not counted\)/.test(await page.locator('#workers tr[data-worker="cpu"]').textContent()),
        'the cpu worker\'s is host memory');
  await page.unroute('**/v1/spillway/events/stream');
  await page.unroute('**/v1/spillway/stats');
  check(await stopRouter(r) === 0, 'the router exits 0');
}

async function main() {
  const overall = setTimeout(() => { console.log('browser test: FAIL: over 90 s'); cleanup(1); }, 90000);
  const t0 = Date.now();
  execFileSync(BIN, ['model', 'make', '-o', path.join(OUT, 'model.gguf'), '--dim', '64', '--layers', '2',
    '--heads', '4', '--kv-heads', '2', '--ffn', '128', '--vocab', '1024', '--seed', '3'], { stdio: 'ignore' });
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true });
  log(`chromium ${browser.version()}`);
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  await withKeys(await ctx.newPage());
  await withoutKeys(await ctx.newPage());
  await eventKinds(await ctx.newPage());
  clearTimeout(overall);
  log(`${Date.now() - t0} ms`);
  await cleanup(failures ? 1 : 0);
}

async function cleanup(code) {
  for (const r of routers) {
    if (!r.exited) r.proc.kill('SIGKILL');
    try { fs.unlinkSync(`/dev/shm/spillway-sim-${r.pool}`); } catch (e) { /* gone already */ }
  }
  if (browser) await browser.close().catch(() => {});
  console.log(failures || code ? `browser test: FAILED (${failures} checks)` : 'browser test: passed');
  process.exit(code || (failures ? 1 : 0));
}

main().catch((e) => { console.log('browser test: FAIL:', e && e.stack || e); failures++; cleanup(1); });
