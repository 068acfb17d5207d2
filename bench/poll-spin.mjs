#!/usr/bin/env node
/**
 * `npm run bench:poll-spin`: what `--poll-spin-us` (core/loop-spin.ts) buys and costs.
 *
 * 1. Wake-up cost: one client, 1 KB POSTs to a bare uWS server (pinned like flashd), with the
 *    server's loop sleeping between requests and with it never sleeping (a setImmediate chain).
 *    The difference is what a sleeping loop pays per request on this machine.
 * 2. `/runsync` with one client and one worker, `--poll-spin-us 0` and the default alternating
 *    (POLL_SPIN_ROUNDS rounds): p50 and p99.
 * 3. CPU: flashd with 8 parked workers at fixed `/run` rates (idle, 10, 200, 1000 per second,
 *    evenly spaced), % of one core, with 0 and the default.
 *
 * Knobs: POLL_SPIN_ROUNDS (default 3), POLL_SPIN_SECONDS per point (default 5), POLL_SPIN_US
 * (the value compared with 0; default flashd's own, 500).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { Conn, head } from './lib/http.mjs';
import { BODY_1K } from './lib/load.mjs';
import { benchKey, cpuSeconds, createEndpoint, freePort, pinSelf, pinned, sleep, startFlashd, track, workerEnv } from './lib/procs.mjs';
import { Samples } from './lib/stats.mjs';
import { SimWorker } from './lib/sim-worker.mjs';

const ROUNDS = Number(process.env.POLL_SPIN_ROUNDS ?? 3);
const SECONDS = Number(process.env.POLL_SPIN_SECONDS ?? 5);
const SPIN = String(process.env.POLL_SPIN_US ?? 500);
const ADMIN = 'bench-admin-key-0123456789abcdef';
const us = (ms) => `${Math.round(ms * 1000)} µs`;

pinSelf(0);
const dir = mkdtempSync(path.join(os.tmpdir(), 'flashd-poll-spin-'));
process.once('exit', () => rmSync(dir, { recursive: true, force: true }));

/** Sequential requests on one connection for `seconds`: latency samples (ms). */
async function serial(conn, h, body, seconds) {
  const s = new Samples();
  const end = performance.now() + seconds * 1000;
  while (performance.now() < end) {
    const t0 = performance.now();
    const r = await conn.request(h, body);
    if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`);
    s.push(performance.now() - t0);
  }
  return s.summary();
}

// 1. Bare uWS, sleeping or polling ----------------------------------------------------------------
const uwsPath = createRequire(import.meta.url).resolve('uWebSockets.js');
async function bareUws(poll) {
  const port = await freePort();
  const src = `const uws = require(${JSON.stringify(uwsPath)});
if (${poll}) { const spin = () => setImmediate(spin); spin(); }
uws.App().post('/*', (res) => {
  res.onAborted(() => {});
  res.onData((ab, last) => { if (last) res.cork(() => res.writeHeader('content-type', 'application/json').end('{"id":"x","status":"IN_QUEUE"}')); });
}).listen('127.0.0.1', ${port}, (t) => console.log(t ? 'up' : 'failed'));`;
  const [cmd, args] = pinned(1, process.execPath, ['-e', src]);
  const child = track(spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] }));
  await new Promise((r) => child.stdout.once('data', r));
  const conn = await new Conn('127.0.0.1', port).connect();
  const h = head('POST', '/x', `127.0.0.1:${port}`, 'Bearer x', true);
  await serial(conn, h, BODY_1K, 0.5);
  const r = await serial(conn, h, BODY_1K, SECONDS / 2);
  conn.close();
  child.kill('SIGKILL');
  return r;
}
console.log(`poll-spin bench: ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), node ${process.version}, ${new Date().toISOString()}`);
console.log('1. bare uWS, one client, 1 KB POST round trip:');
for (let i = 0; i < ROUNDS; i++) {
  const sleeping = await bareUws(false);
  const polling = await bareUws(true);
  console.log(`   round ${i + 1}: loop sleeping p50 ${us(sleeping.p50)} p99 ${us(sleeping.p99)}; loop polling p50 ${us(polling.p50)} p99 ${us(polling.p99)}`);
}

// 2 and 3. flashd --------------------------------------------------------------------------------
async function flashd(spin, name) {
  const port = await freePort();
  const f = await startFlashd({ port, dataDir: path.join(dir, name), adminKey: ADMIN, sync: 'normal', cpu: 1, extra: ['--poll-spin-us', spin] });
  const key = await benchKey(f.url, ADMIN);
  const ep = await createEndpoint(f.url, key, 'spin');
  return { f, port, key, ep };
}

async function workers(s, n) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const env = await workerEnv(s.f.url, s.key, s.ep);
    out.push(new SimWorker({ host: '127.0.0.1', port: s.port, endpointId: s.ep, workerId: env.workerId, key: env.key }).start());
  }
  return out;
}

console.log('2. flashd /runsync, one client, one worker (NORMAL):');
for (let i = 0; i < ROUNDS; i++) {
  const line = [];
  for (const spin of ['0', SPIN]) {
    const s = await flashd(spin, `c1-${i}-${spin}`);
    const ws = await workers(s, 1);
    const conn = await new Conn('127.0.0.1', s.port).connect();
    const h = head('POST', `/v2/${s.ep}/runsync`, `127.0.0.1:${s.port}`, `Bearer ${s.key}`, true);
    await serial(conn, h, BODY_1K, 1);
    const r = await serial(conn, h, BODY_1K, SECONDS);
    line.push(`--poll-spin-us ${spin}: p50 ${us(r.p50)} p99 ${us(r.p99)} (${r.n} jobs)`);
    conn.close();
    for (const w of ws) await w.stop();
    await s.f.stop();
  }
  console.log(`   round ${i + 1}: ${line.join('; ')}`);
}

console.log('3. flashd CPU with 8 parked workers, one client sending /run at a fixed rate (% of one core):');
for (const spin of ['0', SPIN]) {
  const s = await flashd(spin, `cpu-${spin}`);
  const ws = await workers(s, 8);
  const conn = await new Conn('127.0.0.1', s.port).connect();
  const h = head('POST', `/v2/${s.ep}/run`, `127.0.0.1:${s.port}`, `Bearer ${s.key}`, true);
  const line = [];
  for (const rate of [0, 10, 200, 1000]) {
    const c0 = cpuSeconds(s.f.pid);
    const t0 = performance.now();
    for (let n = 0; performance.now() - t0 < SECONDS * 1000; n++) {
      if (rate === 0) {
        await sleep(100);
        continue;
      }
      const due = t0 + (n * 1000) / rate;
      while (performance.now() < due) await (due - performance.now() > 2 ? sleep(1) : new Promise((r) => setImmediate(r)));
      await conn.request(h, BODY_1K);
    }
    const secs = (performance.now() - t0) / 1000;
    line.push(`${rate === 0 ? 'idle' : `${rate}/s`} ${((100 * (cpuSeconds(s.f.pid) - c0)) / secs).toFixed(1)} %`);
  }
  console.log(`   --poll-spin-us ${spin}: ${line.join(', ')}`);
  conn.close();
  for (const w of ws) await w.stop();
  await s.f.stop();
}
process.exit(0);
