// cors.test.js - a page served from another origin calls the router, in a
// real browser (Debian's chromium, headless, driven by playwright-core;
// run.sh sets it up). A real `spillway serve` on 127.0.0.1 with api-keys
// and cors-origins naming one page server's origin; two page servers on
// other ports (so other origins): the listed one and one that is not.
//
// From the listed origin, with the key: a chat completion, and a streamed
// one read chunk by chunk (the Authorization and Content-Type headers make
// them requests a browser sends only after a preflight the server
// allowed), and the X-Request-Id header the page may read. Without the key: the
// page reads the 401 and its typed error. From the other origin: the
// browser refuses the page the answer (fetch rejects).
//
// The run is bounded (60 s); the router is stopped (SIGTERM, then
// SIGKILL) on any failure.
'use strict';

const { chromium } = require('playwright-core');
const { spawn, execFileSync } = require('child_process');
const fs = require('fs');
const http = require('http');
const path = require('path');

const BIN = process.env.SPILLWAY_BIN;
const OUT = process.env.SPILLWAY_BROWSER_OUT;
const CHROMIUM = process.env.SPILLWAY_CHROMIUM;
const KEY = 'browser-cors-key-1';
let router = null;
let browser = null;
const servers = [];
let failures = 0;

function log(...a) { console.log('browser test:', ...a); }
function check(ok, what) {
  if (ok) { console.log('  ok   ' + what); return; }
  console.log('  FAIL ' + what);
  failures++;
}

// A page server on 127.0.0.1 (port 0): serves one empty page; resolves
// with its origin.
function pageServer() {
  return new Promise((resolve) => {
    const s = http.createServer((req, res) => {
      res.writeHead(200, { 'Content-Type': 'text/html' });
      res.end('<!doctype html><title>page</title><p>a page on another origin</p>');
    });
    servers.push(s);
    s.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${s.address().port}`));
  });
}

function startRouter(allowed) {
  const dir = path.join(OUT, 'cors');
  fs.mkdirSync(dir, { recursive: true });
  const ini = path.join(dir, 'router.ini');
  fs.writeFileSync(ini, [
    '[server]', 'listen = 127.0.0.1:0', `state-dir = ${dir}/state`, 'health-interval-ms = 100',
    'ready-timeout = 30', `api-keys = ${KEY}`, `cors-origins = ${allowed}`,
    '[model]', `path = ${path.join(OUT, 'model.gguf')}`,
    '[worker cpu]', 'threads = 1', 'ctx-limit = 512', ''].join('\n'));
  const logFile = fs.openSync(path.join(dir, 'router.log'), 'w');
  const proc = spawn(BIN, ['serve', '--config', ini], { stdio: ['ignore', 'pipe', logFile] });
  router = { proc, url: null, exited: false };
  proc.on('exit', () => { router.exited = true; });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('no "listening on" in 40 s')), 40000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (127\.0\.0\.1:\d+)/.exec(out);
      if (m && !router.url) {
        router.url = `http://${m[1]}`;
        clearTimeout(timer);
        resolve(router);
      }
    });
    proc.on('exit', (code) => { if (!router.url) { clearTimeout(timer); reject(new Error(`router exited ${code}`)); } });
  });
}

function stopRouter() {
  return new Promise((resolve) => {
    if (router.exited) { resolve(router.proc.exitCode); return; }
    const kill = setTimeout(() => router.proc.kill('SIGKILL'), 15000);
    router.proc.on('exit', (code) => { clearTimeout(kill); resolve(code); });
    router.proc.kill('SIGTERM');
  });
}

// What the page does: fetch from its own origin to the router's.
async function callFromPage(page, url, key, stream) {
  return page.evaluate(async ({ url, key, stream }) => {
    const headers = { 'Content-Type': 'application/json' };
    if (key) headers.Authorization = `Bearer ${key}`;
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6,
                                  temperature: 0, stream });
    try {
      const r = await fetch(url + '/v1/chat/completions', { method: 'POST', headers, body });
      let text = '';
      let chunks = 0;
      if (stream && r.ok) {
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          chunks++;
          text += dec.decode(value, { stream: true });
        }
      } else {
        text = await r.text();
      }
      return { status: r.status, text, chunks, requestId: r.headers.get('X-Request-Id') };
    } catch (e) {
      return { error: String(e) };
    }
  }, { url, key, stream });
}

async function main() {
  const overall = setTimeout(() => { console.log('browser test: FAIL: over 60 s'); cleanup(1); }, 60000);
  execFileSync(BIN, ['model', 'make', '-o', path.join(OUT, 'model.gguf'), '--dim', '64', '--layers', '2',
    '--heads', '4', '--kv-heads', '2', '--ffn', '128', '--vocab', '1024', '--seed', '3'], { stdio: 'ignore' });
  const listed = await pageServer();
  const other = await pageServer();
  await startRouter(listed);
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true });
  log(`chromium ${browser.version()}; router ${router.url}; page ${listed}, other ${other}`);
  const page = await browser.newPage();
  await page.goto(listed + '/');

  const plain = await callFromPage(page, router.url, KEY, false);
  let reply = null;
  try { reply = JSON.parse(plain.text); } catch (e) { /* checked below */ }
  check(plain.status === 200 && reply && reply.choices[0].message.role === 'assistant',
        'a chat completion from the listed origin' + (plain.error ? ': ' + plain.error : ''));
  check(!!plain.requestId, 'the page reads X-Request-Id');

  const streamed = await callFromPage(page, router.url, KEY, true);
  check(streamed.status === 200 && /"delta"/.test(streamed.text || '') &&
        /data: \[DONE\]/.test(streamed.text || ''),
        `a streamed one, read as it comes (${streamed.chunks} reads)` + (streamed.error ? ': ' + streamed.error : ''));

  const nokey = await callFromPage(page, router.url, null, false);
  let err = null;
  try { err = JSON.parse(nokey.text); } catch (e) { /* checked below */ }
  check(nokey.status === 401 && err && err.error.code === 'invalid_api_key',
        'without the key the page reads the typed 401');

  await page.goto(other + '/');
  const refused = await callFromPage(page, router.url, KEY, false);
  check(!!refused.error, 'from an origin not listed the browser keeps the answer from the page' +
        (refused.error ? '' : ` (status ${refused.status})`));

  check(await stopRouter() === 0, 'the router exits 0');
  clearTimeout(overall);
  await cleanup(failures ? 1 : 0);
}

async function cleanup(code) {
  if (router && !router.exited) router.proc.kill('SIGKILL');
  for (const s of servers) s.close();
  if (browser) await browser.close().catch(() => {});
  console.log(failures || code ? `browser test: FAILED (${failures} checks)` : 'browser test: passed');
  process.exit(code || (failures ? 1 : 0));
}

main().catch((e) => { console.log('browser test: FAIL:', e && e.stack || e); failures++; cleanup(1); });
