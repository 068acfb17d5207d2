/**
 * The peer: BullMQ 5 with a local redis-server (Debian), on the same workloads as flashd:
 * S1 = Queue.add, S2 = add -> Worker -> job.waitUntilFinished (worker concurrency = clients),
 * S3 = idle worker pickup, S4 = addBulk then drain with worker concurrency 64. Redis is pinned
 * to CPU1; BullMQ's client, QueueEvents and Worker run in this process on CPU0, as flashd's
 * clients and simulated workers do. Default job options (completed jobs are kept).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DATA_1K, closedLoop, until } from './lib/load.mjs';
import { cpuSeconds, foreignCpu, freePort, rssMb, sleep, startRedis } from './lib/procs.mjs';
import { Samples, combine, nowUs } from './lib/stats.mjs';

const flat = (r) => ({ rate: r.rate, p50: r.lat.p50, p99: r.lat.p99, p999: r.lat.p999, serverCpuMsPer1k: r.serverCpuMsPer1k ?? null, loadCpu: r.loadCpu ?? null, foreignCpu: r.foreignCpu ?? null });
const KEYS = ['rate', 'p50', 'p99', 'p999', 'serverCpuMsPer1k', 'loadCpu', 'foreignCpu'];
const quiet = (x) => {
  x.on?.('error', () => undefined);
  return x;
};

export async function bullmqSuite({ aof, cfg, log }) {
  let bull;
  try {
    bull = await import('bullmq');
  } catch {
    log('   bullmq is not installed (npm i -D bullmq): peer skipped');
    return null;
  }
  const { Queue, Worker, QueueEvents } = bull;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-redis-'));
  const port = await freePort();
  const redis = await startRedis({ port, dir, aof, cpu: 1 });
  if (!redis) {
    log('   redis-server is not installed (apt-get install -y redis-server): peer skipped');
    rmSync(dir, { recursive: true, force: true });
    return null;
  }
  const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
  const res = { system: aof ? 'BullMQ + Redis (AOF, fsync always)' : 'BullMQ + Redis (no persistence)', aof };
  const admin = quiet(new Queue('admin', { connection }));
  const client = await admin.client;
  const flush = () => client.flushall();
  const cpu = () => cpuSeconds(redis.pid);
  const measured = async (fn) => {
    const c0 = cpu();
    const foreign = foreignCpu(() => [redis.pid]);
    const r = await fn();
    r.foreignCpu = foreign();
    const c1 = cpu();
    if (c0 !== null && c1 !== null && r.ok > 0) r.serverCpuMsPer1k = ((c1 - c0) * 1e6) / r.ok;
    return r;
  };
  let qn = 0;
  const name = (s) => `${s}-${++qn}`;

  try {
    // S1: add only.
    const s1Run = async (c, seconds) => {
      const queue = quiet(new Queue(name('s1'), { connection }));
      await queue.waitUntilReady();
      const ids = [];
      const r = await measured(() =>
        closedLoop(c, seconds, async () => {
          const j = await queue.add('j', DATA_1K);
          ids.push(j.id);
          return true;
        }),
      );
      const waiting = await queue.getWaitingCount();
      const distinct = new Set(ids).size;
      r.check = distinct === ids.length && waiting === ids.length && r.failed === 0;
      r.checkDetail = `acked=${ids.length} distinct=${distinct} waiting=${waiting} failed=${r.failed}`;
      await queue.close();
      await flush();
      return r;
    };
    res.s1 = {};
    for (const c of cfg.s1Clients) {
      await s1Run(c, cfg.warm);
      const runs = [];
      for (let k = 0; k < cfg.runs; k++) runs.push(await s1Run(c, cfg.seconds));
      res.s1[c] = { ...combine(runs.map(flat), KEYS), check: runs.every((r) => r.check), checkDetail: runs.map((r) => r.checkDetail) };
      log(`  S1 add c=${c}: ${runs.map((r) => r.rate.toFixed(0)).join(', ')} jobs/s; check ${res.s1[c].check ? 'ok' : 'FAILED ' + res.s1[c].checkDetail.join(' | ')}`);
    }

    // S2: add -> worker -> waitUntilFinished, worker concurrency = clients.
    res.s2 = {};
    for (const W of cfg.s2Workers) {
      const qname = name('s2');
      const queue = quiet(new Queue(qname, { connection }));
      const events = quiet(new QueueEvents(qname, { connection }));
      queue.setMaxListeners(0);
      events.setMaxListeners(0);
      let processed = [];
      const worker = quiet(new Worker(qname, async (job) => {
        processed.push(job.id);
        return { job: job.id };
      }, { connection, concurrency: W }));
      await Promise.all([queue.waitUntilReady(), events.waitUntilReady(), worker.waitUntilReady()]);
      const once = async (seconds) => {
        processed = [];
        const acked = [];
        let bad = 0;
        const r = await measured(() =>
          closedLoop(W, seconds, async () => {
            const job = await queue.add('j', DATA_1K);
            const rv = await job.waitUntilFinished(events, 60_000);
            if (rv?.job !== job.id) {
              bad++;
              return false;
            }
            acked.push(job.id);
            return true;
          }),
        );
        const counts = new Map();
        for (const id of processed) counts.set(id, (counts.get(id) ?? 0) + 1);
        let once1 = 0;
        for (const id of acked) if (counts.get(id) === 1) once1++;
        r.check = once1 === acked.length && counts.size === acked.length && bad === 0 && r.failed === 0;
        r.checkDetail = `acked=${acked.length} executedOnce=${once1} executedIds=${counts.size} bad=${bad} failed=${r.failed}`;
        return r;
      };
      try {
        await once(cfg.warm);
        const runs = [];
        for (let k = 0; k < cfg.runs; k++) runs.push(await once(cfg.seconds));
        res.s2[W] = { ...combine(runs.map(flat), KEYS), check: runs.every((r) => r.check), checkDetail: runs.map((r) => r.checkDetail) };
        log(`  S2 add->worker->waitUntilFinished W=c=${W}: ${runs.map((r) => r.rate.toFixed(0)).join(', ')} jobs/s, p50 ${runs.map((r) => r.lat.p50.toFixed(0)).join(', ')} µs; check ${res.s2[W].check ? 'ok' : 'FAILED ' + res.s2[W].checkDetail.join(' | ')}`);
      } finally {
        await worker.close();
        await events.close();
        await queue.close();
        await flush();
      }
    }

    // S3: idle worker pickup.
    {
      const qname = name('s3');
      const queue = quiet(new Queue(qname, { connection }));
      let onStart = null;
      let onDone = null;
      const seen = [];
      const worker = quiet(new Worker(qname, async (job) => {
        onStart?.(nowUs());
        seen.push(job.id);
        return { job: job.id };
      }, { connection, concurrency: 1 }));
      worker.on('completed', () => onDone?.(nowUs()));
      await Promise.all([queue.waitUntilReady(), worker.waitUntilReady()]);
      await sleep(50);
      const pickup = new Samples();
      const e2e = new Samples();
      const ack = new Samples();
      const ids = [];
      try {
        for (let i = 0; i < cfg.s3Samples; i++) {
          await sleep(1);
          const got = new Promise((r) => (onStart = r));
          const fin = new Promise((r) => (onDone = r));
          const t0 = nowUs();
          const job = await queue.add('j', DATA_1K);
          const t1 = nowUs();
          ids.push(job.id);
          pickup.push((await got) - t0);
          e2e.push((await fin) - t0);
          ack.push(t1 - t0);
        }
      } finally {
        await worker.close();
        await queue.close();
        await flush();
      }
      res.s3 = {
        pickup: pickup.summary(), ack: ack.summary(), e2e: e2e.summary(),
        check: seen.length === ids.length && ids.every((id, k) => seen[k] === id),
        checkDetail: `submitted=${ids.length} processed=${seen.length}`,
      };
      log(`  S3 pickup p50 ${res.s3.pickup.p50.toFixed(0)} µs p99 ${res.s3.pickup.p99.toFixed(0)} µs; check ${res.s3.check ? 'ok' : 'FAILED ' + res.s3.checkDetail}`);
    }

    // S4: addBulk, then drain with concurrency 64.
    const s4 = [];
    for (let k = 0; k < cfg.s4Runs; k++) {
      const qname = name('s4');
      const queue = quiet(new Queue(qname, { connection }));
      await queue.waitUntilReady();
      const ids = [];
      const te = performance.now();
      for (let i = 0; i < cfg.s4Jobs; i += 1000) {
        const n = Math.min(1000, cfg.s4Jobs - i);
        const jobs = await queue.addBulk(Array.from({ length: n }, () => ({ name: 'j', data: DATA_1K })));
        for (const j of jobs) ids.push(j.id);
      }
      const enqueueRate = ids.length / ((performance.now() - te) / 1000);
      const processed = [];
      const c0 = cpu();
      const t0 = performance.now();
      const worker = quiet(new Worker(qname, async (job) => {
        processed.push(job.id);
        return { job: job.id };
      }, { connection, concurrency: 64 }));
      let completed = 0;
      worker.on('completed', () => completed++);
      let timedOut = false;
      try {
        await until(() => completed >= ids.length, 300_000, 'BullMQ drain');
      } catch {
        timedOut = true;
      }
      const elapsed = (performance.now() - t0) / 1000;
      const c1 = cpu();
      await worker.close();
      const counts = new Map();
      for (const id of processed) counts.set(id, (counts.get(id) ?? 0) + 1);
      let once = 0;
      for (const id of ids) if (counts.get(id) === 1) once++;
      const done = await queue.getCompletedCount();
      await queue.close();
      await flush();
      const r = {
        rate: completed / elapsed, enqueueRate, serverCpuMsPer1k: c0 !== null && c1 !== null ? ((c1 - c0) * 1e6) / Math.max(1, completed) : null,
        check: !timedOut && once === ids.length && counts.size === ids.length && done === ids.length,
        checkDetail: `acked=${ids.length} executedOnce=${once} executedIds=${counts.size} completed=${done}`,
      };
      s4.push(r);
      log(`  S4 drain ${cfg.s4Jobs} (addBulk 1000, worker concurrency 64): ${r.rate.toFixed(0)} jobs/s (enqueue ${enqueueRate.toFixed(0)}/s); check ${r.check ? 'ok' : 'FAILED ' + r.checkDetail}`);
    }
    res.s4 = { jobs: cfg.s4Jobs, ...combine(s4, ['rate', 'enqueueRate', 'serverCpuMsPer1k']), check: s4.every((r) => r.check), checkDetail: s4.map((r) => r.checkDetail) };
    res.serverRssMb = rssMb(redis.pid);
    return res;
  } finally {
    await admin.close().catch(() => undefined);
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
