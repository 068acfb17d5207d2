#!/usr/bin/env node
/**
 * `npm run bench:recovery`: how long a restart takes with a backlog (perf-anchors S7: "≤ 1 s
 * recovery for a 100k-row DB"). For each N in RECOVERY_JOBS (default 100000; a comma list, e.g.
 * 100000,600000):
 * - flashd (synchronous=FULL) gets N queued /run jobs of 1 KB from 64 clients, no workers, and is
 *   SIGKILLed; then, RECOVERY_RUNS times (default 3), started on that data dir and SIGKILLed once
 *   it listens. Printed: spawn to listening, flashd's CPU by then, its own `jobs recovered ms=`
 *   figure, and RSS a second later.
 * - The peer: BullMQ on redis-server with AOF and `appendfsync always` (the same promise) gets
 *   the same N jobs by `addBulk`, and redis-server is SIGKILLed and started again the same way.
 *   Ready is the first PING answered (redis answers -LOADING until its AOF is read); then
 *   `getWaitingCount()` must give N.
 * flashd and redis-server run on CPU1, this process on CPU0, as in `npm run bench`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Conn, head } from './lib/http.mjs';
import { BODY_1K, DATA_1K, countedLoop } from './lib/load.mjs';
import { benchKey, cpuSeconds, createEndpoint, freePort, pinSelf, rssMb, sleep, startFlashd, startRedis } from './lib/procs.mjs';

const ADMIN = 'bench-admin-key-0123456789abcdef';
const sizes = (process.env.RECOVERY_JOBS ?? '100000').split(',').map(Number).filter((n) => n > 0);
const runs = Number(process.env.RECOVERY_RUNS ?? 3);
const log = (s) => process.stdout.write(`${s}\n`);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (xs, unit = 'ms') => xs.some(Number.isNaN) ? '-' : `${Math.round(median(xs))} ${unit} (${Math.round(Math.min(...xs))}–${Math.round(Math.max(...xs))})`;

pinSelf(0);

async function flashdRecovery(n) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-recovery-'));
  try {
    const port = await freePort();
    const opts = { port, dataDir: path.join(dir, 'data'), adminKey: ADMIN, sync: 'full', cpu: 1 };
    let srv = await startFlashd(opts);
    const key = await benchKey(srv.url, ADMIN);
    const ep = await createEndpoint(srv.url, key, 'recovery');
    const conns = [];
    for (let i = 0; i < 64; i++) conns.push(await new Conn('127.0.0.1', port).connect());
    const h = head('POST', `/v2/${ep}/run`, `127.0.0.1:${port}`, `Bearer ${key}`, true);
    const fill = await countedLoop(64, n, async (_, i) => (await conns[i].request(h, BODY_1K)).status === 200);
    conns.forEach((c) => c.close());
    if (fill.ok !== n) throw new Error(`only ${fill.ok} of ${n} /run acknowledged`);
    log(`  flashd: ${n} jobs queued in ${fill.elapsed.toFixed(1)} s`);
    await srv.kill();
    const out = { listen: [], cpu: [], recovered: [], rss: [] };
    for (let r = 0; r < runs; r++) {
      srv = await startFlashd({ ...opts, startTimeoutMs: 300_000 });
      const cpu = cpuSeconds(srv.pid);
      const m = /jobs recovered queued=(\d+) running=\d+(?: ms=(\d+))?/.exec(srv.stderrTail());
      if (!m || Number(m[1]) !== n) throw new Error(`flashd recovered ${m?.[1]} jobs, expected ${n}`);
      await sleep(1000);
      out.listen.push(srv.startMs);
      out.cpu.push((cpu ?? NaN) * 1000);
      out.recovered.push(m[2] === undefined ? NaN : Number(m[2])); // builds before 0ebcd59 did not log it
      out.rss.push(rssMb(srv.pid) ?? NaN);
      await srv.kill();
    }
    return out;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Whether redis answers PING with PONG now (not -LOADING, not refused). */
function pong(port) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => s.write('PING\r\n'));
    let got = '';
    s.setEncoding('latin1');
    s.on('data', (d) => {
      got += d;
      if (got.includes('\r\n')) {
        s.destroy();
        resolve(got.startsWith('+PONG'));
      }
    });
    s.once('error', () => resolve(false));
  });
}

async function bullmqRecovery(n) {
  let Queue;
  try {
    ({ Queue } = await import('bullmq'));
  } catch {
    return null;
  }
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-recovery-redis-'));
  try {
    const port = await freePort();
    let redis = await startRedis({ port, dir, aof: true, cpu: 1 });
    if (!redis) return null;
    const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null, retryStrategy: () => 20 };
    let queue = new Queue('recovery', { connection });
    queue.on('error', () => undefined);
    const t0 = performance.now();
    for (let i = 0; i < n; i += 1000) {
      await queue.addBulk(Array.from({ length: Math.min(1000, n - i) }, () => ({ name: 'job', data: DATA_1K })));
    }
    log(`  bullmq: ${n} jobs queued in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    await queue.close();
    await redis.stop();
    const out = { listen: [], cpu: [], rss: [] };
    for (let r = 0; r < runs; r++) {
      const s0 = performance.now();
      redis = await startRedis({ port, dir, aof: true, cpu: 1 });
      // Ready: a PING answered (-LOADING until the AOF is read). Over a raw socket: ioredis's
      // ready check waits a whole second when it finds redis loading.
      while (!(await pong(port))) await sleep(2);
      const readyMs = performance.now() - s0;
      const cpuMs = (cpuSeconds(redis.pid) ?? NaN) * 1000;
      queue = new Queue('recovery', { connection });
      queue.on('error', () => undefined);
      const count = await queue.getWaitingCount();
      if (count !== n) throw new Error(`redis came back with ${count} of ${n} jobs`);
      out.listen.push(readyMs);
      out.cpu.push(cpuMs);
      out.rss.push(rssMb(redis.pid) ?? NaN);
      await queue.close();
      await redis.stop();
    }
    return out;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

log(`bench:recovery ${new Date().toISOString()} on ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), node ${process.version}; ${runs} restarts per size`);
for (const n of sizes) {
  log(`${n} queued jobs of 1 KB:`);
  const f = await flashdRecovery(n);
  log(`  flashd (FULL): spawn to listening ${fmt(f.listen)}, CPU by then ${fmt(f.cpu)}, recovery itself ${fmt(f.recovered)}, RSS ${fmt(f.rss, 'MB')}`);
  const b = await bullmqRecovery(n);
  if (b) log(`  BullMQ + Redis (AOF, fsync always): spawn to ready ${fmt(b.listen)}, CPU by then ${fmt(b.cpu)}, RSS ${fmt(b.rss, 'MB')}`);
  else log('  BullMQ peer skipped (bullmq or redis-server missing)');
}
