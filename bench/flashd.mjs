/**
 * flashd scenarios (perf-anchors §7): S1 /run, S2 /runsync with W workers, S3 idle pickup,
 * S4 drain, S5 /status storm during S2, S7 kill -9 mid-traffic and restart. flashd runs as
 * its own process (pinned to CPU1 when possible); clients and simulated workers run in this
 * process (CPU0) over keep-alive HTTP. Every run checks that each acknowledged job exists or
 * completed exactly once.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Conn, call, head } from './lib/http.mjs';
import { BODY_1K, closedLoop, countedLoop, until } from './lib/load.mjs';
import { benchKey, cpuSeconds, createEndpoint, foreignCpu, freePort, rssMb, sleep, startFlashd, workerEnv } from './lib/procs.mjs';
import { SimWorker } from './lib/sim-worker.mjs';
import { Samples, combine, nowUs } from './lib/stats.mjs';

const ADMIN = 'bench-admin-key-0123456789abcdef';
const HOST = '127.0.0.1';

const idOf = (b) => b.toString('latin1', 7, b.indexOf(34, 7));

async function openConns(port, n) {
  const conns = [];
  for (let i = 0; i < n; i++) conns.push(await new Conn(HOST, port).connect());
  return conns;
}
const closeAll = (conns) => conns.forEach((c) => c.close());

class Ctx {
  constructor(srv, port, key, log) {
    this.srv = srv;
    this.port = port;
    this.url = `http://${HOST}:${port}`;
    this.key = key;
    this.auth = `Bearer ${key}`;
    this.host = `${HOST}:${port}`;
    this.log = log;
  }
  async workers(endpointId, n, hooks = {}) {
    const ws = [];
    for (let i = 0; i < n; i++) {
      const env = await workerEnv(this.url, this.key, endpointId);
      ws.push(new SimWorker({ host: HOST, port: this.port, endpointId, workerId: env.workerId, key: env.key, ...hooks }));
    }
    return ws;
  }
  async health(ep) {
    const r = await call(this.url, 'GET', `/v2/${ep}/health`, this.auth);
    return r.body;
  }
  cpu() {
    return cpuSeconds(this.srv.pid);
  }
}

/** Wraps one measured run with the server's CPU time per 1k jobs. */
async function measured(ctx, fn) {
  const c0 = ctx.cpu();
  const foreign = foreignCpu(() => [ctx.srv.pid]);
  const r = await fn();
  r.foreignCpu = foreign();
  const c1 = ctx.cpu();
  if (c0 !== null && c1 !== null && r.ok > 0) r.serverCpuMsPer1k = ((c1 - c0) * 1000 * 1000) / r.ok;
  return r;
}

const flat = (r) => ({ rate: r.rate, p50: r.lat.p50, p99: r.lat.p99, p999: r.lat.p999, serverCpuMsPer1k: r.serverCpuMsPer1k ?? null, loadCpu: r.loadCpu ?? null, foreignCpu: r.foreignCpu ?? null });
const KEYS = ['rate', 'p50', 'p99', 'p999', 'serverCpuMsPer1k', 'loadCpu', 'foreignCpu'];

// S1 --------------------------------------------------------------------------------------------

async function s1Run(ctx, c, seconds) {
  const ep = await createEndpoint(ctx.url, ctx.key, 's1');
  const conns = await openConns(ctx.port, c);
  const h = head('POST', `/v2/${ep}/run`, ctx.host, ctx.auth, true);
  const ids = [];
  const r = await measured(ctx, () =>
    closedLoop(c, seconds, async (i) => {
      const res = await conns[i].request(h, BODY_1K);
      if (res.status !== 200) return false;
      ids.push(idOf(res.body));
      return true;
    }),
  );
  closeAll(conns);
  // Every acknowledged job exists exactly once: distinct ids, the queue holds exactly them.
  const health = await ctx.health(ep);
  const purge = await call(ctx.url, 'POST', `/v2/${ep}/purge-queue`, ctx.auth, {});
  const distinct = new Set(ids).size;
  r.check = distinct === ids.length && health.jobs.inQueue === ids.length && purge.body.removed === ids.length && r.failed === 0;
  r.checkDetail = `acked=${ids.length} distinct=${distinct} inQueue=${health.jobs.inQueue} purged=${purge.body.removed} failed=${r.failed}`;
  return r;
}

// S2 --------------------------------------------------------------------------------------------

async function s2Level(ctx, W, cfg, poll) {
  const ep = await createEndpoint(ctx.url, ctx.key, `s2-${W}`);
  const workers = await ctx.workers(ep, W);
  workers.forEach((w) => w.start());
  const conns = await openConns(ctx.port, W);
  const h = head('POST', `/v2/${ep}/runsync`, ctx.host, ctx.auth, true);
  const recent = [];
  const once = async (seconds) => {
    workers.forEach((w) => w.reset());
    const acked = [];
    let bad = 0;
    const r = await measured(ctx, () =>
      closedLoop(W, seconds, async (i) => {
        const res = await conns[i].request(h, BODY_1K);
        if (res.status !== 200) return false;
        const j = JSON.parse(res.body.toString('utf8'));
        if (j.status !== 'COMPLETED' || j.output?.job !== j.id) {
          bad++;
          return false;
        }
        acked.push(j.id);
        if (recent.length < 4096) recent.push(j.id);
        else recent[(Math.random() * 4096) | 0] = j.id;
        return true;
      }),
    );
    // The worker's answer to job-done can arrive after the client's /runsync reply.
    await until(() => workers.every((w) => !w.busy), 10_000, 'workers to settle');
    const counts = new Map();
    let accepted = 0;
    for (const w of workers) {
      for (const id of w.received) counts.set(id, (counts.get(id) ?? 0) + 1);
      accepted += w.accepted.length;
    }
    let once1 = 0;
    for (const id of acked) if (counts.get(id) === 1) once1++;
    r.check = once1 === acked.length && counts.size === acked.length && accepted === acked.length && bad === 0 && r.failed === 0;
    r.checkDetail = `acked=${acked.length} executedOnce=${once1} executedIds=${counts.size} accepted=${accepted} bad=${bad} failed=${r.failed}`;
    return r;
  };
  const level = { once, recent, ep };
  try {
    await once(cfg.warm);
    const runs = [];
    for (let k = 0; k < cfg.runs; k++) runs.push(await once(cfg.seconds));
    let storm = null;
    if (poll) storm = await poll(level, runs);
    return { runs, storm };
  } finally {
    closeAll(conns);
    await Promise.all(workers.map((w) => w.stop()));
  }
}

// S3 --------------------------------------------------------------------------------------------

async function s3(ctx, samples) {
  const ep = await createEndpoint(ctx.url, ctx.key, 's3');
  let onRecv = null;
  let onDone = null;
  const [w] = await ctx.workers(ep, 1, {
    onReceive: () => onRecv?.(nowUs()),
    onDone: () => onDone?.(nowUs()),
  });
  w.start();
  const [conn] = await openConns(ctx.port, 1);
  const h = head('POST', `/v2/${ep}/run`, ctx.host, ctx.auth, true);
  const pickup = new Samples();
  const e2e = new Samples();
  const ack = new Samples();
  let failed = 0;
  const ids = [];
  try {
    for (let i = 0; i < samples; i++) {
      // Let the worker's job-take reach the server and park there.
      await sleep(1);
      const got = new Promise((r) => (onRecv = r));
      const fin = new Promise((r) => (onDone = r));
      const t0 = nowUs();
      const res = await conn.request(h, BODY_1K);
      const t1 = nowUs();
      if (res.status !== 200) {
        failed++;
        continue;
      }
      ids.push(idOf(res.body));
      const tr = await got;
      const td = await fin;
      pickup.push(tr - t0);
      ack.push(t1 - t0);
      e2e.push(td - t0);
    }
  } finally {
    conn.close();
    await w.stop();
  }
  const check = w.received.length === ids.length && w.accepted.length === ids.length && ids.every((id, k) => w.received[k] === id) && failed === 0;
  return {
    pickup: pickup.summary(), ack: ack.summary(), e2e: e2e.summary(), check,
    checkDetail: `submitted=${ids.length} received=${w.received.length} accepted=${w.accepted.length} failed=${failed}`,
  };
}

// S4 --------------------------------------------------------------------------------------------

async function s4Run(ctx, jobs, W) {
  const ep = await createEndpoint(ctx.url, ctx.key, 's4');
  let done = 0;
  const workers = await ctx.workers(ep, W, { onDone: () => done++ });
  const conns = await openConns(ctx.port, 64);
  const h = head('POST', `/v2/${ep}/run`, ctx.host, ctx.auth, true);
  const ids = [];
  const enq = await countedLoop(64, jobs, async (_, i) => {
    const res = await conns[i].request(h, BODY_1K);
    if (res.status !== 200) return false;
    ids.push(idOf(res.body));
    return true;
  });
  closeAll(conns);
  const c0 = ctx.cpu();
  const t0 = performance.now();
  workers.forEach((w) => w.start());
  let timedOut = false;
  try {
    await until(() => done >= ids.length, 300_000, `drain of ${ids.length} jobs`);
  } catch {
    timedOut = true;
  }
  const elapsed = (performance.now() - t0) / 1000;
  const c1 = ctx.cpu();
  await Promise.all(workers.map((w) => w.stop()));
  const counts = new Map();
  let accepted = 0;
  for (const w of workers) {
    for (const id of w.received) counts.set(id, (counts.get(id) ?? 0) + 1);
    accepted += w.accepted.length;
  }
  let once = 0;
  for (const id of ids) if (counts.get(id) === 1) once++;
  const health = await ctx.health(ep);
  const check = !timedOut && once === ids.length && counts.size === ids.length && accepted === ids.length && health.jobs.completed === ids.length && enq.failed === 0;
  return {
    ok: done, rate: done / elapsed, elapsed, enqueueRate: enq.rate, serverCpuMsPer1k: c0 !== null && c1 !== null ? ((c1 - c0) * 1e6) / Math.max(1, done) : null,
    check, checkDetail: `acked=${ids.length} executedOnce=${once} executedIds=${counts.size} accepted=${accepted} completed=${health.jobs.completed} failedEnqueue=${enq.failed}`,
  };
}

// S5 --------------------------------------------------------------------------------------------

/** Interleaves plain S2 (W=64) runs with runs under a /status storm at `rate` polls/s. */
function s5Storm(ctx, cfg) {
  return async (level) => {
    const base = [];
    const storm = [];
    for (let k = 0; k < cfg.runs; k++) {
      base.push(await level.once(cfg.seconds));
      const conns = await openConns(ctx.port, cfg.pollers);
      let stop = false;
      let polls = 0;
      let bad = 0;
      const lat = new Samples();
      const t0 = performance.now();
      const perPoller = cfg.pollRate / cfg.pollers;
      const pollers = conns.map(async (c, i) => {
        let n = 0;
        while (!stop) {
          // Paced: poll k of this poller is due at t0 + k / perPoller (open loop, no catch-up burst).
          const due = t0 + (n * 1000) / perPoller + (i * 1000) / cfg.pollRate;
          const wait = due - performance.now();
          if (wait > 1) await sleep(wait);
          if (stop) break;
          n++;
          const id = level.recent[(Math.random() * level.recent.length) | 0];
          const s = nowUs();
          const r = await c.request(`GET /v2/${level.ep}/status/${id} HTTP/1.1\r\nHost: ${ctx.host}\r\nAuthorization: ${ctx.auth}`);
          lat.push(nowUs() - s);
          polls++;
          if (r.status !== 200) bad++;
          if (performance.now() - due > 1000) n = Math.floor(((performance.now() - t0) * perPoller) / 1000);
        }
      });
      const r = await level.once(cfg.seconds);
      stop = true;
      await Promise.all(pollers);
      closeAll(conns);
      const secs = (performance.now() - t0) / 1000;
      r.pollRate = polls / secs;
      r.pollLat = lat.summary();
      r.pollBad = bad;
      storm.push(r);
    }
    const med = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
    const b = med(base.map((r) => r.rate));
    const s = med(storm.map((r) => r.rate));
    return {
      base: combine(base.map(flat), KEYS), storm: combine(storm.map((r) => ({ ...flat(r), pollRate: r.pollRate, pollP50: r.pollLat.p50, pollP99: r.pollLat.p99 })), ['rate', 'p50', 'p99', 'pollRate', 'pollP50', 'pollP99']),
      degradationPct: ((b - s) / b) * 100, pollBad: storm.reduce((a, r) => a + r.pollBad, 0),
      check: base.every((r) => r.check) && storm.every((r) => r.check && r.pollBad === 0),
    };
  };
}

// S7 --------------------------------------------------------------------------------------------

/**
 * kill -9 of flashd in the middle of traffic (/run and /runsync clients, W workers, a
 * pre-queued backlog), restart on the same data dir and port, then drain. Checks from the
 * database: every job acknowledged with a 200 is COMPLETED with its own output, and no job got
 * two accepted results.
 */
export async function s7Kill(opts) {
  const { sync, prequeue, log } = opts;
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'flashd-s7-'));
  const port = await freePort();
  const start = () => startFlashd({ port, dataDir, adminKey: ADMIN, sync, cpu: 1, leaseMs: 2000, takeHoldMs: 5000 });
  let srv = await start();
  const out = { sync, prequeue };
  try {
    const key = await benchKey(srv.url, ADMIN);
    const ctx = new Ctx(srv, port, key, log);
    const ep = await createEndpoint(ctx.url, key, 's7');
    const acked = new Set();
    // Backlog: queued jobs the restart has to recover.
    const pre = await openConns(port, 64);
    const hRun = head('POST', `/v2/${ep}/run`, ctx.host, ctx.auth, true);
    const hSync = head('POST', `/v2/${ep}/runsync`, ctx.host, ctx.auth, true);
    await countedLoop(64, prequeue, async (_, i) => {
      const r = await pre[i].request(hRun, BODY_1K);
      if (r.status !== 200) return false;
      acked.add(idOf(r.body));
      return true;
    });
    closeAll(pre);
    const workers = await ctx.workers(ep, 8, { retryMs: 10, retryWindowMs: 60_000 });
    workers.forEach((w) => w.start());
    // Traffic: 8 /run and 8 /runsync clients that reconnect while flashd is down.
    let stop = false;
    let killedAt = 0;
    let restarted = false;
    let firstAckAfter = 0;
    let unknownOutcome = 0;
    const client = async (syncMode) => {
      const c = new Conn(HOST, port);
      while (!stop) {
        if (c.closed) {
          try {
            await c.connect(1000);
          } catch {
            await sleep(10);
            continue;
          }
        }
        try {
          const r = await c.request(syncMode ? hSync : hRun, BODY_1K);
          if (r.status !== 200) {
            await sleep(5);
            continue;
          }
          const j = JSON.parse(r.body.toString('utf8'));
          if (syncMode && j.status !== 'COMPLETED') continue;
          acked.add(j.id);
          if (restarted && !firstAckAfter) firstAckAfter = performance.now();
        } catch {
          unknownOutcome++;
        }
      }
      c.close();
    };
    const clients = [...Array.from({ length: 8 }, () => client(false)), ...Array.from({ length: 8 }, () => client(true))];
    await sleep(opts.beforeKillMs ?? 2000);
    const ackedAtKill = acked.size;
    killedAt = performance.now();
    await srv.kill();
    restarted = true;
    srv = await start();
    out.restartListenMs = srv.startMs;
    const m = /jobs recovered queued=(\d+) running=(\d+)/.exec(srv.stderrTail());
    out.recoveredQueued = m ? Number(m[1]) : 0;
    out.recoveredRunning = m ? Number(m[2]) : 0;
    ctx.srv = srv;
    await until(() => firstAckAfter > 0, 30_000, 'first acknowledged job after restart');
    out.killToFirstAckMs = firstAckAfter - killedAt;
    await sleep(opts.afterKillMs ?? 1000);
    stop = true;
    await Promise.all(clients);
    // Drain: everything acknowledged must complete (leases of jobs lost with the connection expire in 2 s).
    const deadline = performance.now() + 120_000;
    for (;;) {
      const h = await ctx.health(ep);
      if (h.jobs.inQueue === 0 && h.jobs.inProgress === 0) break;
      if (performance.now() > deadline) throw new Error(`S7 drain stalled: ${JSON.stringify(h.jobs)}`);
      await sleep(100);
    }
    await Promise.all(workers.map((w) => w.stop()));
    await srv.stop();
    const db = new Database(path.join(dataDir, 'flashd.db'), { readonly: true });
    const integrity = db.pragma('integrity_check', { simple: true });
    const rows = new Map(db.prepare('SELECT id, status, output FROM jobs WHERE endpoint_id = ?').all(ep).map((r) => [r.id, r]));
    db.close();
    let lost = 0;
    let wrongOutput = 0;
    for (const id of acked) {
      const r = rows.get(id);
      if (!r || r.status !== 'COMPLETED') lost++;
      else if (JSON.parse(r.output).job !== id) wrongOutput++;
    }
    const acceptedCount = new Map();
    let executions = 0;
    for (const w of workers) {
      executions += w.received.length;
      for (const id of w.accepted) acceptedCount.set(id, (acceptedCount.get(id) ?? 0) + 1);
    }
    let duplicated = 0;
    for (const n of acceptedCount.values()) if (n > 1) duplicated++;
    Object.assign(out, {
      acked: acked.size, ackedAtKill, unknownOutcome, lost, duplicated, wrongOutput, integrity, executions,
      reExecuted: executions - acceptedCount.size, stale409: workers.reduce((a, w) => a + w.stale, 0),
      check: lost === 0 && duplicated === 0 && wrongOutput === 0 && integrity === 'ok',
    });
    return out;
  } finally {
    await srv.kill();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

// Suite -------------------------------------------------------------------------------------------

export async function flashdSuite({ sync, cfg, log, storm }) {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), `flashd-bench-${sync}-`));
  const port = await freePort();
  const srv = await startFlashd({ port, dataDir, adminKey: ADMIN, sync, cpu: 1 });
  const res = { system: `flashd (${sync === 'full' ? 'synchronous=FULL, group commit' : 'synchronous=NORMAL, group commit'})`, sync };
  try {
    const key = await benchKey(srv.url, ADMIN);
    const ctx = new Ctx(srv, port, key, log);

    res.s1 = {};
    for (const c of cfg.s1Clients) {
      await s1Run(ctx, c, cfg.warm);
      const runs = [];
      for (let k = 0; k < cfg.runs; k++) runs.push(await s1Run(ctx, c, cfg.seconds));
      res.s1[c] = { ...combine(runs.map(flat), KEYS), check: runs.every((r) => r.check), checkDetail: runs.map((r) => r.checkDetail) };
      log(`  S1 /run c=${c}: ${runs.map((r) => r.rate.toFixed(0)).join(', ')} jobs/s; check ${res.s1[c].check ? 'ok' : 'FAILED ' + res.s1[c].checkDetail.join(' | ')}`);
    }

    res.s2 = {};
    for (const W of cfg.s2Workers) {
      const poll = storm && W === Math.max(...cfg.s2Workers) ? s5Storm(ctx, cfg) : null;
      const { runs, storm: st } = await s2Level(ctx, W, cfg, poll);
      res.s2[W] = { ...combine(runs.map(flat), KEYS), check: runs.every((r) => r.check), checkDetail: runs.map((r) => r.checkDetail) };
      log(`  S2 /runsync W=c=${W}: ${runs.map((r) => r.rate.toFixed(0)).join(', ')} jobs/s, p50 ${runs.map((r) => r.lat.p50.toFixed(0)).join(', ')} µs; check ${res.s2[W].check ? 'ok' : 'FAILED ' + res.s2[W].checkDetail.join(' | ')}`);
      if (st) {
        res.s5 = { workers: W, pollRateTarget: cfg.pollRate, ...st };
        log(`  S5 /status storm: ${st.storm.pollRate.median?.toFixed(0)} polls/s, S2 ${st.base.rate.median.toFixed(0)} -> ${st.storm.rate.median.toFixed(0)} jobs/s (${st.degradationPct.toFixed(1)} % lower); check ${st.check ? 'ok' : 'FAILED'}`);
      }
    }

    res.s3 = await s3(ctx, cfg.s3Samples);
    log(`  S3 pickup p50 ${res.s3.pickup.p50.toFixed(0)} µs p99 ${res.s3.pickup.p99.toFixed(0)} µs; check ${res.s3.check ? 'ok' : 'FAILED ' + res.s3.checkDetail}`);

    const s4 = [];
    for (let k = 0; k < cfg.s4Runs; k++) {
      const r = await s4Run(ctx, cfg.s4Jobs, 64);
      s4.push(r);
      log(`  S4 drain ${cfg.s4Jobs} with 64 workers: ${r.rate.toFixed(0)} jobs/s (enqueue ${r.enqueueRate.toFixed(0)}/s); check ${r.check ? 'ok' : 'FAILED ' + r.checkDetail}`);
    }
    res.s4 = { jobs: cfg.s4Jobs, ...combine(s4.map((r) => ({ rate: r.rate, enqueueRate: r.enqueueRate, serverCpuMsPer1k: r.serverCpuMsPer1k })), ['rate', 'enqueueRate', 'serverCpuMsPer1k']), check: s4.every((r) => r.check), checkDetail: s4.map((r) => r.checkDetail) };
    res.serverRssMb = rssMb(srv.pid);
  } finally {
    await srv.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
  res.s7 = await s7Kill({ sync, prequeue: cfg.s7Prequeue, log });
  const s7 = res.s7;
  log(`  S7 kill -9: acked=${s7.acked} lost=${s7.lost} duplicated=${s7.duplicated} restart ${s7.restartListenMs.toFixed(0)} ms (recovered ${s7.recoveredQueued} queued, ${s7.recoveredRunning} running), kill->first ack ${s7.killToFirstAckMs.toFixed(0)} ms, integrity ${s7.integrity}`);
  return res;
}

/** S3 alone on a fresh flashd (for quick checks). */
export async function s3Only(sync, samples) {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'flashd-s3-'));
  const port = await freePort();
  const srv = await startFlashd({ port, dataDir, adminKey: ADMIN, sync, cpu: 1 });
  try {
    const key = await benchKey(srv.url, ADMIN);
    return await s3(new Ctx(srv, port, key, () => undefined), samples);
  } finally {
    await srv.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
}
