/**
 * The loop around `decideScale`: observe each QUEUE endpoint, decide, act through the runtime.
 * It runs every second and is woken by submits (coalesced per endpoint and event-loop turn),
 * so the first job to an idle endpoint starts a worker at once, and when a QUEUE_DELAY
 * endpoint's oldest job will have waited `queueDelay` × (1 + the workers still starting), so
 * its next worker starts then. One bad endpoint cannot stop the loop: each evaluation is
 * caught and logged.
 */
import { createHash } from 'node:crypto';
import type { AuthService } from '../auth/index.js';
import type { Clock } from '../core/clock.js';
import { newId } from '../core/ids.js';
import { sortedJson } from '../core/json-raw.js';
import type { Logger } from '../core/logger.js';
import { NO_COMMAND_REASON, hasNoCommand, hasNoImage, idleTimeoutApplies, noImageReason, type EndpointService, type EndpointSpec } from '../endpoints/index.js';
import { PAUSED_MS, SDK_DEFAULT_ENV, workerEnv, type JobQueue } from '../queue/index.js';
import type { ExitInfo, LaunchSpec, WorkerRuntime } from '../runtime/index.js';
import type { ResourceRow } from '../store/index.js';
import { aboveMax, afterCrash, decideScale, inCrashRun, secs, type CrashState, type ScaleDecision } from './decide.js';
import type { LogHub } from './log-hub.js';
import { CPU_ONLY_PLACEMENT, type Placement, type Reservation } from './placement.js';

export interface AutoscalerOptions {
  queue: JobQueue;
  endpoints: EndpointService;
  /** null: flashd launches nothing (external workers only). */
  runtime: WorkerRuntime | null;
  /** With no runtime: why (`--runtime none`, or no engine found), for the endpoint log. */
  noRuntimeReason?: string;
  auth: AuthService;
  logs: LogHub;
  clock: Clock;
  log: Logger;
  baseUrl(): string;
  pingIntervalMs: number;
  /** SIGTERM → SIGKILL grace when stopping a worker. */
  stopGraceMs?: number;
  /**
   * A managed worker that has not contacted flashd this long after the runtime started it is
   * stopped and counted as a crash (RunPod's RUNPOD_INIT_TIMEOUT; the endpoint's env may set
   * that, in s).
   */
  initTimeoutMs?: number;
  /** Idle grace for QUEUE endpoints scaling on REQUEST_COUNT, where idleTimeout does not apply. */
  requestCountIdleMs?: number;
  /** Device placement (GPUs); default: CPU endpoints only. */
  placement?: Placement;
  /** The plain registry credential for pulls, only handed to the runtime. */
  registryAuth?(ownerId: string, id: string): { username: string; password: string } | undefined;
}

interface Managed {
  endpointId: string;
  keyId: string;
  stopping: boolean;
  /** Stopped for not polling within the init timeout: its exit counts as a crash. */
  initTimedOut?: boolean;
  /** When the runtime reported it running (monotonic): the init timeout counts from there, not from an image pull. */
  runningSince?: number;
  /** When flashd began stopping it (monotonic): it holds its place under max until its exit, within bounds. */
  stoppingSince?: number;
  /**
   * Stopped for not calling within --lease-ms (hung whole, or gone unreported): it holds no place
   * under max while it exits, its GPUs apart, which stay reserved in placement until its exit.
   */
  unheard?: boolean;
  /** A kept worker whose container the runtime is restarting (FlashBoot), until the launch resolves. */
  restarting?: boolean;
}

const UNHEALTHY_SHOWN_MS = 60_000;
/** How long after a crash (or after the backoff it began) a start still names it as the crash it follows. */
const CRASH_NAMED_MS = 60_000;

/** A crashed worker a start has not replaced yet: how it ended, when (monotonic), and the backoff its crash began (0: none). */
interface CrashedWorker {
  workerId: string;
  how: string;
  at: number;
  backoffUntil: number;
}
const DEFAULT_INIT_TIMEOUT_MS = 7 * 60_000;
/**
 * Why the process runtime starts no worker for an endpoint whose command a key without admin
 * set (under a container runtime, before flashd was started with `--runtime process`).
 */
const HOST_COMMAND_NOT_ADMIN = 'its image, command or env was last set by a key without the "admin" scope, and the process runtime '
  + "runs commands on the host as flashd's user; a PATCH from an admin key that names image, args, entrypoint, cmd or env (the same values will do) "
  + 'lets it start, or run flashd with a container runtime';

/** How long past the stop grace a shutdown waits for the runtime to confirm its workers' exits. */
const DRAIN_SLACK_MS = 5000;

/** The init timeout of an endpoint: its env's RUNPOD_INIT_TIMEOUT (seconds) when valid, else the default. */
function initTimeoutOf(spec: EndpointSpec, fallbackMs: number): number {
  const raw = spec.env['RUNPOD_INIT_TIMEOUT'];
  const seconds = raw === undefined ? NaN : Number(raw);
  return Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : fallbackMs;
}

export class Autoscaler {
  readonly #o: AutoscalerOptions;
  readonly #managed = new Map<string, Managed>();
  /** Identities of workers a runtime kept for a fast restart (FlashBoot): workerId → key id. */
  readonly #kept = new Map<string, { endpointId: string; keyId: string }>();
  readonly #crashes = new Map<string, CrashState>();
  /**
   * Per endpoint: its crashed workers no start has replaced yet, oldest first (see #afterCrash):
   * the next start names one, so a start after a crash does not read as a plain cold start.
   */
  readonly #crashedUnreplaced = new Map<string, CrashedWorker[]>();
  readonly #unhealthy = new Map<string, { endpointId: string; until: number }>();
  /** Per endpoint: why no worker could start, as last logged (see #noteHeldBack). */
  readonly #heldBack = new Map<string, string>();
  /** Endpoints whose low-priority jobs wait with no worker up, as last logged (see #noteLowOnly). */
  readonly #lowOnly = new Set<string>();
  /** Endpoints whose jobs wait with workers.max 0 and no worker up, as last logged (see #noteNoMax). */
  readonly #noMax = new Set<string>();
  /** Endpoints whose jobs wait behind idle workers that take none, as last logged (see #notePaused). */
  readonly #paused = new Set<string>();
  /** Endpoints whose QUEUE_DELAY start is held back by workers still starting, as last logged (see #noteHeldByStarting). */
  readonly #heldByStarting = new Set<string>();
  readonly #dirty = new Set<string>();
  /** Per endpoint: a wake-up for when its oldest job will have waited `queueDelay` (decision.recheckInMs). */
  readonly #rechecks = new Map<string, { at: number; timer: NodeJS.Timeout }>();
  #scheduled = false;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  /** flashd is shutting down: workers it stops lose their jobs through no fault of the jobs. */
  #shuttingDown = false;

  readonly #placement: Placement;

  constructor(options: AutoscalerOptions) {
    this.#o = options;
    this.#placement = options.placement ?? CPU_ONLY_PLACEMENT;
  }

  start(): void {
    this.#timer = setInterval(() => this.tick(), 1000);
    this.#timer.unref();
    this.tick();
  }

  /**
   * How many of the endpoint's workers a `workers.max` of `max` would stop or retire now (the
   * over-max rule of decideScale): the serving workers past `max`, as far as flashd started them
   * (an external worker is never stopped). Not those already being stopped or replaced, nor
   * unhealthy ones. A PATCH reports `workers` as a restart reason only when this is above 0.
   */
  workersAboveMax(endpointId: string, max: number): number {
    if (this.#o.runtime === null) return 0;
    const registry = this.#o.queue.workers;
    const serving = registry.list(endpointId).filter((w) => !registry.silent(w) && !this.#managed.get(w.id)?.stopping
      && registry.state(w) !== 'unhealthy' && !(w.recycle && w.managed));
    return Math.max(0, Math.min(serving.length - max, serving.filter((w) => w.managed).length));
  }

  /** Wakes the loop for one endpoint (coalesced). */
  trigger(endpointId: string): void {
    if (this.#closed || this.#o.runtime === null) return;
    this.#dirty.add(endpointId);
    if (this.#scheduled) return;
    this.#scheduled = true;
    setImmediate(() => {
      this.#scheduled = false;
      const ids = [...this.#dirty];
      this.#dirty.clear();
      for (const id of ids) this.#evaluateSafely(id);
    });
  }

  tick(): void {
    if (this.#closed) return;
    const mono = this.#o.clock.monotonic();
    for (const [workerId, u] of this.#unhealthy) {
      if (mono >= u.until) {
        this.#unhealthy.delete(workerId);
        // Only the crashed incarnation: a kept worker restarted under the same id stays.
        if (this.#o.queue.workers.get(u.endpointId, workerId)?.phase === 'unhealthy') this.#o.queue.workers.remove(u.endpointId, workerId);
      }
    }
    for (const row of this.#o.endpoints.endpoints.listAll()) this.#evaluateSafely(row.id, row);
  }

  #evaluateSafely(endpointId: string, row?: ResourceRow<EndpointSpec>): void {
    try {
      this.#evaluate(endpointId, row ?? this.#o.endpoints.byId(endpointId));
    } catch (err) {
      this.#o.log.error('autoscaler evaluation failed', { endpointId, err });
    }
  }

  /** Observe → decide → act for one endpoint. */
  #evaluate(endpointId: string, row: ResourceRow<EndpointSpec> | undefined): ScaleDecision | undefined {
    if (!row || row.data.type !== 'QUEUE') return undefined;
    const spec = row.data;
    const mono = this.#o.clock.monotonic();
    const registry = this.#o.queue.workers;
    const load = this.#o.queue.load(endpointId);
    const crash = this.#crashes.get(endpointId);
    const initTimeoutMs = initTimeoutOf(spec, this.#o.initTimeoutMs ?? DEFAULT_INIT_TIMEOUT_MS);
    for (const w of registry.list(endpointId)) {
      const m = this.#managed.get(w.id);
      if (!m || m.stopping || m.runningSince === undefined || registry.state(w) !== 'initializing' || mono - m.runningSince < initTimeoutMs) continue;
      m.initTimedOut = true;
      void this.#stop(w.id, `it did not ask for a job within ${Math.round(initTimeoutMs / 1000)} s of starting (RUNPOD_INIT_TIMEOUT)`, false);
    }
    // One that holds nothing and has not called for a lease (WorkerRegistry.unheard: hung whole,
    // or its process died unreported) is stopped: left as it was, it passed for an idle worker,
    // the one `min` keeps, and the queue waited behind it for good.
    for (const w of registry.list(endpointId)) {
      const m = this.#managed.get(w.id);
      if (!m || m.stopping || !registry.unheard(w)) continue;
      m.unheard = true;
      void this.#stop(w.id, `it has not called for ${secs(registry.silentMs(w))} s, over --lease-ms (${secs(this.#o.queue.settings.leaseMs)} s): hung, or gone unreported`, false);
    }
    const listed = registry.list(endpointId);
    // The workers that count: answering, and not being stopped.
    const live = listed.filter((w) => !registry.silent(w) && !this.#managed.get(w.id)?.stopping);
    const blocked = this.#o.runtime?.runsOnHost && spec.commandByAdmin === false ? HOST_COMMAND_NOT_ADMIN
      : this.#o.runtime?.runsOnHost && hasNoCommand(spec) ? NO_COMMAND_REASON
      : this.#o.runtime && !this.#o.runtime.runsOnHost && hasNoImage(spec.image) ? noImageReason(this.#o.runtime.name)
      : spec.gpu ? (this.#o.runtime?.gpuBlocked?.() ?? null) : null;
    const runtimeRoom = this.#o.runtime && blocked === null ? this.#o.runtime.capacity(endpointId) : 0;
    const capacity = this.#o.runtime ? Math.min(runtimeRoom, this.#placement.capacity(endpointId, spec)) : 0;
    const decision = decideScale({
      min: spec.workers.min,
      max: spec.workers.max,
      idleTimeoutMs: idleTimeoutApplies(spec.type, spec.scaling) ? spec.workers.idleTimeout * 1000 : this.#o.requestCountIdleMs ?? 5000,
      scaling: spec.scaling,
      queued: load.queued,
      lowQueued: load.lowQueued,
      inProgress: load.inProgress,
      oldestWaitMs: load.oldestWaitMs,
      workers: live.map((w) => {
        const state = registry.state(w);
        const endedOnly = state === 'running' ? registry.endedOnly(w) : undefined;
        return {
          id: w.id, state, idleMs: mono - w.idleSince, managed: w.managed, recycle: w.recycle, refresh: w.refresh, retired: w.retired,
          paused: state === 'idle' && registry.paused(w),
          uncounted: state === 'running' && !this.#o.queue.runsCountedJob(w), returningMs: registry.returningMs(w), ...(endedOnly ? { endedOnly } : {}),
        };
      }),
      // A worker still running only jobs flashd ended a lease after it was told to stop them
      // holds its place under max for good (its heartbeat keeps pinging): it is stopped.
      endedStopMs: this.#o.queue.settings.leaseMs,
      // Every worker being stopped holds its place under max until it has exited (decideScale
      // leaves out one replaced for a new configuration): counting only those that asked to be
      // recycled or hit the init timeout, a job arriving while an idle-stopped worker exited
      // cold-started a second process beside it, past max.
      // Not past the stop grace and DRAIN_SLACK_MS, by which the runtime has killed it: an exit
      // never reported (an engine gone) must not hold the place for good.
      // Nor one stopped as unheard (hung whole, or gone unreported): it takes no job, and SIGTERM
      // does nothing to a hung process, so its replacement would wait the whole grace for the
      // SIGKILL. Its GPUs stay reserved until its exit: placement's capacity holds a GPU
      // endpoint's replacement back until then, or puts it on a free one.
      exiting: listed.filter((w) => {
        const m = this.#managed.get(w.id);
        return m?.stopping === true && m.unheard !== true && mono - (m.stoppingSince ?? mono) < this.#graceMs + DRAIN_SLACK_MS;
      }).map((w) => ({ id: w.id, replaced: w.recycle && !w.refresh, initTimedOut: this.#managed.get(w.id)?.initTimedOut === true })),
      capacity,
      backoff: crash !== undefined && mono < crash.backoffUntil,
    });
    registry.setThrottled(endpointId, decision.throttled);
    const noneUp = !live.some((w) => registry.state(w) !== 'unhealthy');
    // With no runtime, said only while no worker is up: beside busy external workers a backlog
    // is the usual case, not news.
    this.#noteHeldBack(endpointId, spec, decision.throttled > 0 && capacity <= 0 && (!!this.#o.runtime || noneUp), runtimeRoom, blocked);
    // With or without a runtime: workers.max 0 is the setting for external workers, and the
    // last one gone leaves the jobs waiting (trigger() does nothing without a runtime; the 1 s
    // tick says it then).
    this.#noteNoMax(endpointId, spec.workers.max === 0 && load.queued + load.lowQueued > 0 && noneUp, load.queued + load.lowQueued);
    // Jobs wait, every idle worker up takes none (paused), and no worker starts for them (max
    // reached, no runtime): /health shows idle workers and a queue that does not move.
    const idleUp = load.queued > 0 && decision.start === 0 ? live.filter((w) => !w.draining && registry.state(w) === 'idle') : [];
    const paused = idleUp.filter((w) => registry.paused(w));
    this.#notePaused(endpointId, paused.length > 0 && paused.length === idleUp.length && load.oldestWaitMs >= PAUSED_MS
      && !live.some((w) => registry.state(w) === 'initializing'), paused.map((w) => w.id), load.queued);
    // Not while its workers crash (within a minute of the last crash): each restart would say it
    // again, beside the crash lines that tell why the jobs wait.
    this.#noteHeldByStarting(endpointId, inCrashRun(crash, mono) ? [] : decision.heldByStarting, spec.scaling.type === 'QUEUE_DELAY' ? spec.scaling.queueDelay : 0, load.queued);
    this.#noteLowOnly(endpointId, !!this.#o.runtime && spec.workers.max > 0 && load.queued === 0 && load.lowQueued > 0 && decision.start === 0
      && noneUp, load.lowQueued);
    if (decision.recheckInMs > 0) this.#recheckIn(endpointId, decision.recheckInMs);
    // A crash backoff holds starts back: decide again when it ends, not at the next 1 s tick
    // after (armed at every decision during it, so an earlier wake-up that finds the backoff
    // still on does not lose this one).
    if (crash !== undefined && mono < crash.backoffUntil) this.#recheckIn(endpointId, crash.backoffUntil - mono);
    // Stops first: a recycled worker's stop is logged before the start of its replacement.
    // (A stopped worker is kept for FlashBoot only once it has exited: no launch here reuses it.)
    for (const id of decision.stop) {
      const w = registry.get(endpointId, id);
      // Recycled: not kept for a FlashBoot restart. One replaced for a new configuration runs the
      // old one; one that asked for it (refresh_worker, stopPod) is to come back clean, and a
      // restart would hand the next job its container as it left it. Nor one stopped while
      // running (a handler that never returned from a job flashd ended), as an unheard one is not.
      void this.#stop(id, decision.stopReasons[id] ?? 'scaled down', w?.recycle !== true && (w === undefined || registry.state(w) !== 'running'));
    }
    for (let i = 0; i < decision.start; i++) this.#launch(row, decision.startReason);
    for (const id of decision.unretire) {
      this.#o.queue.unretire(endpointId, id);
      this.#o.logs.append(endpointId, id, 'system', `worker ${id} fits under workers.max (${spec.workers.max}) again: it takes jobs again`);
      this.#o.log.info('worker no longer retiring', { endpointId, workerId: id, max: spec.workers.max });
    }
    // External workers count toward max: one that joins at max retires a worker flashd started.
    const external = decision.retire.length ? live.filter((w) => !w.managed && registry.state(w) !== 'unhealthy').length : 0;
    for (const id of decision.retire) {
      this.#o.queue.retireAboveMax(endpointId, id);
      this.#o.logs.append(endpointId, id, 'system', `worker ${id} is ${aboveMax(spec.workers.max, external)}: it finishes its jobs, takes no new one and stops`);
      this.#o.log.info('worker retiring', { endpointId, workerId: id, max: spec.workers.max, externalWorkers: external || undefined });
    }
    this.#trimUnhealthy(endpointId, spec.workers.max);
    return decision;
  }

  /**
   * A crashed worker shows `unhealthy` for UNHEALTHY_SHOWN_MS or until a new worker takes its
   * place, whichever comes first: the workers shown (crashed ones included) never outnumber
   * workers.max, as on RunPod, where a worker that fails is restarted in its place. Without this
   * a crash loop piled up one unhealthy worker per crash of the last minute (7 with max 1).
   * The oldest crashes go first.
   */
  #trimUnhealthy(endpointId: string, max: number): void {
    const registry = this.#o.queue.workers;
    let over = registry.list(endpointId).filter((w) => !registry.silent(w)).length - max;
    if (over <= 0) return;
    for (const [workerId, u] of this.#unhealthy) {
      if (over <= 0) break;
      if (u.endpointId !== endpointId || registry.get(endpointId, workerId)?.phase !== 'unhealthy') continue;
      this.#unhealthy.delete(workerId);
      registry.remove(endpointId, workerId);
      over--;
    }
  }

  /**
   * Decides again for this endpoint in `ms` (QUEUE_DELAY: when its oldest job will have waited
   * `queueDelay`, one more for each worker still starting; a crash backoff: when it ends), so the start comes then and not up to a tick
   * later. One wake-up per endpoint, the earliest asked for.
   */
  #recheckIn(endpointId: string, ms: number): void {
    const at = this.#o.clock.monotonic() + ms;
    const pending = this.#rechecks.get(endpointId);
    if (pending && pending.at <= at) return;
    if (pending) clearTimeout(pending.timer);
    const timer = setTimeout(() => {
      this.#rechecks.delete(endpointId);
      this.trigger(endpointId);
    }, ms);
    timer.unref();
    this.#rechecks.set(endpointId, { at, timer });
  }

  #clearRechecks(endpointId?: string): void {
    for (const [id, r] of this.#rechecks) {
      if (endpointId !== undefined && id !== endpointId) continue;
      clearTimeout(r.timer);
      this.#rechecks.delete(id);
    }
  }

  /**
   * The launch description of one worker of an endpoint (identity apart). Its CPU and memory
   * limits are those of the `cpu` entry placement reserved (the first that fits, which need not
   * be the first), and so is the config hash: a kept FlashBoot container of another entry's
   * limits is not restarted for this placement.
   */
  #launchSpec(row: ResourceRow<EndpointSpec>, workerId: string, env: Record<string, string>, placed: Reservation): LaunchSpec {
    const spec = row.data;
    const { gpuDeviceIds } = placed;
    const cpu = placed.cpu ? { vcpuCount: placed.cpu.vcpuCount, memoryGb: Math.max(1, Math.round(placed.cpu.memoryGb)) } : null;
    const volume = spec.mounts.network[0] !== undefined
      ? { kind: 'network' as const, id: spec.mounts.network[0] }
      : spec.mounts.global[0] !== undefined ? { kind: 'global' as const, id: spec.mounts.global[0] } : null;
    const auth = spec.registry ? this.#o.registryAuth?.(row.ownerId, spec.registry) : undefined;
    const registryAuth = auth ? { ...auth, serveraddress: spec.image.includes('/') && /[.:]/.test(spec.image.split('/')[0] as string) ? (spec.image.split('/')[0] as string) : 'docker.io' } : null;
    const identity = { image: spec.image, entrypoint: spec.entrypoint, cmd: spec.cmd, env: spec.env, ports: spec.ports, disk: spec.disk, volume, gpuDeviceIds, cpu, registry: spec.registry, flashboot: spec.flashboot };
    return {
      endpointId: row.id, workerId, entrypoint: spec.entrypoint, cmd: spec.cmd, image: spec.image, env, ports: spec.ports,
      diskGb: spec.disk, volume, gpuDeviceIds, cpu, registryAuth, flashboot: spec.flashboot,
      configHash: createHash('sha256').update(sortedJson(identity)).digest('hex'),
    };
  }

  /**
   * Starts one worker. With FlashBoot the runtime may restart a kept worker instead of creating
   * one: asked first (`keptWorker`), so the start is said, counted and filed under the id that
   * runs. A fresh identity is made either way, for a new container (also when the kept one
   * cannot be restarted and the runtime creates one in its place).
   */
  #launch(row: ResourceRow<EndpointSpec>, reason: string): void {
    const runtime = this.#o.runtime;
    if (!runtime) return;
    const spec = row.data;
    const endpointId = row.id;
    const freshId = newId('wkr');
    const placed = this.#placement.reserve(endpointId, freshId, spec);
    if (!placed) return;
    const { row: keyRow, key } = this.#o.auth.createManagedWorkerKey(endpointId, freshId);
    const env = {
      ...SDK_DEFAULT_ENV,
      // stdout is a pipe to the log here: Python would block-buffer a handler's print() until
      // the job (or the worker) ended, as `ENV PYTHONUNBUFFERED=1` in RunPod's templates avoids.
      PYTHONUNBUFFERED: '1',
      ...spec.env,
      ...workerEnv({ baseUrl: this.#o.baseUrl(), endpointId, workerId: freshId, key, gpu: placed.gpuName, pingIntervalMs: this.#o.pingIntervalMs }),
      // As on RunPod's machines (multi-GPU servers size tensor parallelism by it): the GPUs this
      // worker was given, 0 for a CPU worker; after the endpoint env, like the GPU list itself.
      RUNPOD_GPU_COUNT: String(placed.gpuDeviceIds.length),
    };
    const launchSpec = this.#launchSpec(row, freshId, env, placed);
    // FlashBoot: the kept worker this launch restarts, with its own identity.
    const keptId = runtime.keptWorker?.(endpointId, launchSpec.configHash) ?? null;
    const kept = keptId !== null ? this.#kept.get(keptId) : undefined;
    // The id events are filed under: the kept worker's or the fresh one, until the runtime says otherwise.
    const ref = { id: freshId };
    if (keptId !== null && kept !== undefined) {
      ref.id = keptId;
      this.#kept.delete(keptId);
      // Before the container starts: its first ping or job-take may come at once.
      this.#o.auth.resumeKey(kept.keyId);
      this.#placement.release(freshId);
      this.#placement.reserve(endpointId, keptId, spec);
      this.#unhealthy.delete(keptId);
    }
    const restarting = ref.id !== freshId;
    this.#o.queue.workers.launched(endpointId, ref.id);
    this.#managed.set(ref.id, { endpointId, keyId: kept?.keyId ?? keyRow.id, stopping: false, ...(restarting ? { restarting: true } : {}) });
    const how = restarting ? ': its kept container restarts (FlashBoot)' : '';
    const crashed = this.#afterCrash(endpointId);
    const after = crashed === undefined ? ''
      : ` (after ${crashed.backoff ? 'the crash backoff: ' : ''}worker ${crashed.workerId} ${crashed.how})`;
    this.#o.logs.append(endpointId, ref.id, 'system', `starting worker ${ref.id} (${runtime.name} runtime): ${reason}${after}${how}`);
    this.#o.log.info('worker starting', { endpointId, workerId: ref.id, runtime: runtime.name, reason, ...(crashed ? { afterCrashOf: crashed.workerId } : {}), ...(restarting ? { flashboot: true } : {}) });
    runtime
      .launch(launchSpec, {
        log: (stream, line) => this.#o.logs.append(endpointId, ref.id, stream, line),
        exit: (info) => this.#exited(endpointId, ref.id, info),
        discarded: () => this.#discard(ref.id),
      })
      .then(
        (result) => {
          const runningSince = this.#o.clock.monotonic();
          const announced = ref.id;
          const m = this.#managed.get(announced);
          if (m) {
            m.runningSince = runningSince;
            delete m.restarting;
          }
          if (result.workerId === announced) {
            // The fresh identity went unused: the kept worker runs with its own.
            if (restarting) this.#o.auth.revokeKeyById(keyRow.id);
            // Stopped while it was restarting (the endpoint deleted, a scale-down, shutdown): the
            // runtime had nothing running under this id to stop yet.
            if (restarting && (m?.stopping || this.#closed || !this.#o.endpoints.byId(endpointId))) {
              if (m && !m.stopping) void this.#stop(announced, 'stopped while it was restarting', false);
              else void runtime.stop(announced, this.#graceMs, { keep: false });
            }
            return;
          }
          // Another worker than the one said runs: a kept one the runtime found only after
          // reconnecting to its engine, or a new container where the kept one announced could
          // not be restarted (its identity is gone with it).
          const replace = this.#o.queue.workers.get(endpointId, announced)?.recycle === true;
          const reused = result.reused ? this.#kept.get(result.workerId) : undefined;
          if (reused) {
            this.#kept.delete(result.workerId);
            this.#o.auth.resumeKey(reused.keyId);
          }
          // What runs keeps its key (a reused worker's own, a new container's fresh one); every
          // other key of this start (the announced worker's, the unused fresh one) goes.
          const runningKey = result.reused ? reused?.keyId : keyRow.id;
          for (const k of new Set([m?.keyId ?? keyRow.id, keyRow.id])) if (k !== runningKey) this.#o.auth.revokeKeyById(k);
          this.#managed.delete(announced);
          this.#o.queue.workers.remove(endpointId, announced);
          this.#placement.release(announced);
          this.#placement.reserve(endpointId, result.workerId, spec);
          ref.id = result.workerId;
          this.#managed.set(result.workerId, { endpointId, keyId: runningKey ?? keyRow.id, stopping: false, runningSince });
          this.#unhealthy.delete(result.workerId);
          this.#o.queue.workers.launched(endpointId, result.workerId);
          this.#o.logs.append(endpointId, result.workerId, 'system', result.reused
            ? `restarted kept worker ${result.workerId} (FlashBoot) instead of starting ${announced}`
            : `starting worker ${result.workerId} instead: the kept worker ${announced} could not be restarted`);
          // A PATCH that landed during the restart marked the announced record; the one running inherits it.
          if (replace) this.#o.queue.recycling(endpointId, result.workerId);
          if (m?.stopping || this.#closed || !this.#o.endpoints.byId(endpointId)) void this.#stop(result.workerId, 'stopped while it was starting', false);
        },
        (err: Error) => {
          // The fresh identity of a kept worker's restart that failed was never used.
          if (restarting) this.#o.auth.revokeKeyById(keyRow.id);
          // A runtime left without room by the failure (its container engine went away, or it is
          // shutting down) failed for want of capacity, not because of the endpoint: that is no
          // crash (no unhealthy worker, no backoff); the jobs wait throttled until it is back.
          const noRoom = this.#o.runtime?.capacity(endpointId) === 0;
          // Stopped before it ran (its endpoint deleted, a PATCH, a scale-down during an image
          // pull): the runtime gave the launch up, as asked; no crash either.
          const stopped = this.#managed.get(ref.id)?.stopping === true;
          this.#exited(endpointId, ref.id, { code: null, signal: null, requested: noRoom || stopped }, err.message);
        },
      );
  }

  /**
   * Says once, in the endpoint log and flashd's, why jobs wait with no worker able to start (no
   * GPU of an allowed type, the host's CUDA too old, too few GPUs, all of them held, the engine
   * unreachable), and again only when the reason changes: without it an endpoint whose GPUs
   * cannot be placed only showed `throttled` in /health.
   */
  #noteHeldBack(endpointId: string, spec: EndpointSpec, heldBack: boolean, runtimeRoom: number, blocked: string | null): void {
    const runtime = this.#o.runtime;
    const reason = !heldBack ? undefined
      : !runtime ? `flashd starts no workers (${this.#o.noRuntimeReason ?? '--runtime none'}); start one yourself with \`flashd worker-env ${endpointId}\``
      : blocked !== null ? blocked
      : runtimeRoom <= 0 ? `the ${runtime.name} runtime has no room (is the container engine reachable? see flashd's log)`
      : (this.#placement.whyNot(endpointId, spec) ?? undefined);
    if (reason === this.#heldBack.get(endpointId)) return;
    if (reason === undefined) {
      this.#heldBack.delete(endpointId);
      return;
    }
    this.#heldBack.set(endpointId, reason);
    this.#o.logs.append(endpointId, null, 'system', `no worker can start: ${reason}; jobs wait in the queue (throttled)`);
    this.#o.log.warn('worker start held back', { endpointId, reason });
  }

  /**
   * Says once, in the endpoint log, that low-priority jobs wait with no worker up: they never
   * start one (policy.lowPriority, as on RunPod), so with workers.min 0 they wait for a normal
   * job or their TTL, which /health and /status alone do not explain. Only where flashd starts
   * workers: without a runtime every job waits for an external worker alike.
   */
  #noteLowOnly(endpointId: string, waiting: boolean, count: number): void {
    this.#sayOnce(this.#lowOnly, endpointId, waiting, () => {
      // No count: the line is said once while they wait, and more may come after it (flashd's
      // own log has the count at that moment).
      this.#o.logs.append(endpointId, null, 'system', 'low-priority jobs wait with no worker up: policy.lowPriority never starts a worker; they run once workers.min or a job without lowPriority brings one up, or expire at their policy.ttl');
      this.#o.log.info('low-priority jobs wait with no worker up', { endpointId, lowQueued: count });
    });
  }

  /**
   * Says once, in the endpoint log and flashd's, that jobs wait with no worker up because
   * workers.max is 0: flashd starts none for them (the setting for external workers only), and
   * without this line /health showed only a queue that never moved and the log nothing at all.
   * With no runtime too (`--runtime none`, the usual setup for external workers).
   */
  #noteNoMax(endpointId: string, waiting: boolean, count: number): void {
    this.#sayOnce(this.#noMax, endpointId, waiting, () => {
      // No count, as for #noteLowOnly's line.
      this.#o.logs.append(endpointId, null, 'system', 'jobs wait with no worker up: workers.max is 0, so flashd starts no worker; they run on a worker you start yourself (worker-env) or once workers.max is raised, or expire at their policy.ttl');
      this.#o.log.warn('jobs wait with workers.max 0 and no worker up', { endpointId, queued: count });
    });
  }

  /**
   * Says once, in the endpoint log and flashd's, that jobs wait while every idle worker up takes
   * none (no job-take open for over PAUSED_MS: its SDK's concurrency_modifier returned 0) and no
   * worker starts for them: /health counts those workers idle and the queue does not move. Where
   * workers.max leaves room a QUEUE_DELAY endpoint starts one beside them, and that start says why.
   */
  #notePaused(endpointId: string, waiting: boolean, workerIds: readonly string[], count: number): void {
    this.#sayOnce(this.#paused, endpointId, waiting, () => {
      this.#o.logs.append(endpointId, null, 'system', `jobs wait while ${workerIds.length} idle worker(s) take none (${workerIds.join(', ')}): they hold no job and have had no job-take open`
        + ` for over ${PAUSED_MS / 1000} s (the SDK's concurrency_modifier returned 0: intake paused), and no worker starts for the jobs (workers.max reached, or no runtime)`);
      this.#o.log.warn('jobs wait while idle workers take none', { endpointId, queued: count, workerIds: workerIds.join(',') });
    });
  }

  /**
   * Says once, in the endpoint log and flashd's, that jobs have waited past queueDelay while
   * workers are still starting and they hold a start back: QUEUE_DELAY adds one more for each
   * further queueDelay the oldest job waits while others start, never more starting than jobs
   * waiting, so with a slow boot (a model loading) /health shows workers initializing, a queue
   * and room under max, and the next start comes after queueDelay. Again for the next such wait.
   */
  #noteHeldByStarting(endpointId: string, workerIds: readonly string[], queueDelay: number, count: number): void {
    this.#sayOnce(this.#heldByStarting, endpointId, workerIds.length > 0, () => {
      const who = workerIds.length === 1 ? `worker ${workerIds[0]} is` : `workers ${workerIds.join(', ')} are`;
      this.#o.logs.append(endpointId, null, 'system', `jobs have waited over queueDelay (${queueDelay} s) while ${who} still starting: QUEUE_DELAY starts one more worker for each further ${queueDelay} s the oldest job waits while workers start, and no more starting than jobs waiting`);
      this.#o.log.info('QUEUE_DELAY start held by a starting worker', { endpointId, queued: count, workerIds: workerIds.join(',') });
    });
  }

  /**
   * The crashed worker a start now replaces (the oldest no start has replaced), taken off the
   * list, and whether a crash backoff held the start back; undefined when none crashed within
   * CRASH_NAMED_MS (of its crash, or of the end of the backoff it began): a start minutes later
   * is a plain one.
   */
  #afterCrash(endpointId: string): { workerId: string; how: string; backoff: boolean } | undefined {
    const list = this.#freshCrashes(endpointId);
    const next = list.shift();
    if (list.length === 0) this.#crashedUnreplaced.delete(endpointId);
    // A backoff begun by any crash still unreplaced held this start back (max above 1: not only the last one's).
    return next && { workerId: next.workerId, how: next.how, backoff: [next, ...list].some((c) => c.backoffUntil > 0) };
  }

  /** The endpoint's crashed workers no start has replaced, those older than CRASH_NAMED_MS dropped. */
  #freshCrashes(endpointId: string): CrashedWorker[] {
    const mono = this.#o.clock.monotonic();
    const list = (this.#crashedUnreplaced.get(endpointId) ?? []).filter((c) => mono - Math.max(c.at, c.backoffUntil) <= CRASH_NAMED_MS);
    this.#crashedUnreplaced.set(endpointId, list);
    return list;
  }

  /** Runs `say` when `waiting` becomes true for an endpoint, not again until it has been false (`said` holds those said). */
  #sayOnce(said: Set<string>, endpointId: string, waiting: boolean, say: () => void): void {
    if (!waiting) {
      said.delete(endpointId);
      return;
    }
    if (said.has(endpointId)) return;
    said.add(endpointId);
    say();
  }


  /** A kept worker is gone for good: its key goes too. */
  #discard(workerId: string): void {
    // Its restart failed (the runtime creates a new container in its place): the key goes now.
    const m = this.#managed.get(workerId);
    if (m?.restarting) this.#revoke(m.keyId);
    const kept = this.#kept.get(workerId);
    if (!kept) return;
    this.#kept.delete(workerId);
    this.#revoke(kept.keyId);
  }

  /**
   * Revokes a managed worker's key. Once flashd is stopping, its store may be closed before a
   * container removal the engine was slow to answer (an endpoint deleted just before the stop)
   * ends: the key is then left to the next start, which revokes every managed key still valid
   * (revokeLeftoverManagedKeys); a deleted endpoint's keys were revoked by the delete itself.
   */
  #revoke(keyId: string): void {
    try {
      this.#o.auth.revokeKeyById(keyId);
    } catch (err) {
      if (!this.#closed) throw err;
    }
  }

  /** `startError`: it never ran, the runtime could not start it (a bad command, a failed pull). */
  #exited(endpointId: string, workerId: string, info: ExitInfo, startError?: string): void {
    const managed = this.#managed.get(workerId);
    this.#managed.delete(workerId);
    this.#placement.release(workerId);
    if (managed && info.kept) {
      // Stopped and kept: its key, in the container's env, stays the same, but refuses every
      // request (a ping would show an idle worker that is not running) until the restart.
      this.#kept.set(workerId, { endpointId, keyId: managed.keyId });
      this.#o.auth.suspendKey(managed.keyId);
    }
    else if (managed) this.#o.auth.revokeKeyById(managed.keyId);
    const worker = this.#o.queue.workers.get(endpointId, workerId);
    const initTimedOut = managed?.initTimedOut === true;
    const crashed = initTimedOut || (!info.requested && !(worker?.recycle && info.code === 0));
    const how = info.signal ? `signal ${info.signal}` : `code ${info.code ?? '?'}`;
    // A job cut short by flashd's own shutdown goes back without using one of its attempts (a
    // worker that dies by itself meanwhile still uses one).
    // Stopped by flashd while its launch was still under way (an image pull): it never ran.
    const stoppedEarly = startError !== undefined && managed?.stopping === true;
    const gone = startError === undefined ? `exited (${how})` : stoppedEarly ? 'stopped before it started' : 'failed to start';
    const charged = !(this.#shuttingDown && info.requested);
    const held = this.#o.queue.workerGone(endpointId, workerId, `worker ${workerId} ${gone}`, charged);
    // One line per end, saying why: one that never ran has no exit code to show.
    if (stoppedEarly) {
      this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} stopped before it started: ${startError}`);
      this.#o.log.info('worker stopped before it started', { endpointId, workerId, reason: startError });
    } else if (startError !== undefined) {
      this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} failed to start: ${startError}`);
      this.#o.log.warn('worker failed to start', { endpointId, workerId, reason: startError });
    } else if (crashed) {
      if (initTimedOut) {
        // flashd stopped it itself: not "unexpected", but a crash all the same.
        this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} stopped (${how}): it never asked for a job`);
        this.#o.log.warn('worker stopped: it never asked for a job', { endpointId, workerId, code: info.code, signal: info.signal });
      } else {
        // One that never asked for a job did not crash on one: its command ended (or failed) as it
        // started. A clean exit of its own then is most likely no worker at all (a handler file
        // that never calls runpod.serverless.start), which a bare `(code 0)` did not tell.
        const neverAsked = worker !== undefined && !worker.asked;
        const before = !neverAsked ? ''
          : info.code === 0 && !info.signal
            ? " before it ever asked for a job: a worker's command runs until it is stopped (does it call runpod.serverless.start?)"
            : ' before it ever asked for a job';
        this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} exited unexpectedly (${how})${before}`);
        this.#o.log.warn('worker exited unexpectedly', { endpointId, workerId, code: info.code, signal: info.signal, ...(neverAsked ? { neverAsked: true } : {}) });
      }
    } else {
      this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} stopped (${how})`);
    }
    // What became of the jobs it held, after its end: flashd's log says `job requeued`, and the
    // endpoint log, which said the stop and the kill, must not leave the job's fate out.
    for (const { jobId, requeued } of held) {
      const line = !requeued ? `job ${jobId} failed: worker ${workerId} ${gone} and it was the job's last attempt`
        : charged ? `job ${jobId} went back to the queue: worker ${workerId} ${gone}`
        : `job ${jobId} went back to the queue: its worker ${workerId} was stopped with flashd (${how}); it runs again after the restart, without using an attempt`;
      this.#o.logs.append(endpointId, workerId, 'system', line);
    }
    if (crashed) {
      this.#o.queue.workers.markUnhealthy(endpointId, workerId);
      const mono = this.#o.clock.monotonic();
      this.#unhealthy.set(workerId, { endpointId, until: mono + UNHEALTHY_SHOWN_MS });
      // Crash loop: from the third crash in a row, back off 2^(n-2) s, up to 60 s (a worker
      // that had run for a minute does not count).
      const ranMs = initTimedOut || managed?.runningSince === undefined ? 0 : mono - managed.runningSince;
      const crashes = afterCrash(this.#crashes.get(endpointId), mono, ranMs);
      if (crashes) this.#crashes.set(endpointId, crashes);
      // For the start that replaces it: `cold start` alone read as if the endpoint had been idle.
      const ended = startError !== undefined ? 'failed to start'
        : initTimedOut ? 'was stopped: it never asked for a job'
        : info.signal ? `exited on signal ${info.signal}` : `exited with code ${info.code ?? '?'}`;
      const list = this.#freshCrashes(endpointId);
      list.push({ workerId, how: ended, at: mono, backoffUntil: crashes && crashes.backoffUntil > mono ? crashes.backoffUntil : 0 });
      this.#crashedUnreplaced.set(endpointId, list);
      if (crashes && crashes.backoffUntil > mono) {
        const waitS = Math.round((crashes.backoffUntil - mono) / 1000);
        this.#o.logs.append(endpointId, workerId, 'system', `${crashes.streak} workers crashed in a row: no new worker for ${waitS} s (crash backoff)`);
        this.#o.log.warn('crash backoff', { endpointId, crashes: crashes.streak, waitS });
      }
    } else {
      this.#o.queue.workers.remove(endpointId, workerId);
    }
    // The capacity it held is free again: endpoints waiting for it go first, not on the next tick.
    for (const waiting of this.#o.queue.workers.throttledEndpoints()) this.trigger(waiting);
    this.trigger(endpointId);
  }

  /** `keep: false`: never kept for a FlashBoot restart (unhealthy, its endpoint deleted, shutdown). */
  async #stop(workerId: string, why: string, keep = true): Promise<void> {
    const m = this.#managed.get(workerId);
    if (!m || m.stopping || !this.#o.runtime) return;
    m.stopping = true;
    m.stoppingSince = this.#o.clock.monotonic();
    this.#o.logs.append(m.endpointId, workerId, 'system', `stopping worker ${workerId}: ${why}`);
    this.#o.log.info('worker stopping', { endpointId: m.endpointId, workerId, reason: why });
    this.#o.queue.stopping(m.endpointId, workerId);
    await this.#o.runtime.stop(workerId, this.#graceMs, keep ? {} : { keep: false });
  }

  get #graceMs(): number {
    return this.#o.stopGraceMs ?? 10_000;
  }

  /**
   * Stops a worker and never keeps it (its endpoint deleted, shutdown). One already being
   * stopped (a scale-down, which may keep it) is told again, so it is not kept.
   */
  #stopForGood(workerId: string, m: Managed, why: string): Promise<void> | undefined {
    return m.stopping ? this.#o.runtime?.stop(workerId, this.#graceMs, { keep: false }) : this.#stop(workerId, why, false);
  }

  /**
   * Configuration changed. When running workers cannot pick the change up (`restart`: the PATCH
   * reply's restartReasons, e.g. a new image or env), managed workers are replaced as they become
   * idle; otherwise (a name, the scaler, min/max) they stay, and the next decision applies it.
   */
  endpointChanged(endpointId: string, restart: boolean, reasons: readonly string[] = []): void {
    if (restart) {
      // The crashes were of the old configuration: the new one starts without their backoff.
      this.#crashes.delete(endpointId);
      this.#crashedUnreplaced.delete(endpointId);
      const what = reasons.filter((r) => r !== 'workers').join(', ');
      const registry = this.#o.queue.workers;
      const external: string[] = [];
      for (const w of registry.list(endpointId)) {
        if (!w.managed) {
          // Up: not gone quiet, its key not revoked, not exiting after a stopPod.
          if (!registry.silent(w) && !w.draining) external.push(w.id);
          continue;
        }
        const m = this.#managed.get(w.id);
        // A busy one is said at the change (its stop comes only when its jobs are done); an idle
        // or starting one stops at once, with its own line.
        if (m && !m.stopping && !(w.recycle && !w.refresh) && registry.state(w) === 'running') {
          this.#o.logs.append(endpointId, w.id, 'system', `worker ${w.id} runs the endpoint's old configuration${what ? ` (changed: ${what})` : ''}: it finishes its jobs, takes no new one and is replaced`);
        }
        this.#o.queue.recycling(endpointId, w.id);
      }
      if (external.length > 0) {
        // flashd cannot restart a worker it did not start: without this the PATCH's
        // restartRequired read as a finished rollout while jobs kept going to those workers.
        this.#o.logs.append(endpointId, null, 'system', `${external.length} external worker(s) (worker-env) still run the endpoint's old configuration${what ? ` (changed: ${what})` : ''}`
          + ` and take its jobs: ${external.join(', ')}; flashd cannot restart workers it did not start, so whoever runs them must restart them on the new configuration`);
        this.#o.log.warn('external workers run the old configuration', { endpointId, externalWorkers: external.length, changed: what || undefined, workerIds: external.join(',') });
      }
      // Workers kept for a FlashBoot restart run the old configuration, with live keys: gone now
      // rather than at the next launch or when their time runs out. One being stopped now (a
      // scale-down, which may keep it) is told again, so it is not kept once it exits.
      void this.#o.runtime?.discardEndpoint?.(endpointId, 'configuration changed');
      for (const [id, m] of this.#managed) if (m.endpointId === endpointId && m.stopping) void this.#o.runtime?.stop(id, this.#graceMs, { keep: false });
    }
    this.trigger(endpointId);
  }

  /** The endpoint is being deleted: stop its workers now. */
  async dropEndpoint(endpointId: string): Promise<void> {
    this.#clearRechecks(endpointId);
    this.#heldBack.delete(endpointId);
    this.#lowOnly.delete(endpointId);
    this.#noMax.delete(endpointId);
    this.#paused.delete(endpointId);
    this.#heldByStarting.delete(endpointId);
    this.#crashedUnreplaced.delete(endpointId);
    const ours = [...this.#managed].filter(([, m]) => m.endpointId === endpointId);
    await Promise.all(ours.map(([id, m]) => this.#stopForGood(id, m, 'endpoint deleted')));
    await this.#o.runtime?.discardEndpoint?.(endpointId);
    for (const [id, k] of this.#kept) if (k.endpointId === endpointId) this.#discard(id);
  }

  /**
   * flashd is stopping: nothing new starts, and every managed worker is told to stop (SIGTERM,
   * SIGKILL after the grace) while the API is still up, so a job that finishes within the
   * grace posts its result instead of running again after the restart. Resolves when they are
   * all gone. A job whose worker is killed goes back to the queue without using an attempt.
   */
  async drain(): Promise<void> {
    this.#closed = true;
    this.#shuttingDown = true;
    if (this.#timer) clearInterval(this.#timer);
    this.#clearRechecks();
    if (!this.#o.runtime || this.#managed.size === 0) return;
    const graceMs = this.#graceMs;
    this.#o.log.info('stopping workers', { count: this.#managed.size, graceMs });
    // Workers already stopping (scale-down) are waited for by the runtime's own stop.
    const stopped = Promise.all([...this.#managed].map(([id, m]) => this.#stopForGood(id, m, 'flashd is stopping')));
    // A runtime that cannot confirm the exits (an engine gone away) must not hold the shutdown:
    // close() then ends what is left.
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), graceMs + DRAIN_SLACK_MS)));
    const outcome = await Promise.race([stopped.then(() => 'done' as const), deadline]);
    clearTimeout(timer);
    if (outcome === 'late') this.#o.log.warn('workers did not confirm their exit in time; closing the runtime', { graceMs });
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#shuttingDown = true;
    if (this.#timer) clearInterval(this.#timer);
    this.#clearRechecks();
    await this.#o.runtime?.close();
  }
}
