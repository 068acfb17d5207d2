/**
 * Per-user fixed-window rate limits over three windows named `minute`, `hour` and `day`,
 * reported with the fields of draft-ietf-httpapi-ratelimit-headers-11:
 *   RateLimit-Policy: "minute";q=600;w=60, "hour";q=18000;w=3600, "day";q=200000;w=86400
 *   RateLimit: "minute";r=599;t=34, "hour";r=…;t=…, "day";r=…;t=…
 * Windows are aligned to the wall clock (UTC) so `t` is the same for every caller. Counters
 * live in memory: a restart starts every window afresh. Only requests that are let through
 * count; a 429 does not use quota.
 */
import type { Clock } from '../core/clock.js';

export interface RateWindow {
  readonly name: 'minute' | 'hour' | 'day';
  readonly seconds: number;
  readonly quota: number;
}

export interface RateDecision {
  allowed: boolean;
  /** Headers for the response (both fields). */
  headers: Record<string, string>;
  /** On refusal: the window that was exceeded and seconds until it resets. */
  violated?: { window: RateWindow; retryAfter: number };
}

interface Counter {
  start: number;
  used: number;
}

export class RateLimiter {
  readonly windows: readonly RateWindow[];
  readonly #clock: Clock;
  readonly #counters = new Map<string, Counter[]>();
  readonly #policy: string;
  #sweepAt = 0;

  constructor(quotas: { minute: number; hour: number; day: number }, clock: Clock) {
    this.windows = [
      { name: 'minute', seconds: 60, quota: quotas.minute },
      { name: 'hour', seconds: 3600, quota: quotas.hour },
      { name: 'day', seconds: 86400, quota: quotas.day },
    ];
    this.#clock = clock;
    this.#policy = this.windows.map((w) => `"${w.name}";q=${w.quota};w=${w.seconds}`).join(', ');
  }

  /** Counts one request for `userId` if every window has room. */
  take(userId: string): RateDecision {
    const now = this.#clock.now();
    this.#sweep(now);
    let counters = this.#counters.get(userId);
    if (!counters) {
      counters = this.windows.map(() => ({ start: 0, used: 0 }));
      this.#counters.set(userId, counters);
    }
    const resets: number[] = [];
    let violated: RateDecision['violated'];
    this.windows.forEach((w, i) => {
      const c = counters[i] as Counter;
      const span = w.seconds * 1000;
      const start = Math.floor(now / span) * span;
      if (c.start !== start) {
        c.start = start;
        c.used = 0;
      }
      const reset = Math.max(1, Math.ceil((start + span - now) / 1000));
      resets.push(reset);
      if (c.used >= w.quota && (!violated || reset > violated.retryAfter)) violated = { window: w, retryAfter: reset };
    });
    if (violated) {
      const v = violated;
      // One member per window, as on a 200: the refused request used no quota, so the other
      // windows report what they have left (an exhausted one r=0).
      const parts = this.windows.map((w, i) => `"${w.name}";r=${Math.max(0, w.quota - (counters[i] as Counter).used)};t=${resets[i]}`);
      return {
        allowed: false,
        violated: v,
        headers: {
          'ratelimit-policy': this.#policy,
          ratelimit: parts.join(', '),
          'retry-after': String(v.retryAfter),
        },
      };
    }
    const parts = this.windows.map((w, i) => {
      const c = counters[i] as Counter;
      c.used++;
      return `"${w.name}";r=${w.quota - c.used};t=${resets[i]}`;
    });
    return { allowed: true, headers: { 'ratelimit-policy': this.#policy, ratelimit: parts.join(', ') } };
  }

  /** Drops users whose day window has passed, so memory stays bounded by active users. */
  #sweep(now: number): void {
    if (now < this.#sweepAt) return;
    this.#sweepAt = now + 60_000;
    const dayStart = Math.floor(now / 86_400_000) * 86_400_000;
    for (const [user, counters] of this.#counters) {
      if ((counters[2] as Counter).start < dayStart) this.#counters.delete(user);
    }
  }
}
