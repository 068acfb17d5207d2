/**
 * Per-endpoint limits of the queue job API, with RunPod's documented quotas (research
 * worker-protocol.md §4 "Rate limits"): requests per 10 s per endpoint, by operation group.
 *
 *   run      /run (and /retry, which queues a job again)      1000
 *   runsync  /runsync                                          2000
 *   status   /status, /status-sync, /stream (and /health, a read)  2000
 *   cancel   /cancel                                            100
 *   purge-queue  /purge-queue                                     2
 *
 * RunPod lists no quota for /retry and /health; flashd counts them with the group they
 * resemble. The concurrent-request caps of the same table are not enforced.
 * `--job-rate-limit-percent` scales every quota (a box serving a fast model may want more than
 * RunPod's hosted limits); 0 turns the job routes' limits off.
 *
 * Reported like the per-user limiter (draft-ietf-httpapi-ratelimit-headers-11), one policy
 * named after the group that applied:
 *   RateLimit-Policy: "status";q=2000;w=10
 *   RateLimit: "status";r=1999;t=7
 * The 10 s windows are aligned to the wall clock (UTC), and every group of an endpoint shares
 * one window start. Only requests let through count. State is one small record per endpoint
 * used recently: `forget` drops a deleted endpoint at once, and a sweep once per window drops
 * the ones idle for a whole window. Callers take only for endpoints that exist (api/dispatch.ts),
 * so made-up ids never add state.
 */
import type { Clock } from '../core/clock.js';

export type JobRateGroup = 'run' | 'runsync' | 'status' | 'cancel' | 'purge-queue';

export interface JobRateQuota {
  readonly group: JobRateGroup;
  /** Requests per window, per endpoint. */
  readonly quota: number;
  /** The operations counted, for details and docs. */
  readonly operations: string;
}

export const JOB_RATE_WINDOW_SECONDS = 10;

export const JOB_RATE_QUOTAS: readonly JobRateQuota[] = Object.freeze([
  { group: 'run', quota: 1000, operations: '/run, /retry' },
  { group: 'runsync', quota: 2000, operations: '/runsync' },
  { group: 'status', quota: 2000, operations: '/status, /status-sync, /stream, /health' },
  { group: 'cancel', quota: 100, operations: '/cancel' },
  { group: 'purge-queue', quota: 2, operations: '/purge-queue' },
] as const);

export interface JobRateDecision {
  allowed: boolean;
  /** RateLimit-Policy and RateLimit, plus Retry-After on refusal. */
  headers: Record<string, string>;
  /** The group's quota. */
  limit: JobRateQuota;
  /** Seconds until the window resets. */
  retryAfter: number;
}

interface Slot {
  /** Start (wall-clock ms) of the window `used` counts in. */
  start: number;
  /** Requests let through in this window, by group index. */
  readonly used: Uint32Array;
}

const SPAN_MS = JOB_RATE_WINDOW_SECONDS * 1000;

export class JobRateLimiter {
  readonly #clock: Clock;
  readonly #slots = new Map<string, Slot>();
  readonly #index: Readonly<Record<JobRateGroup, number>>;
  readonly #policy: readonly string[];
  #sweepAt = 0;

  readonly #quotas: readonly JobRateQuota[];
  /** False with `--job-rate-limit-percent 0`: the job routes are not limited at all. */
  readonly enabled: boolean;

  /** `percent` scales RunPod's quotas (100: as RunPod; 0: no limit). */
  constructor(clock: Clock, percent = 100) {
    this.#clock = clock;
    this.enabled = percent > 0;
    this.#quotas = JOB_RATE_QUOTAS.map((q) => ({ ...q, quota: Math.max(1, Math.round((q.quota * percent) / 100)) }));
    const index = {} as Record<JobRateGroup, number>;
    this.#quotas.forEach((q, i) => (index[q.group] = i));
    this.#index = index;
    this.#policy = this.#quotas.map((q) => `"${q.group}";q=${q.quota};w=${JOB_RATE_WINDOW_SECONDS}`);
  }

  /** Counts one request of `group` for `endpointId` if the group's window has room. */
  take(endpointId: string, group: JobRateGroup): JobRateDecision {
    const now = this.#clock.now();
    const start = now - (now % SPAN_MS);
    if (now >= this.#sweepAt) this.#sweep(start);
    let slot = this.#slots.get(endpointId);
    if (!slot) {
      slot = { start, used: new Uint32Array(this.#quotas.length) };
      this.#slots.set(endpointId, slot);
    } else if (slot.start !== start) {
      slot.start = start;
      slot.used.fill(0);
    }
    const i = this.#index[group];
    const limit = this.#quotas[i] as JobRateQuota;
    const policy = this.#policy[i] as string;
    const retryAfter = Math.max(1, Math.ceil((start + SPAN_MS - now) / 1000));
    const used = slot.used[i] as number;
    if (used >= limit.quota) {
      return {
        allowed: false, limit, retryAfter,
        headers: { 'ratelimit-policy': policy, ratelimit: `"${group}";r=0;t=${retryAfter}`, 'retry-after': String(retryAfter) },
      };
    }
    slot.used[i] = used + 1;
    return {
      allowed: true, limit, retryAfter,
      headers: { 'ratelimit-policy': policy, ratelimit: `"${group}";r=${limit.quota - used - 1};t=${retryAfter}` },
    };
  }

  /**
   * The headers `take` would report now for `group`, without counting a request: the reply to a
   * request refused before it may spend the quota (a key without the scope, a worker key).
   */
  peek(endpointId: string, group: JobRateGroup): Record<string, string> {
    const now = this.#clock.now();
    const start = now - (now % SPAN_MS);
    const slot = this.#slots.get(endpointId);
    const i = this.#index[group];
    const limit = this.#quotas[i] as JobRateQuota;
    const used = slot && slot.start === start ? (slot.used[i] as number) : 0;
    const retryAfter = Math.max(1, Math.ceil((start + SPAN_MS - now) / 1000));
    return { 'ratelimit-policy': this.#policy[i] as string, ratelimit: `"${group}";r=${Math.max(0, limit.quota - used)};t=${retryAfter}` };
  }

  /** Drops the state of a deleted endpoint. */
  forget(endpointId: string): void {
    this.#slots.delete(endpointId);
  }

  /** Endpoints with state (tests, metrics). */
  get size(): number {
    return this.#slots.size;
  }

  /**
   * Once per window: drops endpoints with no request in this window or the one before (their
   * counts are void anyway), so state is bounded by the endpoints used in the last 20 s.
   */
  #sweep(windowStart: number): void {
    this.#sweepAt = windowStart + SPAN_MS;
    const idleBefore = windowStart - SPAN_MS;
    for (const [id, slot] of this.#slots) {
      if (slot.start < idleBefore) this.#slots.delete(id);
    }
  }
}
