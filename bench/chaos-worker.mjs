#!/usr/bin/env node
/**
 * One simulated worker process for `npm run chaos` (bench/chaos.mjs starts, kills and
 * restarts it). It speaks RunPod's worker protocol over keep-alive HTTP: job-take (long-poll),
 * ping while a job runs, job-done with an output that names this execution (a random nonce),
 * re-posting an unanswered result until it gets an answer. Every step is appended to a log
 * file with a synchronous write before the next step, so the log survives SIGKILL:
 *   {"t":"exec","w","job","seq","nonce","at"}          a job was received and starts
 *   {"t":"done","w","job","nonce","status","body","at"} the answer to a result post
 *   {"t":"self-kill","w","job","point","at"}           about to SIGKILL itself
 * It may kill itself on purpose (CHAOS_SELF_KILL_P per point): right after take, in the middle
 * of the job, or after writing the result post and before reading its answer.
 *
 * env: CHAOS_HOST, CHAOS_PORT, CHAOS_EP, CHAOS_WORKER_ID, CHAOS_KEY, CHAOS_LOG,
 *      CHAOS_SELF_KILL_P (0), CHAOS_MAX_WORK_MS (150), CHAOS_PING_MS (500), CHAOS_LIFETIME_MS (600000)
 */
import { appendFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { Conn, head } from './lib/http.mjs';

const env = process.env;
const HOST = env.CHAOS_HOST ?? '127.0.0.1';
const PORT = Number(env.CHAOS_PORT);
const EP = env.CHAOS_EP;
const WID = env.CHAOS_WORKER_ID;
const KEY = env.CHAOS_KEY;
const LOG = env.CHAOS_LOG;
const P = Number(env.CHAOS_SELF_KILL_P ?? 0);
const MAX_WORK = Number(env.CHAOS_MAX_WORK_MS ?? 150);
const PING_MS = Number(env.CHAOS_PING_MS ?? 500);
const LIFETIME = Number(env.CHAOS_LIFETIME_MS ?? 600_000);
if (!PORT || !EP || !WID || !KEY || !LOG) {
  process.stderr.write('chaos-worker: CHAOS_PORT, CHAOS_EP, CHAOS_WORKER_ID, CHAOS_KEY and CHAOS_LOG are required\n');
  process.exit(2);
}

const hostHeader = `${HOST}:${PORT}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (o) => appendFileSync(LOG, JSON.stringify({ ...o, w: WID, at: Date.now() }) + '\n');
const selfKill = (job, point) => {
  log({ t: 'self-kill', job, point });
  process.kill(process.pid, 'SIGKILL');
};
const maybeKill = (job, point) => {
  if (P > 0 && Math.random() < P) selfKill(job, point);
};

// Bounded lifetime: a worker never outlives its parent's run by much.
setTimeout(() => process.exit(0), LIFETIME).unref();
process.on('SIGTERM', () => process.exit(0));
// The parent died (its end of the IPC-less stdin pipe closes): leave too.
process.stdin.on('end', () => process.exit(0));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();

const main = new Conn(HOST, PORT);
const pinger = new Conn(HOST, PORT);

async function connected(c) {
  while (c.closed) {
    try {
      await c.connect(1000);
    } catch {
      await sleep(50 + Math.random() * 100);
    }
  }
}

const takeHead = head('GET', `/v2/${EP}/job-take/${WID}?gpu=cpu&job_in_progress=0`, hostHeader, KEY);
const pingHead = (ids) => head('GET', `/v2/${EP}/ping/${WID}?gpu=cpu${ids.length ? `&job_id=${ids.join(',')}` : ''}`, hostHeader, KEY);
const doneHead = (job) =>
  `POST /v2/${EP}/job-done/${WID}/${job}?gpu=cpu&isStream=false HTTP/1.1\r\nHost: ${hostHeader}\r\nAuthorization: ${KEY}\r\nContent-Type: application/x-www-form-urlencoded`;

/** Heartbeat for the job being run, every PING_MS, on its own connection; stop() returns at once. */
function heartbeat(job) {
  let timer = null;
  const beat = async () => {
    timer = null;
    try {
      // Skip a beat while the previous ping is still out (flashd restarting).
      if (pinger.closed) await pinger.connect(1000);
      if (!pinger.pending) await pinger.request(pingHead([job]), undefined, 5000);
    } catch {
      // flashd is restarting; the next beat tries again
    }
    if (timer === null && !stopped) timer = setTimeout(beat, PING_MS);
  };
  let stopped = false;
  timer = setTimeout(beat, PING_MS);
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}

async function runJob(job, seq) {
  const nonce = randomBytes(6).toString('hex');
  log({ t: 'exec', job, seq, nonce });
  maybeKill(job, 'take');
  const stopBeat = heartbeat(job);
  const work = Math.random() * MAX_WORK;
  if (P > 0 && Math.random() < P) {
    await sleep(work / 2);
    selfKill(job, 'mid');
  }
  await sleep(work);
  stopBeat();
  const body = JSON.stringify({ output: { job, seq, worker: WID, nonce } });
  const killAfterWrite = P > 0 && Math.random() < P;
  // Post until answered: flashd may be down or restarting. Bounded by 60 s.
  const deadline = Date.now() + 60_000;
  for (let attempt = 1; Date.now() < deadline; attempt++) {
    await connected(main);
    let r;
    try {
      const pending = main.request(doneHead(job), body, 10_000);
      if (killAfterWrite) selfKill(job, 'after-post');
      r = await pending;
    } catch {
      await sleep(50 + Math.random() * 100);
      continue;
    }
    log({ t: 'done', job, nonce, attempt, status: r.status, body: r.body.toString('utf8').slice(0, 300) });
    if (r.status >= 500) {
      await sleep(100);
      continue;
    }
    return;
  }
  log({ t: 'done-gave-up', job, nonce });
}

async function loop() {
  for (;;) {
    await connected(main);
    let r;
    try {
      r = await main.request(takeHead, undefined, 95_000);
    } catch {
      await sleep(50 + Math.random() * 100);
      continue;
    }
    if (r.status === 204) continue;
    if (r.status !== 200) {
      await sleep(100);
      continue;
    }
    const job = JSON.parse(r.body.toString('utf8'));
    await runJob(job.id, job.input?.seq ?? null);
  }
}

log({ t: 'start' });
await loop();
