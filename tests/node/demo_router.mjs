// demo_router.mjs - what every SDK test shares: its checks' tally, and a
// real `spillway serve` of config/demo.ini (`make run`'s configuration) on
// a port, a pool and a state directory of the test's own, started and
// stopped. run.sh copies it beside the test, into the install.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

let failures = 0;

// One check: printed, and counted when it fails.
export function check(ok, what) {
  console.log(`${ok ? 'ok' : 'FAIL'}: ${what}`);
  if (!ok) failures++;
}

export function failed() {
  return failures;
}

// Starts the router as `tag` (its files and pool are named by it), with
// the lines in extra added after `listen` (e.g. `api-keys = K`); resolves
// to { proc, port, stop() } once it listens, rejects if it exits or does
// not listen within 60 s.
export async function startDemoRouter(tag, extra = '') {
  const dir = process.env.SPILLWAY_SDK_DIR;
  const ini = path.join(dir, `router-${tag}.ini`);
  fs.writeFileSync(ini, fs.readFileSync(process.env.SPILLWAY_DEMO_INI, 'utf8')
    .replace(/^listen = .*$/m, `listen = 127.0.0.1:0${extra ? `\n${extra}` : ''}`)
    .replace(/^state-dir = .*$/m, `state-dir = ${dir}/state-${tag}`)
    .replace(/^path = build\/models\/demo\.gguf$/m, `path = ${process.env.SPILLWAY_DEMO_MODEL}`)
    .replace(/sim-gpu:demo/g, `sim-gpu:sdk-${tag}-${process.pid}`));
  const log = fs.openSync(path.join(dir, `router-${tag}.log`), 'w');
  const proc = spawn(process.env.SPILLWAY_BIN, ['serve', '--config', ini],
                     { stdio: ['ignore', 'pipe', log] });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error('the router did not start in 60 s')), 60000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /listening on 127\.0\.0\.1:(\d+)/.exec(out);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => reject(new Error(`the router exited (${code})`)));
  });
  // SIGTERM (a drain), then SIGKILL after 15 s
  const stop = () => new Promise((resolve) => {
    if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
    const t = setTimeout(() => { proc.kill('SIGKILL'); resolve(); }, 15000);
    proc.on('exit', () => { clearTimeout(t); resolve(); });
    proc.kill('SIGTERM');
  });
  return { proc, port, stop };
}
