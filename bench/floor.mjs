#!/usr/bin/env node
/**
 * `npm run bench:floor`: what one request costs the server core before flashd's own work, and
 * what is left for it. Same pinning as `npm run bench` (server CPU1, this load generator CPU0),
 * 64 keep-alive clients, closed loop, and for each point: requests/s, server CPU µs per request
 * (utime+stime from /proc), how busy the server core was, and this process's own CPU per
 * request (the load generator's cost):
 *
 *   1. a bare uWebSockets.js server (the same addon flashd loads) answering a 1 KB POST with a
 *      fixed /run-like reply after reading its body: the HTTP floor, and the most requests a
 *      second this load generator can send on this host;
 *   2. flashd (synchronous=NORMAL) on an unauthenticated GET (`/healthz`), two authenticated
 *      reads (`/v2/{id}/health`, `/v2/{id}/status/{job}`) and `/run` with the 1 KB body S1 sends;
 *   3. the store alone (bench/sqlite-floor.mjs, 40 jobs per commit, as S1 commits).
 *
 * It prints the floor for `/run` (1 + 3) and the rate that floor allows on one core.
 *
 *   node bench/floor.mjs [seconds per point=3] [rounds=5]
 *
 * Each round measures every point once (this host's speed drifts within minutes, so points
 * measured far apart do not compare); each line is the median over the rounds, with the spread
 * of the server's CPU per request.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { Conn, call, head } from './lib/http.mjs';
import { BODY_1K, closedLoop } from './lib/load.mjs';
import { REPO_ROOT, benchKey, canPin, cpuSeconds, createEndpoint, freePort, pinSelf, pinned, sleep, startFlashd, track } from './lib/procs.mjs';

const seconds = Number(process.argv[2] ?? 3);
const rounds = Number(process.argv[3] ?? 5);
const C = 64;
const ADMIN = 'bench-admin-key-0123456789abcdef';
pinSelf(0);
const tmp = mkdtempSync(path.join(os.tmpdir(), 'flashd-floor-'));
process.once('exit', () => rmSync(tmp, { recursive: true, force: true }));

/** Drives `h` (+ body) from C connections for `seconds`; returns one measurement. */
async function measure(pid, port, h, body) {
  const conns = [];
  for (let i = 0; i < C; i++) conns.push(await new Conn('127.0.0.1', port).connect());
  const send = async (i) => (await conns[i].request(h, body)).status < 300;
  await closedLoop(C, 0.5, send); // warm-up
  const s0 = cpuSeconds(pid);
  const c0 = process.cpuUsage();
  const r = await closedLoop(C, seconds, send);
  const c = process.cpuUsage(c0);
  conns.forEach((x) => x.close());
  if (r.ok === 0) throw new Error('no request got a 2xx');
  const serverUs = ((cpuSeconds(pid) - s0) * 1e6) / r.ok;
  return { rate: r.rate, serverUs, busy: (r.rate * serverUs) / 1e6, clientUs: (c.user + c.system) / r.ok };
}

console.log(`request floor, ${C} clients, ${rounds} rounds of ${seconds} s per point${canPin() ? ', servers on CPU1, load on CPU0' : ' (no taskset: not pinned)'}`);

// 1. Bare uWS: read the body, answer what /run answers.
const uws = createRequire(path.join(REPO_ROOT, 'package.json')).resolve('uWebSockets.js');
const barePort = await freePort();
const file = path.join(tmp, 'bare.cjs');
writeFileSync(file, `const uws = require(${JSON.stringify(uws)});
const reply = JSON.stringify({ id: '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b-f1', status: 'IN_QUEUE' });
uws.App().post('/*', (res) => {
  res.onAborted(() => {});
  const parts = [];
  res.onData((ab, last) => {
    parts.push(Buffer.from(ab.slice(0)));
    if (last) res.cork(() => res.writeStatus('200 OK').writeHeader('Content-Type', 'application/json').end(reply));
  });
}).listen('127.0.0.1', ${barePort}, (s) => { if (!s) process.exit(1); console.log('ready'); });
`);
const [cmd, args] = pinned(1, process.execPath, [file]);
const bare = track(spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] }));
await new Promise((resolve, reject) => {
  bare.stdout.once('data', resolve);
  bare.once('exit', (code) => reject(new Error(`bare uWS server exited ${code}`)));
});

// 2. flashd.
const port = await freePort();
const f = await startFlashd({ port, dataDir: path.join(tmp, 'data'), adminKey: ADMIN, sync: 'normal', cpu: 1 });
const key = await benchKey(f.url, ADMIN);
const ep = await createEndpoint(f.url, key, 'floor');
const job = await call(f.url, 'POST', `/v2/${ep}/run`, `Bearer ${key}`, { input: { n: 1 } });
const host = `127.0.0.1:${port}`;
const get = (p) => `GET ${p} HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${key}`;
const points = [
  ['bare uWS: POST 1 KB', bare.pid, barePort, `POST /v2/x/run HTTP/1.1\r\nHost: 127.0.0.1:${barePort}\r\nAuthorization: Bearer k\r\nContent-Type: application/json`, BODY_1K],
  ['flashd: GET /healthz (no key)', f.pid, port, `GET /healthz HTTP/1.1\r\nHost: ${host}`],
  ['flashd: GET /v2/{id}/health', f.pid, port, get(`/v2/${ep}/health`)],
  ['flashd: GET /v2/{id}/status/{job}', f.pid, port, get(`/v2/${ep}/status/${job.body.id}`)],
  ['flashd: POST /v2/{id}/run 1 KB', f.pid, port, head('POST', `/v2/${ep}/run`, host, `Bearer ${key}`, true), BODY_1K],
];
// Rounds, each point once per round: this host's speed drifts by tens of per cent within
// minutes, so points measured minutes apart would not compare.
const results = points.map(() => []);
for (let round = 0; round < rounds; round++) {
  for (let i = 0; i < points.length; i++) {
    const [, pid, p, h, body] = points[i];
    results[i].push(await measure(pid, p, h, body));
  }
  process.stderr.write(`round ${round + 1} of ${rounds} done\n`);
}
await f.stop();
bare.kill('SIGKILL');
const med = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const span = (xs, d) => `${Math.min(...xs).toFixed(d)}–${Math.max(...xs).toFixed(d)}`;
const rows = results.map((rs, i) => {
  const row = { label: points[i][0], rate: med(rs.map((r) => r.rate)), serverUs: med(rs.map((r) => r.serverUs)), busy: med(rs.map((r) => r.busy)), clientUs: med(rs.map((r) => r.clientUs)) };
  console.log(`  ${row.label.padEnd(34)} ${String(Math.round(row.rate)).padStart(6)} req/s  server ${row.serverUs.toFixed(1).padStart(5)} µs/req (${span(rs.map((r) => r.serverUs), 1)}; core ${Math.round(row.busy * 100)} % busy)  load generator ${row.clientUs.toFixed(1)} µs/req`);
  return row;
});

// 3. The store alone.
const store = spawnSync(process.execPath, [path.join(REPO_ROOT, 'bench/sqlite-floor.mjs'), '4', '40'], { encoding: 'utf8' });
const m = /40 jobs per commit, multi-row[^:]*: (\d+) jobs\/s, CPU ([\d.]+) µs\/job/.exec(store.stdout);
if (!m) throw new Error(`bench/sqlite-floor.mjs: ${store.stdout}${store.stderr}`);
const storeUs = Number(m[2]);
console.log(`  ${'store alone: 40 jobs per commit'.padEnd(34)} ${String(m[1]).padStart(6)} jobs/s  CPU ${storeUs.toFixed(1).padStart(5)} µs/job`);

const [bareRow] = rows;
const run = rows[rows.length - 1];
const floor = bareRow.serverUs + storeUs;
console.log(`
/run floor (bare POST + store): ${floor.toFixed(1)} µs of the server core, at most ${(1e6 / floor / 1000).toFixed(1)}k /run a second
flashd's own work on a /run beyond that floor: ${(run.serverUs - floor).toFixed(1)} µs
40k /run a second needs at most 25.0 µs a /run; this load generator alone needs ${bareRow.clientUs.toFixed(1)} µs a request on CPU0 (at most ${(1e6 / bareRow.clientUs / 1000).toFixed(1)}k a second)`);
await sleep(50);
process.exit(0);
