/**
 * Gives `flashd.db`'s free pages back to the filesystem while flashd runs. Deleted rows (results
 * that expired, a deleted endpoint's jobs, /stream chunks read) leave their pages on SQLite's
 * freelist, where later writes reuse them; the file never shrinks by itself, so a burst of big
 * jobs left it at its peak size for ever. The database is in auto_vacuum=INCREMENTAL mode (set
 * by openDb), so `PRAGMA incremental_vacuum(N)` moves the last N pages into free ones and cuts
 * them off the end, here a slice of VACUUM_SLICE_PAGES at a time: each slice is a write of the
 * group commit (store/write-batch.ts), so its sync runs off the event loop like any other, and
 * the next slice waits until that one is durable and VACUUM_SLICE_GAP_MS has passed, so job
 * traffic always goes between two slices. A full VACUUM would hold the event loop for seconds on
 * a large file.
 *
 * Only a freelist worth it is reclaimed (VACUUM_MIN_FREE_BYTES and VACUUM_MIN_FREE_SHARE of the
 * file): steady traffic frees and reuses a few MB all the time, and cutting those off would only
 * make the next inserts grow the file again. The file shrinks on disk when a checkpoint has
 * copied the slices into it: one is run when a reclaim ends (PASSIVE: it never waits).
 */
import type { Statement } from 'better-sqlite3';
import type { Logger } from '../core/logger.js';
import type { Db } from './db.js';
import type { WriteBatch } from './write-batch.js';

/**
 * Pages one slice gives back (256 KB of 4 KB pages). Where live pages must move into the holes
 * (big rows freed between small ones), a slice of 64 took about 0.8 ms of CPU (median), 256
 * about 3 ms and up to 10 ms: too long a hold of the event loop.
 */
export const VACUUM_SLICE_PAGES = 64;
/** Free space smaller than this is left for reuse. */
export const VACUUM_MIN_FREE_BYTES = 16 * 1024 * 1024;
/** And so is free space under this share of the file. */
export const VACUUM_MIN_FREE_SHARE = 0.25;
/** Between the end of a slice's commit and the next slice (ms). */
export const VACUUM_SLICE_GAP_MS = 10;
/** After a slice failed, how long until a check may start again (ms). */
const RETRY_AFTER_FAILURE_MS = 60_000;

export class SpaceReclaimer {
  readonly #db: Db;
  readonly #batch: WriteBatch;
  readonly #log: Logger;
  readonly #freePages: Statement;
  readonly #pageCount: Statement;
  readonly #pageSize: number;
  #running = false;
  #closed = false;
  #timer: NodeJS.Timeout | null = null;
  #failedAt = -Infinity;
  /** Slices committed (diagnostics and tests). */
  slices = 0;

  constructor(db: Db, batch: WriteBatch, log: Logger) {
    this.#db = db;
    this.#batch = batch;
    this.#log = log;
    this.#freePages = db.prepare('PRAGMA freelist_count').pluck();
    this.#pageCount = db.prepare('PRAGMA page_count').pluck();
    this.#pageSize = db.pragma('page_size', { simple: true }) as number;
  }

  /** Whether a reclaim is under way. */
  get running(): boolean {
    return this.#running;
  }

  /** Starts giving free pages back when there are enough of them (a read when there are not). */
  check(): void {
    if (this.#running || this.#closed || Date.now() - this.#failedAt < RETRY_AFTER_FAILURE_MS) return;
    const free = this.#freePages.get() as number;
    const pages = this.#pageCount.get() as number;
    if (free * this.#pageSize < VACUUM_MIN_FREE_BYTES || free < pages * VACUUM_MIN_FREE_SHARE) return;
    this.#running = true;
    this.#log.info('store giving free space back to the filesystem', { freeMb: this.#mb(free), fileMb: this.#mb(pages) });
    const started = Date.now();
    const slice = (): void => {
      this.#timer = null;
      if (this.#closed) return;
      let error: unknown;
      // Caught here: a failing slice must not fail the job writes that share its commit. Unless
      // SQLite rolled the whole transaction back (a full disk or an I/O error while its pages
      // spilled to the WAL): the writes after it would each commit on their own while the batch
      // reports them rolled back, so the batch fails as it is.
      this.#batch.write(() => {
        try {
          this.#db.pragma(`incremental_vacuum(${VACUUM_SLICE_PAGES})`);
        } catch (err) {
          if (!this.#db.inTransaction) throw err;
          error = err;
        }
      });
      this.#batch.committed().then(() => {
        if (this.#closed) return;
        if (error !== undefined) throw error;
        this.slices++;
        if ((this.#freePages.get() as number) > 0) {
          this.#timer = setTimeout(slice, VACUUM_SLICE_GAP_MS);
          this.#timer.unref();
          return;
        }
        this.#running = false;
        // The file is cut once a checkpoint has copied the slices into it.
        this.#db.pragma('wal_checkpoint(PASSIVE)');
        this.#log.info('store gave free space back', { ms: Date.now() - started, fileMb: this.#mb(this.#pageCount.get() as number) });
      }).catch((err: unknown) => {
        this.#running = false;
        this.#failedAt = Date.now();
        this.#log.warn('store could not give free space back; tried again in a minute', { err });
      });
    };
    slice();
  }

  close(): void {
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #mb(pages: number): number {
    return Math.round((pages * this.#pageSize) / 104857.6) / 10;
  }
}
