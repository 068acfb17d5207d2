#!/usr/bin/env node
/**
 * `npm run chaos`: crash test (reliability-anchors R1 + R2). Starts flashd on its own data dir
 * and a free port, N worker processes (bench/chaos-worker.mjs), and sends jobs to /run from
 * this process while SIGKILLing random workers and flashd itself at random moments; workers
 * also SIGKILL themselves at chosen points (right after take, mid-job, between writing the
 * result and reading its answer). flashd restarts on the same data dir and port (after a
 * `PRAGMA integrity_check`), workers restart with the same worker id or a fresh one. Short
 * leases (--lease-ms 2000) bring lost jobs back quickly.
 *
 * Every third job (by its sequence number) carries a `webhook` to a receiver in this process
 * (flashd runs with --webhook-allow-private and --webhook-retry-delay-ms 500). The receiver
 * answers after 0-50 ms, so deliveries are in flight when flashd is killed, and answers 503 to
 * the first POST of a tenth of those jobs, so some deliveries need their second try.
 *
 * At the end, every id that got a 200 from /run must reach a final state. Prints one line
 *   lost=<n> duplicated=<n> unexpected=<n> ...
 * where lost = acknowledged id unknown to flashd or not COMPLETED, duplicated = job for which
 * two result posts were accepted ({"ok":true} without "duplicate"), unexpected = job that
 * flashd ran although no /run carried it, and ranUncommitted = job a worker ran whose /run was
 * cut by a flashd kill and whose row that kill took (flashd hands a job to a parked job-take
 * before the commit that stores it; no 200 was given: bench/lib/chaos-verdict.mjs). Then, after waiting (bounded) for owed webhooks,
 *   webhooks: owed=<n> delivered=<n> missing=<n> extra=<n> ...
 * where owed = acknowledged jobs with a webhook that reached a final state, delivered = those
 * of them with at least one delivery (a POST answered 2xx), extra = deliveries past the first
 * (at least once allows them; counted). Every delivery's body must carry the job's id, its
 * final /status status and, for COMPLETED, its /status output; a delivery for a job no /run
 * carried (or one without a webhook) fails. Then `chaos: N passed, N failed`; exit 1 on any
 * failed check.
 *
 * env: CHAOS_JOBS (3000), CHAOS_KILLS (30 orchestrated kills; worker self-kills come on top),
 *      CHAOS_WORKERS (6), CHAOS_SECONDS (submission window, default JOBS/25 s),
 *      CHAOS_FLASHD_SHARE (0.3 of kills hit flashd), CHAOS_SEED, CHAOS_FLASHD (entry file),
 *      CHAOS_KEEP=1 (keep the data dir and logs), CHAOS_TIMEOUT_S (overall limit, 900),
 *      CHAOS_WEBHOOK_EVERY (3: every Nth job has a webhook; 0 for none),
 *      CHAOS_WEBHOOK_WAIT_S (30: how long to wait for owed webhooks after the drain),
 *      CHAOS_INPUT_PAD (200: characters of padding in each input; over 2,048 the inputs go to job_inputs),
 *      CHAOS_ENV_WAIT_S (60: how long a worker restart waits for flashd to be back; one that waits
 *      longer is counted, tried again, and fails the run at the end, with the summary)
 */
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { Conn, head } from './lib/http.mjs';
import { handleArgs, headerUsage } from './lib/args.mjs';
import { classifyJobs } from './lib/chaos-verdict.mjs';
import { benchKey, createEndpoint, freePort, sleep, startFlashd, track, workerEnv } from './lib/procs.mjs';

handleArgs('chaos', `${headerUsage(import.meta.url)}\nIt passes only with lost=0 duplicated=0 unexpected=0 and every owed webhook delivered.\ne.g. CHAOS_JOBS=500 CHAOS_KILLS=8 npm run chaos   (test/e2e/chaos.test.ts, in CI, runs 300 jobs and 6 kills)\n`);

const env = process.env;
const int = (name, def) => (env[name] !== undefined && env[name] !== '' ? Number(env[name]) : def);
const JOBS = int('CHAOS_JOBS', 3000);
const KILLS = int('CHAOS_KILLS', 30);
const WORKERS = int('CHAOS_WORKERS', 6);
const WINDOW_S = int('CHAOS_SECONDS', Math.max(8, Math.round(JOBS / 25)));
const FLASHD_SHARE = Number(env.CHAOS_FLASHD_SHARE ?? 0.3);
const TIMEOUT_S = int('CHAOS_TIMEOUT_S', 900);
const LEASE_MS = 2000;
const TAKE_HOLD_MS = 3000;
const REQUEUE_LIMIT_MS = int('CHAOS_REQUEUE_LIMIT_MS', 10_000);
// How long a worker restart waits for flashd to be back: a restart after a kill takes 2-6 s on a
// loaded 2-core box, and a start may take up to startFlashd's 30 s, tried again by startServer.
const ENV_WAIT_MS = int('CHAOS_ENV_WAIT_S', 60) * 1000;
const ADMIN = 'chaos-admin-key-0123456789abcdef';
const HOST = '127.0.0.1';
const HOOK_EVERY = int('CHAOS_WEBHOOK_EVERY', 3);
const HOOK_WAIT_S = int('CHAOS_WEBHOOK_WAIT_S', 30);
const HOOK_RETRY_MS = 500;
const INPUT_PAD = int('CHAOS_INPUT_PAD', 200);
const WORKER_JS = fileURLToPath(new URL('./chaos-worker.mjs', import.meta.url));
// Expected self-kills are about as many as orchestrated kills, split over three points.
const SELF_KILL_P = Math.min(0.05, KILLS / Math.max(1, JOBS) / 3);

// Seeded PRNG for the kill schedule, so a failing run can be replayed with CHAOS_SEED.
const SEED = int('CHAOS_SEED', Date.now() % 2 ** 31);
let seed = SEED >>> 0;
/** mulberry32 */
const rand = () => {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};

const say = (s) => process.stdout.write(`[chaos ${((performance.now() - T0) / 1000).toFixed(1)}s] ${s}\n`);
const T0 = performance.now();
const hardStop = setTimeout(() => {
  say(`overall limit of ${TIMEOUT_S} s reached: giving up`);
  process.exit(3);
}, TIMEOUT_S * 1000);
hardStop.unref();

const dir = mkdtempSync(path.join(os.tmpdir(), 'flashd-chaos-'));
const dataDir = path.join(dir, 'data');
const logDir = path.join(dir, 'logs');
mkdirSync(logDir, { recursive: true });

const stats = { flashdKills: 0, workerKills: 0, workerExits: 0, integrityChecks: 0, integrityFailures: [], restartMs: [], harnessErrors: [] };

// flashd -------------------------------------------------------------------------------------------

let port = await freePort();
let srv = null;
let flashdUp = false;

async function startServer(firstStart = false) {
  for (let attempt = 1; ; attempt++) {
    // The first start may pick another free port (someone took this one); restarts keep theirs.
    if (firstStart && attempt > 1) port = await freePort();
    try {
      srv = await startFlashd({
        port, dataDir, adminKey: ADMIN, sync: 'full', leaseMs: LEASE_MS, takeHoldMs: TAKE_HOLD_MS,
        extra: ['--max-attempts', '50', '--webhook-allow-private', '--webhook-retry-delay-ms', String(HOOK_RETRY_MS)], entry: env.CHAOS_FLASHD || undefined,
      });
      flashdUp = true;
      return;
    } catch (err) {
      say(`flashd start attempt ${attempt} failed: ${err.message ?? err}`);
      if (attempt >= 20) throw err;
      await sleep(200);
    }
  }
}

function integrityCheck(when) {
  const db = new Database(path.join(dataDir, 'flashd.db'));
  try {
    const r = db.pragma('integrity_check', { simple: true });
    stats.integrityChecks++;
    if (r !== 'ok') stats.integrityFailures.push(`${when}: ${r}`);
    return r;
  } finally {
    db.close();
  }
}

async function killServer() {
  flashdUp = false;
  await srv.kill();
  stats.flashdKills++;
  integrityCheck(`after kill ${stats.flashdKills}`);
  const t = performance.now();
  await startServer();
  stats.restartMs.push(performance.now() - t);
}

// Workers -----------------------------------------------------------------------------------------

let key;
let endpointId;
const workers = []; // { slot, workerId, key, child, incarnation, restarting }
const deaths = new Map(); // worker log file name -> when that incarnation was killed (ms since epoch)
let stopping = false;

async function freshEnv() {
  const deadline = performance.now() + ENV_WAIT_MS;
  let last = 'flashd was not up';
  while (performance.now() < deadline) {
    try {
      if (flashdUp) return await workerEnv(`http://${HOST}:${port}`, key, endpointId);
    } catch (err) {
      // flashd went down in between
      last = err.message ?? String(err);
    }
    await sleep(50);
  }
  throw new Error(`could not get a worker env for ${ENV_WAIT_MS / 1000} s (flashd down that long?): ${last}`);
}

function spawnWorker(slot) {
  const w = workers[slot];
  w.incarnation++;
  const child = track(spawn(process.execPath, [WORKER_JS], {
    env: {
      ...env, NODE_OPTIONS: '', CHAOS_HOST: HOST, CHAOS_PORT: String(port), CHAOS_EP: endpointId, CHAOS_WORKER_ID: w.workerId, CHAOS_KEY: w.key,
      CHAOS_LOG: path.join(logDir, `${w.workerId}.${w.incarnation}.log`), CHAOS_SELF_KILL_P: String(SELF_KILL_P),
      CHAOS_PING_MS: String(Math.floor(LEASE_MS / 3)), CHAOS_LIFETIME_MS: String(TIMEOUT_S * 1000),
    },
    stdio: ['pipe', 'ignore', 'inherit'],
  }));
  w.child = child;
  child.once('exit', () => {
    stats.workerExits++;
    if (stopping || w.child !== child) return;
    void restartWorker(slot, 50 + rand() * 400);
  });
}

/**
 * Never rejects (it runs unawaited): a restart that cannot get a worker env is counted (a failed
 * check at the end, after the summary and flashd's log tail) and tried again a second later.
 */
async function restartWorker(slot, delayMs) {
  const w = workers[slot];
  if (w.restarting) return;
  w.restarting = true;
  try {
    await sleep(delayMs);
    if (stopping) return;
    // Half the restarts keep the worker id (a worker restarted with the same env), half get a new one.
    if (rand() < 0.5) {
      const e = await freshEnv();
      w.workerId = e.workerId;
      w.key = e.key;
      w.incarnation = 0;
    }
    w.restarting = false;
    spawnWorker(slot);
  } catch (err) {
    stats.harnessErrors.push(`worker slot ${slot} restart: ${err.message ?? err}`);
    say(`worker slot ${slot} restart failed, trying again in 1 s: ${err.message ?? err}`);
    w.restarting = false;
    if (!stopping) void restartWorker(slot, 1000);
  }
}

function killWorker() {
  const live = workers.filter((w) => w.child && w.child.exitCode === null && w.child.signalCode === null && !w.restarting);
  if (live.length === 0) return;
  const w = live[Math.floor(rand() * live.length)];
  stats.workerKills++;
  deaths.set(`${w.workerId}.${w.incarnation}.log`, Date.now());
  w.child.kill('SIGKILL');
}

// Webhook receiver ----------------------------------------------------------------------------------

// Jobs whose seq is a multiple of HOOK_EVERY carry `http://127.0.0.1:<hookPort>/hook/<seq>`; a
// tenth of them get a 503 to their first POST (seq / HOOK_EVERY ending in 1).
const hooked = (seq) => HOOK_EVERY > 0 && seq % HOOK_EVERY === 0;
const failFirst = (seq) => hooked(seq) && Math.floor(seq / HOOK_EVERY) % 10 === 1;
const hooks = { posts: 0, refused: 0, malformed: [], deliveries: new Map() }; // deliveries: id -> [{ seq, body }]
const refusedOnce = new Set();
let hookServer = null;
let hookPort = 0;

async function startReceiver() {
  hookServer = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      hooks.posts++;
      const seq = Number(/^\/hook\/(\d+)$/.exec(req.url ?? '')?.[1] ?? NaN);
      let body;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        body = undefined;
      }
      if (!Number.isInteger(seq) || !body || typeof body.id !== 'string') {
        hooks.malformed.push(`${req.url}: ${Buffer.concat(chunks).toString('utf8').slice(0, 200)}`);
        res.writeHead(400).end();
        return;
      }
      if (failFirst(seq) && !refusedOnce.has(seq)) {
        refusedOnce.add(seq);
        hooks.refused++;
        res.writeHead(503).end();
        return;
      }
      // Recorded when answered: flashd may be killed before it reads the answer (and send again).
      if (!hooks.deliveries.has(body.id)) hooks.deliveries.set(body.id, []);
      hooks.deliveries.get(body.id).push({ seq, body });
      // Answer a little later, so a flashd kill finds deliveries in flight.
      setTimeout(() => res.writeHead(200, { 'content-type': 'text/plain' }).end('ok'), Math.random() * 50);
    });
  });
  hookPort = await new Promise((resolve, reject) => {
    hookServer.once('error', reject);
    hookServer.listen(0, HOST, () => resolve(hookServer.address().port));
  });
}

function stopReceiver() {
  if (!hookServer) return;
  hookServer.close();
  hookServer.closeAllConnections();
  hookServer = null;
}

/** JSON text with object keys sorted, to compare two parsed values. */
const canon = (v) => JSON.stringify(v, (_k, x) => (x && typeof x === 'object' && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x));

// Client ------------------------------------------------------------------------------------------

const sent = new Map(); // seq -> 'acked' | 'unknown' | 'refused'
const acked = new Map(); // id -> seq
let seqNext = 0;

async function submitter(index, count) {
  const c = new Conn(HOST, port);
  const pad = 'p'.repeat(INPUT_PAD);
  for (let k = 0; k < count && !stopping; ) {
    // Paced: WORKERS*... about JOBS over WINDOW_S overall.
    const due = T_SUBMIT + ((k * SUBMITTERS + index) * WINDOW_S * 1000) / JOBS;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait);
    if (c.closed) {
      try {
        await c.connect(1000);
      } catch {
        await sleep(20);
        continue;
      }
    }
    const seq = seqNext++;
    const body = JSON.stringify(hooked(seq) ? { input: { seq, pad }, webhook: `http://${HOST}:${hookPort}/hook/${seq}` } : { input: { seq, pad } });
    sent.set(seq, 'sending');
    try {
      const r = await c.request(RUN_HEAD, body, 10_000);
      if (r.status === 200) {
        const id = JSON.parse(r.body.toString('utf8')).id;
        sent.set(seq, 'acked');
        acked.set(id, seq);
        k++;
      } else {
        sent.set(seq, `refused-${r.status}`);
        await sleep(50);
      }
    } catch {
      // Written but unanswered (flashd died): it may or may not exist.
      sent.set(seq, 'unknown');
      await sleep(20);
    }
  }
  c.close();
}

let RUN_HEAD;
let T_SUBMIT;
const SUBMITTERS = 8;

// Main --------------------------------------------------------------------------------------------

let exitCode = 1;
try {
  say(`jobs=${JOBS} kills=${KILLS} (+ self-kills p=${SELF_KILL_P.toFixed(4)} per point) workers=${WORKERS} window=${WINDOW_S}s seed=${SEED} dir=${dir}`);
  await startReceiver();
  await startServer(true);
  key = await benchKey(srv.url, ADMIN);
  endpointId = await createEndpoint(srv.url, key, 'chaos');
  RUN_HEAD = head('POST', `/v2/${endpointId}/run`, `${HOST}:${port}`, `Bearer ${key}`, true);
  for (let i = 0; i < WORKERS; i++) {
    const e = await freshEnv();
    workers.push({ slot: i, workerId: e.workerId, key: e.key, child: null, incarnation: 0, restarting: false });
    spawnWorker(i);
  }

  // Kill schedule: KILLS moments spread over the submission window.
  const schedule = Array.from({ length: KILLS }, () => ({ at: (0.05 + 0.9 * rand()) * WINDOW_S * 1000, flashd: rand() < FLASHD_SHARE })).sort((a, b) => a.at - b.at);
  // At least one kill of each kind when there are two or more.
  if (KILLS >= 2 && FLASHD_SHARE > 0 && !schedule.some((k) => k.flashd)) schedule[Math.floor(rand() * KILLS)].flashd = true;
  if (KILLS >= 2 && FLASHD_SHARE < 1 && schedule.every((k) => k.flashd)) schedule[Math.floor(rand() * KILLS)].flashd = false;
  T_SUBMIT = performance.now();
  const per = Math.ceil(JOBS / SUBMITTERS);
  const clients = Array.from({ length: SUBMITTERS }, (_, i) => submitter(i, Math.max(0, Math.min(per, JOBS - i * per))));
  const killer = (async () => {
    for (const k of schedule) {
      const wait = T_SUBMIT + k.at - performance.now();
      if (wait > 0) await sleep(wait);
      if (k.flashd) await killServer();
      else killWorker();
    }
  })();
  await Promise.all([...clients, killer]);
  const submitS = (performance.now() - T_SUBMIT) / 1000;
  say(`submitted: ${acked.size} acknowledged in ${submitS.toFixed(1)} s; ${stats.flashdKills} flashd kills, ${stats.workerKills} worker kills so far`);

  // Wait until every acknowledged job is final (bounded).
  const T_DRAIN = performance.now();
  const pending = new Set(acked.keys());
  const finalStates = new Map();
  const statusConns = [];
  for (let i = 0; i < 8; i++) statusConns.push(new Conn(HOST, port));
  const drainDeadline = performance.now() + 180_000;
  while (pending.size > 0 && performance.now() < drainDeadline) {
    const ids = [...pending];
    let next = 0;
    await Promise.all(statusConns.map(async (c) => {
      while (next < ids.length) {
        const id = ids[next++];
        try {
          if (c.closed) await c.connect(1000);
          const r = await c.request(head('GET', `/v2/${endpointId}/status/${id}`, `${HOST}:${port}`, `Bearer ${key}`), undefined, 10_000);
          if (r.status === 200) {
            const b = JSON.parse(r.body.toString('utf8'));
            const s = b.status;
            if (s === 'COMPLETED' || s === 'FAILED' || s === 'CANCELLED' || s === 'TIMED_OUT') {
              pending.delete(id);
              finalStates.set(id, { status: s, output: b.output });
            }
          }
        } catch {
          // retry next round
        }
      }
    }));
    if (pending.size > 0) await sleep(250);
  }
  const drainS = (performance.now() - T_DRAIN) / 1000;
  statusConns.forEach((c) => c.close());
  say(`drain: ${acked.size - pending.size}/${acked.size} final after ${drainS.toFixed(1)} s`);

  // Wait (bounded) until every acknowledged job with a webhook that ended got a delivery. No
  // flashd kill comes after the schedule's last one, whose restart sent what was still owed.
  const T_HOOKS = performance.now();
  const owedIds = [...finalStates.keys()].filter((id) => hooked(acked.get(id)));
  const hookDeadline = performance.now() + HOOK_WAIT_S * 1000;
  while (owedIds.some((id) => !hooks.deliveries.has(id)) && performance.now() < hookDeadline) await sleep(100);
  const hookWaitS = (performance.now() - T_HOOKS) / 1000;

  // Stop everything, then look at the database and the worker logs.
  stopping = true;
  for (const w of workers) if (w.child && w.child.exitCode === null) w.child.kill('SIGKILL');
  await sleep(100);
  await srv.stop();
  stopReceiver();
  const integrity = integrityCheck('at the end');

  const db = new Database(path.join(dataDir, 'flashd.db'), { readonly: true });
  // A long input is in job_inputs, its row's input '' (migration 15).
  const rows = db.prepare(`SELECT id, status, coalesce((SELECT input FROM job_inputs WHERE job_id = jobs.id), input) AS input, output, attempt, retries,
    created_at, completed_at FROM jobs WHERE endpoint_id = ?`).all(endpointId);
  db.close();
  const byId = new Map(rows.map((r) => [r.id, r]));

  // Worker logs.
  const execs = new Map(); // job -> [{w, nonce, at}]
  const accepted = new Map(); // job -> [{w, nonce}]
  let dupAcks = 0;
  let stale = 0;
  let unknownPosts = 0;
  const selfKills = { take: 0, mid: 0, 'after-post': 0 };
  for (const f of readdirSync(logDir)) {
    for (const line of readFileSync(path.join(logDir, f), 'utf8').split('\n')) {
      if (!line) continue;
      let e;
      try {
        e = JSON.parse(line);
      } catch {
        continue; // a line cut by SIGKILL
      }
      if (e.t === 'exec') {
        if (!execs.has(e.job)) execs.set(e.job, []);
        execs.get(e.job).push({ ...e, file: f });
      } else if (e.t === 'done') {
        if (e.status === 200 && /"ok":true/.test(e.body)) {
          if (/"duplicate":true/.test(e.body)) dupAcks++;
          else {
            if (!accepted.has(e.job)) accepted.set(e.job, []);
            accepted.get(e.job).push(e);
          }
        } else if (e.status === 409) stale++;
        else if (e.status === 404) unknownPosts++;
      } else if (e.t === 'self-kill') {
        selfKills[e.point] = (selfKills[e.point] ?? 0) + 1;
        deaths.set(f, e.at);
      }
    }
  }

  let lost = 0;
  let notCompleted = 0;
  let wrongOutput = 0;
  const lostIds = [];
  for (const [id, seq] of acked) {
    const r = byId.get(id);
    if (!r || (r.status !== 'COMPLETED' && r.status !== 'FAILED' && r.status !== 'CANCELLED' && r.status !== 'TIMED_OUT')) {
      lost++;
      lostIds.push(`${id}:${r ? r.status : 'missing'}`);
      continue;
    }
    if (r.status !== 'COMPLETED') {
      notCompleted++;
      continue;
    }
    const out = JSON.parse(r.output);
    const nonces = (execs.get(id) ?? []).map((e) => e.nonce);
    const acc = accepted.get(id) ?? [];
    // The stored output is from this job's own input, from one of its executions, and equals the accepted post.
    if (out.seq !== seq || out.job !== id || !nonces.includes(out.nonce) || (acc.length > 0 && acc[0].nonce !== out.nonce)) wrongOutput++;
  }
  let duplicated = 0;
  for (const list of accepted.values()) if (list.length > 1) duplicated++;
  // Unexpected: a job flashd holds or ran that no /run of ours carried.
  // Rows or runs no /run explains; a run of a job a kill took before its commit is no such job.
  const { unexpected, recovered, ranUncommitted } = classifyJobs(rows, execs, sent);
  let executions = 0;
  let maxExec = 0;
  for (const list of execs.values()) {
    executions += list.length;
    maxExec = Math.max(maxExec, list.length);
  }
  // Requeue delay (R1): from the death of a worker holding a job to the job's next execution.
  let requeueMaxMs = 0;
  let requeues = 0;
  for (const list of execs.values()) {
    list.sort((a, b) => a.at - b.at);
    for (let i = 0; i + 1 < list.length; i++) {
      const died = deaths.get(list[i].file);
      if (died === undefined || died < list[i].at || list[i + 1].at < died) continue;
      requeues++;
      requeueMaxMs = Math.max(requeueMaxMs, list[i + 1].at - died);
    }
  }
  const latencies = rows.filter((r) => acked.has(r.id) && r.completed_at).map((r) => r.completed_at - r.created_at).sort((a, b) => a - b);
  const p = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0;

  const summary = {
    lost, duplicated, unexpected, acked: acked.size, notCompleted, wrongOutput, recovered, ranUncommitted,
    unknownOutcome: [...sent.values()].filter((s) => s === 'unknown').length, executions, maxExecPerJob: maxExec,
    reexecuted: executions - execs.size, dupAcks, stale409: stale, unknown404: unknownPosts,
    flashdKills: stats.flashdKills, workerKills: stats.workerKills,
    selfKills: `${selfKills.take}/${selfKills.mid}/${selfKills['after-post']}`,
    integrity: stats.integrityFailures.length ? 'FAILED' : integrity, integrityChecks: stats.integrityChecks,
    drainS: drainS.toFixed(1), jobLatencyP50Ms: p(0.5), jobLatencyMaxMs: latencies.at(-1) ?? 0,
    restartMsMax: stats.restartMs.length ? Math.round(Math.max(...stats.restartMs)) : 0,
    requeues, requeueMaxMs, harnessErrors: stats.harnessErrors.length,
  };
  process.stdout.write(Object.entries(summary).map(([k, v]) => `${k}=${v}`).join(' ') + '\n');

  // Webhooks: each owed one delivered at least once; every delivery's body agrees with /status.
  let hookMissing = 0;
  let hookDelivered = 0;
  const missingIds = [];
  for (const id of owedIds) {
    if (hooks.deliveries.has(id)) hookDelivered++;
    else {
      hookMissing++;
      missingIds.push(`${id}:${finalStates.get(id).status}`);
    }
  }
  let hookExtra = 0;
  let hookUnexpected = 0;
  let hookRecovered = 0;
  let hookMismatch = 0;
  const hookProblems = [];
  for (const [id, list] of hooks.deliveries) {
    hookExtra += list.length - 1;
    const seq = acked.get(id);
    const row = byId.get(id);
    const inputSeq = row ? JSON.parse(row.input).seq : undefined;
    // The job's own: acknowledged, or a /run cut by a flashd kill that still became this job.
    let final;
    if (seq !== undefined) final = finalStates.get(id);
    else if (row && (sent.get(inputSeq) === 'unknown' || sent.get(inputSeq) === 'sending')) {
      hookRecovered++;
      final = { status: row.status, output: row.output === null ? undefined : JSON.parse(row.output) };
    }
    const ownSeq = seq ?? inputSeq;
    if (!final || !hooked(ownSeq)) {
      hookUnexpected++;
      hookProblems.push(`unexpected ${id} (seq ${ownSeq}, ${sent.get(ownSeq) ?? 'never sent'})`);
      continue;
    }
    for (const { seq: urlSeq, body } of list) {
      const ok = urlSeq === ownSeq && body.id === id && body.status === final.status && body.input?.seq === ownSeq &&
        body.webhook === `http://${HOST}:${hookPort}/hook/${ownSeq}` &&
        (final.status !== 'COMPLETED' || (body.output?.job === id && canon(body.output) === canon(final.output)));
      if (!ok) {
        hookMismatch++;
        hookProblems.push(`mismatch ${id}: ${body.status} ${canon(body.output)} against /status ${final.status} ${canon(final.output)}`);
      }
    }
  }
  const hookSummary = {
    owed: owedIds.length, delivered: hookDelivered, missing: hookMissing, extra: hookExtra, unexpected: hookUnexpected,
    mismatched: hookMismatch, malformed: hooks.malformed.length, recovered: hookRecovered, posts: hooks.posts,
    refused503: hooks.refused, waitS: hookWaitS.toFixed(1),
  };
  process.stdout.write(`webhooks: ${Object.entries(hookSummary).map(([k, v]) => `${k}=${v}`).join(' ')}\n`);
  if (missingIds.length) say(`webhooks missing: ${missingIds.slice(0, 20).join(' ')}`);
  if (hookProblems.length) say(`webhook problems: ${hookProblems.slice(0, 10).join(' | ')}`);
  if (hooks.malformed.length) say(`malformed webhook posts: ${hooks.malformed.slice(0, 5).join(' | ')}`);
  if (lostIds.length) say(`lost: ${lostIds.slice(0, 20).join(' ')}`);
  if (stats.integrityFailures.length) say(`integrity failures: ${stats.integrityFailures.join(' | ')}`);
  if (stats.harnessErrors.length) say(`harness errors: ${stats.harnessErrors.slice(0, 10).join(' | ')}`);

  const checks = [
    ['no acknowledged job lost', lost === 0],
    ['no job completed twice', duplicated === 0],
    ['no unexpected job', unexpected === 0],
    ['every acknowledged job COMPLETED with its own output', notCompleted === 0 && wrongOutput === 0],
    ['integrity_check ok after every kill and at the end', stats.integrityFailures.length === 0 && integrity === 'ok'],
    // Lease 2 s + reaper 0.5 s + a flashd restart or a busy queue in between: 10 s is generous.
    [`a dead worker's job ran again within ${REQUEUE_LIMIT_MS} ms`, requeueMaxMs <= REQUEUE_LIMIT_MS],
    ['every owed webhook delivered at least once', hookMissing === 0 && (owedIds.length > 0 || HOOK_EVERY === 0)],
    ['no webhook for a job no /run carried, or one without a webhook', hookUnexpected === 0 && hooks.malformed.length === 0],
    ['every webhook body has its job\'s id, final status and output', hookMismatch === 0],
    [`every worker restart got a worker env within ${ENV_WAIT_MS / 1000} s`, stats.harnessErrors.length === 0],
    ['kills happened', stats.flashdKills + stats.workerKills + selfKills.take + selfKills.mid + selfKills['after-post'] > 0 || KILLS === 0],
  ];
  const failed = checks.filter(([, ok]) => !ok);
  for (const [name, ok] of checks) if (!ok) say(`FAILED: ${name}`);
  if (failed.length) say(`flashd stderr tail:\n${srv.stderrTail().slice(-3000)}`);
  process.stdout.write(`chaos: ${checks.length - failed.length} passed, ${failed.length} failed\n`);
  exitCode = failed.length === 0 ? 0 : 1;
} catch (err) {
  say(`error: ${err.stack ?? err}`);
  if (srv) say(`flashd stderr tail:\n${srv.stderrTail().slice(-3000)}`);
  exitCode = 2;
} finally {
  stopping = true;
  for (const w of workers) if (w.child && w.child.exitCode === null && w.child.signalCode === null) w.child.kill('SIGKILL');
  if (srv) await srv.kill();
  stopReceiver();
  if (env.CHAOS_KEEP === '1') say(`kept ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
}
process.exit(exitCode);
