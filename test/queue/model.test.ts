/**
 * A seeded, model-based test of the job queue: several simulated workers and a client drive a
 * real flashd over HTTP (real SQLite, a manual clock) with random interleavings of /run,
 * /runsync, job-take(-batch), job-done (result, error, progress, stopPod), job-stream, pings with
 * and without the held jobs, job-stop, /cancel, /retry, /purge-queue, /status (?ttl), /stream,
 * short executionTimeout and ttl, workers that stop pinging (lost leases) or come back as
 * zombies with late results, and restarts on the same data dir. A model says what every job's
 * status must be; after every step it is checked against the replies, /health and /status:
 * transitions allowed by the spec, one completion per run, stale results refused, counters equal
 * to the jobs' states, no job stuck or lost, and /stream hands out each chunk of the current
 * run once, in order. A failure prints the seed and the last operations.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const LEASE = 3000;
const MAX_ATTEMPTS = 3;
const RUN_RETENTION = 30 * 60_000;
const SYNC_RETENTION = 60_000;

/** mulberry32: small, seeded, good enough to pick operations. */
function rng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: <T>(xs: readonly T[]): T | undefined => (xs.length ? xs[Math.floor(next() * xs.length)] : undefined),
    chance: (p: number) => next() < p,
  };
}

type Status = 'IN_QUEUE' | 'IN_PROGRESS' | 'COMPLETED' | 'FAILED' | 'CANCELLED' | 'TIMED_OUT';

interface MJob {
  id: string;
  ep: string;
  status: Status;
  /** The server's job.workerId: set by a claim, kept by a final state, cleared by a requeue or /retry. */
  workerId: string | null;
  /** The worker whose posted result ended the job. */
  resultBy: string | null;
  output: unknown;
  error: string | null;
  progress: unknown;
  retries: number;
  attempt: number;
  lowPriority: boolean;
  execTimeout: number;
  ttl: number;
  ttlAt: number;
  leaseAt: number;
  execAt: number;
  /** When the current run was claimed (a stop's keepUntil counts from it). */
  claimAt: number;
  /** A ping of its worker listed it in the current run (Job.pinged): a stop for it ends at that worker's next ping without it. */
  pinged: boolean;
  retention: number;
  expiresAt: number | null;
  /** Acknowledged /stream chunks of the current run not yet handed out. */
  unread: unknown[];
  /**
   * Not to be handed to each of these workers until its time (Job.fences): every worker that may
   * still run an old attempt, not only the last holder.
   */
  fences: Map<string, number>;
  /**
   * The workers its row's `fenced_from` names: its fences when last claimed (a claim leaves the
   * column as the requeue, /retry or ping wrote it while queued), and each worker whose stop
   * for it began while it ran (a ping listing it while another worker holds it).
   */
  rowFenced: string[];
  /**
   * Running at the last restart: the workers its row named (but its holder) that have not pinged
   * since (JobQueue.#bootFences). Its next attempt is fenced from each, within 2 leases of the restart.
   */
  bootFenced: Set<string>;
  /** The restart epoch it ended in (a job ended before a restart is read from its row, not memory). */
  finishedEpoch: number;
  /** Count of /retry calls (a terminal FAILED/TIMED_OUT may change only after one). */
  retried: number;
  lastSeen: { status: Status; retried: number } | null;
}

interface SimWorker {
  w: TestWorker;
  ep: string;
  /** Jobs this worker believes it runs (a zombie keeps them after losing the lease). */
  held: Set<string>;
  /** Steps left without heartbeats (dead), then it comes back. */
  deadFor: number;
  zombie: boolean;
  /** Server-side WorkerInfo.fenced, as far as the model knows it. */
  fenced: Set<string>;
  /** Fences a restart read back from queued rows, joining `fenced` at its next ping (JobQueue.#adoptFences). */
  restored: Set<string>;
  /** When it last called (the registry forgets a silent external worker that holds nothing after 2 leases). */
  lastSeen: number;
  /** Server-side WorkerInfo.stops: jobs it is to stop (keepUntil: claim + 1 s, 0 once a ping listed the job; offered: last offered on job-stop, -1 not yet). */
  stops: Map<string, { keepUntil: number; offered: number }>;
  /** Server-side WorkerInfo.letGo. */
  letGo: Set<string>;
  /** Server-side WorkerInfo.ended: jobs the server ended while this worker held them. */
  ended: Set<string>;
  /** Whether the registry has a record for it (none after a stopPod retirement, a sweep or a restart, until it calls). */
  registered: boolean;
  /**
   * Retired (stopPod) until then: calls other than job-take get its retired record, out of the
   * registry, with the stops, let-go jobs, ended jobs and fences it had (WorkerRegistry.retire),
   * so a stop still pending reaches the worker; a job-take puts that record back in the registry
   * (the worker did not exit); any call after then gets a new one.
   */
  retiredUntil: number;
  /**
   * Server-side WorkerInfo.refresh: it posted stopPod and has asked for no job since, so the
   * result that leaves it holding nothing retires it, whichever carried the stopPod; holding
   * nothing for any reason (flashd ended the rest), it is out of /health (WorkerRegistry.silent).
   */
  asked: boolean;
}

interface Ctx {
  t: Test;
  seed: number;
  r: ReturnType<typeof rng>;
  clock: ManualClock;
  a: TestAgent;
  dir: string;
  eps: string[];
  workers: SimWorker[];
  jobs: Map<string, MJob>;
  log: string[];
  counter: number;
  /** Restarts so far. */
  epoch: number;
  /** Until when a job running at the last restart is fenced from the workers of its row's `fenced_from` (#bootFencesUntil). */
  bootUntil: number;
}

const stats = new Map<string, number>();
class ModelError extends Error {}

function fail(c: Ctx, msg: string): never {
  // The history of every job the message names, then the last operations.
  const named = [...c.jobs.keys()].map(short).filter((s) => msg.includes(s));
  const history = c.log.filter((l) => named.some((s) => l.includes(s)) || /step|restart|stops pinging|back/.test(l)).slice(-60);
  const lines = [...history, '--- last:', ...c.log.slice(-15)];
  throw new ModelError(`seed ${c.seed}: ${msg}\nlast operations:\n  ${lines.join('\n  ')}`);
}

const now = (c: Ctx) => c.clock.monotonic();
const expired = (c: Ctx, j: MJob) => j.expiresAt !== null && j.expiresAt <= now(c);
const short = (id: string) => id.replace(/-[a-z0-9]+$/, '').slice(-5);

function note(c: Ctx, s: string) {
  if (process.env['MODEL_VERBOSE']) {
    const key = `${s.split(' ')[0]} ${/: (\w+)/.exec(s)?.[1] ?? ''}`;
    stats.set(key, (stats.get(key) ?? 0) + 1);
  }
  c.log.push(`[t=${now(c)}] ${s}`);
  if (c.log.length > 20_000) c.log.splice(0, 10_000);
}

/** Checks an observed status against the last one seen: the spec's transitions only. */
function observe(c: Ctx, j: MJob, status: Status, where: string) {
  if (status !== j.status) fail(c, `${where}: job ${short(j.id)} is ${status}, model says ${j.status}`);
  const last = j.lastSeen;
  if (last && last.status !== status) {
    if (last.status === 'COMPLETED' || last.status === 'CANCELLED') fail(c, `${where}: job ${short(j.id)} left ${last.status} for ${status}`);
    if ((last.status === 'FAILED' || last.status === 'TIMED_OUT') && last.retried === j.retried) {
      fail(c, `${where}: job ${short(j.id)} left ${last.status} for ${status} without a /retry`);
    }
  }
  j.lastSeen = { status, retried: j.retried };
}

// Model transitions -------------------------------------------------------------------------------

function finish(c: Ctx, j: MJob, status: Status, output: unknown, error: string | null) {
  j.status = status;
  j.output = output;
  j.error = error;
  j.expiresAt = now(c) + j.retention;
  j.fences = new Map();
  j.finishedEpoch = c.epoch;
}

/** A retired worker whose calls still get its retired record (WorkerRegistry.seen). */
const retained = (c: Ctx, sw: SimWorker) => !sw.registered && sw.retiredUntil > now(c);

/**
 * WorkerRegistry.seen: every call reaches a record with the worker's stops. A retired worker
 * gets its retired record (`retained`): out of the registry, or, asking for work, back in it;
 * otherwise an unregistered worker gets a new, empty one.
 */
function contact(c: Ctx, sw: SimWorker, wantsJobs = false): void {
  if (!sw.registered && retained(c, sw)) {
    if (!wantsJobs) {
      sw.lastSeen = now(c);
      return;
    }
    // It asked for work: it did not exit, and its retired record comes back, stops and all.
    sw.retiredUntil = 0;
    sw.registered = true;
    note(c, `model: ${short(sw.w.workerId)} back from retirement`);
  }
  if (!sw.registered) {
    sw.retiredUntil = 0;
    sw.registered = true;
    sw.asked = false;
    sw.stops.clear();
    sw.letGo.clear();
    sw.ended.clear();
    sw.fenced.clear();
  }
  // A worker asking for work after its stopPod did not exit: the request lapses.
  if (wantsJobs && sw.asked) {
    sw.asked = false;
    note(c, `model: ${short(sw.w.workerId)} withdrew its stopPod`);
  }
  sw.lastSeen = now(c);
}

/** JobQueue.#retireIfIdle, after a result: one in the registry that asked and holds nothing retires. */
function retireIfIdle(c: Ctx, sw: SimWorker) {
  const holds = [...c.jobs.values()].some((x) => x.status === 'IN_PROGRESS' && x.workerId === sw.w.workerId);
  if (!sw.registered || !sw.asked || holds) return;
  // The registry lets it go; its last calls get its retired record for a while, stops and all
  // (a job cancelled before the result that retired it is still offered on job-stop).
  sw.registered = false;
  sw.asked = false;
  sw.retiredUntil = now(c) + 2 * LEASE;
  note(c, `model: ${short(sw.w.workerId)} retired`);
}

/** The registry forgot the worker: its stops, let-go jobs and fences went with the record. */
function forget(sw: SimWorker) {
  sw.registered = false;
  sw.asked = false;
  sw.stops.clear();
  sw.letGo.clear();
  sw.ended.clear();
  sw.fenced.clear();
}

/** JobQueue.#requestStop. `j`: the job it held (the stop outlives a ping without it until a second after the claim, unless a ping of it listed the job). */
function requestStop(c: Ctx, sw: SimWorker | undefined, id: string, j?: MJob) {
  if (!sw || !(sw.registered || retained(c, sw)) || sw.letGo.has(id)) return;
  sw.stops.set(id, { keepUntil: j && !(j.pinged && j.workerId === sw.w.workerId) ? j.claimAt + 1000 : 0, offered: -1 });
}

/** JobQueue.#endedOn: the server ended the job while `sw` held it. */
function endedOn(c: Ctx, sw: SimWorker | undefined, j: MJob) {
  if (sw && (sw.registered || retained(c, sw))) sw.ended.add(j.id);
  requestStop(c, sw, j.id, j);
}

const holderOf = (c: Ctx, j: MJob) => (j.workerId === null ? undefined : c.workers.find((x) => x.w.workerId === j.workerId));

function claim(c: Ctx, j: MJob, sw: SimWorker) {
  j.status = 'IN_PROGRESS';
  j.attempt++;
  j.workerId = sw.w.workerId;
  j.leaseAt = now(c) + LEASE;
  j.execAt = now(c) + j.execTimeout;
  j.claimAt = now(c);
  j.pinged = false;
  j.progress = null;
  j.rowFenced = [...j.fences.keys()];
  j.fences = new Map();
  sw.fenced.delete(j.id);
  sw.stops.delete(j.id);
  sw.letGo.delete(j.id);
  sw.ended.delete(j.id);
  sw.held.add(j.id);
}

function requeueOrFail(c: Ctx, j: MJob) {
  const holder = holderOf(c, j);
  if (j.attempt >= MAX_ATTEMPTS) {
    finish(c, j, 'FAILED', null, 'gave up');
    endedOn(c, holder, j);
    return;
  }
  requestStop(c, holder, j.id, j);
  j.status = 'IN_QUEUE';
  j.retries++;
  // Fenced from the worker that lost its lease, and from every worker still running an earlier
  // attempt (its stop pending: a job requeued twice may still run on both).
  j.fences = oldRunFences(c, j, holder);
  note(c, `model: requeue ${short(j.id)} fences ${fencesOf(j)}`);
  j.workerId = null;
  j.progress = null;
  j.unread = [];
}

/**
 * JobQueue.#fenceOldRuns: a new attempt (a requeue, a /retry) is fenced from `holder` (a lapsed
 * lease) and from every worker of the job's endpoint whose record, in the registry or retired,
 * has a stop pending for it (it may still run an old attempt), for a lease.
 */
function oldRunFences(c: Ctx, j: MJob, holder?: SimWorker): Map<string, number> {
  const fences = new Map<string, number>();
  for (const sw of c.workers) {
    if (sw === holder || (sw.ep === j.ep && (sw.registered || retained(c, sw)) && sw.stops.has(j.id))) {
      fences.set(sw.w.workerId, now(c) + LEASE);
      sw.fenced.add(j.id);
    }
  }
  // Running at the restart, its row naming workers that have not pinged since: fenced from each
  // (it may still run an older attempt, its stop lost with the restart), taken over at its ping.
  if (now(c) < c.bootUntil) for (const wid of j.bootFenced) if (wid !== holder?.w.workerId && !fences.has(wid)) fences.set(wid, now(c) + LEASE);
  j.bootFenced = new Set();
  return fences;
}

const fencesOf = (j: MJob) => JSON.stringify([...j.fences].map(([w, until]) => `${short(w)}<${until}`));

/** What the reaper does at the current time (run after every clock move). */
function reapModel(c: Ctx) {
  const n = now(c);
  for (const j of c.jobs.values()) {
    if (j.status === 'IN_PROGRESS') {
      if (n >= j.execAt || n >= j.ttlAt) {
        finish(c, j, 'TIMED_OUT', null, 'timed out');
        endedOn(c, holderOf(c, j), j);
      }
      else if (n >= j.leaseAt) requeueOrFail(c, j);
    }
  }
  for (const j of c.jobs.values()) if (j.status === 'IN_QUEUE' && n >= j.ttlAt) finish(c, j, 'TIMED_OUT', null, 'expired in queue');
}

/** May `sw` be handed `j` now? */
function eligible(c: Ctx, j: MJob, sw: SimWorker): 'yes' | 'no' {
  if (j.ep !== sw.ep || j.status !== 'IN_QUEUE' || now(c) >= j.ttlAt) return 'no';
  const until = j.fences.get(sw.w.workerId);
  if (until !== undefined && now(c) < until) return 'no';
  return 'yes';
}

// Expected outcomes of worker posts -----------------------------------------------------------------

type Outcome = 'accepted' | 'duplicate' | 'finished' | 'ended' | 'stale' | 'unknown';

/** `result`: a final result (a re-post of one is a duplicate), not a progress update or stream chunk. */
function expectedOutcome(c: Ctx, sw: SimWorker, id: string, result: boolean): Outcome[] {
  const j = c.jobs.get(id);
  if (!j || j.ep !== sw.ep) return ['unknown'];
  const wid = sw.w.workerId;
  let o: Outcome;
  if (j.status === 'IN_PROGRESS' && j.workerId === wid) o = 'accepted';
  else if (j.resultBy === wid) o = result ? 'duplicate' : 'finished';
  else if (j.resultBy === null && j.workerId === wid && (j.status === 'CANCELLED' || j.status === 'TIMED_OUT' || j.status === 'FAILED')) o = 'ended';
  // An attempt the server ended on this worker, the job since retried (queued, or another's).
  else if (sw.ended.has(id)) o = 'ended';
  else o = 'stale';
  // An expired result may still be in memory or its row not yet swept.
  return expired(c, j) ? [o, 'unknown'] : [o];
}

function outcomeOf(status: number, json: any): Outcome | string {
  if (status === 200 && json?.duplicate) return 'duplicate';
  if (status === 200 && json?.discarded) return /with this worker's result/.test(json.reason) ? 'finished' : 'ended';
  if (status === 200) return 'accepted';
  if (status === 409) return 'stale';
  if (status === 404) return 'unknown';
  return `HTTP ${status} ${JSON.stringify(json)}`;
}

/** The server's #unfence. */
function unfenceModel(c: Ctx, sw: SimWorker, j: MJob | undefined) {
  if (!j) return;
  sw.fenced.delete(j.id);
  j.fences.delete(sw.w.workerId);
  note(c, `model: unfence ${short(j.id)} from ${short(sw.w.workerId)}`);
}

// Operations ---------------------------------------------------------------------------------------

const live = (c: Ctx) => c.workers.filter((x) => x.deadFor === 0);
const jobsOf = (c: Ctx, ep?: string) => [...c.jobs.values()].filter((j) => (ep === undefined || j.ep === ep) && !expired(c, j));

async function opRun(c: Ctx) {
  const ep = c.r.pick(c.eps) as string;
  const lowPriority = c.r.chance(0.15);
  const execTimeout = c.r.chance(0.25) ? 5000 : 600_000;
  const ttl = c.r.chance(0.2) ? 10_000 : 86_400_000;
  const n = ++c.counter;
  const res = await c.a.req('POST', `/v2/${ep}/run`, { body: { input: { n }, policy: { lowPriority, executionTimeout: execTimeout, ttl } } });
  if (res.status !== 200 || res.json?.status !== 'IN_QUEUE') fail(c, `/run: ${res.status} ${res.text}`);
  const id = res.json.id as string;
  note(c, `run ${short(id)} n=${n} ep=${c.eps.indexOf(ep)} low=${lowPriority} exec=${execTimeout} ttl=${ttl}`);
  c.jobs.set(id, newJob(c, id, ep, { lowPriority, execTimeout, ttl, retention: RUN_RETENTION }));
}

function newJob(c: Ctx, id: string, ep: string, o: { lowPriority: boolean; execTimeout: number; ttl: number; retention: number }): MJob {
  return {
    id, ep, status: 'IN_QUEUE', workerId: null, resultBy: null, output: null, error: null, progress: null, retries: 0, attempt: 0,
    lowPriority: o.lowPriority, execTimeout: o.execTimeout, ttl: o.ttl, ttlAt: now(c) + o.ttl, leaseAt: 0, execAt: 0, claimAt: 0, pinged: false, retention: o.retention,
    expiresAt: null, unread: [], fences: new Map(), rowFenced: [], bootFenced: new Set(), finishedEpoch: -1, retried: 0, lastSeen: null,
  };
}

/** Checks one take's jobs against the model and claims them there. `unknownOk`: a /runsync job not in the model yet. */
function applyTake(c: Ctx, sw: SimWorker, got: { id: string; input: any }[], max: number, unknownOk?: (job: { id: string; input: any }) => MJob | undefined) {
  contact(c, sw, true);
  for (const job of got) {
    let j = c.jobs.get(job.id);
    if (!j && unknownOk) j = unknownOk(job);
    if (!j) fail(c, `take by ${short(sw.w.workerId)} got unknown job ${job.id}`);
    const e = eligible(c, j, sw);
    if (e === 'no') fail(c, `take by ${short(sw.w.workerId)} got job ${short(j.id)} (${j.status}, fences ${fencesOf(j)}) it may not have`);
    // Normal before low priority.
    if (j.lowPriority) {
      const normal = jobsOf(c, sw.ep).find((x) => !x.lowPriority && !got.some((g) => g.id === x.id) && eligible(c, x, sw) === 'yes');
      if (normal) fail(c, `take by ${short(sw.w.workerId)} got low-priority ${short(j.id)} while normal ${short(normal.id)} was queued (fences ${fencesOf(normal)}, ttlAt ${normal.ttlAt})`);
    }
    claim(c, j, sw);
  }
  if (got.length < max) {
    const left = jobsOf(c, sw.ep).find((x) => eligible(c, x, sw) === 'yes');
    if (left) fail(c, `take by ${short(sw.w.workerId)} got ${got.length} of ${max} while ${short(left.id)} (${left.status}) was queued for it`);
  }
}

async function opTake(c: Ctx, sw: SimWorker, batch: boolean) {
  const size = batch ? c.r.int(1, 3) : 1;
  let got: { id: string; input: any }[];
  if (batch) {
    const res = await sw.w.takeBatch(size);
    if (res.status !== 200) fail(c, `job-take-batch: ${res.status}`);
    got = res.jobs;
  } else {
    const one = await sw.w.take(sw.held.size > 0);
    got = one ? [one] : [];
  }
  note(c, `take${batch ? `-batch(${size})` : ''} by ${short(sw.w.workerId)}: ${got.map((g) => short(g.id)).join(',') || 'none'}`);
  applyTake(c, sw, got, size);
}

async function opDone(c: Ctx, sw: SimWorker, id: string, kind: 'ok' | 'error' | 'progress' | 'stopPod') {
  const j = c.jobs.get(id);
  const expect = expectedOutcome(c, sw, id, kind !== 'progress');
  const n = ++c.counter;
  const body = kind === 'ok' ? { output: { r: n } } : kind === 'error' ? { error: `e${n}`, output: { partial: n } } : kind === 'progress' ? { status: 'IN_PROGRESS', output: { p: n } } : { output: { r: n }, stopPod: true };
  const before = j ? { status: j.status, output: j.output, error: j.error } : undefined;
  const res = await sw.w.done(id, body);
  contact(c, sw);
  const got = outcomeOf(res.status, res.json);
  note(c, `done(${kind}) by ${short(sw.w.workerId)} for ${short(id)}: ${got} (model ${expect.join('|')})`);
  if (!expect.includes(got as Outcome)) fail(c, `job-done ${kind} by ${short(sw.w.workerId)} for ${short(id)}: got ${got}, model ${expect.join('|')} (job ${JSON.stringify(before)})`);
  if (kind !== 'progress') sw.held.delete(id);
  // A recycle request stands whatever became of the job; a result that leaves a worker that
  // asked holding nothing retires it, whichever of its results carried the stopPod.
  if (kind === 'stopPod' && sw.registered) sw.asked = true;
  const retire = () => {
    if (kind !== 'progress') retireIfIdle(c, sw);
  };
  if (!j) {
    retire();
    return;
  }
  if (got === 'accepted') {
    j.leaseAt = now(c) + LEASE;
    if (kind === 'progress') {
      j.progress = body.output;
      return;
    }
    j.resultBy = sw.w.workerId;
    if (kind === 'error') finish(c, j, 'FAILED', body.output, (body as { error: string }).error);
    else finish(c, j, 'COMPLETED', body.output, null);
    retire();
  } else if (kind !== 'progress') {
    if (got === 'ended' || got === 'stale') {
      sw.stops.delete(id);
      sw.letGo.add(id);
      unfenceModel(c, sw, j);
    }
    retire();
  }
}

async function opStream(c: Ctx, sw: SimWorker, id: string) {
  const j = c.jobs.get(id);
  const expect = expectedOutcome(c, sw, id, false);
  const chunk = { c: ++c.counter };
  const res = await fetch(sw.w.postUrl('stream', id), {
    method: 'POST',
    headers: { authorization: sw.w.key, 'content-type': 'application/x-www-form-urlencoded' },
    body: JSON.stringify({ output: chunk }),
  });
  const text = await res.text();
  contact(c, sw);
  const got = outcomeOf(res.status, text ? JSON.parse(text) : undefined);
  note(c, `stream by ${short(sw.w.workerId)} for ${short(id)} ${JSON.stringify(chunk)}: ${got} (model ${expect.join('|')})`);
  if (!expect.includes(got as Outcome)) fail(c, `job-stream by ${short(sw.w.workerId)} for ${short(id)}: got ${got}, model ${expect.join('|')}`);
  if (j && got === 'accepted') {
    j.leaseAt = now(c) + LEASE;
    j.unread.push(chunk);
  }
}

async function opPing(c: Ctx, sw: SimWorker, ids: string[]) {
  const status = await sw.w.ping(ids);
  note(c, `ping by ${short(sw.w.workerId)} [${ids.map(short).join(',')}]: ${status}`);
  if (status !== 200) fail(c, `ping: ${status}`);
  contact(c, sw);
  const listed = new Set(ids);
  const wid = sw.w.workerId;
  // Restored fences join a record in the registry only (JobQueue.#adoptFences), not a retired one.
  if (sw.registered) {
    for (const id of sw.restored) {
      if (c.jobs.get(id)?.fences.has(wid)) sw.fenced.add(id);
      // A job running at the restart: this ping lists it (a stop) or says it let go.
      c.jobs.get(id)?.bootFenced.delete(wid);
    }
    sw.restored.clear();
  }
  for (const id of [...sw.fenced]) if (!listed.has(id)) unfenceModel(c, sw, c.jobs.get(id));
  for (const id of [...sw.letGo]) if (!listed.has(id)) sw.letGo.delete(id);
  for (const id of ids) {
    const found = c.jobs.get(id);
    const j = found?.ep === sw.ep ? found : undefined;
    if (j && j.status === 'IN_PROGRESS' && j.workerId === wid) {
      j.leaseAt = now(c) + LEASE;
      j.pinged = true;
      sw.stops.delete(id);
    } else if (j?.resultBy === wid || sw.letGo.has(id)) {
      // It posted its result; a heartbeat made before the post.
    } else {
      // Listed, so registered: its next ping without the job ends the stop, whenever it took it.
      const stop = sw.stops.get(id);
      if (stop) stop.keepUntil = 0;
      else {
        requestStop(c, sw, id);
        // Running on another worker: the stop that begins now is written into its row too
        // (fenced_from), so a restart fences the next attempt from this worker (bootFenced).
        if (j?.status === 'IN_PROGRESS' && sw.stops.has(id) && !j.rowFenced.includes(wid)) j.rowFenced = [...j.rowFenced, wid];
      }
      if (j?.fences.has(wid)) j.fences.set(wid, now(c) + LEASE);
      else if (j?.status === 'IN_QUEUE') {
        // It still runs an old attempt of a queued job: fenced from it (beside any other fence).
        j.fences.set(wid, now(c) + LEASE);
        sw.fenced.add(id);
      }
    }
  }
  for (const [id, stop] of [...sw.stops]) if (!listed.has(id) && now(c) >= stop.keepUntil) sw.stops.delete(id);
  for (const id of [...sw.ended]) if (!listed.has(id) && !sw.stops.has(id)) sw.ended.delete(id);
}

async function opStops(c: Ctx, sw: SimWorker, why = '') {
  const ids = await sw.w.stops();
  contact(c, sw);
  let want: string[] = [];
  if ([...sw.stops.values()].some((st) => st.offered < 0 || now(c) - st.offered >= 1000)) {
    want = [...sw.stops.keys()];
    for (const st of sw.stops.values()) st.offered = now(c);
  }
  note(c, `job-stop by ${short(sw.w.workerId)}${why}: [${ids.map(short).join(',')}] (model [${want.map(short).join(',')}])`);
  if (JSON.stringify([...ids].sort()) !== JSON.stringify([...want].sort())) {
    fail(c, `job-stop by ${short(sw.w.workerId)}${why} gave [${ids.map(short).join(',')}], model [${want.map(short).join(',')}]`);
  }
  for (const id of ids) {
    const j = c.jobs.get(id);
    if (j && j.status === 'IN_PROGRESS' && j.workerId === sw.w.workerId) fail(c, `job-stop tells ${short(sw.w.workerId)} to stop ${short(id)}, which it holds in the current run`);
    // runpod-python cancels the task: no result is posted.
    sw.held.delete(id);
  }
}

async function opCancel(c: Ctx, j: MJob) {
  const res = await c.a.req('POST', `/v2/${j.ep}/cancel/${j.id}`);
  const wasHolder = j.status === 'IN_PROGRESS' ? c.workers.find((x) => x.w.workerId === j.workerId) : undefined;
  note(c, `cancel ${short(j.id)} (${j.status}): ${res.status} ${res.json?.status ?? ''}`);
  if (expired(c, j)) {
    if (res.status !== 404) fail(c, `cancel of an expired job: ${res.status} ${res.text}`);
    return;
  }
  if (res.status !== 200) fail(c, `cancel ${short(j.id)}: ${res.status} ${res.text}`);
  if (j.status === 'IN_QUEUE' || j.status === 'IN_PROGRESS') finish(c, j, 'CANCELLED', null, null);
  if (wasHolder) endedOn(c, wasHolder, j);
  observe(c, j, res.json.status, 'cancel reply');
  // The worker that ran it is told to stop it at its next job-stop poll.
  if (wasHolder && wasHolder.deadFor === 0 && c.r.chance(0.5)) {
    if (![...wasHolder.stops.keys()].includes(j.id)) fail(c, `model: no stop for ${short(j.id)} after /cancel`);
    await opStops(c, wasHolder, ' after cancel');
  }
}

async function opRetry(c: Ctx, j: MJob) {
  const res = await c.a.req('POST', `/v2/${j.ep}/retry/${j.id}`);
  note(c, `retry ${short(j.id)} (${j.status}): ${res.status}`);
  if (expired(c, j)) {
    if (res.status !== 404) fail(c, `retry of an expired job: ${res.status} ${res.text}`);
    return;
  }
  if (j.status !== 'FAILED' && j.status !== 'TIMED_OUT') {
    if (res.status !== 409) fail(c, `retry of a ${j.status} job: ${res.status} ${res.text}`);
    return;
  }
  if (res.status !== 200 || res.json.status !== 'IN_QUEUE') fail(c, `retry of a ${j.status} job: ${res.status} ${res.text}`);
  // Fenced from every worker whose stop for an old run is pending (the last holder's, and any
  // earlier one's still running: a job retried twice may run on both), also on a retired record
  // (stopPod): a take from it brings that record back, and it may still run the old run.
  queuedByRetry(c, j, oldRunFences(c, j));
}

/** What a /retry answered 200 does to the model's job: a new run, queued, fenced or not. */
function queuedByRetry(c: Ctx, j: MJob, fences: MJob['fences']) {
  j.status = 'IN_QUEUE';
  j.output = null;
  j.error = null;
  j.progress = null;
  j.unread = [];
  j.workerId = null;
  j.resultBy = null;
  j.expiresAt = null;
  j.retries++;
  j.attempt = 0;
  j.retried++;
  j.ttlAt = now(c) + j.ttl;
  j.fences = fences;
}

async function opPurge(c: Ctx) {
  const ep = c.r.pick(c.eps) as string;
  const res = await c.a.req('POST', `/v2/${ep}/purge-queue`);
  const queued = jobsOf(c, ep).filter((j) => j.status === 'IN_QUEUE');
  note(c, `purge ep=${c.eps.indexOf(ep)}: ${res.status} ${res.text} (model ${queued.length})`);
  if (res.status !== 200 || res.json.removed !== queued.length) fail(c, `purge-queue removed ${res.json?.removed}, model has ${queued.length} queued`);
  for (const j of queued) finish(c, j, 'CANCELLED', null, null);
}

async function checkStatus(c: Ctx, j: MJob, where: string, ttl?: number) {
  const res = await c.a.req('GET', `/v2/${j.ep}/status/${j.id}${ttl ? `?ttl=${ttl}` : ''}`);
  if (expired(c, j)) {
    if (res.status !== 404) fail(c, `${where}: /status of an expired job ${short(j.id)}: ${res.status} ${res.text}`);
    return;
  }
  if (res.status !== 200) fail(c, `${where}: /status of ${short(j.id)} (model ${j.status}): ${res.status} ${res.text} — job lost`);
  const s = res.json;
  observe(c, j, s.status, where);
  if (!(s.delayTime >= 0) || !(s.executionTime >= 0)) fail(c, `${where}: /status of ${short(j.id)} delayTime ${s.delayTime}, executionTime ${s.executionTime}`);
  const want: Record<string, unknown> = { id: j.id, status: j.status };
  want['workerId'] = j.workerId ?? '';
  if (j.status === 'IN_PROGRESS') {
    if (j.progress !== null) want['output'] = j.progress;
  } else if (j.output !== null) want['output'] = j.output;
  if (j.retries > 0) want['retries'] = j.retries;
  const gotView: Record<string, unknown> = { id: s.id, status: s.status };
  for (const k of ['workerId', 'output', 'retries']) if (s[k] !== undefined) gotView[k] = s[k];
  if (JSON.stringify(sortKeys(gotView)) !== JSON.stringify(sortKeys(want))) fail(c, `${where}: /status of ${short(j.id)} ${JSON.stringify(gotView)}, model ${JSON.stringify(want)}`);
  if ((j.error !== null) !== (typeof s.error === 'string')) fail(c, `${where}: /status error ${JSON.stringify(s.error)}, model ${j.error}`);
  if (ttl) {
    j.retention = ttl;
    if (j.expiresAt !== null) j.expiresAt = now(c) + ttl;
  }
}

function sortKeys(o: Record<string, unknown>) {
  return Object.fromEntries(Object.entries(o).sort(([a], [b]) => a.localeCompare(b)));
}

/**
 * The model's /stream polls carry `?wait=0`, which answers at once: steps take no real time, and
 * a poll without `wait` within 100 ms of the job's last answer is paced and held up to 1 s
 * (api/jobs.ts STREAM_PACE_MS, test/queue/stream-poll-pace.test.ts), which would outlast a
 * pending /runsync's real 1 s wait.
 */
const STREAM_NOW = '?wait=0';

async function checkStream(c: Ctx, j: MJob) {
  const res = await c.a.req('GET', `/v2/${j.ep}/stream/${j.id}${STREAM_NOW}`);
  if (expired(c, j)) {
    if (res.status !== 404) fail(c, `/stream of an expired job: ${res.status}`);
    return;
  }
  if (res.status !== 200) fail(c, `/stream of ${short(j.id)}: ${res.status} ${res.text}`);
  note(c, `/stream ${short(j.id)}: ${res.text.slice(0, 200)} (model ${JSON.stringify(j.unread)})`);
  observe(c, j, res.json.status, '/stream');
  const got = (res.json.stream as { output: unknown }[]).map((x) => x.output);
  if (JSON.stringify(got) !== JSON.stringify(j.unread)) fail(c, `/stream of ${short(j.id)} gave ${JSON.stringify(got)}, model ${JSON.stringify(j.unread)}`);
  j.unread = [];
}

async function checkHealth(c: Ctx) {
  for (const ep of c.eps) {
    const res = await c.a.req('GET', `/v2/${ep}/health`);
    if (res.status !== 200) fail(c, `/health: ${res.status}`);
    const js = jobsOf(c, ep);
    const want = {
      completed: js.filter((j) => j.status === 'COMPLETED').length,
      failed: js.filter((j) => j.status === 'FAILED' || j.status === 'TIMED_OUT').length,
      inProgress: js.filter((j) => j.status === 'IN_PROGRESS').length,
      inQueue: js.filter((j) => j.status === 'IN_QUEUE').length,
      retried: js.reduce((n, j) => n + j.retries, 0),
    };
    // Workers: an external one is running while it holds a job, or has a stop pending and has
    // called within a lease (WorkerRegistry.state), else idle; one silent for 10 s that holds
    // nothing is left out (WorkerRegistry.silent), and so is one that asked to be recycled
    // (stopPod) and holds nothing, whatever ended its last job (a result, a /cancel, a timeout,
    // a lapsed lease), though its stops are pending: it takes no job and exits.
    let running = 0;
    let idle = 0;
    for (const sw of c.workers) {
      if (sw.ep !== ep || !sw.registered) continue;
      const holds = js.some((j) => j.status === 'IN_PROGRESS' && j.workerId === sw.w.workerId);
      if (!holds && (now(c) - sw.lastSeen > 10_000 || sw.asked)) continue;
      if (holds || (sw.stops.size > 0 && now(c) - sw.lastSeen <= LEASE)) running++;
      else idle++;
    }
    const wantWorkers = { idle, running, ready: idle + running, initializing: 0, unhealthy: 0, throttled: 0 };
    if (JSON.stringify(sortKeys(res.json.workers)) !== JSON.stringify(sortKeys(wantWorkers))) {
      fail(c, `/health workers of ep ${c.eps.indexOf(ep)}: ${JSON.stringify(res.json.workers)}, model ${JSON.stringify(wantWorkers)}`);
    }
    const got = res.json.jobs;
    for (const k of Object.keys(want) as (keyof typeof want)[]) {
      if (got[k] !== want[k]) {
        // Which jobs differ (named, so the failure shows their history)?
        const differ: string[] = [];
        for (const j of js) {
          const r = await c.a.req('GET', `/v2/${ep}/status/${j.id}`);
          if (r.json?.status !== j.status || (r.json?.retries ?? 0) !== j.retries) differ.push(`${short(j.id)} ${r.json?.status}/${r.json?.retries ?? 0} vs ${j.status}/${j.retries}`);
        }
        fail(c, `/health of ep ${c.eps.indexOf(ep)}: ${k} ${got[k]}, model ${want[k]} (${JSON.stringify(got)} vs ${JSON.stringify(want)}); jobs that differ: ${differ.join('; ') || 'none'}`);
      }
      if (got[k] < 0) fail(c, `/health ${k} negative`);
    }
  }
}

/** Moves the clock: live workers heartbeat first (mostly), then time passes and the reaper runs. */
async function opStep(c: Ctx, fixed?: number) {
  for (const sw of live(c)) if (c.r.chance(0.85)) await opPing(c, sw, [...sw.held]);
  // Mostly within a lease (pinging workers keep their jobs); sometimes past it; rarely past every retention.
  const ms = fixed ?? (c.r.chance(0.01) ? 31 * 60_000 : (c.r.pick([200, 500, 1000, 1500, 2000, 2500, 2900, 200, 1000, 3100, 5200]) as number));
  c.clock.advance(ms);
  note(c, `step +${ms}`);
  c.a.agent.queue.reap();
  c.a.agent.queue.expire();
  await c.a.agent.queue.durable();
  reapModel(c);
  sweepModel(c);
  for (const sw of c.workers) {
    if (sw.deadFor > 0 && --sw.deadFor === 0) {
      if (!sw.zombie) sw.held.clear();
      note(c, `worker ${short(sw.w.workerId)} back${sw.zombie ? ' as a zombie' : ''}`);
    }
  }
}

/** WorkerRegistry.sweep: an external worker silent for 2 leases that holds nothing is forgotten, fences and all. */
function sweepModel(c: Ctx) {
  for (const sw of c.workers) {
    const holds = [...c.jobs.values()].some((j) => j.status === 'IN_PROGRESS' && j.workerId === sw.w.workerId);
    if (sw.registered && !holds && now(c) - sw.lastSeen > 2 * LEASE) forget(sw);
  }
}

async function opRunsync(c: Ctx) {
  const ep = c.r.pick(c.eps) as string;
  const workers = live(c).filter((x) => x.ep === ep);
  const mode = workers.length === 0 ? 'wait' : (c.r.pick(['done', 'done', 'error', 'hold', 'wait']) as string);
  const n = ++c.counter;
  const marker = `rs${n}`;
  const pending = c.a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { rs: marker } } });
  note(c, `runsync ${marker} ep=${c.eps.indexOf(ep)} mode=${mode}`);
  let j: MJob | undefined;
  let answered = false;
  const checkReply = async (res: Awaited<typeof pending>) => {
    answered = true;
    if (res.status !== 200) fail(c, `/runsync: ${res.status} ${res.text}`);
    if (!j) {
      j = newJob(c, res.json.id, ep, { lowPriority: false, execTimeout: 300_000, ttl: 86_400_000, retention: SYNC_RETENTION });
      c.jobs.set(j.id, j);
    }
    note(c, `runsync ${marker} → ${short(res.json.id)} ${res.json.status}`);
    if (res.json.id !== j.id) fail(c, `/runsync answered ${res.json.id}, the worker got ${j.id}`);
    observe(c, j, res.json.status, '/runsync');
    if (j.status === 'COMPLETED' && JSON.stringify(res.json.output) !== JSON.stringify(j.output)) fail(c, `/runsync output ${JSON.stringify(res.json.output)}, model ${JSON.stringify(j.output)}`);
  };
  if (mode !== 'wait') {
    const sw = c.r.pick(workers) as SimWorker;
    for (let i = 0; i < 200 && !j; i++) {
      const got = await sw.w.take(sw.held.size > 0);
      const jobs = got ? [got] : [];
      note(c, `runsync take by ${short(sw.w.workerId)}: ${jobs.map((g) => short(g.id)).join(',') || 'none'}`);
      applyTake(c, sw, jobs, 1, (job) => {
        if (job.input?.rs !== marker) return undefined;
        const mj = newJob(c, job.id, ep, { lowPriority: false, execTimeout: 300_000, ttl: 86_400_000, retention: SYNC_RETENTION });
        c.jobs.set(job.id, mj);
        return mj;
      });
      if ((got?.input as { rs?: string } | undefined)?.rs === marker) j = c.jobs.get((got as { id: string }).id);
    }
    if (!j) fail(c, `runsync job ${marker} never reached a worker`);
    // While the caller waits (its insert may still be deferred): chunks, progress, heartbeats, time, a cancel.
    const job = j;
    for (let k = c.r.int(0, 4); k > 0; k--) {
      const pick = c.r.int(0, 10);
      if (pick < 3) await opStream(c, sw, job.id);
      else if (pick < 5) await opDone(c, sw, job.id, 'progress');
      else if (pick < 6) await opPing(c, sw, [...sw.held]);
      else if (pick < 7) await checkStatus(c, job, '/status during /runsync');
      else if (pick < 8) await checkStream(c, job);
      else if (pick < 9) await opStep(c, c.r.pick([500, 2000, 3100]));
      else if (pick < 10 || answered) await opCancel(c, job);
      else {
        // A restart while the caller waits: it is answered with the job's state, which the restart keeps.
        const closing = restart(c);
        await checkReply(await pending);
        await closing;
      }
    }
    if (mode === 'done' || mode === 'error') await opDone(c, sw, j.id, mode === 'done' ? 'ok' : 'error');
  }
  if (!answered) await checkReply(await pending);
}

/** Two requests in flight together; either order is allowed, and the replies must agree with the state that results. */
async function opRace(c: Ctx) {
  const running = [...c.jobs.values()].filter((j) => j.status === 'IN_PROGRESS' && live(c).some((x) => x.w.workerId === j.workerId));
  const j = c.r.pick(running);
  if (!j) return;
  const sw = live(c).find((x) => x.w.workerId === j.workerId) as SimWorker;
  const kind = c.r.int(0, 3);
  const n = ++c.counter;
  if (kind === 0) {
    const [d, x] = await Promise.all([sw.w.done(j.id, { output: { r: n } }), c.a.req('POST', `/v2/${j.ep}/cancel/${j.id}`)]);
    contact(c, sw);
    sw.held.delete(j.id);
    note(c, `race done/cancel ${short(j.id)}: done ${outcomeOf(d.status, d.json)}, cancel ${x.status} ${x.json?.status}`);
    const done = outcomeOf(d.status, d.json);
    if (done === 'accepted' && x.json?.status === 'COMPLETED') {
      j.resultBy = sw.w.workerId;
      finish(c, j, 'COMPLETED', { r: n }, null);
    } else if (done === 'ended' && x.json?.status === 'CANCELLED') {
      finish(c, j, 'CANCELLED', null, null);
      // Whichever came first, the worker let go of the job: no stop is left for it.
      sw.stops.delete(j.id);
      sw.letGo.add(j.id);
      if (sw.registered) sw.ended.add(j.id);
    } else {
      fail(c, `race done/cancel of ${short(j.id)}: done ${done}, cancel ${x.status} ${x.text}`);
    }
    retireIfIdle(c, sw);
  } else if (kind === 1) {
    const [d1, d2] = await Promise.all([sw.w.done(j.id, { output: { r: n } }), sw.w.done(j.id, { output: { r: -n } })]);
    contact(c, sw);
    sw.held.delete(j.id);
    const o1 = outcomeOf(d1.status, d1.json);
    const o2 = outcomeOf(d2.status, d2.json);
    note(c, `race done/done ${short(j.id)}: ${o1}, ${o2}`);
    j.resultBy = sw.w.workerId;
    if (o1 === 'accepted' && o2 === 'duplicate') finish(c, j, 'COMPLETED', { r: n }, null);
    else if (o2 === 'accepted' && o1 === 'duplicate') finish(c, j, 'COMPLETED', { r: -n }, null);
    else fail(c, `race done/done of ${short(j.id)}: ${o1}, ${o2}`);
    retireIfIdle(c, sw);
  } else if (kind === 2) {
    const chunk = { c: n };
    const post = fetch(sw.w.postUrl('stream', j.id), {
      method: 'POST', headers: { authorization: sw.w.key, 'content-type': 'application/x-www-form-urlencoded' }, body: JSON.stringify({ output: chunk }),
    }).then(async (r) => ({ status: r.status, text: await r.text() }));
    const [p, poll] = await Promise.all([post, c.a.req('GET', `/v2/${j.ep}/stream/${j.id}${STREAM_NOW}`)]);
    contact(c, sw);
    note(c, `race stream/poll ${short(j.id)}: post ${p.status}, poll ${poll.text.slice(0, 120)}`);
    if (p.status !== 200) fail(c, `race stream/poll: post ${p.status} ${p.text}`);
    j.leaseAt = now(c) + LEASE;
    const want = [...j.unread, chunk];
    const first = (poll.json.stream as { output: unknown }[]).map((x) => x.output);
    const again = await c.a.req('GET', `/v2/${j.ep}/stream/${j.id}${STREAM_NOW}`);
    const rest = (again.json.stream as { output: unknown }[]).map((x) => x.output);
    if (JSON.stringify([...first, ...rest]) !== JSON.stringify(want)) fail(c, `race stream/poll of ${short(j.id)}: ${JSON.stringify(first)} then ${JSON.stringify(rest)}, model ${JSON.stringify(want)}`);
    j.unread = [];
  } else {
    const [d, x] = await Promise.all([sw.w.done(j.id, { error: `e${n}` }), c.a.req('POST', `/v2/${j.ep}/retry/${j.id}`)]);
    contact(c, sw);
    sw.held.delete(j.id);
    const done = outcomeOf(d.status, d.json);
    note(c, `race error/retry ${short(j.id)}: done ${done}, retry ${x.status}`);
    if (done !== 'accepted') fail(c, `race error/retry of ${short(j.id)}: done ${done}`);
    j.resultBy = sw.w.workerId;
    finish(c, j, 'FAILED', null, `e${n}`);
    if (x.status === 200) {
      // The retry came after the result: a new run, not fenced from this worker (it posted the
      // result itself), only from any other still running an earlier run.
      queuedByRetry(c, j, oldRunFences(c, j));
    } else if (x.status !== 409) {
      fail(c, `race error/retry: retry ${x.status} ${x.text}`);
    }
    retireIfIdle(c, sw);
  }
}

async function restart(c: Ctx) {
  const from = c.a.url;
  await c.a.agent.close();
  c.a = await startAgent(c.t, agentConfig, { clock: c.clock, dir: c.dir });
  note(c, 'restart');
  c.epoch++;
  c.bootUntil = now(c) + 2 * LEASE;
  for (const sw of c.workers) {
    sw.w = sw.w.rebase(from, c.a.url);
    // The registry starts empty (fences, stops and retirements are gone), but for the workers of running jobs; leases are fresh.
    forget(sw);
    sw.restored.clear();
    sw.retiredUntil = 0;
    if ([...c.jobs.values()].some((j) => j.status === 'IN_PROGRESS' && j.workerId === sw.w.workerId)) {
      sw.registered = true;
      sw.lastSeen = now(c);
    }
  }
  for (const j of c.jobs.values()) {
    if (j.status === 'IN_PROGRESS') j.leaseAt = now(c) + LEASE;
    // A queued job's fence is in its row (migration 10): back for a lease from the start, and
    // taken into its worker's record at that worker's next ping. Other jobs' rows hold none.
    if (j.status === 'IN_QUEUE') {
      for (const fenced of j.fences.keys()) {
        j.fences.set(fenced, now(c) + LEASE);
        c.workers.find((x) => x.w.workerId === fenced)?.restored.add(j.id);
      }
    } else j.fences = new Map();
    // A running job's row still names the workers its last requeue fenced it from, and those told
    // to stop an older attempt while it ran (JobQueue.#bootFences).
    j.bootFenced = new Set();
    if (j.status === 'IN_PROGRESS') {
      for (const fenced of j.rowFenced) {
        if (fenced === j.workerId) continue;
        j.bootFenced.add(fenced);
        c.workers.find((x) => x.w.workerId === fenced)?.restored.add(j.id);
      }
    }
  }
}

const agentConfig = { takeHoldMs: 100, leaseMs: LEASE, maxAttempts: MAX_ATTEMPTS, jobRateLimitPercent: 0 };

/** A job a worker may post for: mostly its own, sometimes one it lost or anyone's. */
function targetFor(c: Ctx, sw: SimWorker): string | undefined {
  if (sw.held.size && c.r.chance(0.8)) return c.r.pick([...sw.held]);
  return c.r.pick([...c.jobs.values()].filter((j) => j.ep === sw.ep || c.r.chance(0.1)).map((j) => j.id));
}

async function runSeed(t: Test, seed: number, steps: number) {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, agentConfig, { clock, dir });
  const eps: string[] = [];
  for (let i = 0; i < 2; i++) eps.push((await a.req('POST', '/v2/serverless', { body: cpuBody({ name: `ep${i}`, workers: { min: 0, max: 0 } }) })).json.id);
  const c: Ctx = { t, seed, r: rng(seed), clock, a, dir, eps, workers: [], jobs: new Map(), log: [], counter: 0, epoch: 0, bootUntil: 0 };
  for (const ep of eps) for (let i = 0; i < 3; i++) c.workers.push({ w: await TestWorker.create(a, ep), ep, held: new Set(), deadFor: 0, zombie: false, fenced: new Set(), restored: new Set(), lastSeen: 0, stops: new Map(), letGo: new Set(), ended: new Set(), registered: false, retiredUntil: 0, asked: false });
  const ops: [number, () => Promise<void>][] = [
    [12, () => opRun(c)],
    [12, async () => { const sw = c.r.pick(live(c)); if (sw) await opTake(c, sw, false); }],
    [5, async () => { const sw = c.r.pick(live(c)); if (sw) await opTake(c, sw, true); }],
    [14, async () => {
      const sw = c.r.pick(live(c));
      const id = sw && targetFor(c, sw);
      if (sw && id) await opDone(c, sw, id, c.r.pick(['ok', 'ok', 'ok', 'error', 'progress', 'progress', 'stopPod'] as const) as 'ok');
    }],
    [7, async () => { const sw = c.r.pick(live(c)); const id = sw && targetFor(c, sw); if (sw && id) await opStream(c, sw, id); }],
    [6, async () => {
      const sw = c.r.pick(live(c));
      if (!sw) return;
      let ids = [...sw.held].filter(() => c.r.chance(0.8));
      // Now and then a job it does not hold, also one ended before a restart (a ping reads its row
      // to know whose result it was). Not an expired one: its row may be gone or not yet.
      const known = [...c.jobs.values()].filter((j) => !expired(c, j));
      if (c.r.chance(0.2)) ids = [...ids, ...[c.r.pick(known)?.id].filter((x): x is string => !!x)];
      await opPing(c, sw, [...new Set(ids)]);
    }],
    [4, async () => { const sw = c.r.pick(live(c)); if (sw) await opStops(c, sw); }],
    [3, async () => { const j = c.r.pick([...c.jobs.values()]); if (j) await opCancel(c, j); }],
    [5, async () => {
      const ended = [...c.jobs.values()].filter((j) => j.status === 'FAILED' || j.status === 'TIMED_OUT');
      const j = c.r.chance(0.8) ? c.r.pick(ended) : c.r.pick([...c.jobs.values()]);
      if (j) await opRetry(c, j);
    }],
    [0.7, () => opPurge(c)],
    [5, async () => { const j = c.r.pick([...c.jobs.values()]); if (j) await checkStatus(c, j, '/status', c.r.chance(0.1) ? c.r.pick([1000, 120_000]) : undefined); }],
    [5, async () => { const j = c.r.pick([...c.jobs.values()].filter((x) => x.unread.length > 0 || c.r.chance(0.2))); if (j) await checkStream(c, j); }],
    [8, () => opStep(c)],
    [1.5, async () => {
      const sw = c.r.pick(live(c));
      if (!sw) return;
      sw.deadFor = c.r.int(1, 4);
      sw.zombie = c.r.chance(0.5);
      note(c, `worker ${short(sw.w.workerId)} stops pinging for ${sw.deadFor} steps`);
    }],
    [Number(process.env['MODEL_RUNSYNC'] ?? 1.2), () => opRunsync(c)],
    [2, () => opRace(c)],
    [Number(process.env['MODEL_RESTART'] ?? 0.4), () => restart(c)],
  ];
  const total = ops.reduce((n, [w]) => n + w, 0);
  try {
    for (let i = 0; i < steps; i++) {
      let x = c.r.next() * total;
      const op = ops.find(([w]) => (x -= w) < 0) ?? (ops[0] as [number, () => Promise<void>]);
      await op[1]();
      // The reaper's own tick also runs between clock moves: nothing is due then but the sweep of
      // workers that went silent and now hold nothing; run it here so it happens at a known point.
      c.a.agent.queue.reap();
      sweepModel(c);
      await checkHealth(c);
      if (i % 25 === 24) for (const j of c.jobs.values()) await checkStatus(c, j, 'sweep');
    }
    // The end: let everything settle (leases lapse, timeouts fire), then every job is final or queued, none stuck.
    for (let k = 0; k < 4; k++) await opStep(c);
    for (const j of c.jobs.values()) {
      await checkStatus(c, j, 'final');
      if (!expired(c, j)) await checkStream(c, j);
    }
    await checkHealth(c);
    const stuck = [...c.jobs.values()].filter((j) => j.status === 'IN_PROGRESS' && now(c) >= j.leaseAt);
    if (stuck.length) fail(c, `jobs IN_PROGRESS past their lease: ${stuck.map((j) => short(j.id)).join(',')}`);
  } catch (err) {
    if (err instanceof ModelError) {
      t.fail(err.message.split('\n')[0] as string);
      t.comment(err.message);
    }
    else throw err;
    return;
  }
  t.pass(`seed ${seed}: ${steps} operations, ${c.jobs.size} jobs`);
  if (process.env['MODEL_VERBOSE'] === 'log') t.comment(c.log.join('\n'));
  if (process.env['MODEL_VERBOSE']) {
    const by: Record<string, number> = {};
    for (const j of c.jobs.values()) by[j.status] = (by[j.status] ?? 0) + 1;
    t.comment(JSON.stringify(by));
    t.comment([...stats].sort((x, y) => y[1] - x[1]).map(([k, v]) => `${v}\t${k}`).join('\n'));
  }
}

// A few seeds for CI (about 5 s each); MODEL_SEEDS=1,2,… MODEL_STEPS=… MODEL_RESTART=… search further.
const SEEDS = (process.env['MODEL_SEEDS'] ?? '1,2,3,4,5').split(',').map(Number);
const STEPS = Number(process.env['MODEL_STEPS'] ?? 250);

for (const seed of SEEDS) {
  t.test(`model seed ${seed}`, async (t) => runSeed(t, seed, STEPS));
}
