/**
 * Logs a failure that repeats without flooding the log. On a full disk every write and every
 * checkpoint fails until space is freed, and a client retrying in a loop would otherwise put a
 * line with its stack in the log per try, onto a disk the log may share.
 *
 * The first failure of a streak is logged in full. After it, with `everyMs`, at most one line per
 * `everyMs` gives how many failed since the last line; without it, nothing until the streak ends.
 * `ok()` ends the streak, with a line when one was logged for it. A new streak's first line is
 * logged at once when the last streak ended `QUIET_MS` or more before it (a second outage: the
 * log must not end on "works again" while writes fail); one that starts sooner is a condition
 * that comes and goes (a small write fits where a large one does not), and with `everyMs` its
 * first line waits for it too, so that still logs at most one failure line per `everyMs`.
 */
import type { Logger } from './logger.js';

/** A streak that starts this long after the last one ended is a new outage, logged at once. */
const QUIET_MS = 10_000;

export interface FailureStreakOptions {
  level: 'warn' | 'error';
  /** The line logged when it works again (info). */
  recovered: string;
  /** At most one failure line per this many ms; unset: one per streak. */
  everyMs?: number;
  now?: () => number;
}

export class FailureStreak {
  readonly #log: Logger;
  readonly #msg: string;
  readonly #options: FailureStreakOptions;
  readonly #now: () => number;
  /** Errors counted already: every request of one failed commit reports the commit's error. */
  readonly #seen = new WeakSet<object>();
  #failing = false;
  /** A line was logged for this streak. */
  #told = false;
  /** Failures in this streak. */
  #failures = 0;
  /** Failures since the last line. */
  #unlogged = 0;
  #lastLineAt = -Infinity;
  /** When the last streak ended (ok()). */
  #endedAt = -Infinity;
  /** This streak started within QUIET_MS of the last one's end: its first line is throttled too. */
  #flapping = false;

  constructor(log: Logger, msg: string, options: FailureStreakOptions) {
    this.#log = log;
    this.#msg = msg;
    this.#options = options;
    this.#now = options.now ?? Date.now;
  }

  get failing(): boolean {
    return this.#failing;
  }

  /** One failure (an error already counted is ignored). */
  fail(err: unknown, fields: Record<string, unknown> = {}): void {
    if (typeof err === 'object' && err !== null) {
      if (this.#seen.has(err)) return;
      this.#seen.add(err);
    }
    const now = this.#now();
    if (!this.#failing) {
      this.#failing = true;
      this.#told = false;
      this.#failures = 0;
      this.#flapping = now - this.#endedAt < QUIET_MS;
    }
    this.#failures++;
    this.#unlogged++;
    const every = this.#options.everyMs;
    const throttled = every !== undefined && now - this.#lastLineAt < every && (this.#told || this.#flapping);
    if (every === undefined ? this.#told : throttled) return;
    const level = this.#options.level;
    if (!this.#told) {
      this.#log[level](this.#msg, { ...fields, ...(this.#unlogged > 1 ? { failures: this.#unlogged } : {}), err });
    } else {
      // The full error was logged at the streak's start; now only how many, and the last one's code.
      const e = err as { code?: unknown; message?: unknown } | null;
      this.#log[level](this.#msg, { ...fields, failures: this.#unlogged, sinceSeconds: Math.round((now - this.#lastLineAt) / 1000), code: e?.code, error: e?.message });
    }
    this.#told = true;
    this.#unlogged = 0;
    this.#lastLineAt = now;
  }

  /** It worked: ends a streak. */
  ok(): void {
    if (!this.#failing) return;
    this.#failing = false;
    this.#endedAt = this.#now();
    if (this.#told) this.#log.info(this.#options.recovered, { failures: this.#failures });
  }
}
