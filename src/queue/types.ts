import type { JobStatus } from '../store/index.js';

export type { JobStatus } from '../store/index.js';

export const TERMINAL: ReadonlySet<JobStatus> = new Set(['COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT']);

/** A job as the queue holds it in memory. Raw JSON stays text end to end. */
export interface Job {
  /** SQLite rowid, set when the insert runs (0 before); see the recovery floor in job-queue.ts. */
  rowid: number;
  /** Its insert is written or queued; false while a /runsync job's insert is deferred (job-queue.ts). */
  inserted: boolean;
  readonly id: string;
  readonly endpointId: string;
  status: JobStatus;
  /**
   * Raw JSON input; null while it lives only in SQLite (a job deep in a queue, or recovered
   * after a restart), loaded when a worker takes the job. Keeps a long backlog out of the heap.
   */
  input: string | null;
  /** Raw JSON object of extra keys for the worker (s3Config); null once it ended COMPLETED or CANCELLED (#finish). */
  extra: string | null;
  readonly webhook: string | null;
  readonly lowPriority: boolean;
  readonly executionTimeoutMs: number;
  readonly ttlMs: number;
  retentionMs: number;
  /** Fencing token: bumped on every claim; results for an older attempt are refused. */
  attempt: number;
  /** The attempt whose claim is in SQLite (claims are written late; see CLAIM_SAVE_DELAY_MS). */
  claimSaved: number;
  /** Write-batch sequence number of the job's last write (durable reads wait only while it is not). */
  writeSeq: number;
  /** Automatic and manual re-queues so far. */
  retries: number;
  workerId: string | null;
  /** The worker whose posted result ended the job (null when flashd ended it: cancel, timeout). */
  resultBy: string | null;
  output: string | null;
  error: string | null;
  /**
   * Latest progress update (raw JSON), shown as `output` while IN_PROGRESS; also in the row's
   * `output` column until the final state overwrites it, so a restart shows it again.
   */
  progress: string | null;
  /**
   * Seq of the next /stream chunk (the chunks themselves are in SQLite, job_chunks); -1 when
   * not known yet (a job read back from its row): read from the table at its first chunk.
   */
  streamSeq: number;
  createdAt: number;
  /** When the current run was queued (wall clock): `createdAt`, or the last /retry. TTL and delayTime count from it. */
  queuedAt: number;
  /**
   * How long the current run's lost attempts held the job, from each claim to its requeue (a
   * lapsed lease, a dead worker). Not time in the queue, so delayTime leaves it out.
   */
  lostMs: number;
  startedAt: number | null;
  /**
   * A ping of the worker that runs it listed it during the current run: that worker has
   * registered the job, so a stop for it ends at its first ping without it
   * (JobQueue.#requestStop), not only a re-offer period after the claim. Cleared at each claim.
   */
  pinged: boolean;
  completedAt: number | null;
  expiresAt: number | null;
  /**
   * A queued job's fences: each worker that may still run an old attempt of it (one that lost
   * its lease, one whose stop for an attempt flashd ended is pending), with until when
   * (monotonic) it is not handed to that worker; null when none. RunPod's protocol carries no
   * attempt number, so a result from that worker could not be told apart from a new attempt's.
   * Every such worker, not only the last holder: a job requeued or retried twice may still run
   * on both. A new Map at each requeue or /retry (HeldState keeps the old one); cleared at a claim.
   */
  fences: Map<string, number> | null;
  /**
   * Its queue's generation when it was last queued: a purge starts a new one, so a queued job
   * of an older generation is the purge's to end, no longer counted in the queue.
   */
  queueGen: number;
  /**
   * Characters of its input counted in the queue's budget of queued inputs kept in memory
   * (QueueSettings.queuedInputBytesInMemory); 0 when none are.
   */
  hotChars: number;
  /** Monotonic deadlines. */
  readonly ttlDeadline: number;
  leaseDeadline: number;
  execDeadline: number;
  /** /runsync callers waiting for a final state. */
  waiters: (() => void)[];
}

/** Counters of /health `workers`. */
export interface WorkerCounts {
  idle: number;
  initializing: number;
  ready: number;
  running: number;
  throttled: number;
  unhealthy: number;
}
