/**
 * Group commit with a pipelined WAL sync.
 *
 * Every write issued during one event-loop turn runs in one transaction, committed in
 * `setImmediate`. With `durability: 'fsync'` (`--sqlite-synchronous full`, the default) a
 * caller is told only once the commit is on disk, but the disk wait no longer blocks the
 * event loop: the transaction commits at `synchronous=NORMAL` (frames written to the WAL,
 * no sync), then `fdatasync` of the WAL file runs on the libuv thread pool while the loop
 * goes on serving requests. Writes that arrive while a sync is in flight wait for it and are
 * committed together when it completes, and the next sync starts at once for them: under load
 * there is one fsync in flight at a time and one commit per sync, covering many turns (fewer,
 * larger commits also write each hot page of the table and its indexes to the WAL fewer times).
 * An fdatasync costs about 70 µs of kernel CPU on a small VM whatever it covers, and under
 * load a sync started for the first caller to come back splits the crowd in two. So when the
 * last sync answered a crowd (BUSY_GROUP callers or more), the next commit waits until about as
 * many callers are waiting again (3/4 of the last group) or BUSY_MAX_WAIT_MS passes, whichever
 * comes first (the group-commit delay of MySQL's binlog_group_commit_sync_delay with
 * sync_no_delay_count, sized by the load itself). A lone client still gets its sync at once.
 *
 * What this promises is what SQLite's `synchronous=FULL` promises: a write whose caller was
 * answered is in a synced WAL and survives power loss. It relies on two facts: fdatasync on
 * any descriptor of a file flushes every write made to that file before the call (POSIX, the
 * page cache is per inode), and in NORMAL mode SQLite itself syncs the WAL before a
 * checkpoint copies it into the database and before the WAL is reused, so frames it covers
 * are never overwritten unsynced. Writes made outside the batch (management routes) keep
 * SQLite's own FULL behaviour: the connection stays at FULL except inside a batch commit.
 */
import { closeSync, fdatasync, fdatasyncSync, openSync } from 'node:fs';
import type { Statement } from 'better-sqlite3';
import type { Db } from './db.js';

type Waiter = (err?: Error) => void;

/** A sync that answered at least this many callers means the server is busy. */
const BUSY_GROUP = 8;
/** When busy, the longest the next commit waits for its group to gather (ms). */
const BUSY_MAX_WAIT_MS = 1;

export interface WriteBatchOptions {
  /** `fsync`: answer callers after the WAL is synced; `none`: after the commit. */
  durability: 'fsync' | 'none';
  /** The database's WAL file (`<db>-wal`); required for `fsync`. */
  walPath?: string;
  onError(err: Error): void;
  /** Called after each commit that succeeded (a streak of failed ones has ended). */
  onCommitted?(): void;
}

export class WriteBatch {
  readonly #onError: (err: Error) => void;
  readonly #onCommitted: (() => void) | undefined;
  #writes: (() => void)[] = [];
  /** What to do if the commit of the writes in #writes fails (see ifRolledBack). */
  #onRollback: (() => void)[] = [];
  /** The writes being committed now, run by the one transaction function made up front. */
  #running: (() => void)[] = [];
  readonly #runAll: () => void;
  #waiters: Waiter[] = [];
  #scheduled = false;
  #closed = false;
  // The sync pipeline (durability fsync only).
  #fd = -1;
  readonly #toNormal: Statement | undefined;
  readonly #toFull: Statement | undefined;
  /** Waiters covered by the sync in flight. */
  #syncing: Waiter[] | null = null;
  /** Waiters committed after the sync in flight started; the next sync covers them. */
  #nextSync: Waiter[] = [];
  /** A commit happened since the last sync started. */
  #dirty = false;
  /** Busy: the next commit waits until #holdTarget callers wait, or for this timer. */
  #hold: NodeJS.Timeout | null = null;
  #holdTarget = 0;
  /** Syncs completed (diagnostics and tests). */
  syncs = 0;
  /**
   * Commits or syncs that failed. After one, what callers were told and what the database
   * holds may differ (the queue stops raising its recovery floor, for one).
   */
  failures = 0;
  /** Sequence number of the batch collecting writes now (what `write` returns). */
  #openSeq = 1;
  #committedSeq = 0;
  #durableSeq = 0;
  /**
   * Batches whose commit or sync failed, as [first, last] runs of sequence numbers (a disk
   * that stays full fails batch after batch: one run, not one entry each). Their writes are not
   * on disk whatever later syncs cover, so they are never durable.
   */
  readonly #failed: Run[] = [];
  /**
   * Of those, the batches whose commit failed, which SQLite rolled back. The others committed
   * and only their sync failed: SQLite holds and reads their writes (a restart may find them
   * too), though they may not be on disk. Each run keeps the error of its last commit.
   */
  readonly #rolledBack: Run[] = [];

  constructor(db: Db, options: WriteBatchOptions) {
    this.#onError = options.onError;
    this.#onCommitted = options.onCommitted;
    // Made once: better-sqlite3 builds four wrapper functions per transaction() call.
    this.#runAll = db.transaction(() => {
      for (const w of this.#running) w();
    });
    if (options.durability === 'fsync') {
      if (!options.walPath) throw new Error('WriteBatch: durability fsync needs walPath');
      // Opened after the database is in WAL mode, so the file exists; read-only is enough to sync it.
      this.#fd = openSync(options.walPath, 'r');
      this.#toNormal = db.prepare('PRAGMA synchronous = NORMAL');
      this.#toFull = db.prepare('PRAGMA synchronous = FULL');
    }
  }

  /** Queues a write for this turn's transaction; returns its batch's sequence number. */
  write(fn: () => void): number {
    if (this.#closed) throw new Error('write batch is closed');
    this.#writes.push(fn);
    this.#schedule();
    return this.#openSeq;
  }

  /**
   * Calls `fn` if the commit of the batch collecting writes now fails, so SQLite rolled its
   * writes back: in that commit's turn, before any caller of `committed` hears of it. Never for
   * a commit that succeeded and whose sync failed. It adds no caller, so it starts no sync.
   */
  ifRolledBack(fn: () => void): void {
    this.#onRollback.push(fn);
  }

  /**
   * Whether `fn` is the last write queued and not yet running: a caller may then add to what
   * `fn` writes (JobQueue gathers one turn's inserts into one statement) without changing
   * the order of writes.
   */
  isLast(fn: () => void): boolean {
    return this.#writes.length > 0 && this.#writes[this.#writes.length - 1] === fn;
  }

  /** Whether the batch numbered `seq` (from `write`) is durable, so a read of it needs no wait. */
  isDurable(seq: number): boolean {
    return seq <= this.#durableSeq && !this.hasFailed(seq);
  }

  /** Whether the batch numbered `seq` failed to commit or sync: it will never be durable. */
  hasFailed(seq: number): boolean {
    return runOf(this.#failed, seq) !== undefined;
  }

  /**
   * Whether the commit of the batch numbered `seq` failed, so SQLite rolled its writes back.
   * False for a batch whose commit succeeded and whose sync failed: SQLite has its writes, and
   * memory must not be put back as if it did not (see JobQueue's undo paths).
   */
  wasRolledBack(seq: number): boolean {
    return runOf(this.#rolledBack, seq) !== undefined;
  }

  /**
   * Why the commit of the batch numbered `seq` failed (of a run of failed commits, the last
   * one's error: a full disk fails them all alike), undefined when it did not: a caller that
   * finds its batch rolled back later (/runsync's deferred insert) answers by it.
   */
  rollbackError(seq: number): Error | undefined {
    return runOf(this.#rolledBack, seq)?.[2];
  }

  /** Resolves once everything queued or committed so far is durable. */
  committed(): Promise<void> {
    if (this.#writes.length === 0 && !this.#scheduled) {
      if (!this.#dirty && !this.#syncing) return Promise.resolve();
      return new Promise((resolve, reject) => this.#afterCommit((err) => (err ? reject(err) : resolve())));
    }
    return new Promise((resolve, reject) => {
      this.#waiters.push((err) => (err ? reject(err) : resolve()));
      if (this.#hold && this.#waiters.length + this.#nextSync.length >= this.#holdTarget) this.#release();
      else this.#schedule();
    });
  }

  /** Ends a hold: the group has gathered, or the wait is over. */
  #release(): void {
    if (this.#hold) clearTimeout(this.#hold);
    this.#hold = null;
    this.#continue();
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

  /**
   * Commits the queued writes. With a sync in flight it waits for that sync to complete (the
   * callers could not be answered before the next sync anyway); `force` commits regardless.
   */
  flush(force = false): void {
    this.#scheduled = false;
    if ((this.#syncing || this.#hold) && !force) return;
    const writes = this.#writes;
    const waiters = this.#waiters;
    const onRollback = this.#onRollback;
    this.#writes = [];
    this.#waiters = [];
    this.#onRollback = [];
    let error: Error | undefined;
    if (writes.length) {
      const seq = this.#openSeq++;
      try {
        this.#toNormal?.run();
        try {
          this.#running = writes;
          try {
            this.#runAll();
          } finally {
            this.#running = [];
          }
        } finally {
          this.#toFull?.run();
        }
        if (this.#fd >= 0) this.#dirty = true;
        else this.#durableSeq = seq;
      } catch (err) {
        error = err as Error;
        this.failures++;
        addRun(this.#failed, seq, seq);
        addRun(this.#rolledBack, seq, seq, error);
        this.#onError(error);
      }
      if (!error) this.#onCommitted?.();
      this.#committedSeq = seq;
      if (error) {
        for (const fn of onRollback) {
          try {
            fn();
          } catch (err) {
            this.#onError(err as Error);
          }
        }
      }
    }
    if (error || this.#fd < 0) {
      for (const w of waiters) w(error);
    } else {
      for (const w of waiters) this.#afterCommit(w);
    }
    // Callers an earlier commit left for the next sync (a forced flush during a hold) wait for
    // one to start: this commit may have had no caller of its own to start it.
    if (this.#nextSync.length > 0 && this.#syncing === null && this.#hold === null) this.#startSync();
  }

  /** After a sync that answered `answered` callers: hold the next commit while a crowd gathers. */
  #holdAfter(answered: number): boolean {
    const target = answered >= BUSY_GROUP ? Math.ceil(answered * 0.75) : 0;
    if (this.#waiters.length + this.#nextSync.length >= target) return false;
    this.#holdTarget = target;
    this.#hold = setTimeout(() => this.#release(), BUSY_MAX_WAIT_MS);
    return true;
  }

  /** Answers `w` once every commit made so far is synced (at once when there is nothing to sync). */
  #afterCommit(w: Waiter): void {
    if (this.#dirty) {
      // Only a sync that starts after the last commit covers it.
      this.#nextSync.push(w);
      if (this.#hold) {
        if (this.#waiters.length + this.#nextSync.length >= this.#holdTarget) this.#release();
      } else if (!this.#syncing) {
        this.#startSync();
      }
    } else if (this.#syncing) {
      this.#syncing.push(w);
    } else {
      w();
    }
  }

  #startSync(): void {
    const group = this.#nextSync;
    this.#nextSync = [];
    this.#syncing = group;
    this.#dirty = false;
    const covers = this.#committedSeq;
    const from = this.#durableSeq + 1;
    const fd = this.#fd;
    fdatasync(fd, (err) => {
      if (this.#closed) {
        // close() synced and answered everyone; the descriptor waited for this call to finish.
        closeSync(fd);
        return;
      }
      this.#syncing = null;
      this.syncs++;
      const error = err ? new Error(`fdatasync of the WAL failed: ${err.message}`, { cause: err }) : undefined;
      if (error) {
        // After a failed fdatasync the kernel may have dropped those pages: a later sync that
        // succeeds says nothing about them (PostgreSQL's "fsyncgate").
        this.failures++;
        addRun(this.#failed, from, covers);
        this.#onError(error);
      } else this.#durableSeq = Math.max(this.#durableSeq, covers);
      for (const w of group) w(error);
      if (!this.#holdAfter(group.length)) this.#continue();
    });
  }

  /** After a sync: commit what waited for it, or sync what was committed meanwhile. */
  #continue(): void {
    if (this.#closed) return;
    if (this.#writes.length || this.#waiters.length) this.flush();
    else if (this.#nextSync.length) this.#startSync();
  }

  close(): void {
    if (this.#closed) return;
    if (this.#hold) clearTimeout(this.#hold);
    this.#hold = null;
    this.flush(true);
    this.#closed = true;
    if (this.#fd >= 0) {
      // Whatever is still waiting (in flight or next) is covered by one last synchronous sync.
      let error: Error | undefined;
      try {
        fdatasyncSync(this.#fd);
        this.#durableSeq = this.#committedSeq;
      } catch (err) {
        error = err as Error;
        this.#onError(error);
      }
      const inFlight = this.#syncing !== null;
      const pending = [...(this.#syncing ?? []), ...this.#nextSync];
      this.#nextSync = [];
      this.#syncing = null;
      this.#dirty = false;
      for (const w of pending) w(error);
      // Never close a descriptor a thread-pool call still uses: its callback closes it.
      if (!inFlight) closeSync(this.#fd);
      this.#fd = -1;
    }
  }
}

/** Batches [first, last] that failed, with the error of the last one when it is kept. */
type Run = [first: number, last: number, err?: Error];

/** The one of `runs` (in order) that holds `seq`. */
function runOf(runs: readonly Run[], seq: number): Run | undefined {
  for (let i = runs.length - 1; i >= 0; i--) {
    const run = runs[i] as Run;
    if (seq > run[1]) return undefined;
    if (seq >= run[0]) return run;
  }
  return undefined;
}

/** Adds [first, last] to `runs`, folding every run it overlaps or touches; `err` is kept as the newest. */
function addRun(runs: Run[], first: number, last: number, err?: Error): void {
  // A failed sync starts at durableSeq + 1, possibly below an earlier failed commit's run:
  // fold every run it overlaps or touches, keeping the lowest start.
  for (let run = runs[runs.length - 1]; run && run[1] >= first - 1; run = runs[runs.length - 1]) {
    first = Math.min(first, run[0]);
    last = Math.max(last, run[1]);
    err ??= run[2];
    runs.pop();
  }
  runs.push(err === undefined ? [first, last] : [first, last, err]);
}
