/**
 * The loop around `decideScale`: observe each QUEUE endpoint, decide, act through the runtime.
 * It runs every second and is woken by submits (coalesced per endpoint and event-loop turn),
 * so the first job to an idle endpoint starts a worker at once. One bad endpoint cannot stop
 * the loop: each evaluation is caught and logged.
 */
import type { AuthService } from '../auth/index.js';
import type { Clock } from '../core/clock.js';
import { newId } from '../core/ids.js';
import type { Logger } from '../core/logger.js';
import { idleTimeoutApplies, type EndpointService, type EndpointSpec } from '../endpoints/index.js';
import { workerEnv, type JobQueue } from '../queue/index.js';
import type { WorkerRuntime } from '../runtime/index.js';
import type { ResourceRow } from '../store/index.js';
import { decideScale, type ScaleDecision } from './decide.js';
import type { LogHub } from './log-hub.js';

export interface AutoscalerOptions {
  queue: JobQueue;
  endpoints: EndpointService;
  /** null: flashd launches nothing (external workers only). */
  runtime: WorkerRuntime | null;
  auth: AuthService;
  logs: LogHub;
  clock: Clock;
  log: Logger;
  baseUrl(): string;
  pingIntervalMs: number;
  /** SIGTERM → SIGKILL grace when stopping a worker. */
  stopGraceMs?: number;
  /** Idle grace for QUEUE endpoints scaling on REQUEST_COUNT, where idleTimeout does not apply. */
  requestCountIdleMs?: number;
}

interface Managed {
  endpointId: string;
  keyId: string;
  stopping: boolean;
}

interface CrashState {
  recent: number[];
  backoffUntil: number;
}

const CRASH_WINDOW_MS = 60_000;
const UNHEALTHY_SHOWN_MS = 60_000;

export class Autoscaler {
  readonly #o: AutoscalerOptions;
  readonly #managed = new Map<string, Managed>();
  readonly #crashes = new Map<string, CrashState>();
  readonly #unhealthy = new Map<string, { endpointId: string; until: number }>();
  readonly #dirty = new Set<string>();
  #scheduled = false;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;

  constructor(options: AutoscalerOptions) {
    this.#o = options;
  }

  start(): void {
    this.#timer = setInterval(() => this.tick(), 1000);
    this.#timer.unref();
    this.tick();
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
        this.#o.queue.workers.remove(u.endpointId, workerId);
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
    const decision = decideScale({
      min: spec.workers.min,
      max: spec.workers.max,
      idleTimeoutMs: idleTimeoutApplies(spec.type, spec.scaling) ? spec.workers.idleTimeout * 1000 : this.#o.requestCountIdleMs ?? 5000,
      scaling: spec.scaling,
      queued: load.queued,
      lowQueued: load.lowQueued,
      inProgress: load.inProgress,
      oldestWaitMs: load.oldestWaitMs,
      workers: registry.list(endpointId).map((w) => ({
        id: w.id, state: registry.state(w), idleMs: mono - w.idleSince, managed: w.managed, recycle: w.recycle,
      })).filter((w) => !this.#managed.get(w.id)?.stopping),
      capacity: this.#o.runtime ? this.#o.runtime.capacity(endpointId) : 0,
      backoff: crash !== undefined && mono < crash.backoffUntil,
    });
    registry.setThrottled(endpointId, decision.throttled);
    for (let i = 0; i < decision.start; i++) this.#launch(row);
    for (const id of decision.stop) void this.#stop(id, 'idle');
    return decision;
  }

  #launch(row: ResourceRow<EndpointSpec>): void {
    const runtime = this.#o.runtime;
    if (!runtime) return;
    const spec = row.data;
    const endpointId = row.id;
    const workerId = newId('wkr');
    const { row: keyRow, key } = this.#o.auth.createWorkerKey('usr_admin', null, endpointId, `managed worker ${workerId}`);
    const env = {
      // runpod-python ≥1.9 kills a worker whose host fails its fitness checks (internet, 4 GB free);
      // isolated self-hosted boxes often would. The endpoint env may set it back to false.
      RUNPOD_SKIP_AUTO_SYSTEM_CHECKS: 'true',
      ...spec.env,
      ...workerEnv({ baseUrl: this.#o.baseUrl(), endpointId, workerId, key, gpu: spec.gpu ? 'gpu' : 'cpu', pingIntervalMs: this.#o.pingIntervalMs }),
    };
    this.#o.queue.workers.launched(endpointId, workerId);
    this.#managed.set(workerId, { endpointId, keyId: keyRow.id, stopping: false });
    this.#o.logs.append(endpointId, workerId, 'system', `starting worker ${workerId} (${runtime.name} runtime)`);
    this.#o.log.info('worker starting', { endpointId, workerId, runtime: runtime.name });
    runtime
      .launch(
        { endpointId, workerId, entrypoint: spec.entrypoint, cmd: spec.cmd, image: spec.image, env },
        {
          log: (stream, line) => this.#o.logs.append(endpointId, workerId, stream, line),
          exit: (info) => this.#exited(endpointId, workerId, info),
        },
      )
      .catch((err: Error) => {
        this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} failed to start: ${err.message}`);
        this.#o.log.warn('worker failed to start', { endpointId, workerId, reason: err.message });
        this.#exited(endpointId, workerId, { code: null, signal: null, requested: false });
      });
  }

  #exited(endpointId: string, workerId: string, info: { code: number | null; signal: string | null; requested: boolean }): void {
    const managed = this.#managed.get(workerId);
    this.#managed.delete(workerId);
    if (managed) this.#o.auth.revokeKeyById(managed.keyId);
    const worker = this.#o.queue.workers.get(endpointId, workerId);
    const crashed = !info.requested && !(worker?.recycle && info.code === 0);
    const how = info.signal ? `signal ${info.signal}` : `code ${info.code ?? '?'}`;
    this.#o.queue.workerGone(endpointId, workerId, `worker ${workerId} exited (${how})`);
    if (crashed) {
      this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} exited unexpectedly (${how})`);
      this.#o.log.warn('worker exited unexpectedly', { endpointId, workerId, code: info.code, signal: info.signal });
      this.#o.queue.workers.markUnhealthy(endpointId, workerId);
      const mono = this.#o.clock.monotonic();
      this.#unhealthy.set(workerId, { endpointId, until: mono + UNHEALTHY_SHOWN_MS });
      const state = this.#crashes.get(endpointId) ?? { recent: [], backoffUntil: 0 };
      state.recent = [...state.recent.filter((t) => mono - t < CRASH_WINDOW_MS), mono];
      // Crash loop: back off 2^n seconds (n = crashes in the last minute beyond the second), up to 60 s.
      if (state.recent.length >= 3) state.backoffUntil = mono + Math.min(60_000, 1000 * 2 ** (state.recent.length - 2));
      this.#crashes.set(endpointId, state);
    } else {
      this.#o.logs.append(endpointId, workerId, 'system', `worker ${workerId} stopped (${how})`);
      this.#o.queue.workers.remove(endpointId, workerId);
    }
    this.trigger(endpointId);
  }

  async #stop(workerId: string, why: string): Promise<void> {
    const m = this.#managed.get(workerId);
    if (!m || m.stopping || !this.#o.runtime) return;
    m.stopping = true;
    this.#o.log.info('worker stopping', { endpointId: m.endpointId, workerId, reason: why });
    await this.#o.runtime.stop(workerId, this.#o.stopGraceMs ?? 10_000);
  }

  /** A worker asked to be recycled (stopPod): stop it once it holds no job. */
  recycle(endpointId: string, workerId: string): void {
    const w = this.#o.queue.workers.get(endpointId, workerId);
    if (w) w.recycle = true;
    this.trigger(endpointId);
  }

  /** Configuration changed: managed workers are replaced as they become idle. */
  endpointChanged(endpointId: string): void {
    for (const w of this.#o.queue.workers.list(endpointId)) if (w.managed) w.recycle = true;
    this.trigger(endpointId);
  }

  /** The endpoint is being deleted: stop its workers now. */
  async dropEndpoint(endpointId: string): Promise<void> {
    const ids = [...this.#managed].filter(([, m]) => m.endpointId === endpointId).map(([id]) => id);
    await Promise.all(ids.map((id) => this.#stop(id, 'endpoint deleted')));
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    await this.#o.runtime?.close();
  }
}
