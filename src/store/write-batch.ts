/**
 * Group commit: every write issued during one event-loop turn runs in one transaction,
 * committed in `setImmediate`, and only then are the callers told (and their HTTP replies
 * sent). With `synchronous=FULL` that is one WAL fsync per turn instead of one per write,
 * which is what lets durability cost almost no throughput (perf-anchors §3, §6).
 */
import type { Db } from './db.js';

export class WriteBatch {
  readonly #db: Db;
  #writes: (() => void)[] = [];
  #waiters: ((err?: Error) => void)[] = [];
  #scheduled = false;
  #closed = false;
  readonly #onError: (err: Error) => void;

  constructor(db: Db, onError: (err: Error) => void) {
    this.#db = db;
    this.#onError = onError;
  }

  /** Queues a write for this turn's transaction. */
  write(fn: () => void): void {
    if (this.#closed) throw new Error('write batch is closed');
    this.#writes.push(fn);
    this.#schedule();
  }

  /** Resolves once everything queued so far is committed. */
  committed(): Promise<void> {
    if (this.#writes.length === 0 && !this.#scheduled) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.#waiters.push((err) => (err ? reject(err) : resolve()));
      this.#schedule();
    });
  }

  /** Queues a write and resolves when it is durable. */
  commit(fn: () => void): Promise<void> {
    this.write(fn);
    return this.committed();
  }

  #schedule(): void {
    if (this.#scheduled) return;
    this.#scheduled = true;
    setImmediate(() => this.flush());
  }

  /** Commits now (also used at shutdown). */
  flush(): void {
    this.#scheduled = false;
    const writes = this.#writes;
    const waiters = this.#waiters;
    this.#writes = [];
    this.#waiters = [];
    let error: Error | undefined;
    if (writes.length) {
      try {
        this.#db.transaction(() => {
          for (const w of writes) w();
        })();
      } catch (err) {
        error = err as Error;
        this.#onError(error);
      }
    }
    for (const w of waiters) w(error);
  }

  close(): void {
    this.flush();
    this.#closed = true;
  }
}
