import type { Statement } from 'better-sqlite3';
import type { SecretBox } from '../core/secret-box.js';
import { vacuumInDataDir, type Db } from './db.js';

export type JobStatus = 'IN_QUEUE' | 'IN_PROGRESS' | 'COMPLETED' | 'FAILED' | 'CANCELLED' | 'TIMED_OUT';

/** A job row as stored. `input`, `output` and `extra` are raw JSON text. */
export interface JobRow {
  /** SQLite's rowid: insertion order, and what the recovery floor is measured in. */
  rowid: number;
  id: string;
  endpointId: string;
  status: JobStatus;
  input: string;
  /**
   * Extra keys handed to the worker with the job (s3Config, whose `accessSecret` is a
   * credential), as a JSON object text. Kept while a /retry may need them: NULL once the job
   * ends COMPLETED or CANCELLED, which can never be retried. Plain here and in memory; the
   * column holds it sealed (JobsRepo: core/secret-box.ts, `<data-dir>/secret.key`).
   */
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
  /** When the current run was queued: `createdAt`, or the time of the last /retry. */
  queuedAt: number;
  /** Time the current run's lost attempts held the job (claim to requeue): not queue time (delayTime). */
  lostMs: number;
  startedAt: number | null;
  completedAt: number | null;
  /**
   * When the result expires (wall clock ms). Negative once it expired while a webhook was still
   * owed: the row stays for that delivery, but it left job_counts at -expiresAt (uncountOwed),
   * so its deletion takes nothing off them again.
   */
  expiresAt: number | null;
  /**
   * A queued job: the workers it is fenced from (they may still run old attempts), as written by
   * encodeFences (decodeFences reads it), or null. A running job: those of its last requeue (the
   * claim leaves the column) and each worker told to stop an older attempt while it ran
   * (addRunningFence).
   */
  fencedFrom: string | null;
}

/**
 * The `fenced_from` text of a queued job fenced from `workerIds`: one id as it is (as migration
 * 10 wrote it), more as a JSON array of them; null for none.
 */
export function encodeFences(workerIds: Iterable<string>): string | null {
  const ids = [...workerIds];
  if (ids.length === 0) return null;
  return ids.length === 1 && !(ids[0] as string).startsWith('[') ? (ids[0] as string) : JSON.stringify(ids);
}

/** The worker ids in a `fenced_from` text (encodeFences). */
export function decodeFences(text: string | null): string[] {
  if (text === null || text === '') return [];
  if (text.startsWith('[')) {
    try {
      const ids: unknown = JSON.parse(text);
      if (Array.isArray(ids) && ids.every((id) => typeof id === 'string')) return ids as string[];
    } catch {
      // A worker id that starts with '[': itself.
    }
  }
  return [text];
}

/**
 * A queued or running job as recovery reads it: no input, no result; `progress` is the last
 * progress update of a running job (stored in `output` until its final state overwrites it).
 */
export type ActiveJobRow = Omit<JobRow, 'input'> & { input: null; progress: string | null };

/** What a queued job's insert writes. */
export type NewJob = Pick<JobRow, 'id' | 'endpointId' | 'extra' | 'webhook' | 'lowPriority' | 'executionTimeoutMs' | 'ttlMs' | 'retentionMs' | 'createdAt'>;

const INSERT_HEAD = `INSERT INTO jobs (id, endpoint_id, status, input, extra, webhook, low_priority, execution_timeout_ms, ttl_ms,
  retention_ms, attempt, retries, created_at) VALUES`;
const INSERT_ROW = "(?, ?, 'IN_QUEUE', ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)";
/** Rows per multi-row insert: 320 parameters, well under SQLite's limit of 32766. */
const INSERT_CHUNK = 32;

/**
 * The longest input kept in its job's row, in characters (migration 15): a longer one goes to
 * `job_inputs`, written once, and the row holds ''. A row with a 4 KB input no longer fits its
 * page (about 4,060 bytes at SQLite's default page size) and spills to overflow pages, which a
 * change of the row's size (a claim, each progress update, the final state) writes again.
 * Below this, the side table saves nothing: an update writes the row's leaf page either way
 * (`node bench/wal-input.mjs`), and the 1 KB inputs of the hot path stay one statement each.
 * 2,048 characters are at most 6 KB of UTF-8, and usually 2 KB.
 */
const INPUT_INLINE_MAX = 2048;

/** Active rows recovery reads per statement (see JobsRepo.active): about 2 MB of JSON. */
const ACTIVE_SLICE_ROWS = 8192;

const ascending = (rows: unknown[][]): boolean => {
  for (let i = 1; i < rows.length; i++) if ((rows[i - 1]![0] as number) > (rows[i]![0] as number)) return false;
  return true;
};

/** The settings key of the recovery floor (see JobsRepo.active). */
const FLOOR_KEY = 'jobs.recovery_floor';

/** Distinct extra keys whose sealed form JobsRepo keeps for reuse (see #seal). */
const SEAL_CACHE_MAX = 256;

/** Set by migration 14 while rows hold plain extra keys an older flashd wrote (see JobsRepo.sealPlainExtras). */
const UNSEALED_KEY = 'jobs.unsealed_extra';

/** An owed webhook's job (JobsRepo.owedWebhooks); null fields when the job's row is gone. */
export interface OwedWebhook {
  jobId: string;
  /** Tries made before (none a 2xx). */
  tries: number;
  status: JobStatus | null;
  webhook: string | null;
  endpointId: string | null;
}

interface Raw {
  rowid: number; id: string; endpoint_id: string; status: JobStatus; input: string; extra: string | null; webhook: string | null;
  low_priority: number; execution_timeout_ms: number; ttl_ms: number; retention_ms: number; attempt: number; retries: number;
  worker_id: string | null; output: string | null; error: string | null; created_at: number; queued_at: number | null; started_at: number | null;
  completed_at: number | null; expires_at: number | null; lost_ms: number; fenced_from: string | null;
}

const map = (r: Raw): JobRow => ({
  rowid: r.rowid, id: r.id, endpointId: r.endpoint_id, status: r.status, input: r.input, extra: r.extra, webhook: r.webhook,
  lowPriority: r.low_priority === 1, executionTimeoutMs: r.execution_timeout_ms, ttlMs: r.ttl_ms, retentionMs: r.retention_ms,
  attempt: r.attempt, retries: r.retries, workerId: r.worker_id, output: r.output, error: r.error, createdAt: r.created_at,
  queuedAt: r.queued_at ?? r.created_at, lostMs: r.lost_ms, startedAt: r.started_at, completedAt: r.completed_at, expiresAt: r.expires_at,
  fencedFrom: r.fenced_from,
});

/**
 * Job rows. Every state change is one statement with the expected current state in its
 * WHERE clause; callers run them inside the write batch's transaction.
 *
 * A job's extra keys (s3Config, whose `accessSecret` is a credential) are sealed by every
 * write of the column and opened by the reads that hand them on (get, active), so a copy of
 * flashd.db alone does not reveal them. A job without them costs nothing: NULL is not sealed.
 *
 * An input over INPUT_INLINE_MAX characters is written once, to job_inputs (migration 15), by
 * the insert; the row's `input` holds '' and inputOf and get read it from there.
 */
export class JobsRepo {
  readonly #db: Db;
  readonly #secrets: SecretBox;
  readonly #unreadable: (jobId: string, err: unknown) => void;
  /** Extra keys sealed or opened lately, both ways (see #seal): at most SEAL_CACHE_MAX each. */
  readonly #sealedOf = new Map<string, string>();
  readonly #openedOf = new Map<string, string>();
  readonly #insert: Statement;
  /** Multi-row inserts by row count (insertMany). */
  readonly #insertChunks: (Statement | undefined)[] = [];
  readonly #insertFinished: Statement;
  readonly #claim: Statement;
  readonly #finish: Statement;
  readonly #requeue: Statement;
  readonly #setExpiry: Statement;
  readonly #setRetention: Statement;
  readonly #get: Statement;
  readonly #active: Statement;
  readonly #getSetting: Statement;
  readonly #setSetting: Statement;
  readonly #expire: Statement;
  readonly #counts: Statement;
  readonly #addCount: Statement;
  readonly #dropCounts: Statement;
  readonly #rowidRange: Statement;
  readonly #deleteSlice: Statement;
  readonly #lease: Statement;
  readonly #input: Statement;
  readonly #inputAdd: Statement;
  readonly #inputSide: Statement;
  readonly #getLight: Statement;
  readonly #anyExpired: Statement;
  readonly #uncountOwed: Statement;
  readonly #outboxAdd: Statement;
  readonly #outboxDelete: Statement;
  readonly #outboxTried: Statement;
  readonly #outboxAll: Statement;
  readonly #owedOf: Statement;
  readonly #deleteOne: Statement;
  readonly #progress: Statement;
  readonly #chunkAdd: Statement;
  readonly #chunkNext: Statement;
  readonly #chunksRead: Statement;
  readonly #chunksDrop: Statement;
  readonly #chunksDropAll: Statement;
  readonly #chunkedJobs: Statement;
  readonly #endedByFlashd: Statement;
  readonly #setFence: Statement;
  readonly #runningFence: Statement;
  readonly #setRunningFence: Statement;

  /**
   * `secrets` seals extra keys at rest; `unreadable` hears of a row whose sealed extra keys do
   * not open (secret.key replaced or lost): the job is read without them.
   */
  constructor(db: Db, secrets: SecretBox, unreadable: (jobId: string, err: unknown) => void = () => undefined) {
    this.#db = db;
    this.#secrets = secrets;
    this.#unreadable = unreadable;
    this.#insert = db.prepare(`${INSERT_HEAD} ${INSERT_ROW}`);
    this.#insertFinished = db.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, extra, webhook, low_priority, execution_timeout_ms,
      ttl_ms, retention_ms, attempt, retries, worker_id, output, error, created_at, started_at, completed_at, expires_at)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`);
    this.#claim = db.prepare(`UPDATE jobs SET status = 'IN_PROGRESS', attempt = ?, worker_id = ?, started_at = ?
      WHERE id = ? AND status = 'IN_QUEUE'`);
    // A final state carries the claim too: a job that finishes quickly has its claim written here only.
    // It drops the extra keys when told (a credential a job that cannot be retried no longer needs).
    this.#finish = db.prepare(`UPDATE jobs SET status = ?, output = ?, error = ?, completed_at = ?, expires_at = ?, worker_id = ?,
      attempt = ?, started_at = ?, extra = CASE WHEN ? THEN NULL ELSE extra END WHERE id = ? AND status IN ('IN_QUEUE', 'IN_PROGRESS')`);
    this.#requeue = db.prepare(`UPDATE jobs SET status = 'IN_QUEUE', worker_id = NULL, output = NULL, error = NULL, started_at = NULL,
      completed_at = NULL, expires_at = NULL, ended_by_flashd = 0, retries = ?, attempt = ?, queued_at = ?, lost_ms = ?, fenced_from = ? WHERE id = ?`);
    // Migration 10: a queued job's fence set or ended outside a requeue (a ping, a worker letting go).
    this.#setFence = db.prepare("UPDATE jobs SET fenced_from = ? WHERE id = ? AND status = 'IN_QUEUE'");
    // A running job's row keeps the fence of its last requeue (the claim leaves it), and names a
    // worker whose stop for it began while it ran (addRunningFence).
    this.#runningFence = db.prepare("SELECT fenced_from FROM jobs WHERE id = ? AND status = 'IN_PROGRESS'").pluck();
    this.#setRunningFence = db.prepare("UPDATE jobs SET fenced_from = ? WHERE id = ? AND status = 'IN_PROGRESS'");
    // Migration 8: a FAILED row that flashd ended, not a worker's result (rare: attempts used up).
    this.#endedByFlashd = db.prepare("UPDATE jobs SET ended_by_flashd = 1 WHERE id = ? AND status = 'FAILED'");
    // A running job's last progress update, in `output` until its final state overwrites it (a
    // requeue NULLs it); never after the job left IN_PROGRESS.
    this.#progress = db.prepare("UPDATE jobs SET output = ? WHERE id = ? AND status = 'IN_PROGRESS'");
    this.#lease = db.prepare('UPDATE jobs SET attempt = ? WHERE id = ?');
    this.#setExpiry = db.prepare('UPDATE jobs SET expires_at = ?, retention_ms = ? WHERE id = ?');
    this.#setRetention = db.prepare('UPDATE jobs SET retention_ms = ? WHERE id = ?');
    this.#get = db.prepare('SELECT rowid, * FROM jobs WHERE id = ?');
    // Recovery reads only the small columns (inputs are loaded when taken, inputOf), in rowid
    // order from the recovery floor (no index of active jobs: the range scan finds them), a
    // slice of rows at a time as one JSON array that SQLite builds: SQLite's JSON and JSON.parse
    // make a row's array about three times faster than better-sqlite3 returning it as a row
    // (about 1.8 s against 5.4 s for 600k queued jobs), and a slice is garbage before the next
    // one is read. The aggregate keeps the subquery's rowid order (checked in active(); an
    // ORDER BY inside it would sort each slice again, a quarter of the read).
    this.#active = db.prepare(`SELECT json_group_array(json_array(rid, id, endpoint_id, status, extra, webhook, low_priority,
      execution_timeout_ms, ttl_ms, retention_ms, attempt, retries, worker_id, created_at, started_at, queued, progress, lost_ms,
      fenced_from)), max(rid) FROM (SELECT rowid AS rid, id, endpoint_id, status, extra, webhook, low_priority,
      execution_timeout_ms, ttl_ms, retention_ms, attempt, retries, worker_id, created_at, started_at,
      coalesce(queued_at, created_at) AS queued, CASE WHEN status = 'IN_PROGRESS' THEN output END AS progress, lost_ms, fenced_from
      FROM jobs WHERE rowid >= ? AND status IN ('IN_QUEUE', 'IN_PROGRESS') ORDER BY rowid LIMIT ?)`).raw();
    // Its own statements rather than IdentityRepo's get/putSetting: a write there moves the
    // identity generation and so empties the key cache, and the floor moves every second.
    this.#getSetting = db.prepare('SELECT value FROM settings WHERE key = ?').pluck();
    this.#setSetting = db.prepare('INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)');
    this.#input = db.prepare('SELECT input FROM jobs WHERE id = ?').pluck();
    // A long input (migration 15): its row holds '', the text is here, deleted with the row (trigger).
    this.#inputAdd = db.prepare('INSERT INTO job_inputs (job_id, input) VALUES (?, ?)');
    this.#inputSide = db.prepare('SELECT input FROM job_inputs WHERE job_id = ?').pluck();
    // Status reads: neither the input nor the (sealed) extra keys, which no view shows.
    this.#getLight = db.prepare(`SELECT rowid, id, endpoint_id, status, NULL AS input, NULL AS extra, webhook, low_priority, execution_timeout_ms, ttl_ms,
      retention_ms, attempt, retries, worker_id, output, error, created_at, queued_at, started_at, completed_at, expires_at, ended_by_flashd, lost_ms, fenced_from FROM jobs WHERE id = ?`);
    // At most `limit` rows a statement: results that expire together (a burst, a purge) are
    // deleted over several commits instead of one that holds the event loop.
    // A result still owed a webhook outlives its expiry until the webhook settles, so a restart
    // can still send it (the row answers no /status: find() leaves expired rows out).
    this.#expire = db.prepare(`DELETE FROM jobs WHERE rowid IN (SELECT rowid FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?
      AND NOT EXISTS (SELECT 1 FROM webhook_outbox WHERE job_id = jobs.id) LIMIT ?)
      RETURNING id, endpoint_id AS endpointId, status, retries, expires_at > 0 AS counted`);
    // A result that expired while its webhook is owed leaves job_counts at its expiry, like any
    // other (/health counts the results still kept), though its row stays for the delivery: its
    // expiry turns negative, which find() still reads as expired, so it is taken off once.
    this.#uncountOwed = db.prepare(`UPDATE jobs SET expires_at = -expires_at WHERE expires_at > 0 AND expires_at <= ?
      AND EXISTS (SELECT 1 FROM webhook_outbox WHERE job_id = jobs.id)
      RETURNING id, endpoint_id AS endpointId, status, retries`);
    this.#counts = db.prepare('SELECT status, jobs, retries FROM job_counts WHERE endpoint_id = ?');
    this.#addCount = db.prepare(`INSERT INTO job_counts (endpoint_id, status, jobs, retries) VALUES (?, ?, ?, ?)
      ON CONFLICT (endpoint_id, status) DO UPDATE SET jobs = jobs + excluded.jobs, retries = retries + excluded.retries`);
    this.#dropCounts = db.prepare('DELETE FROM job_counts WHERE endpoint_id = ?');
    // Two subqueries: SQLite reads a lone min() or max() of rowid off the end of the table's
    // b-tree, but both in one SELECT walk every row (a full scan of the id index inside the
    // DELETE request: 500k rows, ~55 ms of the event loop).
    this.#rowidRange = db.prepare('SELECT (SELECT min(rowid) FROM jobs) AS lo, (SELECT max(rowid) FROM jobs) AS hi');
    // A finished job still owed its webhook keeps its row for the body (JobQueue.dropEndpoint);
    // the row goes when the delivery settles (deleteJob).
    this.#deleteSlice = db.prepare(`DELETE FROM jobs WHERE rowid >= ? AND rowid < ? AND endpoint_id = ?
      AND (status IN ('IN_QUEUE', 'IN_PROGRESS') OR NOT EXISTS (SELECT 1 FROM webhook_outbox WHERE job_id = jobs.id))`);
    // CROSS JOIN keeps the outbox the outer loop: with a plain JOIN SQLite walks every row of
    // jobs for the endpoint_id test (no index by endpoint) and looks each up in the outbox, a
    // full scan inside the DELETE request (1M rows: ~330 ms of the event loop).
    this.#owedOf = db.prepare('SELECT o.job_id FROM webhook_outbox o CROSS JOIN jobs j ON j.id = o.job_id WHERE j.endpoint_id = ?').pluck();
    this.#deleteOne = db.prepare('DELETE FROM jobs WHERE id = ?');
    // Also an expired row owed a webhook that is still counted (uncountOwed).
    this.#anyExpired = db.prepare(`SELECT 1 FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?
      AND (expires_at > 0 OR NOT EXISTS (SELECT 1 FROM webhook_outbox WHERE job_id = jobs.id)) LIMIT 1`).pluck();
    // A /retry's run owes a new delivery: the first run's tries do not count against it.
    this.#outboxAdd = db.prepare('INSERT INTO webhook_outbox (job_id) VALUES (?) ON CONFLICT (job_id) DO UPDATE SET tries = 0');
    this.#outboxTried = db.prepare('UPDATE webhook_outbox SET tries = ? WHERE job_id = ?');
    this.#outboxDelete = db.prepare('DELETE FROM webhook_outbox WHERE job_id = ?');
    // In the order the jobs ended (then rowid), as they were first sent: the outbox is keyed by
    // job id, which sorts by creation. Each row finds its job by primary key and the few owed
    // are sorted apart (no index on jobs: each would cost every insert and finish).
    // The same lookup gives each job's status, URL and endpoint, without its input or output.
    this.#outboxAll = db.prepare(`SELECT o.job_id AS jobId, o.tries, j.status, j.webhook, j.endpoint_id AS endpointId
      FROM webhook_outbox o LEFT JOIN jobs j ON j.id = o.job_id ORDER BY j.completed_at, j.rowid`);
    // /stream chunks (migration 7): one row per chunk, read and deleted by a poll; the rest go
    // with their job's row (trigger) or a /retry.
    this.#chunkAdd = db.prepare('INSERT INTO job_chunks (job_id, seq, chunk) VALUES (?, ?, ?)');
    this.#chunkNext = db.prepare('SELECT coalesce(max(seq) + 1, 0) FROM job_chunks WHERE job_id = ?').pluck();
    this.#chunksRead = db.prepare('SELECT seq, chunk FROM job_chunks WHERE job_id = ? AND seq > ? AND seq <= ? ORDER BY seq').raw();
    this.#chunksDrop = db.prepare('DELETE FROM job_chunks WHERE job_id = ? AND seq <= ?');
    this.#chunksDropAll = db.prepare('DELETE FROM job_chunks WHERE job_id = ?');
    this.#chunkedJobs = db.prepare(`SELECT c.job_id, (SELECT endpoint_id FROM jobs WHERE id = c.job_id), max(c.seq)
      FROM job_chunks c GROUP BY c.job_id`).raw();
  }

  /**
   * The column's form of a job's extra keys: sealed (`v1.…`), NULL as NULL. A seal costs about
   * 15 µs (an AES-GCM context per value), as much again as the rest of a /run's insert, while
   * a client's jobs usually all carry the same s3Config: the sealed form of the last values
   * sealed or opened is reused (SEAL_CACHE_MAX). Rows with the same extra keys then hold the
   * same sealed text, which tells a reader of flashd.db only that they are equal.
   */
  #seal(extra: string | null): string | null {
    if (extra === null) return null;
    let sealed = this.#sealedOf.get(extra);
    if (sealed === undefined) {
      sealed = this.#secrets.seal(extra);
      this.#remember(extra, sealed);
    }
    return sealed;
  }

  #remember(plain: string, sealed: string): void {
    if (this.#sealedOf.size >= SEAL_CACHE_MAX) {
      this.#sealedOf.clear();
      this.#openedOf.clear();
    }
    this.#sealedOf.set(plain, sealed);
    this.#openedOf.set(sealed, plain);
  }

  /**
   * The extra keys of a stored column: opened, or as they are when plain (a JSON object, written
   * by an older flashd before sealPlainExtras ran). A sealed value that does not open is
   * reported and read as none.
   */
  #open(jobId: string, stored: string | null): string | null {
    if (stored === null || stored.startsWith('{')) return stored;
    const known = this.#openedOf.get(stored);
    if (known !== undefined) return known;
    try {
      const plain = this.#secrets.open(stored);
      this.#remember(plain, stored);
      return plain;
    } catch (err) {
      this.#unreadable(jobId, err);
      return null;
    }
  }

  /**
   * Seals the extra keys rows of an older flashd hold in plain text (migration 14 marks that
   * there are some; migration 11, that it cleared some), once; returns how many it sealed.
   * Called at start, before recovery. Sealing or clearing a value leaves its plain text in the
   * free space of its page, and pages an older flashd split or freed keep copies of cells, which
   * secure_delete does not reach: a VACUUM rebuilds the file from the rows alone, and the
   * checkpoint then empties the WAL. The mark goes after the VACUUM, so a start stopped before
   * it erases again. The VACUUM's temporary copy goes in the data directory (vacuumInDataDir).
   */
  sealPlainExtras(): number {
    if (this.#getSetting.get(UNSEALED_KEY) === undefined) return 0;
    const sealed = this.#db.transaction(() => {
      const rows = this.#db.prepare("SELECT rowid, extra FROM jobs WHERE extra GLOB '{*'").raw().all() as [number, string][];
      const update = this.#db.prepare('UPDATE jobs SET extra = ? WHERE rowid = ?');
      for (const [rowid, extra] of rows) update.run(this.#seal(extra), rowid);
      return rows.length;
    })();
    vacuumInDataDir(this.#db);
    this.#db.prepare('DELETE FROM settings WHERE key = ?').run(UNSEALED_KEY);
    this.#db.pragma('wal_checkpoint(TRUNCATE)');
    return sealed;
  }

  /**
   * What a new row's `input` column holds: the input, or '' when it is longer than
   * INPUT_INLINE_MAX, after writing it to job_inputs (in the caller's transaction).
   */
  #inputColumn(id: string, input: string): string {
    if (input.length <= INPUT_INLINE_MAX) return input;
    this.#inputAdd.run(id, input);
    return '';
  }

  /** A row's input: its `input` column, or the text in job_inputs when that is '' (undefined if missing). */
  #inputOfRow(id: string, stored: string): string | undefined {
    return stored === '' ? (this.#inputSide.get(id) as string | undefined) : stored;
  }

  /** Inserts a queued job; returns its rowid. */
  insert(j: NewJob, input: string): number {
    return this.#insert.run(j.id, j.endpointId, this.#inputColumn(j.id, input), this.#seal(j.extra), j.webhook, j.lowPriority ? 1 : 0, j.executionTimeoutMs, j.ttlMs, j.retentionMs, j.createdAt).lastInsertRowid as number;
  }

  /**
   * Inserts queued jobs (`inputs[i]` is the input of `jobs[i]`) with one multi-row statement
   * per INSERT_CHUNK of them, and returns the rowid of the first: the rows get consecutive
   * rowids (each new row takes the largest rowid + 1, and nothing else writes in between).
   * A group commit's /run inserts go through here: one statement for 32 rows costs about
   * 2 µs per job less than 32 statements (BENCHMARKS.md, "Session 10").
   */
  insertMany(jobs: readonly NewJob[], inputs: readonly string[]): number {
    let first = 0;
    for (let at = 0; at < jobs.length; at += INSERT_CHUNK) {
      const n = Math.min(INSERT_CHUNK, jobs.length - at);
      const args: unknown[] = new Array(n * 10);
      for (let i = 0, k = 0; i < n; i++) {
        const j = jobs[at + i] as NewJob;
        args[k++] = j.id;
        args[k++] = j.endpointId;
        args[k++] = this.#inputColumn(j.id, inputs[at + i] as string);
        args[k++] = this.#seal(j.extra);
        args[k++] = j.webhook;
        args[k++] = j.lowPriority ? 1 : 0;
        args[k++] = j.executionTimeoutMs;
        args[k++] = j.ttlMs;
        args[k++] = j.retentionMs;
        args[k++] = j.createdAt;
      }
      const last = this.#insertN(n).run(args).lastInsertRowid as number;
      if (at === 0) first = last - n + 1;
    }
    return first;
  }

  /** The statement inserting `n` queued jobs, prepared on first use. */
  #insertN(n: number): Statement {
    let s = this.#insertChunks[n];
    if (!s) {
      s = n === 1 ? this.#insert : this.#db.prepare(`${INSERT_HEAD} ${Array.from({ length: n }, () => INSERT_ROW).join(', ')}`);
      this.#insertChunks[n] = s;
    }
    return s;
  }

  /** Inserts a job already in its final state (a /runsync job written once, at the end); returns its rowid. */
  insertFinished(j: Omit<JobRow, 'rowid' | 'input' | 'fencedFrom'>, input: string): number {
    return this.#insertFinished.run(j.id, j.endpointId, j.status, this.#inputColumn(j.id, input), this.#seal(j.extra), j.webhook, j.lowPriority ? 1 : 0, j.executionTimeoutMs, j.ttlMs,
      j.retentionMs, j.attempt, j.retries, j.workerId, j.output, j.error, j.createdAt, j.startedAt, j.completedAt, j.expiresAt).lastInsertRowid as number;
  }

  claim(id: string, attempt: number, workerId: string, startedAt: number): void {
    this.#claim.run(attempt, workerId, startedAt, id);
  }

  /** A queued or running job's final state; `dropExtra` also clears its extra keys (see JobQueue's #finish). */
  finish(id: string, status: JobStatus, output: string | null, error: string | null, completedAt: number, expiresAt: number,
    workerId: string | null, attempt: number, startedAt: number | null, dropExtra: boolean): void {
    this.#finish.run(status, output, error, completedAt, expiresAt, workerId, attempt, startedAt, dropExtra ? 1 : 0, id);
  }

  /** The job's webhook is owed (written with its final state). */
  webhookOwed(id: string): void {
    this.#outboxAdd.run(id);
  }

  /** The job's webhook has made `tries` tries, none a 2xx (a start goes on at the next one). */
  webhookTried(id: string, tries: number): void {
    this.#outboxTried.run(tries, id);
  }

  /** The job's webhook was delivered, or its tries ran out. */
  webhookSettled(id: string): void {
    this.#outboxDelete.run(id);
  }

  /**
   * The webhooks still owed, in the order their jobs ended (then rowid; those whose job is gone
   * first, with null status, URL and endpoint), each with its job's status, URL and endpoint,
   * read without the input or output (JobQueue.webhooksOwed at start).
   */
  owedWebhooks(): OwedWebhook[] {
    return this.#outboxAll.all() as OwedWebhook[];
  }

  /** Ids of the jobs whose webhook is still owed, in that order. */
  webhooksOwed(): string[] {
    return this.owedWebhooks().map((w) => w.jobId);
  }

  /** Ids of an endpoint's jobs still owed a webhook (few: the outbox is read, each job by its key). */
  webhooksOwedOf(endpointId: string): string[] {
    return this.#owedOf.all(endpointId) as string[];
  }

  /** Deletes one job's row (a deleted endpoint's job, once its webhook settled). */
  deleteJob(id: string): void {
    this.#deleteOne.run(id);
  }

  /**
   * Back to the queue (lease lost, reclaimed, or a manual retry): same id and input.
   * `fencedFrom`: the workers that may still run old attempts (see Job.fences), encodeFences' text.
   */
  requeue(id: string, retries: number, attempt: number, queuedAt: number, lostMs: number, fencedFrom: string | null): void {
    this.#requeue.run(retries, attempt, queuedAt, lostMs, fencedFrom, id);
  }

  /** A queued job's fences: the workers it is fenced from (encodeFences), or null when none (a no-op once not queued). */
  setFence(id: string, fencedFrom: string | null): void {
    this.#setFence.run(fencedFrom, id);
  }

  /**
   * Adds `workerId` to a running job's `fenced_from` (a no-op when the row names it already or
   * the job is not running): a worker told to stop an older attempt while the job runs on
   * another, so a restart still knows it may run one (JobQueue.#bootFences). Read and written
   * in the same transaction, after the writes queued before it, so a requeue's fence in the
   * same commit is kept.
   */
  addRunningFence(id: string, workerId: string): void {
    const text = this.#runningFence.get(id) as string | null | undefined;
    if (text === undefined) return;
    const ids = decodeFences(text);
    if (ids.includes(workerId)) return;
    this.#setRunningFence.run(encodeFences([...ids, workerId]), id);
  }

  /** How long the result of an unfinished job will be kept (`/status?ttl=`). */
  setRetention(id: string, retentionMs: number): void {
    this.#setRetention.run(retentionMs, id);
  }

  /** Records a new attempt number for a job that keeps running (restart reclaim). */
  setAttempt(id: string, attempt: number): void {
    this.#lease.run(attempt, id);
  }

  /** A finished job's expiry and the retention it came from (`/status?ttl=`; a /retry's run keeps it). */
  setExpiry(id: string, expiresAt: number, retentionMs: number): void {
    this.#setExpiry.run(expiresAt, retentionMs, id);
  }

  /** A job row; `extra: false` leaves its sealed extra keys unopened (`extra` null), for readers that never use them. */
  get(id: string, options: { extra?: boolean } = {}): JobRow | undefined {
    const r = this.#get.get(id) as Raw | undefined;
    if (!r) return undefined;
    const row = map(r);
    // A long input whose job_inputs row is missing (never: written and deleted with the row) reads as null.
    row.input = this.#inputOfRow(row.id, row.input) ?? 'null';
    row.extra = options.extra === false ? null : this.#open(row.id, row.extra);
    return row;
  }

  /**
   * A job row without its input (status reads: the input may be megabytes and is not shown)
   * and without its extra keys (`extra` null: no view shows them; get() opens them).
   * `endedByFlashd`: a FAILED row flashd ended itself rather than recorded from its worker.
   */
  getWithoutInput(id: string): (Omit<JobRow, 'input'> & { input: null; endedByFlashd: boolean }) | undefined {
    const r = this.#getLight.get(id) as (Raw & { ended_by_flashd: number }) | undefined;
    return r && { ...(map(r) as unknown as Omit<JobRow, 'input'> & { input: null }), endedByFlashd: r.ended_by_flashd === 1 };
  }

  /** Marks a FAILED row as ended by flashd (attempts used up), not by its worker's result. */
  markEndedByFlashd(id: string): void {
    this.#endedByFlashd.run(id);
  }

  /**
   * Queued and running jobs (restart recovery), with `input` and `output` null, in rowid
   * (insertion) order, read `sliceRows` at a time as the caller goes. Only rows at or above the
   * recovery floor are read; the queue keeps every active row there (`floor`, `setFloor`).
   */
  *active(floor: number, sliceRows = ACTIVE_SLICE_ROWS): Generator<ActiveJobRow> {
    for (let from = floor; ;) {
      const [json, last] = this.#active.get(from, sliceRows) as [string, number | null];
      if (last === null) return;
      from = last + 1;
      const rows = JSON.parse(json) as unknown[][];
      if (!ascending(rows)) rows.sort((a, b) => (a[0] as number) - (b[0] as number));
      for (const r of rows) {
        yield {
          rowid: r[0] as number, id: r[1] as string, endpointId: r[2] as string, status: r[3] as JobStatus, input: null,
          extra: this.#open(r[1] as string, r[4] as string | null),
          webhook: r[5] as string | null, lowPriority: r[6] === 1, executionTimeoutMs: r[7] as number, ttlMs: r[8] as number,
          retentionMs: r[9] as number, attempt: r[10] as number, retries: r[11] as number, workerId: r[12] as string | null,
          output: null, error: null, createdAt: r[13] as number, queuedAt: r[15] as number, lostMs: r[17] as number, startedAt: r[14] as number | null, completedAt: null,
          expiresAt: null, fencedFrom: r[18] as string | null, progress: r[16] as string | null,
        };
      }
    }
  }

  /** The recovery floor: no queued or running job has a lower rowid (0 when never set: read all). */
  floor(): number {
    const v = this.#getSetting.get(FLOOR_KEY) as string | undefined;
    const n = v === undefined ? 0 : Number(v);
    return Number.isSafeInteger(n) && n > 0 ? n : 0;
  }

  setFloor(rowid: number): void {
    this.#setSetting.run(FLOOR_KEY, String(rowid));
  }

  /** The raw input of a job (from job_inputs when long), or undefined when there is no such row. */
  inputOf(id: string): string | undefined {
    const stored = this.#input.get(id) as string | undefined;
    return stored === undefined ? undefined : this.#inputOfRow(id, stored);
  }

  /** Whether a row's result has expired (one index probe: the expiry sweep runs every second). */
  anyExpired(now: number): boolean {
    return this.#anyExpired.get(now) !== undefined;
  }

  /**
   * Deletes expired rows (their stream chunks go with them: trigger); returns them (for
   * job_counts: `counted` is 0 for a row that already left them, uncountOwed).
   */
  deleteExpired(now: number, limit: number): { id: string; endpointId: string; status: JobStatus; retries: number; counted: number }[] {
    return this.#expire.all(now, limit) as { id: string; endpointId: string; status: JobStatus; retries: number; counted: number }[];
  }

  /**
   * Expired rows kept for a webhook still owed, not yet taken off job_counts: marked taken off
   * (a negative expires_at) and returned, so the caller takes them off in the same write.
   */
  uncountOwed(now: number): { id: string; endpointId: string; status: JobStatus; retries: number }[] {
    return this.#uncountOwed.all(now) as { id: string; endpointId: string; status: JobStatus; retries: number }[];
  }

  /** A running job's latest progress update (raw JSON); a no-op once the job left IN_PROGRESS. */
  setProgress(id: string, progress: string): void {
    this.#progress.run(progress, id);
  }

  /** Stores one /stream chunk (the JSON text of one element of `stream`). */
  addChunk(jobId: string, seq: number, chunk: string): void {
    this.#chunkAdd.run(jobId, seq, chunk);
  }

  /** One past the highest chunk seq stored for the job (0 when it has none). */
  nextChunkSeq(jobId: string): number {
    return this.#chunkNext.get(jobId) as number;
  }

  /**
   * The job's chunks after `after` up to `upTo`, in order, until their text reaches `maxBytes` bytes of
   * UTF-8, as a reply sends it (at least one): `last` is the seq of the last one read (`after` when
   * none). Bytes, not characters: a chunk of CJK text or emoji is up to 3 bytes a character.
   */
  chunks(jobId: string, after: number, upTo: number, maxBytes: number): { chunks: string[]; last: number } {
    const chunks: string[] = [];
    let last = after;
    let size = 0;
    for (const [seq, chunk] of this.#chunksRead.iterate(jobId, after, upTo) as IterableIterator<[number, string]>) {
      // A chunk is stored as the JSON text it is served as, so its UTF-8 length is what it adds.
      const bytes = Buffer.byteLength(chunk, 'utf8');
      if (chunks.length > 0 && size + bytes > maxBytes) break;
      chunks.push(chunk);
      size += bytes;
      last = seq;
    }
    return { chunks, last };
  }

  /** Deletes the job's chunks up to `upTo` (read by a poll). */
  dropChunks(jobId: string, upTo: number): void {
    this.#chunksDrop.run(jobId, upTo);
  }

  /** Deletes every chunk of the job (a /retry starts a new run). */
  dropAllChunks(jobId: string): void {
    this.#chunksDropAll.run(jobId);
  }

  /**
   * Jobs that have stored chunks (read at start): id, endpoint (null when the job row is gone)
   * and the highest seq.
   */
  chunkedJobs(): { jobId: string; endpointId: string | null; maxSeq: number }[] {
    return (this.#chunkedJobs.all() as [string, string | null, number][]).map(([jobId, endpointId, maxSeq]) => ({ jobId, endpointId, maxSeq }));
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

  /** Deletes an endpoint's rows with rowid in [from, to), but for finished jobs still owed a webhook. */
  deleteSlice(endpointId: string, from: number, to: number): number {
    return this.#deleteSlice.run(from, to, endpointId).changes;
  }
}
