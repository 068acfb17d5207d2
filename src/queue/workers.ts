/**
 * Every worker of every endpoint as the queue sees it: the ones flashd launched (managed) and
 * external ones that announce themselves by calling job-take or ping. State is derived from
 * what a worker holds and when it was last heard from.
 */
import type { Clock } from '../core/clock.js';
import type { WorkerCounts } from './types.js';

export type WorkerState = 'initializing' | 'idle' | 'running' | 'unhealthy';

/** A stop pending on a worker (WorkerInfo.stops). */
export interface PendingStop { keepUntil: number; offered: number; readonly since: number; readonly why: string }

export interface WorkerInfo {
  readonly id: string;
  readonly endpointId: string;
  readonly managed: boolean;
  /** Set by the runtime: a launched worker that has not polled yet, or one that crashed. */
  phase: 'initializing' | 'up' | 'unhealthy';
  /** Jobs this worker holds now. */
  readonly jobs: Set<string>;
  /** When it last called, or a take of it was last answered (monotonic). */
  lastSeen: number;
  /**
   * When it last called (job-take, ping, job-stop, a result): `lastSeen` without the answers to
   * its takes, which a hold that runs out gives a hung worker too. What the stop of an unheard
   * worker says it has been silent for.
   */
  lastCall: number;
  /**
   * It has pinged while it held no job and had a job-take open: its heartbeat runs beside the
   * take, as the SDK's and runpod-python's do (every PING_INTERVAL, whatever the worker holds).
   * Its silence then says it hung (see `unheard`), though its take is still open.
   */
  pingsIdle: boolean;
  idleSince: number;
  /** Open job-take long-polls. */
  parked: number;
  /**
   * Jobs the worker must stop, with the monotonic time the stop was last offered on job-stop
   * (-1: not offered yet). Offered again at most once a second while the worker's pings still
   * list the job, since a stop that arrives before the worker made the job's task is dropped.
   * `keepUntil`: until then a ping that does not list the job leaves the stop in place (that
   * ping may have been made before the worker registered a job it took moments ago); 0 once a
   * ping listed the job (registered: its next ping without it ends the stop at once).
   * `since`: when flashd asked for the stop (monotonic); `why`: how flashd ended the job for the worker (`cancelled`,
   * `timed out: …`), for the log. A worker left running only such jobs past a bound is stopped
   * (WorkerRegistry.endedOnly, decide.ts).
   */
  readonly stops: ReadonlyMap<string, PendingStop>;
  /**
   * Jobs the worker posted a final result for after flashd had taken them from it (cancelled,
   * timed out, reassigned): it let go of them, though a heartbeat made before its post may still
   * list them, so they get no new stop. Forgotten once a ping no longer lists them.
   */
  readonly letGo: Set<string>;
  /**
   * Jobs flashd ended (cancelled, timed out, attempts used up) while this worker held them: its
   * late result for that attempt is discarded with a 200 (`ended`), also once a /retry has queued
   * the job again or another worker runs it, and never completes the new run. Forgotten when it
   * takes the job again, or once its stop is over and a ping no longer lists the job.
   */
  readonly ended: Set<string>;
  /**
   * For each job it holds, the number of its last stream chunk stored (the `chunk` query of its
   * job-stream posts, 1 for the first yield): a chunk posted again under a number already stored
   * (its answer was lost, so the worker retried) is acknowledged without being stored twice.
   * Dropped when the job leaves the worker.
   */
  readonly chunks: Map<string, number>;
  /**
   * Jobs taken away from this worker while it may still run them (a lapsed lease): it is not
   * handed them again until a ping no longer lists them, or a lease period has passed.
   */
  readonly fenced: Set<string>;
  /** Parked job-stop requests, woken when a stop is added. */
  stopWaiters: (() => void)[];
  /** To be replaced: it asked (stopPod / refresh_worker), or its endpoint's configuration changed. */
  recycle: boolean;
  /**
   * Recycled because it asked (stopPod), not for a new configuration: until it exits it still
   * holds its place under `workers.max` (decide.ts), so refresh_worker with concurrency above 1
   * does not start a replacement per job. An external one's results retire it once it holds
   * nothing (JobQueue.#retireIfIdle), and one that holds nothing, whatever ended its jobs, is
   * `silent` (out of /health and the autoscaler's workers); a job-take from it clears this and
   * `recycle` (it did not exit).
   */
  refresh: boolean;
  /**
   * Recycled for being busy above a lowered `workers.max` (JobQueue.retireAboveMax), held as
   * `refresh` is: when `max` leaves room for it again before it stops, it takes jobs again.
   */
  retired: boolean;
  /** flashd is stopping it: no more jobs, and its polls are answered at once (JobQueue.stopping). */
  draining: boolean;
  /** It has asked for a job (job-take) at least once. */
  asked: boolean;
  /**
   * The API key it last authenticated with on a job-take, ping or job-stop (null: none yet, as
   * for a record recovered at start from a running job): the principal's keyId, so revoking a
   * key can find the workers that use it (WorkerRegistry.keyRevoked).
   */
  keyId: string | null;
  /**
   * That key was revoked (WorkerRegistry.keyRevoked): every request it makes is refused, so it
   * is left out of `/health` and, external, of the autoscaler's workers (see `silent`), until it
   * calls with another key.
   */
  revoked: boolean;
  /** When its last job-take was answered (monotonic; -Infinity: never). */
  answeredAt: number;
  /** That answer held fewer jobs than it asked for: it has free slots and asks again at once (see WorkerRegistry.returningMs). */
  wantsMore: boolean;
}

/** A new worker record: an external worker that is up, unless `init` says otherwise. */
function record(endpointId: string, workerId: string, now: number, init: Partial<Pick<WorkerInfo, 'managed' | 'phase' | 'recycle' | 'draining'>> = {}): WorkerInfo {
  return {
    id: workerId, endpointId, managed: false, phase: 'up', jobs: new Set(), lastSeen: now, lastCall: now, pingsIdle: false, idleSince: now,
    parked: 0, stops: new Map(), letGo: new Set(), ended: new Set(), chunks: new Map(), fenced: new Set(), stopWaiters: [], recycle: false, refresh: false, retired: false, draining: false, asked: false,
    keyId: null, revoked: false, answeredAt: -Infinity, wantsMore: false, ...init,
  };
}

/** See WorkerRegistry.silent. */
export const SILENT_MS = 10_000;

/**
 * How long after a job-take answered with fewer jobs than it asked for its worker is still
 * expected back for the rest (WorkerRegistry.returningMs). An SDK asks again within
 * milliseconds (vendor_flash; runpod-python with an async handler); one that has not by then is
 * busy (runpod-python runs a sync handler on the loop that takes jobs).
 */
export const RETURN_MS = 1000;

/**
 * How long a worker that holds no job may go with no job-take open before it counts as paused
 * (WorkerRegistry.paused): well above the milliseconds between a job-done and the next job-take.
 */
export const PAUSED_MS = 2000;

export class WorkerRegistry {
  readonly #clock: Clock;
  readonly #byEndpoint = new Map<string, Map<string, WorkerInfo>>();
  readonly #throttled = new Map<string, number>();
  readonly #forgetAfterMs: number;
  /**
   * Workers that asked to be recycled and left (`${endpointId} ${workerId}`): until when
   * (monotonic), and their record, out of the registry, that their last calls are given (`seen`).
   */
  readonly #retired = new Map<string, { until: number; w: WorkerInfo }>();
  /**
   * Job id → the records that have a stop pending for it (addStop), so stillRunning, called at
   * every requeue and /retry, looks at those only, not at every worker of the endpoint: a mass
   * requeue (a reap after a restart with thousands of jobs running, a worker holding 64 lost)
   * was requeues × workers. A record may stay here after it left the registry (retired, or
   * removed but still referenced): stillRunning checks each one against the registry, as its scan did.
   */
  readonly #stopping = new Map<string, Set<WorkerInfo>>();
  /**
   * Called when a worker flashd launched first asks for a job (after taking one, if any was
   * waiting): a QUEUE_DELAY endpoint paces its next worker by those still starting (one more
   * each further queueDelay while they start), so the autoscaler looks again then. Not at its first ping, which may come before: it would
   * find the worker idle and start nothing.
   */
  onUp: ((endpointId: string, workerId: string) => void) | null = null;

  /** @param forgetAfterMs - when a silent external worker is forgotten: 2 × the lease (`--lease-ms`). */
  constructor(clock: Clock, forgetAfterMs: number) {
    this.#clock = clock;
    this.#forgetAfterMs = forgetAfterMs;
  }

  #map(endpointId: string): Map<string, WorkerInfo> {
    let m = this.#byEndpoint.get(endpointId);
    if (!m) this.#byEndpoint.set(endpointId, (m = new Map()));
    return m;
  }

  get(endpointId: string, workerId: string): WorkerInfo | undefined {
    return this.#byEndpoint.get(endpointId)?.get(workerId);
  }

  /** Registers a worker flashd is launching. */
  launched(endpointId: string, workerId: string): WorkerInfo {
    const now = this.#clock.monotonic();
    const w = record(endpointId, workerId, now, { managed: true, phase: 'initializing' });
    const map = this.#map(endpointId);
    const before = map.get(workerId);
    if (before !== undefined) this.#unindexAll(before);
    map.set(workerId, w);
    return w;
  }

  /** Puts a stop on the worker (WorkerInfo.stops), replacing any it had for the job. */
  addStop(w: WorkerInfo, jobId: string, stop: PendingStop): void {
    (w.stops as Map<string, PendingStop>).set(jobId, stop);
    let ws = this.#stopping.get(jobId);
    if (ws === undefined) this.#stopping.set(jobId, (ws = new Set()));
    ws.add(w);
  }

  /** Ends the worker's stop for the job; false if it had none. */
  dropStop(w: WorkerInfo, jobId: string): boolean {
    if (!(w.stops as Map<string, PendingStop>).delete(jobId)) return false;
    this.#unindex(w, jobId);
    return true;
  }

  #unindex(w: WorkerInfo, jobId: string): void {
    const ws = this.#stopping.get(jobId);
    if (ws?.delete(w) && ws.size === 0) this.#stopping.delete(jobId);
  }

  /** A record forgotten for good: its stops leave the index (they stay on the record). */
  #unindexAll(w: WorkerInfo): void {
    for (const jobId of w.stops.keys()) this.#unindex(w, jobId);
  }

  /**
   * Any contact from a worker: marks it up (one flashd launched: once it asks for a job, a ping
   * alone leaves it initializing), creating the record for external workers. A worker
   * that retired (stopPod) is not brought back by the last ping or job-stop poll of the process
   * on its way out (runpod-python's heartbeat runs in its own process): those get its retired
   * record, draining and out of the registry, whose pending stops job-stop still offers (a job
   * flashd cancelled before the result that retired it). Only a job-take (`wantsJobs`) brings it
   * back: a worker asking for work after its stopPod did not exit (RunPod would have stopped the
   * pod), so it gets its retired record again, pending stops, fences and all (the job flashd
   * ended there may still run, and must still be told to stop). Once the retired record is
   * forgotten (`forgetAfterMs`), any call gets a new record.
   * `keyId`: the key the call authenticated with (see WorkerInfo.keyId); a key other than the one
   * recorded takes its place, and ends a `revoked` mark, since this call's key is good.
   */
  seen(endpointId: string, workerId: string, wantsJobs = false, keyId?: string): WorkerInfo {
    const now = this.#clock.monotonic();
    const map = this.#map(endpointId);
    let w = map.get(workerId);
    if (!w && this.#retired.size > 0) {
      const key = `${endpointId} ${workerId}`;
      const retired = this.#retired.get(key);
      if (retired !== undefined && now >= retired.until) {
        this.#retired.delete(key);
        this.#unindexAll(retired.w);
      } else if (retired !== undefined && wantsJobs) {
        // It asked for work: it did not exit. Its own record comes back, with the stops still
        // pending on it (a job flashd ended there may still run), its ended and let-go jobs and
        // its fences; JobQueue.take withdraws its stopPod.
        this.#retired.delete(key);
        w = retired.w;
        w.draining = false;
        if (w.stops.size === 0) w.idleSince = now;
        map.set(workerId, w);
      } else if (retired !== undefined) {
        retired.w.lastSeen = now;
        retired.w.lastCall = now;
        return retired.w;
      }
    }
    if (!w) {
      w = record(endpointId, workerId, now);
      map.set(workerId, w);
    }
    // A worker flashd launched is idle from its first contact, not from its launch: a boot longer
    // than idleTimeout would otherwise have it stopped the moment it came up.
    if (w.phase === 'initializing' && w.jobs.size === 0) w.idleSince = now;
    // An unhealthy mark (its own ping said so, or it crashed) stays until it asks for work again:
    // a worker taking jobs is up (a restarted incarnation with the same id, a passing check).
    const firstAsk = wantsJobs && w.managed && !w.asked;
    if (wantsJobs) w.asked = true;
    // One flashd launched is up once it asks for work, not at its first ping: runpod-python's
    // heartbeat, a process of its own, pings just as well from the local test API
    // (--rp_serve_api) or realtime mode, which take no job from the queue; counted idle, such a
    // worker held its place for good while the queue waited, out of the init timeout's reach.
    if (wantsJobs || (w.phase === 'initializing' && !w.managed)) w.phase = 'up';
    if (keyId !== undefined && keyId !== w.keyId) {
      w.keyId = keyId;
      w.revoked = false;
    }
    w.lastSeen = now;
    w.lastCall = now;
    if (firstAsk) this.onUp?.(endpointId, workerId);
    return w;
  }

  /**
   * An API key was revoked: marks `revoked` and returns the workers that last authenticated with
   * it, and the worker a worker key was made for (`named`: its endpoint and worker id) when that
   * one has recorded no key yet. A scan of every worker, but only at a revocation: nothing is
   * added to job-take or job-done.
   */
  keyRevoked(keyId: string, named?: { endpointId: string; workerId: string }): WorkerInfo[] {
    const out: WorkerInfo[] = [];
    for (const w of this.all()) {
      if (w.keyId === keyId || (w.keyId === null && named !== undefined && w.endpointId === named.endpointId && w.id === named.workerId)) {
        w.revoked = true;
        out.push(w);
      }
    }
    return out;
  }

  /**
   * The record of a worker in the registry, or else its retired record while its last calls
   * still get it (see `seen`): where the stops still pending on it are.
   */
  getOrRetired(endpointId: string, workerId: string): WorkerInfo | undefined {
    const w = this.get(endpointId, workerId);
    if (w || this.#retired.size === 0) return w;
    const retired = this.#retired.get(`${endpointId} ${workerId}`);
    return retired !== undefined && this.#clock.monotonic() < retired.until ? retired.w : undefined;
  }

  /**
   * The workers of the endpoint, in the registry or retired (their last calls still get their
   * record, see `seen`), whose stop for `jobId` is pending: they may still run an old attempt of
   * it, so a new attempt is fenced from each (JobQueue.#fenceOldRuns). Only the records with a
   * stop for the job are looked at (#stopping), each kept if it is the endpoint's record of its
   * worker in the registry, or its retired record not yet forgotten.
   */
  stillRunning(endpointId: string, jobId: string): WorkerInfo[] {
    const ws = this.#stopping.get(jobId);
    if (ws === undefined) return [];
    const out: WorkerInfo[] = [];
    const map = this.#byEndpoint.get(endpointId);
    for (const w of ws) {
      if (w.endpointId !== endpointId || !w.stops.has(jobId)) continue;
      if (map?.get(w.id) === w) out.push(w);
      else {
        const retired = this.#retired.get(`${endpointId} ${w.id}`);
        if (retired?.w === w && this.#clock.monotonic() < retired.until) out.push(w);
      }
    }
    return out;
  }

  /**
   * Removes a worker that asked to be recycled and holds nothing; its record, draining, is kept
   * for its last calls (see `seen`), so the stops still pending on it reach the worker.
   */
  retire(endpointId: string, workerId: string): void {
    const w = this.#removeKeepingStops(endpointId, workerId);
    if (!w) return;
    w.recycle = true;
    w.draining = true;
    const key = `${endpointId} ${workerId}`;
    const before = this.#retired.get(key);
    if (before !== undefined && before.w !== w) this.#unindexAll(before.w);
    this.#retired.set(key, { until: this.#clock.monotonic() + this.#forgetAfterMs, w });
  }

  markUnhealthy(endpointId: string, workerId: string): void {
    const w = this.get(endpointId, workerId);
    if (w) w.phase = 'unhealthy';
  }

  remove(endpointId: string, workerId: string): WorkerInfo | undefined {
    const w = this.#removeKeepingStops(endpointId, workerId);
    if (w) this.#unindexAll(w);
    return w;
  }

  /** remove, its pending stops still indexed (a retired record's last calls still get them). */
  #removeKeepingStops(endpointId: string, workerId: string): WorkerInfo | undefined {
    const map = this.#byEndpoint.get(endpointId);
    const w = map?.get(workerId);
    if (w) {
      map?.delete(workerId);
      for (const wake of w.stopWaiters) wake();
      w.stopWaiters = [];
    }
    return w;
  }

  /** Every worker known, of every endpoint. */
  *all(): IterableIterator<WorkerInfo> {
    for (const m of this.#byEndpoint.values()) yield* m.values();
  }

  list(endpointId: string): WorkerInfo[] {
    return [...(this.#byEndpoint.get(endpointId)?.values() ?? [])];
  }

  dropEndpoint(endpointId: string): WorkerInfo[] {
    const all = this.list(endpointId);
    for (const w of all) this.remove(endpointId, w.id);
    this.#byEndpoint.delete(endpointId);
    this.#throttled.delete(endpointId);
    return all;
  }

  setThrottled(endpointId: string, n: number): void {
    if (n > 0) this.#throttled.set(endpointId, n);
    else this.#throttled.delete(endpointId);
  }

  /** Endpoints waiting for capacity. */
  throttledEndpoints(): string[] {
    return [...this.#throttled.keys()];
  }

  /** Forgets external workers not heard from for a while (they hold no jobs by then). */
  sweep(): void {
    const now = this.#clock.monotonic();
    for (const [key, { until, w }] of this.#retired) {
      if (now < until) continue;
      this.#retired.delete(key);
      this.#unindexAll(w);
    }
    for (const map of this.#byEndpoint.values()) {
      for (const w of map.values()) {
        if (!w.managed && w.parked === 0 && w.jobs.size === 0 && now - w.lastSeen > this.#forgetAfterMs) {
          map.delete(w.id);
          this.#unindexAll(w);
        }
      }
    }
  }

  state(w: WorkerInfo): WorkerState {
    if (w.phase === 'unhealthy') return 'unhealthy';
    if (w.phase === 'initializing') return 'initializing';
    // A job flashd ended (timeout, cancel, a lapsed lease) that the worker's pings still list is
    // still running there (a sync handler cannot be interrupted): the worker is busy, not idle.
    // Not once it has not called for a whole lease: no ping lists the job any more, so nothing
    // says it runs it (a hung process: it would be busy for good, holding its place under max).
    return w.jobs.size > 0 || (w.stops.size > 0 && !this.#unheardFor(w)) ? 'running' : 'idle';
  }

  /** It has not called (job-take, ping, job-stop) for a whole lease (`--lease-ms`). */
  #unheardFor(w: WorkerInfo): boolean {
    return this.#clock.monotonic() - w.lastSeen > this.#forgetAfterMs / 2;
  }

  /**
   * An external worker that holds no job and has no job-take open, and has not called for
   * SILENT_MS: it has most likely gone (an SDK re-polls job-take at once after every answer).
   * It is left out of `/health` and of the autoscaler's idle workers, which would otherwise hold
   * off a QUEUE_DELAY scale-up until the sweep forgets it (2 × lease). An external worker whose
   * key was revoked (`revoked`) is silent at once, whatever it holds: each call it makes is
   * refused, so it takes no job and posts no result (the jobs it held go back to the queue when
   * their leases lapse, as for any worker that stopped calling). So is one that asked to be
   * recycled (stopPod, `refresh`) and holds no job, whatever ended its last one: its own result
   * retires it (JobQueue.#retireIfIdle), but one that flashd ended (a /cancel, the execution
   * timeout, a lapsed lease) left it counted until this rule's 10 s, though it takes no job and
   * exits once its handlers stop. Its record stays, so job-stop still tells it to stop the jobs
   * flashd ended; a job-take clears `refresh` (it did not exit) and it counts again.
   */
  silent(w: WorkerInfo): boolean {
    return !w.managed && (w.revoked || (w.jobs.size === 0 && (w.refresh || (w.parked === 0 && this.#clock.monotonic() - w.lastSeen > SILENT_MS))));
  }

  /**
   * A worker flashd launched that is up, holds no job, has no job-take open and has not called
   * (job-take or ping) for a whole lease: its process has most likely died without the runtime
   * saying so, as when a container dies while the engine's API is down (its exit is reported
   * only once the engine answers again). A live SDK always has a take open or pings every
   * PING_INTERVAL (a third of the lease). With a take open too, once it has pinged while idle
   * (`pingsIdle`): its heartbeat goes on whatever it holds, so a lease without a call means it
   * hung whole (handler and heartbeat); its open take says nothing, and waiting for the take's
   * hold to run out first made an idle hung worker pass for idle for `--take-hold-ms` more (and
   * be handed the next job). A worker that only polls job-take (no heartbeat while idle) is
   * judged only while no take of it is open.
   * `/health` counts it `unhealthy` (neither idle nor ready); the autoscaler still counts it, so
   * it is stopped as any idle worker (and counted as it is again if it calls). Stops it was
   * offered do not keep it busy then (see `state`): a hung worker (handler and heartbeat both
   * stuck) whose job flashd took back at its lease is unhealthy, not running for good.
   */
  unheard(w: WorkerInfo): boolean {
    if (!w.managed || w.phase !== 'up' || w.jobs.size > 0) return false;
    // By its calls alone: the answer a hold that ran out gave its take (lastSeen) is no sign of life.
    if (w.pingsIdle) return this.#clock.monotonic() - w.lastCall > this.#forgetAfterMs / 2;
    return w.parked === 0 && this.#unheardFor(w);
  }

  /** Ms since the worker last called (see WorkerInfo.lastCall): what an unheard worker's stop reports. */
  silentMs(w: WorkerInfo): number {
    return this.#clock.monotonic() - w.lastCall;
  }

  /**
   * A worker whose only work left is jobs flashd ended (a timeout, a TTL, a /cancel, one taken
   * back) that its pings still list: it holds no job and has no job-take open. The one flashd
   * ended first, with ms since then (`endedMs`); undefined otherwise. A handler that honours
   * job-stop returns and its pings drop the job; one that never returns (a deadlock, a sync call
   * that never ends) kept its worker `running` for good, holding its place under max: the
   * autoscaler stops a managed one once `endedMs` passes the lease (decide.ts). Counted from the
   * end, not from job-stop's answer: runpod-python never asks job-stop, and a sync handler of
   * its runs to its end however long that is.
   */
  endedOnly(w: WorkerInfo): { jobId: string; why: string; endedMs: number } | undefined {
    if (w.stops.size === 0 || w.jobs.size > 0 || w.parked > 0) return undefined;
    let first: [string, { since: number; why: string }] | undefined;
    for (const entry of w.stops) {
      if (first === undefined || entry[1].since < first[1].since) first = entry;
    }
    if (first === undefined) return undefined;
    return { jobId: first[0], why: first[1].why, endedMs: this.#clock.monotonic() - first[1].since };
  }

  /**
   * For how many more ms the worker is expected to ask for jobs again, 0 when it is not: its last
   * job-take got fewer jobs than it asked for (concurrency above 1, or a hold that ran out) and
   * it has not asked again yet, within RETURN_MS of that answer. Between an answer and the next
   * take no take of it is parked, so a job queued then waits for it, though it has room for it.
   * (One with a take parked needs no such guess: a queued job goes to it at once, unless it is
   * fenced from that worker.)
   */
  returningMs(w: WorkerInfo): number {
    if (!w.wantsMore || w.parked > 0) return 0;
    return Math.max(0, Math.ceil(w.answeredAt + RETURN_MS - this.#clock.monotonic()));
  }

  /**
   * A worker that is up, holds no job and has had no job-take open for PAUSED_MS (since its last
   * take was answered or its last job ended; SILENT_MS since its first contact for one that has
   * never asked for a job): it takes no job, though it pings (its SDK's `concurrency_modifier`
   * returned 0: intake paused). `/health` still counts it `idle` (RunPod shows such a worker idle
   * too), but it is no idle capacity: it does not hold off a QUEUE_DELAY scale-up (decide.ts). An
   * SDK asks again within milliseconds of each answer and of each result, so a working worker is
   * never paused.
   */
  paused(w: WorkerInfo): boolean {
    // One that has never asked may still be booting past its first ping (the SDK's heartbeat
    // starts before its take loop, seconds apart on a loaded host): SILENT_MS for it.
    return w.phase === 'up' && w.jobs.size === 0 && w.parked === 0
      && this.#clock.monotonic() - Math.max(w.answeredAt, w.idleSince) > (w.asked ? PAUSED_MS : SILENT_MS);
  }

  counts(endpointId: string): WorkerCounts {
    const c: WorkerCounts = { idle: 0, initializing: 0, ready: 0, running: 0, throttled: this.#throttled.get(endpointId) ?? 0, unhealthy: 0 };
    for (const w of this.list(endpointId)) {
      // A managed worker whose key was revoked is being replaced (JobQueue.keyRevoked): not counted either.
      if (this.silent(w) || w.revoked) continue;
      if (this.unheard(w)) {
        c.unhealthy++;
        continue;
      }
      const state = this.state(w);
      // A worker flashd is stopping that holds no job takes none again: not idle, not ready,
      // however long it takes to exit (up to the stop grace if it ignores SIGTERM). Nor
      // initializing: one stopped while starting (the init timeout, a lower max, a new
      // configuration) will never come up. Nor running for a job flashd ended whose stop is
      // still pending (`state`): it runs none of the endpoint's jobs, and the autoscaler, whose
      // log then says "no worker up", counts it out too.
      if (state !== 'unhealthy' && w.draining && w.jobs.size === 0) continue;
      c[state]++;
    }
    c.ready = c.idle + c.running;
    return c;
  }
}
