/**
 * The scaling decision, a pure function of one endpoint's snapshot (beta9's
 * `endpointDeploymentScaleFunc` split: observe → decide → act). Table-tested in
 * test/scheduler/decide.test.ts.
 *
 * - Keep workers between `min` and `max`.
 * - QUEUE_DELAY: with no worker at all, the first waiting job starts one at once (a cold
 *   start). Otherwise, while no worker is idle, one more is added when the oldest waiting job
 *   has waited `queueDelay`, and while workers are still starting one more for each further
 *   `queueDelay` it waits (waited >= queueDelay × (starting + 1)), never more starting than
 *   jobs waiting (`heldByStarting` names the starting ones while they hold a start back, for
 *   the log); `recheckInMs` says when that wait will be long enough. An idle worker that takes
 *   no job (`paused`: no job-take open for a while, its SDK's concurrency_modifier returned 0) is
 *   no idle capacity: it holds off no scale-up, though `/health` counts it idle.
 * - REQUEST_COUNT: target `ceil((inQueue + inProgress) / requestCount)`, beside the workers busy
 *   only with work that leaves out (low-priority jobs, jobs flashd ended that a handler still
 *   runs): they serve none of the jobs counted, so they do not stand for the target. Unless such
 *   a worker is coming back for more jobs (`returningMs`: concurrency above 1, between a job-take's
 *   answer and its next take): it takes a queued job itself, and the loop looks again once it
 *   is overdue.
 * - Low-priority jobs never cause a scale-up.
 * - `max` caps the managed workers that exist: one being stopped (`exiting`: idle, above max,
 *   init timeout, asked to be recycled) keeps its place until it has exited, so a job arriving
 *   while it exits waits for the exit and then starts a worker. One replaced for a new
 *   configuration is the exception (below). One stopped for the init timeout also stands for
 *   its replacement until it has exited, even below max: its exit is a crash, and a crash
 *   backoff must be able to hold that replacement.
 * - Idle workers stop after `idleTimeout` (down to `min`; REQUEST_COUNT, which has no
 *   idleTimeout: down to its target, after the loop's grace), longest idle first; above `max`
 *   (a lowered `max`, or an external worker that joined at it: external workers count toward
 *   `max` but are never stopped), starting and idle workers stop at once and busy ones are retired: they
 *   finish what they hold, take no new job and then stop, so a backlog that keeps every worker
 *   busy cannot hold the count above `max`. A retired worker
 *   that fits under `max` again before it stops (max raised) serves again.
 * - A managed worker marked for replacement (a new configuration, stopPod) takes no more jobs:
 *   it is not counted as serving and it stops as soon as it holds no job, even while it is
 *   starting, or while it still runs only jobs flashd ended (`endedOnly`, at once). For a new configuration its replacement starts at once (`max` applying to the
 *   others); one that asked (stopPod, refresh_worker) keeps its place under `max` while it
 *   still runs jobs, so its replacement waits for room.
 * - A managed worker whose only work left is jobs flashd ended (a timeout, a TTL, a /cancel) that
 *   it still runs more than `endedStopMs` (the lease) after flashd ended the first of them
 *   (`endedOnly`: a handler that never returns) is stopped: busy for good, it held its place
 *   under `max` and the queue waited behind it. Its exit makes room for a replacement.
 * - When the runtime has no room, the shortfall is reported as `throttled`.
 */
import type { Scaling } from '../endpoints/index.js';

export interface WorkerSnapshot {
  id: string;
  state: 'initializing' | 'idle' | 'running' | 'unhealthy';
  /** ms since the worker last held a job (meaningful when idle). */
  idleMs: number;
  /**
   * Idle, but with no job-take open for a while (WorkerRegistry.paused: its SDK's
   * concurrency_modifier returned 0): it takes no job, so it is no idle capacity for QUEUE_DELAY.
   * It is still an idle worker for min, max and idleTimeout.
   */
  paused?: boolean;
  /** Launched by flashd (only those are stopped by the autoscaler). */
  managed: boolean;
  /** Marked for replacement (config change, stopPod): stop as soon as it is idle. */
  recycle: boolean;
  /** Recycled because it asked (stopPod, refresh_worker): it holds its place under max until it exits. */
  refresh?: boolean;
  /** Recycled for being busy above a lowered max (with `recycle` and `refresh`): it serves again once max has room for it. */
  retired?: boolean;
  /**
   * Running, but none of its jobs is counted in `inProgress` (only low-priority jobs, or jobs
   * flashd ended that its handler still runs): REQUEST_COUNT's target does not count on it.
   */
  uncounted?: boolean;
  /**
   * For how many more ms it is expected back for more jobs (WorkerRegistry.returningMs): its last
   * job-take got fewer than it asked for (concurrency above 1) and it has not asked again yet. Busy
   * with uncounted work, it still has room: a job queued now goes to it, so it starts nobody.
   */
  returningMs?: number;
  /**
   * Its only work left is jobs flashd ended that it still runs (WorkerRegistry.endedOnly): the
   * first one flashd ended, how (`why`), and ms since then (`endedMs`).
   */
  endedOnly?: { jobId: string; why: string; endedMs: number };
}

export interface ScaleInput {
  min: number;
  max: number;
  /** Idle time before a worker stops. */
  idleTimeoutMs: number;
  scaling: Scaling;
  /** Normal-priority jobs waiting. */
  queued: number;
  lowQueued: number;
  /** Normal-priority jobs running (running low-priority jobs are left out, as queued ones are). */
  inProgress: number;
  /** How long the oldest normal-priority job has waited. */
  oldestWaitMs: number;
  workers: readonly WorkerSnapshot[];
  /** Workers the runtime can start now. */
  capacity: number;
  /** True while crash-loop backoff holds new starts back. */
  backoff: boolean;
  /**
   * Managed workers being stopped that have not exited yet (not in `workers`). Each takes its
   * place under max until it has exited (max caps the processes or containers that exist, as
   * the device ledger does for GPUs), except one replaced for the endpoint's new configuration.
   */
  exiting?: readonly ExitingSnapshot[];
  /**
   * How long a managed worker may go on running only jobs flashd ended after the first of them
   * ended (`endedOnly.endedMs`) before it is stopped (`--lease-ms`); unset: never.
   */
  endedStopMs?: number;
}

/** A managed worker flashd is stopping (SIGTERM sent) that has not exited yet. */
export interface ExitingSnapshot {
  id: string;
  /**
   * Replaced for the endpoint's new configuration (a PATCH that needs a restart): like the busy
   * workers of the old configuration it holds no place under max, so jobs submitted after the
   * PATCH do not wait for it.
   */
  replaced?: boolean;
  /**
   * Stopped for the init timeout: its exit counts as a crash, so it also stands for the worker
   * that will replace it. The replacement starts only once it has exited and the crash is
   * counted (a crash backoff then holds it), whatever room is left under max.
   */
  initTimedOut?: boolean;
}

export interface ScaleDecision {
  start: number;
  stop: string[];
  /** Busy managed workers above `max`: they take no new job and stop once idle (JobQueue.recycling, asked). */
  retire: string[];
  /** Retired workers that fit under `max` again (raised, or others gone): they take jobs again (JobQueue.unretire). */
  unretire: string[];
  throttled: number;
  desired: number;
  /** Why the `start` workers start, for the logs ('' when none starts). */
  startReason: string;
  /** Why each worker in `stop` stops, for the logs. */
  stopReasons: Record<string, string>;
  /**
   * QUEUE_DELAY: ms until the oldest job's wait reaches `queueDelay`, when only that wait holds
   * the next worker back; REQUEST_COUNT: ms until a worker busy with uncounted work that is
   * expected back for more jobs (`returningMs`) is overdue, while jobs are queued (0 otherwise).
   * The loop decides again then, not at its next tick.
   */
  recheckInMs: number;
  /**
   * QUEUE_DELAY: the workers still starting while the oldest job has waited past `queueDelay`
   * and both `max` and the runtime (`capacity`) have room after this decision's starts: they
   * hold the next start back (one more each further `queueDelay`, never more starting than jobs
   * waiting); empty otherwise, and during a crash backoff or while the runtime has no room
   * (each said by its own line).
   */
  heldByStarting: string[];
}

/** Seconds for a log line: `2`, `2.5`. */
export const secs = (ms: number): string => String(Math.round(ms / 100) / 10);

/**
 * `above workers.max (3)`, naming the external workers up when there are any: they count toward
 * max, so one that joins at max puts a worker flashd started above it with nobody lowering max.
 */
export const aboveMax = (max: number, external: number): string =>
  external > 0 ? `above workers.max (${max}), counting the endpoint's ${external} external worker(s)` : `above workers.max (${max})`;

export function decideScale(s: ScaleInput): ScaleDecision {
  // Still running only jobs flashd ended, long after it was told to stop them: a handler that
  // never returns (a deadlock, a call that never ends) while the SDK's heartbeat goes on pinging.
  // It would count as running for good; it is stopped, whatever else this decision does with it.
  const stuck = s.endedStopMs === undefined ? []
    : s.workers.filter((w) => w.managed && w.state === 'running' && w.endedOnly !== undefined && w.endedOnly.endedMs > (s.endedStopMs as number));
  // Stopped for idleness, above max, for the init timeout or because it asked: until it has
  // exited it still runs (a handler's cleanup, a deaf one's whole stop grace), so a job arriving
  // meanwhile waits for the exit and then cold-starts, rather than a second worker running
  // beside it past max.
  const exiting = (s.exiting ?? []).filter((e) => !e.replaced).length;
  // Retired workers (busy above a lowered max) that fit under max again, beside the serving
  // workers and those holding their places, serve again: a PATCH that raises max back does not
  // leave them idle until they stop, to be replaced by cold starts.
  const unretire: string[] = [];
  const retiredNow = (w: WorkerSnapshot) => w.managed && w.recycle && w.retired === true && w.state !== 'unhealthy';
  let room = s.max - exiting - s.workers.filter((w) => w.state !== 'unhealthy' && !retiredNow(w) && (!(w.recycle && w.managed) || w.refresh)).length;
  for (const w of s.workers) {
    if (room <= 0) break;
    if (!retiredNow(w) || stuck.includes(w)) continue;
    unretire.push(w.id);
    room--;
  }
  const workers = unretire.length ? s.workers.map((w) => (unretire.includes(w.id) ? { ...w, recycle: false, refresh: false, retired: false } : w)) : s.workers;
  const live = workers.filter((w) => w.state !== 'unhealthy');
  // A managed worker marked for replacement takes no more jobs (JobQueue.recycling): it neither
  // serves the queue nor counts toward max, so its replacement starts while it finishes.
  const serving = live.filter((w) => !(w.recycle && w.managed));
  const active = serving.length;
  // One that takes no job (paused) is no idle capacity: counted as such, it held off every
  // QUEUE_DELAY scale-up while the queue waited for its TTL.
  const idle = serving.filter((w) => w.state === 'idle' && w.paused !== true);
  const starting = serving.filter((w) => w.state === 'initializing').length;
  // Workers of an old configuration finishing their jobs (a PATCH that needs a restart): up, but
  // serving no new job. A start beside them says so, not "no worker up".
  const replacing = live.filter((w) => w.managed && w.recycle && !w.refresh).length;
  // Workers that asked to be recycled (stopPod, refresh_worker), a retired one above a lowered
  // max apart: a start beside them replaces them, and says so.
  const refreshing = live.filter((w) => w.managed && w.recycle && w.refresh && !w.retired).length;

  let desired = active;
  let why = '';
  let recheckInMs = 0;
  let pacedBy: string[] = [];
  if (s.scaling.type === 'REQUEST_COUNT') {
    // A worker busy with work the target leaves out serves none of the jobs counted: counted
    // toward the target, it would keep a normal job waiting behind a low-priority one (or a
    // cancelled one a sync handler still runs) for as long as that one runs.
    // One that is coming back for more jobs (a free slot, concurrency above 1) takes a queued one
    // itself; if it is not back in time, the next decision counts it as occupied.
    const uncounted = serving.filter((w) => w.uncounted === true && w.state === 'running');
    const returning = uncounted.filter((w) => (w.returningMs ?? 0) > 0);
    const occupied = uncounted.length - returning.length;
    if (s.queued > 0 && returning.length > 0) recheckInMs = Math.min(...returning.map((w) => w.returningMs as number));
    const wanted = Math.ceil((s.queued + s.inProgress) / s.scaling.requestCount);
    desired = wanted + occupied;
    why = `REQUEST_COUNT: ${s.queued + s.inProgress} job(s) queued or running at ${s.scaling.requestCount} per worker: ${wanted} worker(s) wanted`
      + (occupied > 0 && wanted > 0 ? ` beside the ${occupied} busy with low-priority or ended jobs` : '')
      // More than max allows: said, or a reader looks for workers that were never to start.
      + (wanted > 0 && desired > s.max ? ` (capped at workers.max ${s.max})` : '');
  } else if (s.queued > 0 && idle.length === 0) {
    if (active === 0) {
      desired = 1;
      why = replacing > 0
        ? `${s.queued} job(s) waiting and no worker of the endpoint's new configuration up`
        : `cold start: ${s.queued} job(s) waiting and no worker up`;
    } else {
      // One worker per queueDelay the oldest job has waited, counting those still starting: the
      // first once it has waited queueDelay, each further one queueDelay later while the others
      // start (waited >= queueDelay × (starting + 1)). One at a time until the last was up made
      // a backlog on a slow boot (a model loading for a minute) wait a boot time per worker.
      // Never more starting (none is idle here) than jobs waiting: each is for one of them.
      const step = s.scaling.queueDelay * 1000;
      const due = step > 0 ? Math.floor(s.oldestWaitMs / step) : Infinity;
      const wanted = Math.min(due, s.queued);
      if (wanted > starting) {
        desired = active + wanted - starting;
        const paused = serving.filter((w) => w.state === 'idle' && w.paused === true).length;
        why = `QUEUE_DELAY: the oldest job has waited ${secs(s.oldestWaitMs)} s (queueDelay ${s.scaling.queueDelay} s) and no worker is idle`
          + (starting > 0 ? ` (${starting} still starting: one more for each further queueDelay waited)` : '')
          + (paused > 0 ? ` (${paused} idle worker(s) take no job: paused intake)` : '');
      } else if (starting < s.queued && active < s.max) {
        recheckInMs = Math.ceil(step * (starting + 1) - s.oldestWaitMs);
      }
      // Past queueDelay, workers still starting pace the next start (or, as many as jobs
      // waiting, hold it back): with a slow boot the queue waited with nothing saying why.
      if (starting > 0 && s.oldestWaitMs >= step) pacedBy = serving.filter((w) => w.state === 'initializing').map((w) => w.id);
    }
  }
  if (desired < s.min) why = `workers.min is ${s.min}`;
  if (replacing > 0 && why) why += ` (replacing ${replacing} worker(s) of the old configuration, which finish their jobs and take no new one)`;
  if (refreshing > 0 && why) why += ` (replacing ${refreshing} recycled worker(s), which asked for it and take no new job)`;
  desired = Math.min(s.max, Math.max(s.min, desired));

  // A managed worker that asked to be recycled (refresh_worker) and still runs jobs keeps its
  // place under max: with concurrency above 1 every job it finishes asks again, and a
  // replacement per request would run past max. One replaced for a new configuration does not.
  // (An idle one is stopped below, in this same decision; it holds its place until it has
  // exited, as every worker being stopped does, one replaced for a new configuration apart.)
  const holding = exiting + live.filter((w) => w.refresh && w.managed).length;
  // One stopped for the init timeout stands for its own replacement until it has exited.
  const awaitingCrash = (s.exiting ?? []).filter((e) => e.initTimedOut && !e.replaced).length;
  let start = Math.max(0, Math.min(desired, s.max - holding) - active - awaitingCrash);
  let throttled = 0;
  if (start > 0 && s.backoff) start = 0;
  if (start > s.capacity) {
    throttled = start - Math.max(0, s.capacity);
    start = Math.max(0, s.capacity);
  }
  // Said only while the starting workers are what holds a start back: room left under max and
  // in the runtime after this decision's starts (with no GPU free, or max reached, a start that
  // came due could not happen either, and the line misled), not during a crash backoff (its
  // own line says it); no room in the runtime is said once a start comes due (throttled).
  const heldByStarting = pacedBy.length > 0 && !s.backoff && throttled === 0
    && s.max - holding - active - awaitingCrash - start > 0 && s.capacity - start > 0 ? pacedBy : [];

  // Scale down: managed workers that hold no job. Above max, starting ones go first (they serve
  // nobody yet), then idle ones, longest idle first; a recycled one goes whether idle or starting.
  const floor = s.scaling.type === 'REQUEST_COUNT' ? Math.max(s.min, desired) : s.min;
  // A recycled one whose only work left is jobs flashd ended (a /cancel, a timeout) goes too, at
  // once, not a lease later as `stuck`: it takes no job, and its handler's result is discarded.
  // One that asked (stopPod) with concurrency above 1 otherwise ran on, counted and holding its
  // place under max, until its handler returned or the lease passed.
  const candidates = [
    ...live.filter((w) => w.managed && w.state === 'initializing'),
    ...live.filter((w) => w.managed && w.state === 'idle').sort((a, b) => b.idleMs - a.idleMs),
    ...live.filter((w) => w.managed && w.recycle && w.state === 'running' && w.endedOnly !== undefined && !stuck.some((x) => x.id === w.id)),
  ];
  const stop: string[] = [];
  const stopReasons: Record<string, string> = {};
  const external = live.filter((w) => !w.managed).length;
  let remaining = active;
  for (const w of stuck) {
    const e = w.endedOnly as NonNullable<WorkerSnapshot['endedOnly']>;
    stop.push(w.id);
    stopReasons[w.id] = `it still runs job ${e.jobId} ${secs(e.endedMs)} s after flashd ended it (${e.why}), over --lease-ms (${secs(s.endedStopMs as number)} s)`;
    if (serving.some((x) => x.id === w.id)) remaining--;
  }
  for (const w of candidates) {
    if (w.recycle) {
      stop.push(w.id);
      // Which of the three: a user reading the log acts on each differently. Above max with no
      // external worker up, max was lowered; with one, it may have joined at max.
      stopReasons[w.id] = w.retired
        ? external > 0 ? `recycled: it was busy ${aboveMax(s.max, external)}` : `recycled: it was busy above a lowered workers.max (${s.max})`
        : w.refresh
          ? 'recycled: the worker asked for it (stopPod: refresh_worker, or a handler that exited)'
          : 'recycled: replaced for the endpoint\'s new configuration';
      if (w.endedOnly !== undefined) stopReasons[w.id] += `; it runs only job ${w.endedOnly.jobId}, which flashd ended (${w.endedOnly.why})`;
      continue;
    }
    const overMax = remaining > s.max;
    const expired = w.state === 'idle' && w.idleMs >= s.idleTimeoutMs && remaining > floor;
    if (overMax || expired) {
      stop.push(w.id);
      stopReasons[w.id] = overMax
        ? aboveMax(s.max, external)
        : s.scaling.type === 'REQUEST_COUNT'
          ? `idle for ${secs(w.idleMs)} s above the REQUEST_COUNT target of ${floor} worker(s) (grace ${secs(s.idleTimeoutMs)} s; idleTimeout does not apply)`
          : `idle for ${secs(w.idleMs)} s (idle timeout ${secs(s.idleTimeoutMs)} s)`;
      remaining--;
    }
  }
  // Still above max (lowered, or an external worker joined at it): busy managed workers are
  // retired, the last listed (the newest) first. They keep their places under max until they
  // have exited, as a worker that asked to be recycled does.
  const retire: string[] = [];
  const busy = serving.filter((w) => w.managed && w.state === 'running' && !stop.includes(w.id));
  for (let i = busy.length - 1; i >= 0 && remaining > s.max; i--) {
    retire.push((busy[i] as WorkerSnapshot).id);
    remaining--;
  }
  return { start, stop, retire, unretire, throttled, desired, startReason: start > 0 ? why : '', stopReasons, recheckInMs, heldByStarting };
}

/** An endpoint's crash loop: crashes in a row, the last one, and when starts may resume. */
export interface CrashState {
  streak: number;
  lastAt: number;
  backoffUntil: number;
}

/** A crash this long after the previous one (or after the last backoff ended) starts a new run. */
const CRASH_QUIET_MS = 60_000;
const CRASH_BACKOFF_MAX_MS = 60_000;

/**
 * Whether `mono` is still within an endpoint's crash run: at most CRASH_QUIET_MS after its last
 * crash or the end of its last backoff (a crash then counts in the streak; see afterCrash).
 */
export function inCrashRun(state: CrashState | undefined, mono: number): boolean {
  return state !== undefined && mono - Math.max(state.lastAt, state.backoffUntil) <= CRASH_QUIET_MS;
}

/**
 * The crash-loop state after a managed worker crashed at `mono` (monotonic ms), `ranMs` after it
 * started running: from the third crash in a row, no start for 2^(n-2) s (n = crashes in a row),
 * up to 60 s, where it stays while the crashes go on. Counting the crashes of a sliding minute
 * instead let the long waits push the early crashes out of it, so the wait fell from 32 s back
 * to 4 s and a loop restarted every few seconds for good. A worker that ran for CRASH_QUIET_MS
 * or more before it crashed is no part of a loop: it leaves the state as it was (the many
 * workers of a large endpoint, each crashing now and then, would otherwise make a streak that
 * never ends and renew a 60 s backoff at every crash, so no worker would ever be replaced).
 */
export function afterCrash(prev: CrashState | undefined, mono: number, ranMs = 0): CrashState | undefined {
  if (ranMs >= CRASH_QUIET_MS) return prev;
  const streak = prev && inCrashRun(prev, mono) ? prev.streak + 1 : 1;
  const backoffUntil = streak >= 3 ? mono + Math.min(CRASH_BACKOFF_MAX_MS, 1000 * 2 ** (streak - 2)) : 0;
  return { streak, lastAt: mono, backoffUntil };
}
