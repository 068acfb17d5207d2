import type { Statement } from 'better-sqlite3';
import type { Db } from './db.js';

export type JobStatus = 'IN_QUEUE' | 'IN_PROGRESS' | 'COMPLETED' | 'FAILED' | 'CANCELLED' | 'TIMED_OUT';

/** A job row as stored. `input`, `output` and `extra` are raw JSON text. */
export interface JobRow {
  id: string;
  endpointId: string;
  status: JobStatus;
  input: string;
  /** Extra keys handed to the worker with the job (e.g. s3Config), as a JSON object text. */
  extra: string | null;
  webhook: string | null;
  lowPriority: boolean;
  executionTimeoutMs: number;
  ttlMs: number;
  retentionMs: number;
  attempt: number;
  retries: number;
  workerId: string | null;
  output: string | null;
  error: string | null;
  createdAt: number;
  startedAt: number | null;
  completedAt: number | null;
  expiresAt: number | null;
}

/** A queued or running job as recovery reads it: no input, no result. */
export type ActiveJobRow = Omit<JobRow, 'input'> & { input: null };

interface Raw {
  id: string; endpoint_id: string; status: JobStatus; input: string; extra: string | null; webhook: string | null;
  low_priority: number; execution_timeout_ms: number; ttl_ms: number; retention_ms: number; attempt: number; retries: number;
  worker_id: string | null; output: string | null; error: string | null; created_at: number; started_at: number | null;
  completed_at: number | null; expires_at: number | null;
}

const map = (r: Raw): JobRow => ({
  id: r.id, endpointId: r.endpoint_id, status: r.status, input: r.input, extra: r.extra, webhook: r.webhook,
  lowPriority: r.low_priority === 1, executionTimeoutMs: r.execution_timeout_ms, ttlMs: r.ttl_ms, retentionMs: r.retention_ms,
  attempt: r.attempt, retries: r.retries, workerId: r.worker_id, output: r.output, error: r.error, createdAt: r.created_at,
  startedAt: r.started_at, completedAt: r.completed_at, expiresAt: r.expires_at,
});

/**
 * Job rows. Every state change is one statement with the expected current state in its
 * WHERE clause; callers run them inside the write batch's transaction.
 */
export class JobsRepo {
  readonly #insert: Statement;
  readonly #claim: Statement;
  readonly #finish: Statement;
  readonly #requeue: Statement;
  readonly #setExpiry: Statement;
  readonly #get: Statement;
  readonly #activeRunning: Statement;
  readonly #activeQueued: Statement;
  readonly #expire: Statement;
  readonly #counts: Statement;
  readonly #addCount: Statement;
  readonly #dropCounts: Statement;
  readonly #rowidRange: Statement;
  readonly #deleteSlice: Statement;
  readonly #lease: Statement;
  readonly #input: Statement;
  readonly #getLight: Statement;

  constructor(db: Db) {
    this.#insert = db.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, extra, webhook, low_priority, execution_timeout_ms, ttl_ms,
      retention_ms, attempt, retries, created_at) VALUES (?, ?, 'IN_QUEUE', ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)`);
    this.#claim = db.prepare(`UPDATE jobs SET status = 'IN_PROGRESS', attempt = ?, worker_id = ?, started_at = ?
      WHERE id = ? AND status = 'IN_QUEUE'`);
    // A final state carries the claim too: a job that finishes quickly has its claim written here only.
    this.#finish = db.prepare(`UPDATE jobs SET status = ?, output = ?, error = ?, completed_at = ?, expires_at = ?, worker_id = ?,
      attempt = ?, started_at = ? WHERE id = ? AND status IN ('IN_QUEUE', 'IN_PROGRESS')`);
    this.#requeue = db.prepare(`UPDATE jobs SET status = 'IN_QUEUE', worker_id = NULL, output = NULL, error = NULL, started_at = NULL,
      completed_at = NULL, expires_at = NULL, retries = ?, attempt = ? WHERE id = ?`);
    this.#lease = db.prepare('UPDATE jobs SET attempt = ? WHERE id = ?');
    this.#setExpiry = db.prepare('UPDATE jobs SET expires_at = ? WHERE id = ?');
    this.#get = db.prepare('SELECT * FROM jobs WHERE id = ?');
    // Recovery reads only the small columns (inputs are loaded when taken, inputOf), one status
    // at a time so each query walks the jobs_active index in order instead of sorting, and as
    // arrays (a restart with a long backlog makes one object per row, not two).
    const activeCols = `id, endpoint_id, status, extra, webhook, low_priority, execution_timeout_ms, ttl_ms, retention_ms, attempt,
      retries, worker_id, created_at, started_at`;
    this.#activeRunning = db.prepare(`SELECT ${activeCols} FROM jobs WHERE status = 'IN_PROGRESS'`).raw();
    this.#activeQueued = db.prepare(`SELECT ${activeCols} FROM jobs WHERE status = 'IN_QUEUE' ORDER BY created_at, rowid`).raw();
    this.#input = db.prepare('SELECT input FROM jobs WHERE id = ?').pluck();
    this.#getLight = db.prepare(`SELECT id, endpoint_id, status, NULL AS input, extra, webhook, low_priority, execution_timeout_ms, ttl_ms,
      retention_ms, attempt, retries, worker_id, output, error, created_at, started_at, completed_at, expires_at FROM jobs WHERE id = ?`);
    this.#expire = db.prepare(`DELETE FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?
      RETURNING endpoint_id AS endpointId, status, retries`);
    this.#counts = db.prepare('SELECT status, jobs, retries FROM job_counts WHERE endpoint_id = ?');
    this.#addCount = db.prepare(`INSERT INTO job_counts (endpoint_id, status, jobs, retries) VALUES (?, ?, ?, ?)
      ON CONFLICT (endpoint_id, status) DO UPDATE SET jobs = jobs + excluded.jobs, retries = retries + excluded.retries`);
    this.#dropCounts = db.prepare('DELETE FROM job_counts WHERE endpoint_id = ?');
    this.#rowidRange = db.prepare('SELECT min(rowid) AS lo, max(rowid) AS hi FROM jobs');
    this.#deleteSlice = db.prepare('DELETE FROM jobs WHERE rowid >= ? AND rowid < ? AND endpoint_id = ?');
  }

  insert(j: Pick<JobRow, 'id' | 'endpointId' | 'extra' | 'webhook' | 'lowPriority' | 'executionTimeoutMs' | 'ttlMs' | 'retentionMs' | 'createdAt'>, input: string): void {
    this.#insert.run(j.id, j.endpointId, input, j.extra, j.webhook, j.lowPriority ? 1 : 0, j.executionTimeoutMs, j.ttlMs, j.retentionMs, j.createdAt);
  }

  claim(id: string, attempt: number, workerId: string, startedAt: number): void {
    this.#claim.run(attempt, workerId, startedAt, id);
  }

  finish(id: string, status: JobStatus, output: string | null, error: string | null, completedAt: number, expiresAt: number,
    workerId: string | null, attempt: number, startedAt: number | null): void {
    this.#finish.run(status, output, error, completedAt, expiresAt, workerId, attempt, startedAt, id);
  }

  /** Back to the queue (lease lost, reclaimed, or a manual retry): same id and input. */
  requeue(id: string, retries: number, attempt: number): void {
    this.#requeue.run(retries, attempt, id);
  }

  /** Records a new attempt number for a job that keeps running (restart reclaim). */
  setAttempt(id: string, attempt: number): void {
    this.#lease.run(attempt, id);
  }

  setExpiry(id: string, expiresAt: number): void {
    this.#setExpiry.run(expiresAt, id);
  }

  get(id: string): JobRow | undefined {
    const r = this.#get.get(id) as Raw | undefined;
    return r && map(r);
  }

  /** A job row without its input (status reads: the input may be megabytes and is not shown). */
  getWithoutInput(id: string): (Omit<JobRow, 'input'> & { input: null }) | undefined {
    const r = this.#getLight.get(id) as Raw | undefined;
    return r && (map(r) as unknown as Omit<JobRow, 'input'> & { input: null });
  }

  /** Running jobs, then queued jobs oldest first (restart recovery), with `input` and `output` null. */
  active(): ActiveJobRow[] {
    const rows: ActiveJobRow[] = [];
    for (const stmt of [this.#activeRunning, this.#activeQueued]) {
      for (const r of stmt.all() as unknown[][]) {
        rows.push({
          id: r[0] as string, endpointId: r[1] as string, status: r[2] as JobStatus, input: null, extra: r[3] as string | null,
          webhook: r[4] as string | null, lowPriority: r[5] === 1, executionTimeoutMs: r[6] as number, ttlMs: r[7] as number,
          retentionMs: r[8] as number, attempt: r[9] as number, retries: r[10] as number, workerId: r[11] as string | null,
          output: null, error: null, createdAt: r[12] as number, startedAt: r[13] as number | null, completedAt: null, expiresAt: null,
        });
      }
    }
    return rows;
  }

  /** The raw input of a job, or undefined when there is no such row. */
  inputOf(id: string): string | undefined {
    return this.#input.get(id) as string | undefined;
  }

  /** Deletes expired rows; returns them (for job_counts). */
  deleteExpired(now: number): { endpointId: string; status: JobStatus; retries: number }[] {
    return this.#expire.all(now) as { endpointId: string; status: JobStatus; retries: number }[];
  }

  /** Finished-job counts of an endpoint (job_counts), and the retries of those jobs. */
  counts(endpointId: string): { byStatus: Partial<Record<JobStatus, number>>; retried: number } {
    const byStatus: Partial<Record<JobStatus, number>> = {};
    let retried = 0;
    for (const r of this.#counts.all(endpointId) as { status: JobStatus; jobs: number; retries: number }[]) {
      byStatus[r.status] = r.jobs;
      retried += r.retries;
    }
    return { byStatus, retried };
  }

  /** Adds to the finished-job counts (negative to take away). */
  addCount(endpointId: string, status: JobStatus, jobs: number, retries: number): void {
    this.#addCount.run(endpointId, status, jobs, retries);
  }

  dropCounts(endpointId: string): void {
    this.#dropCounts.run(endpointId);
  }

  /** The rowids in use now: an endpoint's rows are deleted slice by slice within them. */
  rowidRange(): { lo: number; hi: number } | undefined {
    const r = this.#rowidRange.get() as { lo: number | null; hi: number | null };
    return r.lo === null || r.hi === null ? undefined : { lo: r.lo, hi: r.hi };
  }

  /** Deletes an endpoint's rows with rowid in [from, to). */
  deleteSlice(endpointId: string, from: number, to: number): number {
    return this.#deleteSlice.run(from, to, endpointId).changes;
  }
}
