#!/usr/bin/env node
/**
 * `npm run bench:profile -- [s1|s2] [seconds]`: runs one scenario against flashd started with
 * `--cpu-prof` and prints where the server's CPU went (self time by function and by file).
 * Use it to find the next thing to make faster; the numbers that count come from `npm run bench`.
 *
 *   PROFILE_SYNC=full|normal   synchronous setting (default full)
 *   PROFILE_C=64               clients (s1) or workers and clients (s2)
 *   PROFILE_CPU=0              no profiler: print rate and server CPU µs per job only
 *   PROFILE_PREFILL=15         first fill the database with this many seconds of /run (c=64, on
 *                              another endpoint, then purged), as `npm run bench` does before S2
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Conn, call, head } from './lib/http.mjs';
import { BODY_1K, closedLoop } from './lib/load.mjs';
import { FLASHD, REPO_ROOT, benchKey, canPin, cpuSeconds, createEndpoint, freePort, pinSelf, sleep, track, workerEnv } from './lib/procs.mjs';
import { SimWorker } from './lib/sim-worker.mjs';

const scenario = process.argv[2] ?? 's1';
const seconds = Number(process.argv[3] ?? 5);
const c = Number(process.env.PROFILE_C ?? 64);
const sync = process.env.PROFILE_SYNC ?? 'full';
const ADMIN = 'bench-admin-key-0123456789abcdef';

pinSelf(0);
const dir = mkdtempSync(path.join(os.tmpdir(), 'flashd-prof-'));
// Removed on every exit (the PROFILE_CPU=0 path exits early): a run leaves up to a GB of data.
process.once('exit', () => {
  if (!process.env.PROFILE_KEEP) rmSync(dir, { recursive: true, force: true });
});
const profDir = path.join(dir, 'prof');
const port = await freePort();
const profiling = process.env.PROFILE_CPU !== '0';
const argv = [...(profiling ? ['--cpu-prof', '--cpu-prof-dir', profDir] : []), ...(process.env.PROFILE_NODE_ARGS ?? '').split(' ').filter(Boolean), FLASHD, '--port', String(port), '--data-dir', path.join(dir, 'data'), '--sqlite-synchronous', sync];
const [cmd, args] = canPin() ? ['taskset', ['-c', '1', process.execPath, ...argv]] : [process.execPath, argv];
const child = track(spawn(cmd, args, { cwd: REPO_ROOT, env: { ...process.env, FLASHD_ADMIN_API_KEY: ADMIN }, stdio: ['ignore', process.env.PROFILE_STDOUT ? 'inherit' : 'ignore', 'pipe'] }));
let err = '';
child.stderr.setEncoding('utf8').on('data', (d) => (err += d));
for (let i = 0; !/flashd listening/.test(err); i++) {
  if (i > 300) throw new Error(`flashd did not start:\n${err}`);
  await sleep(50);
}
const url = `http://127.0.0.1:${port}`;
const key = await benchKey(url, ADMIN);
const ep = await createEndpoint(url, key, 'prof');
const prefill = Number(process.env.PROFILE_PREFILL ?? 0);
if (prefill > 0) {
  const fill = await createEndpoint(url, key, 'prefill');
  const fc = [];
  for (let i = 0; i < 64; i++) fc.push(await new Conn('127.0.0.1', port).connect());
  const fh = head('POST', `/v2/${fill}/run`, `127.0.0.1:${port}`, `Bearer ${key}`, true);
  const f = await closedLoop(64, prefill, async (i) => (await fc[i].request(fh, BODY_1K)).status === 200);
  fc.forEach((x) => x.close());
  const purged = await call(url, 'POST', `/v2/${fill}/purge-queue`, `Bearer ${key}`, {});
  console.log(`prefill: ${f.ok} jobs in ${prefill} s, ${purged.body.removed} purged`);
}
const conns = [];
for (let i = 0; i < c; i++) conns.push(await new Conn('127.0.0.1', port).connect());
const workers = [];
if (scenario === 's2') {
  for (let i = 0; i < c; i++) {
    const env = await workerEnv(url, key, ep);
    workers.push(new SimWorker({ host: '127.0.0.1', port, endpointId: ep, workerId: env.workerId, key: env.key }).start());
  }
}
const h = head('POST', `/v2/${ep}/${scenario === 's2' ? 'runsync' : 'run'}`, `127.0.0.1:${port}`, `Bearer ${key}`, true);
await closedLoop(c, 1, async (i) => (await conns[i].request(h, BODY_1K)).status === 200); // warm-up
const sysOf = () => Number(readFileSync(`/proc/${child.pid}/stat`, 'latin1').split(') ')[1].split(' ')[12]) / 100;
const cpu0 = cpuSeconds(child.pid);
const sys0 = sysOf();
const r = await closedLoop(c, seconds, async (i) => (await conns[i].request(h, BODY_1K)).status === 200);
const cpuUs = ((cpuSeconds(child.pid) - cpu0) * 1e6) / r.ok;
const sysUs = ((sysOf() - sys0) * 1e6) / r.ok;
console.log(`${scenario} c=${c} ${sync}: ${Math.round(r.rate)} jobs/s, p50 ${Math.round(r.lat.p50)} µs, p99 ${Math.round(r.lat.p99)} µs, server CPU ${cpuUs.toFixed(1)} µs/job (kernel ${sysUs.toFixed(1)})${profiling ? ' (profiling slows it down)' : ''}`);
for (const w of workers) await w.stop();
conns.forEach((x) => x.close());
child.kill('SIGTERM');
await new Promise((res) => child.once('exit', res));
if (!profiling) process.exit(0);

const file = readdirSync(profDir).find((f) => f.endsWith('.cpuprofile'));
if (!file) throw new Error('no profile written');
const prof = JSON.parse(readFileSync(path.join(profDir, file), 'utf8'));
const self = new Map();
const dt = prof.timeDeltas;
const byId = new Map(prof.nodes.map((n) => [n.id, n]));
const hits = new Map();
for (let i = 0; i < prof.samples.length; i++) hits.set(prof.samples[i], (hits.get(prof.samples[i]) ?? 0) + (dt[i] ?? 0));
let total = 0;
const byFile = new Map();
for (const [id, us] of hits) {
  const n = byId.get(id);
  const f = n.callFrame;
  if (f.functionName === '(idle)') continue;
  total += us;
  const file = (f.url || '').replace(/^.*\//, '') || '(native)';
  const k = `${f.functionName || '(anon)'} ${file}:${f.lineNumber + 1}`;
  self.set(k, (self.get(k) ?? 0) + us);
  byFile.set(file, (byFile.get(file) ?? 0) + us);
}
const top = (m, n) => [...m].sort((a, b) => b[1] - a[1]).slice(0, n).map(([k, us]) => `${((100 * us) / total).toFixed(1).padStart(5)} %  ${k}`).join('\n');
console.log(`\nbusy CPU ${(total / 1e6).toFixed(2)} s; self time by function:\n${top(self, 45)}\n\nby file:\n${top(byFile, 12)}`);
if (process.env.PROFILE_KEEP) console.log(`profile kept in ${profDir}`);
