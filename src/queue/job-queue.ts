/**
 * The job lifecycle. Memory holds the queues, leases and parked long-polls; SQLite holds the
 * truth. Every state change is one named function here (submit, claim, progress, complete,
 * fail, requeue, timeOut, cancel, retry, purge) that checks the current state first and writes
 * one conditional statement through the group-commit batch. A job can therefore finish once:
 * a result for another worker or an older attempt is refused as stale.
 *
 * Execution is at least once: a job whose worker dies or loses its lease goes back to the
 * queue, at most `maxAttempts` times. Completion is recorded exactly once.
 *
 * Restart recovery reads the jobs table from the recovery floor up (there is no index of active
 * jobs; migration 4). The invariant, kept inside the same transactions as the writes it covers:
 * every queued or running row has a rowid at or above the floor stored in settings.
 * - A row that becomes active with a lower rowid lowers the floor in its own transaction: an
 *   insert given a reused rowid, a /retry of an old job.
 * - The floor rises to the lowest rowid of an active job in memory (#lowestActiveRowid), computed
 *   inside the commit that writes it, so memory and rows agree at that point; never while an
 *   endpoint's rows are still being deleted (they are active rows memory no longer holds).
 */
import type { Cancellation } from '../core/abort.js';
import type { Clock } from '../core/clock.js';
import { AgentError, storageUnavailable } from '../core/errors.js';
import { newJobId } from '../core/ids.js';
import type { Logger } from '../core/logger.js';
import { decodeFences, encodeFences, type ActiveJobRow, type JobRow, type JobsRepo, type WriteBatch } from '../store/index.js';
import { Deque } from './deque.js';
import { MinHeap } from './min-heap.js';
import { TERMINAL, type Job, type JobStatus, type WorkerCounts } from './types.js';
import { webhookBody, type JobSnapshot } from './views.js';
import type { WorkerInfo, WorkerRegistry } from './workers.js';

export interface QueueSettings {
  /** A claimed job's lease; renewed by its worker's pings that list it and its result, stream and progress posts. */
  leaseMs: number;
  /** How long job-take and job-stop hold an idle request (must stay under the SDK's 90 s). */
  takeHoldMs: number;
  /** Claims per job before it fails for good (worker deaths, lost leases). */
  maxAttempts: number;
  runRetentionMs: number;
  syncRetentionMs: number;
  maxSyncRetentionMs: number;
  /** Default `policy.ttl`: queue plus execution time. */
  defaultTtlMs: number;
  /** Largest stream chunk; larger outputs are split. */
  streamChunkBytes: number;
  /**
   * Finished jobs kept in memory for /status (older ones are read from SQLite by id). Few: a
   * finished job that stays in the heap for seconds is copied by every young-generation GC and
   * then promoted, which cost more than the SQLite reads it saves.
   */
  finishedInMemory: number;
  /**
   * Also at most this many characters of output and error over the finished jobs kept in
   * memory: results may be 64 MiB each, and 2,000 of them would hold gigabytes. Past it, the
   * oldest finished jobs whose final write is durable leave memory and are read from SQLite.
   */
  finishedBytesInMemory: number;
  /**
   * At most this many characters of input over the queued jobs that keep theirs in memory (the
   * first HOT_QUEUE_DEPTH of each endpoint): inputs may be 20 MiB each, so the per-endpoint
   * count alone let a few endpoints hold gigabytes. Past it a queued job's input waits in
   * SQLite only and is read back when a worker takes it, as for a job deep in its queue.
   */
  queuedInputBytesInMemory: number;
}

export const DEFAULT_QUEUE_SETTINGS: QueueSettings = {
  leaseMs: 30_000,
  takeHoldMs: 55_000,
  maxAttempts: 3,
  runRetentionMs: 30 * 60_000,
  syncRetentionMs: 60_000,
  maxSyncRetentionMs: 5 * 60_000,
  defaultTtlMs: 24 * 3_600_000,
  streamChunkBytes: 1024 * 1024,
  finishedInMemory: 2_000,
  finishedBytesInMemory: 64 * 1024 * 1024,
  queuedInputBytesInMemory: 256 * 1024 * 1024,
};

export interface SubmitInput {
  endpointId: string;
  /** Raw JSON of `input`. */
  input: string;
  /** Raw JSON object of extra keys for the worker, or null. */
  extra: string | null;
  webhook: string | null;
  executionTimeoutMs: number;
  ttlMs: number;
  lowPriority: boolean;
  retentionMs: number;
}

export interface QueueListener {
  /** A job became available (submit or requeue): wake the autoscaler. */
  jobQueued?(endpointId: string): void;
  /** A worker asked to be recycled (stopPod / refresh_worker). */
  recycleWorker?(endpointId: string, workerId: string): void;
  /**
   * A job reached a final state, after commit. `hookBody()` renders what its webhook POSTs (the
   * final status body plus `input` and `webhook`, views.ts webhookBody) from what the job held;
   * undefined without one. A delivery that cannot start now drops it and builds the same body
   * from the row when its turn comes (JobQueue.webhookBody).
   */
  finished?(job: Job, hookBody: (() => string) | undefined): void;
  /** A finished job began a new run (/retry): its final status is no longer final. */
  retried?(job: Job): void;
  /**
   * flashd ended a job a worker was running (an execution timeout, a TTL, a /cancel): the worker
   * is told to stop it (job-stop). `why`: how it ended (`cancelled`, `timed out: …`).
   */
  endedOnWorker?(job: Job, workerId: string, why: string): void;
  /** A worker's ping said it is unhealthy (runpod-python's failed fitness check), with what it said. */
  workerUnhealthy?(endpointId: string, workerId: string, report: UnhealthyReport): void;
}

/**
 * What a worker's `ping?status=unhealthy&check=…&reason=…` says (runpod-python's fitness-check
 * report, research/worker-protocol.md §1.12): each empty when not given.
 */
export interface UnhealthyReport {
  check: string;
  reason: string;
}

/** A job handed to a worker: its input is in memory. */
export type ClaimedJob = Job & { input: string };

interface Taker {
  worker: WorkerInfo;
  max: number;
  /** Whether the credential that parked this take may still be handed jobs (see take). */
  allowed: (() => boolean) | undefined;
  resolve(jobs: ClaimedJob[]): void;
}

class EndpointQueue {
  // Replaced whole by a purge (it takes the old ones).
  retry = new Deque<Job>();
  normal = new Deque<Job>();
  low = new Deque<Job>();
  /** Raised by each purge (see Job.queueGen); unique across queues, so a queue made anew never reuses one. */
  gen: number;
  queued = 0;
  lowQueued = 0;
  /** Sum of `retries` over the queued jobs (`/health` reads it; walking a backlog per call would not scale). */
  queuedRetries = 0;
  /**
   * Ids of the queued jobs by TTL deadline, an entry per enqueue, so the reaper looks only at
   * the jobs that expire (a walk of the backlog whenever a lower bound was due made a few
   * short-TTL jobs among a long backlog a walk of all of it every second). Entries go lazily
   * (see reap): ids, not jobs, so an entry left behind holds no finished job (and its output)
   * in memory. Replaced whole by a purge; rebuilt from the deques once stale entries dominate.
   */
  ttls = new MinHeap<string>();
  inProgress = 0;
  /** Of inProgress, the low-priority ones (they never count toward a scale-up). */
  lowInProgress = 0;
  takers: Taker[] = [];
  /**
   * The deques purges in flight took from this queue (see purge): their jobs still IN_QUEUE
   * are in no other list, so deleting the endpoint must find them here.
   */
  held: Deque<Job>[][] = [];

  constructor(gen: number) {
    this.gen = gen;
  }

  /** Counts a job that leaves the queue (taken, cancelled, expired, dropped). */
  left(job: Job): void {
    if (job.lowPriority) this.lowQueued--;
    else this.queued--;
    this.queuedRetries -= job.retries;
  }
}

/**
 * `duplicate`: only a re-post of this same worker's result, already recorded for the job (a
 * lost acknowledgement). `ended`: flashd ended the job (cancel, timeout, attempts used up)
 * while this worker held it, also when a /retry has started a new run since (WorkerInfo.ended);
 * the late result is discarded with a 2xx, because runpod-python logs every 4xx on a result
 * post as an ERROR and a cancelled job is no fault of the worker.
 * `finished`: a progress update or stream chunk from the worker whose own result already ended
 * the job: no re-post of that result, so not `duplicate`; discarded with a 2xx, as `ended` is.
 * `stale`: the job moved on without this worker (lost lease, another worker's result): 409.
 */
export type DoneOutcome = 'accepted' | 'duplicate' | 'finished' | 'ended' | 'stale' | 'unknown';

/** `{"output":}` and `,"metrics":`: what a /stream element adds to its piece and its metrics. */
const ELEMENT_BYTES = 11;
const METRICS_BYTES = 11;
/**
 * Room kept in each piece of a split chunk for its marker members, `,"part":I,"parts":N` with I
 * and N of `digits` digits, and `,"json":true` when the pieces are JSON text.
 */
const splitBytes = (digits: number, json: boolean): number => ',"part":,"parts":'.length + 2 * digits + (json ? ',"json":true'.length : 0);

/** The marker members of piece `i` (1-based) of `n`: a client joins pieces 1..n back into the chunk. */
const splitMarker = (i: number, n: number, json: boolean): string => `,"part":${i},"parts":${n}${json ? ',"json":true' : ''}`;

/**
 * Splits `text` into JSON string literals (as JSON.stringify writes them) whose UTF-8 encoding,
 * quotes and escapes included, is at most `firstBudget` bytes for the first and `budget` for the
 * others, each as large as fits, never between the two halves of a surrogate pair (an emoji:
 * each half alone is not text). One pass over the text, each piece sliced and stringified once.
 */
function jsonStringPieces(text: string, firstBudget: number, budget: number, emit: (piece: string, bytes: number, first: boolean) => void): void {
  let start = 0;
  let room = Math.max(8, firstBudget) - 2; // the quotes
  let used = 0;
  const cut = (end: number) => {
    emit(JSON.stringify(text.slice(start, end)), used + 2, start === 0);
    start = end;
    used = 0;
    room = Math.max(8, budget) - 2;
  };
  for (let i = 0; i < text.length; ) {
    const c = text.charCodeAt(i);
    let units = 1;
    let bytes: number;
    if (c < 0x80) {
      if (c >= 0x20) bytes = c === 0x22 || c === 0x5c ? 2 : 1;
      else bytes = c === 0x08 || c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d ? 2 : 6;
    } else if (c < 0x800) {
      bytes = 2;
    } else if (c >= 0xd800 && c <= 0xdfff) {
      const next = text.charCodeAt(i + 1);
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        units = 2;
        bytes = 4;
      } else {
        bytes = 6; // a lone surrogate: JSON.stringify writes it as \udxxx
      }
    } else {
      bytes = 3;
    }
    if (used + bytes > room && used > 0) cut(i);
    used += bytes;
    i += units;
  }
  if (used > 0 || start === 0) cut(text.length);
}

const ENDED_BY_FLASHD: ReadonlySet<JobStatus> = new Set(['CANCELLED', 'TIMED_OUT', 'FAILED']);

/**
 * Whether a finished row holds this worker's own posted result: COMPLETED, or FAILED by its
 * result rather than by flashd (migration 8; a job flashd ended while the worker held it is not).
 */
const postedByRow = (row: Omit<JobRow, 'input'> & { endedByFlashd: boolean }, workerId: string): boolean =>
  row.workerId === workerId && (row.status === 'COMPLETED' || (row.status === 'FAILED' && !row.endedByFlashd));

/** Queued again by `/retry` (a new run: attempts start again, queued_at is the retry's time). */
/**
 * The error of a job whose TTL ran out while it was queued: never taken, or taken and put back
 * after its worker was lost (`attempt` counts those runs; a /retry starts it again at 0).
 */
const queuedExpiry = (job: { attempt: number }): string => (job.attempt === 0
  ? 'Job expired in the queue before a worker took it (policy.ttl).'
  : `Job expired in the queue (policy.ttl) while waiting to run again, after ${job.attempt === 1 ? 'its worker was lost' : `losing its worker ${job.attempt} times`}.`);

const manuallyRetried = (row: ActiveJobRow): boolean => row.attempt === 0 && row.queuedAt > row.createdAt;

/**
 * Recovered queued rows in the order they were queued. They come in rowid (insert) order, but a
 * `/retry` queues an old row again behind newer ones: such a row waits here and is let out, by
 * its queued_at, before the first later row created after it was retried (or at the end), so a
 * restart does not move a retried job to the front. Rows stream through (`before`), a slice of
 * the backlog in memory at a time.
 */
class QueueOrder {
  readonly #waiting: ActiveJobRow[] = [];

  /** The rows that go in line before `row` (a queued row that is not a manual retry), oldest first. */
  *before(row: ActiveJobRow): Generator<ActiveJobRow> {
    while (this.#waiting.length > 0 && (this.#waiting[0] as ActiveJobRow).queuedAt < row.createdAt) yield this.#waiting.shift() as ActiveJobRow;
  }

  hold(row: ActiveJobRow): void {
    let i = this.#waiting.length;
    while (i > 0 && (this.#waiting[i - 1] as ActiveJobRow).queuedAt > row.queuedAt) i--;
    this.#waiting.splice(i, 0, row);
  }

  /** The retried rows still waiting once every row was read. */
  rest(): ActiveJobRow[] {
    return this.#waiting.splice(0);
  }
}

/**
 * Shared empty list: most jobs never get a /runsync waiter, so a job gets its own array on
 * first use (frozen, so a push onto the shared one fails loudly).
 */
const NO_WAITERS: (() => void)[] = Object.freeze([]) as unknown as (() => void)[];
const NOOP = (): void => undefined;

/**
 * Python's truth test, which runpod-python applies to a handler's `error` (worker-protocol.md
 * §1.7 "any truthy error"): null, false, 0, '' and empty lists and objects are falsy.
 */
function truthy(v: unknown): boolean {
  if (v === undefined || v === null || v === false || v === 0 || v === '') return false;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === 'object') return Object.keys(v).length > 0;
  return true;
}

/** What a finished job holds in memory for /status: its output and error (unchanged once final). */
function heldChars(j: Job): number {
  return (j.output?.length ?? 0) + (j.error?.length ?? 0);
}

/** The 404 of a job id that names no job of the endpoint, or one whose result expired. */
export function jobNotFound(jobId: string): AgentError {
  return new AgentError('NOT_FOUND', `Job ${jobId} not found (unknown, or its result expired).`);
}

/** Wakes the /runsync calls waiting on `job` (each once). */
function wakeWaiters(job: Job): void {
  if (job.waiters === NO_WAITERS) return;
  const waiters = job.waiters;
  job.waiters = NO_WAITERS;
  for (const w of waiters) w();
}

/** A job-take of `worker` was answered with `got` of the `asked` jobs (see WorkerRegistry.returningMs). */
function answered(worker: WorkerInfo, got: number, asked: number, mono: number): void {
  worker.answeredAt = mono;
  worker.wantsMore = got < Math.max(1, asked);
}

/** An empty answer after `ms`, or at once when the client goes away first. */
function drained<T>(cancel: Cancellation | AbortSignal, ms: number): Promise<T[]> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      unhook();
      resolve([]);
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      resolve([]);
    };
    let unhook: () => void;
    if ('onAbort' in cancel) unhook = cancel.onAbort(onAbort);
    else {
      cancel.addEventListener('abort', onAbort, { once: true });
      unhook = () => cancel.removeEventListener('abort', onAbort);
    }
  });
}

/**
 * A job whose /stream chunks (in SQLite, job_chunks) are not all read yet. Kept apart from the
 * Job, which may leave memory (#evict) while its chunks wait: a poll reads SQLite only when
 * this says there is something new, and only chunks whose post was acknowledged.
 */
interface UnreadStream {
  readonly endpointId: string;
  /** Chunks up to this seq are durable and their post was answered: a poll may hand them out. */
  upTo: number;
  /** Chunks up to this seq were handed out (their delete is queued or done). */
  read: number;
}

/**
 * A claim is written to SQLite only once its job has run this long (ms). Most jobs finish
 * sooner and are then written once, by their final state, instead of twice. A crash inside
 * this window forgets the claim: the job is queued again after the restart, which at-least-once
 * execution allows, and the old attempt's result is refused as stale.
 */
const CLAIM_SAVE_DELAY_MS = 100;
/**
 * The most chunk text one /stream poll hands out, in bytes of UTF-8 as the reply sends it, not
 * characters (a chunk of 1 MB is a third as many characters of CJK text; chunks are at most 1 MB
 * each, so at least 16 a poll):
 * a job can hold gigabytes of unread chunks, and one reply with all of them would hold them in
 * memory at once, or fail past V8's longest string and lose them. The rest go to the next
 * poll; runpod-python's `stream()` polls on while a poll returns chunks, final status or not.
 */
export const STREAM_POLL_BYTES = 16 * 1024 * 1024;

/** The longest delay a Node timer holds (2^31 − 1 ms); a later deadline is looked at again then. */
const MAX_TIMER_MS = 2_147_483_647;

/**
 * A /runsync job is inserted only once it has existed this long (ms) without finishing; one
 * that finishes sooner is written once, by its final state. Nobody was told of it before its
 * result (the 200 of /runsync carries the result, or the id once the job is written), so a
 * crash inside this window loses a job whose caller only sees its connection break.
 */
const SYNC_INSERT_DELAY_MS = 100;

/**
 * Rowids per slice when an endpoint's jobs are deleted (see #deleteRows), so at most this many
 * rows a commit: about 5 µs a row (the row, its id and expiry index entries, the stream-chunk
 * trigger, its pages written to the WAL at commit), a few ms of the event loop a slice.
 */
const DELETE_SLICE_ROWS = 1_000;

/**
 * Jobs of a deleted endpoint taken out of memory per event-loop turn (see dropEndpoint): 0.4 to
 * 1.7 µs a job (its map entry, set entries and waiters; measured with 400k jobs in memory), so
 * about 1 to 3.5 ms a turn.
 */
const DROP_SLICE_JOBS = 2_000;

/** Expired rows deleted per commit (see expire). */
export const EXPIRE_SLICE_ROWS = 2_000;

/** Ended jobs a queue's deques may hold before the reaper compacts them (see reap). */
const DEAD_QUEUED_COMPACT = 1024;

/** Jobs ended per commit by a purge (see purge): the event loop runs between slices. */
export const PURGE_SLICE_JOBS = 2_000;

/**
 * Queued jobs the reaper expires (policy.ttl) per pass: a backlog whose TTLs ran out together
 * (a weekend without workers, a restart after them) is ended a slice per commit, the next pass
 * once that commit is in, rather than in one pass and one commit holding the event loop.
 */
export const EXPIRE_QUEUED_SLICE_JOBS = 2_000;

/**
 * Running jobs the reaper ends per pass (a lapsed lease requeued or failed, an execution timeout,
 * a TTL): a node holding many jobs that dies (64,000 over 1,000 workers) has every lease lapse
 * together, and each requeue costs its fences, stop, queue entry and row write (about 30 µs, a
 * further 10 µs in the commit). They are ended a slice per commit, the next pass once that
 * commit is in, rather than in one pass and one commit holding the event loop for seconds. The
 * jobs a pass leaves are still IN_PROGRESS on their attempt meanwhile, as a moment before their
 * deadline: a ping or result of their worker is taken (a lapsed lease renewed), except that one
 * past its execution timeout or TTL is ended first (#endIfDue), as at its deadline.
 */
export const REAP_RUNNING_SLICE_JOBS = 1_000;

/**
 * Stale TTL-heap entries (of jobs no longer queued) the reaper drops per pass, each a heap pop
 * and no write: a pass that reaches this many among due entries goes on after its commit.
 */
const SKIP_TTL_ENTRIES = 8 * EXPIRE_QUEUED_SLICE_JOBS;

/** Queued jobs of an endpoint beyond this many keep their input in SQLite only, until taken. */
const HOT_QUEUE_DEPTH = 64;

/** A pending stop is offered again on job-stop at most this often. */
const STOP_REOFFER_MS = 1000;
/**
 * A worker being stopped that polls again (its SIGTERM not handled yet, or ignored) is answered
 * after this long rather than at once: runpod-python re-polls immediately on a 204, so an
 * instant answer is a tight loop until the stop grace period ends.
 */
export const DRAIN_POLL_HOLD_MS = 250;


/** Whether queued `job` is fenced from `workerId` at `mono` (Job.fences). */
function fencedNow(job: Job, workerId: string, mono: number): boolean {
  const until = job.fences?.get(workerId);
  return until !== undefined && mono < until;
}

/** A queued or running job's fields that #finish changes (see JobQueue.#unfinish). */
type LiveState = Pick<Job, 'status' | 'resultBy' | 'output' | 'error' | 'rowid' | 'inserted' | 'input' | 'extra' | 'progress' | 'claimSaved' | 'writeSeq' | 'completedAt' | 'expiresAt'>;

/** A running job's fields that a requeue changes (see JobQueue.#unrequeue). */
type HeldState = Pick<Job, 'workerId' | 'retries' | 'attempt' | 'claimSaved' | 'startedAt' | 'lostMs' | 'progress' | 'fences' | 'inserted' | 'rowid' | 'writeSeq'>;

/** An end not known to be stored yet: the job, how it ended, and what it was before (#unfinishAll). */
interface Ending { job: Job; endedAs: JobStatus; before: LiveState }

export interface DoneBody {
  status?: unknown;
  output?: unknown;
  /** The source text of `output`, when the body's text was at hand (stored as is). */
  outputJson?: string | undefined;
  error?: unknown;
  stopPod?: unknown;
}

export class JobQueue {
  readonly settings: QueueSettings;
  readonly workers: WorkerRegistry;
  readonly #repo: JobsRepo;
  readonly #batch: WriteBatch;
  readonly #clock: Clock;
  readonly #log: Logger;
  /** --log-level debug, read once: each job's lifecycle lines cost this check when off. */
  readonly #debug: boolean;
  readonly #jobs = new Map<string, Job>();
  readonly #finishedOrder = new Deque<Job>();
  /** Characters of output and error held by the jobs in #finishedOrder (see heldChars). */
  #finishedChars = 0;
  /** Characters of input held by queued jobs, counted in Job.hotChars. */
  #hotChars = 0;
  /** Jobs with acknowledged /stream chunks not yet read, by job id (see UnreadStream). */
  readonly #unread = new Map<string, UnreadStream>();
  /** /stream `?wait=` polls parked on a job, woken by its next acknowledged chunk (waitStream). */
  readonly #streamWaiters = new Map<string, Set<() => void>>();
  /** Webhook deliveries in flight per job (see webhookSettled). */
  readonly #webhooksPending = new Map<string, number>();
  /**
   * Jobs of deleted endpoints still owed a webhook: their rows outlive the deletion for the
   * body, and go with the outbox row when the delivery settles (dropEndpoint, webhooksOwed).
   */
  readonly #hookOrphans = new Set<string>();
  readonly #queues = new Map<string, EndpointQueue>();
  readonly #running = new Set<Job>();
  readonly #listeners: QueueListener[] = [];
  /** Claimed jobs, in claim order, whose claim is not written yet. */
  readonly #unsavedClaims = new Deque<Job>();
  #claimTimer: NodeJS.Timeout | null = null;
  /** /runsync jobs, in submit order, whose insert is deferred (SYNC_INSERT_DELAY_MS). */
  readonly #unsavedJobs = new Deque<Job>();
  /** The inserts gathering into one write this turn (see #writeInsert). */
  #insertRun: { jobs: Job[]; inputs: string[]; write: () => void; seq: number } | null = null;
  #insertTimer: NodeJS.Timeout | null = null;
  /** Finished-job count changes not written yet, by endpoint and status. */
  readonly #counts = new Map<string, Map<JobStatus, { jobs: number; retries: number }>>();
  #countsQueued = false;
  #closing = false;
  /** flashd is stopping (stopDispatch): no job goes to any worker until the restart. */
  #dispatchStopped = false;
  /**
   * A timer for the earliest execution timeout or TTL of a running job, so a job times out at
   * its deadline rather than at the periodic reap up to a second later (when a result posted in
   * between would still have completed it). `#deadlineAt` is the monotonic time it is set for.
   */
  #deadlineTimer: NodeJS.Timeout | null = null;
  #deadlineAt = Infinity;
  /** An expiry sweep is deleting rows (a slice per commit). */
  #expiring = false;
  /** A reap pass is due after the current commit: the last one stopped at EXPIRE_QUEUED_SLICE_JOBS. */
  #reapAgain = false;
  /** The recovery floor as last written (see the file header). */
  #floor = 0;
  /** Highest rowid inserted or recovered: the floor when nothing is active. */
  #maxRowid = 0;
  /** Active jobs whose rowid is out of order in their deque (manual retries); the floor walk reads all of them. */
  readonly #outOfOrder = new Set<Job>();
  /** Jobs whose insert was rolled back (#forget): an end undone after that must not bring one back. */
  readonly #forgotten = new WeakSet<Job>();
  /** Endpoint deletions still deleting rows, and purges still ending jobs: the floor does not rise meanwhile. */
  #floorHeld = 0;
  /**
   * Endpoint deletions under way, in the order asked, each the rowids it has left to delete in:
   * one slice of the first is written per commit (#deleteStep).
   */
  readonly #deletions: { endpointId: string; from: number; end: number }[] = [];
  /** A slice of #deletions is queued or about to be (#deleteStep). */
  #deleteQueued = false;
  /**
   * Deleted endpoints whose queued jobs are still leaving memory, a slice a turn (#dropStep),
   * each with the deques that hold them. Until then every lookup by id (#get) passes them by.
   */
  readonly #dropping = new Map<string, Deque<Job>[]>();
  #dropQueued = false;
  /** The last queue generation handed out (EndpointQueue.gen). */
  #queueGens = 0;
  #floorQueued = false;
  /**
   * Fences read back from queued rows at start (`${endpointId} ${workerId}` → job ids), until
   * that worker's first ping takes them into its record (#adoptFences).
   */
  readonly #restoredFences = new Map<string, Set<string>>();
  /**
   * Jobs running at start whose row names other workers in `fenced_from` (job id → worker ids):
   * each may still run an older attempt (the fence its requeue wrote stays in the row while the
   * job runs, the claim leaves it), its pending stop lost with the restart. Until that worker's
   * first ping (#adoptFences: a ping listing the job puts its stop back, one without it says it
   * let go), the job's next attempt is fenced from it (#fenceOldRuns), for as long as the
   * registry would have kept a silent worker's record and stops: 2 × the lease from the start
   * (#bootFencesUntil). Also in #restoredFences, under each worker; no worker record is made.
   */
  readonly #bootFences = new Map<string, Set<string>>();
  #bootFencesUntil = 0;

  readonly #endpointExists: (id: string) => boolean;

  constructor(options: {
    repo: JobsRepo; batch: WriteBatch; clock: Clock; log: Logger; workers: WorkerRegistry; settings?: Partial<QueueSettings>;
    /** Recovery drops the rows of endpoints deleted before their rows were (a crash mid-deletion). */
    endpointExists?: (id: string) => boolean;
  }) {
    this.#endpointExists = options.endpointExists ?? (() => true);
    this.#repo = options.repo;
    this.#batch = options.batch;
    this.#clock = options.clock;
    this.#log = options.log;
    this.#debug = options.log.debugEnabled;
    this.workers = options.workers;
    this.settings = { ...DEFAULT_QUEUE_SETTINGS, ...options.settings };
  }

  on(listener: QueueListener): void {
    this.#listeners.push(listener);
  }

  #queue(endpointId: string): EndpointQueue {
    let q = this.#queues.get(endpointId);
    if (!q) this.#queues.set(endpointId, (q = new EndpointQueue(++this.#queueGens)));
    return q;
  }

  /**
   * The job by id, unless its endpoint was deleted and its jobs are still leaving memory
   * (dropEndpoint): to everything that asks by id, such a job is gone from the DELETE on.
   */
  #get(jobId: string): Job | undefined {
    const job = this.#jobs.get(jobId);
    if (job !== undefined && this.#dropping.size !== 0 && this.#dropping.has(job.endpointId)) return undefined;
    return job;
  }

  // Recovery ----------------------------------------------------------------------------------

  /**
   * After a restart: queued jobs go back in line in their original order; running jobs keep
   * their worker and get a fresh lease, so a worker that survived the restart finishes them
   * without a second execution, and a dead one loses them when the lease runs out.
   */
  recover(): { queued: number; running: number } {
    const mono = this.#clock.monotonic();
    const now = this.#clock.now();
    let queued = 0;
    let running = 0;
    const orphaned = new Set<string>();
    this.#floor = this.#repo.floor();
    this.#bootFencesUntil = mono + 2 * this.settings.leaseMs;
    this.#maxRowid = this.#repo.rowidRange()?.hi ?? 0;
    const restore = (row: ActiveJobRow): void => {
      if (orphaned.has(row.endpointId)) return;
      if (!this.#endpointExists(row.endpointId)) {
        orphaned.add(row.endpointId);
        return;
      }
      const job = this.#fromRow(row, mono, now);
      job.progress = row.progress;
      this.#jobs.set(job.id, job);
      const q = this.#queue(job.endpointId);
      if (job.status === 'IN_QUEUE') {
        // Fenced from a worker that may still run an old attempt (migration 10): its record comes
        // with its first call, which takes the fence over (#adoptFences).
        if (job.fences !== null) for (const workerId of job.fences.keys()) this.#addRestoredFence(job.endpointId, workerId, job.id);
        // Requeued after it ran (a lost lease, a dead worker): at the front, as before the stop.
        // A manual /retry is out of rowid order (QueueOrder), which the floor walk must know.
        if (manuallyRetried(row)) this.#outOfOrder.add(job);
        this.#enqueue(q, job, row.attempt > 0);
        queued++;
      } else {
        // Workers its row is still fenced from (other than its holder) may run older attempts.
        for (const workerId of decodeFences(row.fencedFrom)) {
          if (workerId === row.workerId) continue;
          let ids = this.#bootFences.get(job.id);
          if (!ids) this.#bootFences.set(job.id, (ids = new Set()));
          ids.add(workerId);
          this.#addRestoredFence(job.endpointId, workerId, job.id);
        }
        job.leaseDeadline = mono + this.settings.leaseMs;
        const elapsed = row.startedAt === null ? 0 : Math.max(0, now - row.startedAt);
        // Past already when it ran out while flashd was down: reap ends it at once, dated then.
        job.execDeadline = mono + job.executionTimeoutMs - elapsed;
        this.#armDeadline(Math.min(job.execDeadline, job.ttlDeadline), mono);
        if (job.workerId) this.workers.seen(job.endpointId, job.workerId).jobs.add(job.id);
        this.#running.add(job);
        q.inProgress++;
        if (job.lowPriority) q.lowInProgress++;
        running++;
      }
    };
    // Row by row as they are read, so a long backlog is never twice in memory.
    const order = new QueueOrder();
    for (const row of this.#repo.active(this.#floor)) {
      if (row.status === 'IN_QUEUE') {
        if (manuallyRetried(row)) {
          order.hold(row);
          continue;
        }
        for (const retried of order.before(row)) restore(retried);
      }
      restore(row);
    }
    for (const retried of order.rest()) restore(retried);
    for (const id of orphaned) {
      this.#log.info('deleting jobs of a deleted endpoint', { endpointId: id });
      this.#repo.dropCounts(id);
      this.#deleteRows(id);
    }
    // Stream chunks left unread by the last run (acknowledged before it stopped or crashed).
    for (const { jobId, endpointId, maxSeq } of this.#repo.chunkedJobs()) {
      // Chunks of a job whose row is gone: nobody can read them.
      if (endpointId === null) this.#batch.write(() => this.#repo.dropAllChunks(jobId));
      else if (!orphaned.has(endpointId) && this.#endpointExists(endpointId)) this.#unread.set(jobId, { endpointId, upTo: maxSeq, read: -1 });
    }
    return { queued, running };
  }

  #fromRow(row: Omit<JobRow, 'input'> & { input: string | null }, mono: number, now: number): Job {
    // A queued row's fence (migration 10) lasts a lease from this start: how long the fence had
    // left is not known (a ping listing the job extends it in memory only), and the worker's pings
    // from now on extend it or end it as before a restart.
    const fencedFrom = row.status === 'IN_QUEUE' ? decodeFences(row.fencedFrom) : [];
    const until = mono + this.settings.leaseMs;
    return {
      rowid: row.rowid, inserted: true, id: row.id, endpointId: row.endpointId, status: row.status, input: row.input, extra: row.extra, webhook: row.webhook,
      lowPriority: row.lowPriority, executionTimeoutMs: row.executionTimeoutMs, ttlMs: row.ttlMs, retentionMs: row.retentionMs,
      attempt: row.attempt, claimSaved: row.attempt, writeSeq: 0, retries: row.retries, workerId: row.workerId,
      resultBy: row.status === 'COMPLETED' || row.status === 'FAILED' ? row.workerId : null, output: row.output, error: row.error, progress: null,
      streamSeq: -1, createdAt: row.createdAt, queuedAt: row.queuedAt, lostMs: row.lostMs, startedAt: row.startedAt, pinged: false, completedAt: row.completedAt, expiresAt: row.expiresAt,
      ttlDeadline: mono + row.ttlMs - (now - row.queuedAt), fences: fencedFrom.length === 0 ? null : new Map(fencedFrom.map((w) => [w, until])), queueGen: 0, hotChars: 0, leaseDeadline: 0, execDeadline: 0, waiters: NO_WAITERS,
    };
  }

  // Submit and claim --------------------------------------------------------------------------

  /**
   * Accepts a job; resolves once it is committed (only then may the client get its 200). With
   * `deferInsert` (/runsync) it resolves at once and the insert waits (SYNC_INSERT_DELAY_MS);
   * `persist` writes it before its id is told to anyone.
   */
  async submit(input: SubmitInput, deferInsert = false): Promise<Job> {
    // A request whose body finished arriving after close(): nothing would wake its /runsync wait.
    if (this.#closing) throw new AgentError('UNAVAILABLE', 'The server is shutting down; retry against its next start.');
    const now = this.#clock.now();
    const job: Job = {
      rowid: 0, inserted: false, id: newJobId(), endpointId: input.endpointId, status: 'IN_QUEUE', input: input.input, extra: input.extra, webhook: input.webhook,
      lowPriority: input.lowPriority, executionTimeoutMs: input.executionTimeoutMs, ttlMs: input.ttlMs, retentionMs: input.retentionMs,
      attempt: 0, claimSaved: 0, writeSeq: 0, retries: 0, workerId: null, resultBy: null, output: null, error: null, progress: null, streamSeq: 0, createdAt: now, queuedAt: now, lostMs: 0, startedAt: null, pinged: false,
      completedAt: null, expiresAt: null, ttlDeadline: this.#clock.monotonic() + input.ttlMs, fences: null, queueGen: 0, hotChars: 0, leaseDeadline: 0, execDeadline: 0, waiters: NO_WAITERS,
    };
    this.#jobs.set(job.id, job);
    if (this.#debug) this.#log.debug('job submitted', { jobId: job.id, endpointId: job.endpointId, lowPriority: job.lowPriority || undefined, webhook: job.webhook !== null || undefined });
    const q = this.#queue(job.endpointId);
    if (deferInsert) {
      this.#unsavedJobs.push(job);
      this.#insertTimer ??= setTimeout(() => this.#saveDeferred(), SYNC_INSERT_DELAY_MS).unref();
      this.#enqueue(q, job, false);
      return job;
    }
    this.#writeInsert(job);
    this.#enqueue(q, job, false);
    try {
      await this.#batch.committed();
    } catch (err) {
      // Not stored, so never acknowledged: take it back out of memory before the caller's 500.
      // Unless only the sync failed: then SQLite has the row (a restart may run it), and so
      // does memory.
      if (this.#batch.wasRolledBack(job.writeSeq)) this.#forget(job);
      throw err;
    }
    return job;
  }

  /**
   * Queues the insert of a job (as IN_QUEUE; a claim is written separately). Inserts queued
   * one after another join one write, and one multi-row statement (JobsRepo.insertMany); any
   * other write in between starts a new one, so writes keep their order.
   */
  #writeInsert(job: Job): void {
    job.inserted = true;
    const run = this.#insertRun;
    if (run && this.#batch.isLast(run.write)) {
      run.jobs.push(job);
      run.inputs.push(job.input as string);
      job.writeSeq = run.seq;
      return;
    }
    const jobs = [job];
    const inputs = [job.input as string];
    const write = (): void => this.#insertJobs(jobs, inputs);
    job.writeSeq = this.#batch.write(write);
    this.#insertRun = { jobs, inputs, write, seq: job.writeSeq };
  }

  /** Runs inside the commit: writes a run of inserts, then notes each job's rowid. */
  #insertJobs(jobs: Job[], inputs: string[]): void {
    if (this.#insertRun?.jobs === jobs) this.#insertRun = null;
    const first = this.#repo.insertMany(jobs, inputs);
    for (let i = 0; i < jobs.length; i++) {
      const job = jobs[i] as Job;
      const rowid = first + i;
      job.rowid = rowid;
      if (rowid > this.#maxRowid) this.#maxRowid = rowid;
      // A reused rowid (the newest rows were deleted, even before a restart) can be below the floor.
      if (rowid < this.#floor) this.#lowerFloor(rowid);
      // Deep in a busy queue, the input waits in SQLite rather than in the heap.
      // So is it once the inputs kept by all queues pass their budget.
      if (job.status === 'IN_QUEUE') {
        const q = this.#queues.get(job.endpointId);
        const chars = (job.input as string).length;
        if ((q && q.queued + q.lowQueued > HOT_QUEUE_DEPTH) || this.#hotChars + chars > this.settings.queuedInputBytesInMemory) job.input = null;
        else {
          job.hotChars = chars;
          this.#hotChars += chars;
        }
      }
    }
  }

  /**
   * Writes a deferred job's insert now, if it still has none (it joins the floor walk's
   * out-of-order set). If that commit is rolled back the job is forgotten, as a /run's is (its
   * /runsync caller gets a 500 from persist): before that was known a worker may have taken it,
   * or its end may be in the same commit, and none of it is stored.
   */
  #insertDeferred(job: Job): void {
    if (job.inserted || this.#get(job.id) !== job) return;
    this.#outOfOrder.add(job);
    this.#writeInsert(job);
    this.#batch.ifRolledBack(() => {
      if (this.#get(job.id) === job) this.#forget(job);
    });
  }

  /** Inserts the /runsync jobs still unfinished SYNC_INSERT_DELAY_MS after their submit. */
  #saveDeferred(): void {
    this.#insertTimer = null;
    const due = this.#clock.now() - SYNC_INSERT_DELAY_MS;
    for (let job = this.#unsavedJobs.peek(); job; job = this.#unsavedJobs.peek()) {
      if (!job.inserted && job.createdAt > due && !this.#closing && this.#get(job.id) === job) break;
      this.#unsavedJobs.shift();
      this.#insertDeferred(job);
    }
    if (this.#unsavedJobs.size && !this.#closing) this.#insertTimer = setTimeout(() => this.#saveDeferred(), SYNC_INSERT_DELAY_MS).unref();
  }

  /**
   * The job is in SQLite and its last write is durable: what /runsync does before it tells a
   * caller the id of a job that is still running. Undefined when that is already so.
   */
  persist(job: Job): Promise<void> | undefined {
    this.#insertDeferred(job);
    if (this.#batch.isDurable(job.writeSeq)) return undefined;
    return (async () => {
      while (!this.#batch.isDurable(job.writeSeq)) {
        // Its last write was rolled back (a full disk): the id cannot be given out as stored. A
        // full disk or an I/O error is a 503 to send again later, as for a /run (api/problem.ts).
        if (this.#batch.hasFailed(job.writeSeq)) {
          throw storageUnavailable(this.#batch.rollbackError(job.writeSeq))
            ?? new AgentError('INTERNAL', `Job ${job.id} could not be stored; the server log says why.`);
        }
        await this.#batch.committed();
      }
    })();
  }

  /**
   * Drops a job whose insert did not commit: off its queue or worker, out of the map. An end
   * made in the same commit (a purge) is not undone after (#unfinishAll brings back a job that
   * left memory).
   */
  #forget(job: Job): void {
    if (job.status === 'IN_QUEUE') {
      this.#leave(job);
    } else if (job.status === 'IN_PROGRESS') {
      const worker = this.#release(job);
      if (worker) this.#requestStop(worker, job.id, 'not stored (its commit failed)', job);
    }
    this.#unhot(job);
    this.#forgotten.add(job);
    job.status = 'CANCELLED';
    if (this.#jobs.get(job.id) === job) this.#jobs.delete(job.id);
    wakeWaiters(job);
  }

  /**
   * A queued job ends outside the queue's own take (cancel, a failed insert): it leaves its
   * queue's counts, unless a purge holding it took it off them already (the purge skips it now).
   */
  #leave(job: Job): void {
    this.#unhot(job);
    const q = this.#queue(job.endpointId);
    if (job.queueGen === q.gen) q.left(job);
  }

  /** Takes a job that leaves the queue (or ends) out of the budget of queued inputs. */
  #unhot(job: Job): void {
    if (job.hotChars === 0) return;
    this.#hotChars -= job.hotChars;
    job.hotChars = 0;
  }

  /** Characters of input that queued jobs hold in memory (QueueSettings.queuedInputBytesInMemory). */
  get queuedInputChars(): number {
    return this.#hotChars;
  }

  #enqueue(q: EndpointQueue, job: Job, front: boolean): void {
    job.queueGen = q.gen;
    if (front) q.retry.push(job);
    else if (job.lowPriority) q.low.push(job);
    else q.normal.push(job);
    if (job.lowPriority) q.lowQueued++;
    else q.queued++;
    q.queuedRetries += job.retries;
    q.ttls.push(job.id, job.ttlDeadline);
    this.#dispatch(q);
    for (const l of this.#listeners) l.jobQueued?.(job.endpointId);
  }

  /**
   * The next live queued job for `worker`: requeued first, then normal, then low priority. A
   * requeued job is not handed back to a worker it was fenced from (see Job.fences); the
   * retry deque is short, so it is searched, not just shifted.
   */
  #next(q: EndpointQueue, worker: WorkerInfo): Job | undefined {
    const mono = this.#clock.monotonic();
    if (q.retry.size > 0) {
      // A requeued low-priority job still waits for the normal ones (it is first among the low).
      const pick = (job: Job) => job.status !== 'IN_QUEUE' || (!job.lowPriority && !fencedNow(job, worker.id, mono));
      for (let job = q.retry.take(pick); job; job = q.retry.take(pick)) if (this.#admit(q, job, mono)) return job;
    }
    // A /retry of a job its earlier workers may still be running is fenced too, in the normal or low
    // deque: take() looks at the head first, so the usual case stays a shift.
    const free = (job: Job) => job.status !== 'IN_QUEUE' || !fencedNow(job, worker.id, mono);
    for (let job = q.normal.take(free); job; job = q.normal.take(free)) if (this.#admit(q, job, mono)) return job;
    if (q.retry.size > 0) for (let job = q.retry.take(free); job; job = q.retry.take(free)) if (this.#admit(q, job, mono)) return job;
    for (let job = q.low.take(free); job; job = q.low.take(free)) if (this.#admit(q, job, mono)) return job;
    return undefined;
  }

  /** A job just off its deque: false when it was ended while queued, or has expired (TIMED_OUT now). */
  #admit(q: EndpointQueue, job: Job, mono: number): boolean {
    if (job.status !== 'IN_QUEUE') return false; // cancelled or purged while queued
    q.left(job);
    this.#unhot(job);
    if (mono < job.ttlDeadline) return true;
    this.#finish(job, 'TIMED_OUT', null, queuedExpiry(job), job.queuedAt + job.ttlMs);
    return false;
  }

  /** Reads the input of a job that waited in SQLite only; a job without a row fails. */
  #loadInput(job: Job): job is ClaimedJob {
    if (job.input !== null) return true;
    const input = this.#repo.inputOf(job.id);
    if (input !== undefined) {
      job.input = input;
      return true;
    }
    this.#log.error('queued job has no row to read its input from', { jobId: job.id, endpointId: job.endpointId });
    this.#finish(job, 'FAILED', null, 'The job input could not be read from the database.');
    return false;
  }

  #claim(job: ClaimedJob, worker: WorkerInfo): ClaimedJob {
    const mono = this.#clock.monotonic();
    job.status = 'IN_PROGRESS';
    job.attempt++;
    job.workerId = worker.id;
    job.startedAt = this.#clock.now();
    job.pinged = false;
    job.leaseDeadline = mono + this.settings.leaseMs;
    job.execDeadline = mono + job.executionTimeoutMs;
    this.#armDeadline(Math.min(job.execDeadline, job.ttlDeadline), mono);
    job.progress = null;
    job.fences = null;
    this.workers.dropStop(worker, job.id);
    worker.letGo.delete(job.id);
    worker.ended.delete(job.id);
    worker.fenced.delete(job.id);
    worker.jobs.add(job.id);
    this.#running.add(job);
    if (this.#debug) this.#log.debug('job taken by worker', { jobId: job.id, endpointId: job.endpointId, workerId: worker.id, attempt: job.attempt });
    const q = this.#queue(job.endpointId);
    q.inProgress++;
    if (job.lowPriority) q.lowInProgress++;
    // The claim is written only if the job is still running CLAIM_SAVE_DELAY_MS from now; a job
    // that finishes sooner is written once, by its final state (which carries the claim too).
    this.#unsavedClaims.push(job);
    this.#claimTimer ??= setTimeout(() => this.#saveClaims(), CLAIM_SAVE_DELAY_MS).unref();
    return job;
  }

  /** Writes the claims of jobs still running since they were claimed (see CLAIM_SAVE_DELAY_MS). */
  #saveClaims(): void {
    this.#claimTimer = null;
    const due = this.#clock.now() - CLAIM_SAVE_DELAY_MS;
    for (let job = this.#unsavedClaims.peek(); job; job = this.#unsavedClaims.peek()) {
      if (job.status === 'IN_PROGRESS' && job.startedAt !== null && job.startedAt > due && !this.#closing) break;
      this.#unsavedClaims.shift();
      this.#writeClaim(job);
    }
    if (this.#unsavedClaims.size && !this.#closing) this.#claimTimer = setTimeout(() => this.#saveClaims(), CLAIM_SAVE_DELAY_MS).unref();
  }

  /** Writes a running job's claim now, if it is not written yet (its deferred insert first). */
  #writeClaim(job: Job): void {
    if (job.status !== 'IN_PROGRESS' || job.claimSaved === job.attempt || job.workerId === null || job.startedAt === null) return;
    this.#insertDeferred(job);
    const { id, attempt, workerId, startedAt } = job;
    job.claimSaved = attempt;
    job.writeSeq = this.#batch.write(() => this.#repo.claim(id, attempt, workerId, startedAt));
  }

  #claimUpTo(q: EndpointQueue, worker: WorkerInfo, max: number): ClaimedJob[] {
    const jobs: ClaimedJob[] = [];
    while (jobs.length < max) {
      const job = this.#next(q, worker);
      if (!job) break;
      if (this.#loadInput(job)) jobs.push(this.#claim(job, worker));
    }
    return jobs;
  }

  /** Hands queued jobs to parked takers, longest-waiting first. */
  #dispatch(q: EndpointQueue): void {
    // Stopping: a job requeued now (a lost lease, a worker cut at the stop grace) waits for the restart.
    if (this.#dispatchStopped) return;
    // A taker that gets nothing stays parked: what is left may be fenced from its worker only.
    for (let i = 0; i < q.takers.length && q.queued + q.lowQueued > 0; ) {
      const taker = q.takers[i] as Taker;
      if (taker.allowed !== undefined && !taker.allowed()) {
        // Its key was revoked (or expired) while it waited: no job, and it is parked no more.
        q.takers.splice(i, 1);
        taker.resolve([]);
        continue;
      }
      const jobs = this.#claimUpTo(q, taker.worker, taker.max);
      if (jobs.length === 0) {
        i++;
        continue;
      }
      q.takers.splice(i, 1);
      taker.resolve(jobs);
    }
  }

  /**
   * job-take: returns up to `max` jobs at once, or holds the request until one arrives (woken
   * by submit, never by a timer) and gives [] after `holdMs`. A held take is handed jobs only
   * while `allowed` says so (the caller's credential, checked when it was parked, may be
   * revoked during the hold); when it says no, the take gets [] at once. `keyId`: that
   * credential's key (WorkerInfo.keyId); its revocation answers the take at once (keyRevoked).
   */
  take(endpointId: string, workerId: string, max: number, cancel: Cancellation, allowed?: () => boolean, holdMs = this.settings.takeHoldMs, keyId?: string): Promise<ClaimedJob[]> {
    const worker = this.workers.seen(endpointId, workerId, true, keyId);
    // An external worker that asked to be recycled and asks for a job again did not exit (the
    // SDKs stop taking before they post the stopPod): it serves on, and its results no longer
    // retire it (#retireIfIdle).
    if (!worker.managed && worker.refresh) {
      worker.recycle = false;
      worker.refresh = false;
    }
    // Being stopped, or a worker flashd launched that is to be replaced (recycling()), or flashd
    // itself stopping (stopDispatch): no job. Its parked polls were answered at once so its SDK
    // sees the SIGTERM and exits; a poll after that waits a little, never a tight loop.
    if (worker.draining || (worker.recycle && worker.managed) || this.#dispatchStopped) return drained<ClaimedJob>(cancel, Math.min(DRAIN_POLL_HOLD_MS, holdMs));
    const q = this.#queue(endpointId);
    // A take renews no lease: only pings (which list the jobs held) and results do. A worker
    // restarted with the same id would otherwise keep its dead incarnation's jobs alive.
    const jobs = this.#claimUpTo(q, worker, Math.max(1, max));
    if (jobs.length || cancel.aborted) {
      answered(worker, jobs.length, max, this.#clock.monotonic());
      return Promise.resolve(jobs);
    }
    return new Promise((resolve) => {
      let settled = false;
      let unhook = NOOP;
      const settle = (result: ClaimedJob[]) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        unhook();
        worker.parked--;
        worker.lastSeen = this.#clock.monotonic();
        answered(worker, result.length, max, worker.lastSeen);
        resolve(result);
      };
      const taker: Taker = { worker, max: Math.max(1, max), allowed, resolve: settle };
      const drop = () => {
        const i = q.takers.indexOf(taker);
        if (i >= 0) q.takers.splice(i, 1);
      };
      const onAbort = () => {
        drop();
        settle([]);
      };
      const timer = setTimeout(() => {
        drop();
        settle([]);
      }, holdMs);
      worker.parked++;
      q.takers.push(taker);
      unhook = cancel.onAbort(onAbort);
    });
  }

  // Results from workers ------------------------------------------------------------------------

  #owned(endpointId: string, worker: WorkerInfo, jobId: string): { job?: Job; outcome?: DoneOutcome } {
    const workerId = worker.id;
    const job = this.#get(jobId);
    if (job && job.endpointId === endpointId) {
      this.#endIfDue(job);
      if (job.status === 'IN_PROGRESS' && job.workerId === workerId) return { job };
      if (job.resultBy === workerId) return { outcome: 'duplicate' };
      // Ended by flashd while this worker held it: the job as it is, or, once a /retry started a
      // new run (queued, or taken by another worker), the worker's own record of it.
      const ended = (job.resultBy === null && job.workerId === workerId && ENDED_BY_FLASHD.has(job.status)) || worker.ended.has(jobId);
      return { outcome: ended ? 'ended' : 'stale' };
    }
    const row = this.#repo.getWithoutInput(jobId);
    if (!row || row.endpointId !== endpointId) return { outcome: 'unknown' };
    if (row.workerId !== workerId) return { outcome: worker.ended.has(jobId) ? 'ended' : 'stale' };
    if (postedByRow(row, workerId)) return { outcome: 'duplicate' };
    return { outcome: ENDED_BY_FLASHD.has(row.status) ? 'ended' : 'stale' };
  }

  /** job-done: a progress update, or the final result of the worker's current attempt. */
  async done(endpointId: string, workerId: string, jobId: string, body: DoneBody): Promise<DoneOutcome> {
    const worker = this.workers.seen(endpointId, workerId);
    const owned = this.#owned(endpointId, worker, jobId);
    const { job } = owned;
    // Only a result is re-posted: a progress update after the worker's own result comes too late.
    const outcome = owned.outcome === 'duplicate' && body.status === 'IN_PROGRESS' ? 'finished' : owned.outcome;
    if (!job) {
      // A late final result (the job timed out or was cancelled, and maybe retried): the worker
      // no longer runs it. Its stop is done, and a /retry fenced from it may go to it now
      // instead of after its pings drop the job (up to a ping interval later).
      if (this.#debug && outcome !== 'stale' && outcome !== 'unknown') {
        // stale and unknown are 409/404, logged as refused requests (api/dispatch.ts).
        const what = outcome === 'ended' ? 'worker result discarded: job already ended by flashd'
          : outcome === 'finished' ? 'worker progress discarded: job already ended with its result' : 'worker result repeated: already recorded';
        this.#log.debug(what, {
          jobId, endpointId, workerId, progress: body.status === 'IN_PROGRESS' || undefined,
        });
      }
      if (body.status !== 'IN_PROGRESS' && (outcome === 'ended' || outcome === 'stale')) {
        this.#stopOver(worker, jobId);
        worker.letGo.add(jobId);
        this.#unfence(worker, jobId);
      }
      // A recycle request stands whatever became of the job: runpod-python's refresh_worker
      // exits the worker after a late result too, and unasked that exit would count as a crash.
      if (body.status !== 'IN_PROGRESS' && body.stopPod === true) this.#recycleAsked(endpointId, workerId);
      // Whichever of its results carried the stopPod (concurrency above 1: this may be the last
      // of the jobs it finishes before it exits).
      if (body.status !== 'IN_PROGRESS' && worker.refresh) this.#retireIfIdle(endpointId, workerId, worker);
      return outcome as DoneOutcome;
    }
    job.leaseDeadline = this.#clock.monotonic() + this.settings.leaseMs;
    if (body.status === 'IN_PROGRESS') {
      const progress = body.output === undefined ? 'null' : body.outputJson ?? JSON.stringify(body.output);
      job.progress = progress;
      // Stored in the row's output (a restart shows it again), so the row must be running: its
      // claim goes first if it was not written yet (CLAIM_SAVE_DELAY_MS).
      this.#writeClaim(job);
      job.writeSeq = this.#batch.write(() => this.#repo.setProgress(jobId, progress));
      await this.#batch.committed();
      return 'accepted';
    }
    if (body.stopPod === true) this.#recycleAsked(endpointId, workerId);
    const output = body.output === undefined ? null : body.outputJson ?? JSON.stringify(body.output);
    const running = this.#liveState(job);
    job.resultBy = workerId;
    const failed = truthy(body.error);
    const status = failed ? 'FAILED' : 'COMPLETED';
    try {
      await this.#finishCommitted(job, status, output, failed ? (typeof body.error === 'string' ? body.error : JSON.stringify(body.error)) : null);
    } catch (err) {
      // Not stored (a full disk): the caller gets a 500 and the job stays this worker's, as if
      // the post had not come, so its retry is written rather than taken for a stored repeat.
      this.#unfinish(job, status, running);
      throw err;
    }
    // Its stopPod may have come with an earlier result while this job still ran (concurrency
    // above 1): the SDK finishes the rest, then exits, so the last of them retires it.
    if (worker.refresh) this.#retireIfIdle(endpointId, workerId, worker);
    return 'accepted';
  }

  /** What #finish changes on a queued or running job, for #unfinish. */
  #liveState(job: Job): LiveState {
    const { status, resultBy, output, error, rowid, inserted, input, extra, progress, claimSaved, writeSeq, completedAt, expiresAt } = job;
    return { status, resultBy, output, error, rowid, inserted, input, extra, progress, claimSaved, writeSeq, completedAt, expiresAt };
  }

  /** What a requeue changes on a running job, for #unrequeue. */
  #heldState(job: Job): HeldState {
    const { workerId, retries, attempt, claimSaved, startedAt, lostMs, progress, fences, inserted, rowid, writeSeq } = job;
    return { workerId, retries, attempt, claimSaved, startedAt, lostMs, progress, fences, inserted, rowid, writeSeq };
  }

  /** One end whose commit failed (a worker's result, a /cancel): see #unfinishAll. */
  #unfinish(job: Job, endedAs: JobStatus, before: LiveState): void {
    this.#unfinishAll([{ job, endedAs, before }]);
  }

  /**
   * Final states whose commit failed (rolled back): a worker's result, a /cancel, a purge slice,
   * or an end flashd made itself (a timeout, a TTL, attempts used up). Each job goes back to
   * what memory held before #finish (queued, or running on its worker), unless something else
   * happened to it since. Otherwise memory says it ended while its row does not: /status shows
   * a result or an end that is nowhere, the retried post, cancel or purge is answered as already
   * done without a write, nothing writes flashd's own end again, and a restart runs the job.
   */
  #unfinishAll(ends: readonly Ending[]): void {
    const back = new Set<Job>();
    for (const { job, endedAs } of ends) {
      // Not when only the sync failed: SQLite has the end, and memory keeps it (see #finish).
      if (job.status !== endedAs || !this.#batch.wasRolledBack(job.writeSeq) || this.#forgotten.has(job)) continue;
      // Not when another record took its id (a /retry) or its endpoint is being deleted. One that
      // left memory (finished jobs past the count cap go, durable or not) comes back.
      const held = this.#jobs.get(job.id);
      if ((held !== undefined && held !== job) || this.#dropping.has(job.endpointId) || !this.#queues.has(job.endpointId)) continue;
      back.add(job);
    }
    if (back.size === 0) return;
    // Out of #finishedOrder in one pass (#evict may have let some go, and took their characters off then).
    this.#finishedOrder.retain((j) => {
      if (!back.has(j)) return true;
      this.#finishedChars = Math.max(0, this.#finishedChars - heldChars(j));
      return false;
    });
    let queued: Map<EndpointQueue, Job[]> | undefined;
    for (const { job, before } of ends) {
      if (!back.delete(job)) continue;
      this.#unowe(job);
      Object.assign(job, before);
      this.#jobs.set(job.id, job);
      const q = this.#queue(job.endpointId);
      if (job.status === 'IN_PROGRESS') {
        job.leaseDeadline = this.#clock.monotonic() + this.settings.leaseMs;
        this.#running.add(job);
        q.inProgress++;
        if (job.lowPriority) q.lowInProgress++;
        const worker = job.workerId ? this.workers.get(job.endpointId, job.workerId) : undefined;
        if (worker) {
          worker.jobs.add(job.id);
          // Its end was not stored: the job is this worker's again, no longer one flashd ended on it.
          worker.ended.delete(job.id);
        }
      } else {
        queued ??= new Map();
        const jobs = queued.get(q);
        if (jobs) jobs.push(job);
        else queued.set(q, [job]);
      }
    }
    if (!queued) return;
    for (const [q, jobs] of queued) {
      // Their old entries may still be in a deque (ended jobs leave them lazily): out first, one
      // pass per deque, so each is queued once, behind jobs submitted meanwhile (out of rowid
      // order for the floor walk).
      const out = new Set(jobs);
      for (const d of [q.retry, q.normal, q.low]) if (d.size > 0) d.retain((j) => !out.has(j));
      for (const job of jobs) {
        this.#outOfOrder.add(job);
        this.#enqueue(q, job, job.attempt > 0);
      }
    }
  }

  /** The webhook #finish owed for an end whose commit failed is owed no more. */
  #unowe(job: Job): void {
    if (job.webhook === null) return;
    const owed = (this.#webhooksPending.get(job.id) ?? 0) - 1;
    if (owed > 0) this.#webhooksPending.set(job.id, owed);
    else this.#webhooksPending.delete(job.id);
  }

  /** The worker asked to be recycled (stopPod, runpod-python's refresh_worker). */
  #recycleAsked(endpointId: string, workerId: string): void {
    this.recycling(endpointId, workerId, true);
    for (const l of this.#listeners) l.recycleWorker?.(endpointId, workerId);
  }

  /**
   * An external worker that asked to be recycled exits by itself: once it holds nothing it
   * leaves /health at once, not 60 s later. Called on each result of a worker that asked
   * (`refresh`), not only the one that carried the stopPod: with concurrency above 1 the others
   * end after it, and the worker exits after the last. A job-take since clears `refresh` (take).
   * Its record is kept out of the registry for its last calls (WorkerRegistry.retire): a job
   * flashd cancelled before this result is still offered on its job-stop polls.
   */
  #retireIfIdle(endpointId: string, workerId: string, worker: WorkerInfo): void {
    if (worker.managed || worker.jobs.size > 0 || this.workers.get(endpointId, workerId) !== worker) return;
    this.stopping(endpointId, workerId);
    this.workers.retire(endpointId, workerId);
  }

  /**
   * job-stream: chunks for /stream, each at most `streamChunkBytes` (larger ones are split),
   * stored in SQLite (job_chunks); resolves once they are durable, so a 200 means stored.
   */
  async stream(endpointId: string, workerId: string, jobId: string, body: { output?: unknown; outputJson?: string | undefined; metrics?: unknown }, chunk?: number): Promise<DoneOutcome> {
    const worker = this.workers.seen(endpointId, workerId);
    const { job, outcome } = this.#owned(endpointId, worker, jobId);
    // A chunk is no re-post of the result: after the worker's own result it comes too late.
    if (!job) return outcome === 'duplicate' ? 'finished' : outcome as DoneOutcome;
    if (chunk !== undefined) {
      // The worker numbers its chunks (`?chunk=`): one it posts again because the answer was lost
      // (a dropped connection, a proxy's 502 after flashd stored it) is not stored a second time.
      if (chunk <= (worker.chunks.get(jobId) ?? 0)) return 'duplicate';
      worker.chunks.set(jobId, chunk);
    }
    job.leaseDeadline = this.#clock.monotonic() + this.settings.leaseMs;
    const metrics = body.metrics === undefined ? undefined : JSON.stringify(body.metrics);
    const output = body.output === undefined || body.output === null ? 'null' : body.outputJson ?? JSON.stringify(body.output);
    const limit = this.settings.streamChunkBytes;
    const metricsBytes = metrics === undefined ? 0 : Buffer.byteLength(metrics);
    /**
     * The JSON text of one /stream element. Metrics go with a chunk only if both fit; metrics too
     * large for that are dropped (logged), the output never.
     */
    const element = (piece: string, pieceBytes: number, withMetrics: boolean, marker = ''): string => {
      if (metrics === undefined || !withMetrics) return `{"output":${piece}${marker}}`;
      if (ELEMENT_BYTES + pieceBytes + Buffer.byteLength(marker) + METRICS_BYTES + metricsBytes <= limit) return `{"output":${piece}${marker},"metrics":${metrics}}`;
      this.#log.warn('stream chunk metrics dropped: over the chunk limit with the output', { endpointId, jobId, metricsBytes, limit });
      return `{"output":${piece}${marker}}`;
    };
    const pieces: string[] = [];
    const outputBytes = Buffer.byteLength(output);
    // Metrics a split makes room for on its first piece: at most half the limit.
    const metricsRide = metrics !== undefined && metricsBytes <= limit / 2;
    // A chunk that fits, or an output that fits alone and would not be split to carry its metrics
    // (an output other than a string: a split would turn it into pieces of its JSON text; or
    // metrics over half the limit, which no piece takes): sent as posted, with no part markers.
    // Counted as the element is served, `{"output":}` and `,"metrics":` included.
    const alone = ELEMENT_BYTES + outputBytes;
    if (alone + (metrics === undefined ? 0 : METRICS_BYTES + metricsBytes) <= limit || (alone <= limit && (typeof body.output !== 'string' || !metricsRide))) {
      pieces.push(element(output, outputBytes, true));
    } else {
      // Too large for one chunk: split strings into pieces (lossless), anything else as pieces of its JSON text.
      // Each element at most `limit` bytes: its piece as large as fits beside `{"output":}` and its
      // markers, the first one leaving room for metrics that take at most half the limit.
      // Each piece carries `part` and `parts` (and `json: true` when the pieces are JSON text), so
      // a client can tell the pieces of one chunk from the chunks posted around it.
      const json = typeof body.output !== 'string';
      const text = json ? output : body.output as string;
      // Room for markers of one digit first; split again with room for more only when there are
      // 10 pieces or more (a chunk over about 10 MB), so the pieces stay as large as they can be.
      const raw: { piece: string; bytes: number }[] = [];
      for (let digits = 1; ; digits++) {
        raw.length = 0;
        const budget = limit - ELEMENT_BYTES - splitBytes(digits, json);
        const first = metricsRide ? budget - METRICS_BYTES - metricsBytes : budget;
        jsonStringPieces(text, first, budget, (piece, bytes) => raw.push({ piece, bytes }));
        if (raw.length < 10 ** digits) break;
      }
      raw.forEach(({ piece, bytes }, i) => pieces.push(element(piece, bytes, i === 0, splitMarker(i + 1, raw.length, json))));
    }
    // A /runsync job whose insert is still deferred gets its row first (a crash must not leave
    // chunks of a job SQLite does not know), and its claim (CLAIM_SAVE_DELAY_MS) as a progress
    // update does: acknowledged chunks of a run SQLite still has as queued would, after a crash,
    // send the job to another run while this worker's later posts get 409. The next seq of a job
    // read back from its row (after a restart) continues after the chunks stored for it.
    this.#writeClaim(job);
    this.#insertDeferred(job);
    if (job.streamSeq < 0) job.streamSeq = this.#repo.nextChunkSeq(jobId);
    const first = job.streamSeq;
    job.streamSeq += pieces.length;
    const last = job.streamSeq - 1;
    const { attempt } = job;
    // This attempt lost the job before the chunks were written (a lost lease, in the same commit):
    // the requeue dropped the attempt's chunks, so these are not written either.
    const abandoned = () => job.attempt !== attempt || job.status === 'IN_QUEUE' || (job.status === 'IN_PROGRESS' && job.workerId !== workerId);
    this.#batch.write(() => {
      // Its rows may be gone already (endpoint deleted: a small table is deleted outside the batch).
      if (this.#get(jobId) !== job || abandoned()) return;
      for (let i = 0; i < pieces.length; i++) this.#repo.addChunk(jobId, first + i, pieces[i] as string);
    });
    try {
      await this.#batch.committed();
    } catch (err) {
      // Not stored: the worker's retry of this chunk must be stored, not taken for a duplicate.
      if (chunk !== undefined && worker.chunks.get(jobId) === chunk) worker.chunks.set(jobId, chunk - 1);
      throw err;
    }
    if (this.#get(jobId) !== job) return 'accepted';
    if (abandoned()) return 'stale';
    // Durable and about to be acknowledged: a /stream poll may hand them out from now on.
    const unread = this.#unread.get(jobId);
    if (!unread) this.#unread.set(jobId, { endpointId, upTo: last, read: -1 });
    else if (last > unread.upTo) unread.upTo = last;
    const parked = this.#streamWaiters.get(jobId);
    if (parked) for (const w of [...parked]) w();
    return 'accepted';
  }

  /**
   * ping: renews the leases of the jobs the worker lists; tells it to stop jobs no longer its own.
   * `unhealthy`: the worker said it is (`status=unhealthy`), and why.
   */
  ping(endpointId: string, workerId: string, jobIds: readonly string[], unhealthy?: UnhealthyReport, keyId?: string): void {
    const worker = this.workers.seen(endpointId, workerId, false, keyId);
    // Its heartbeat runs beside its take (WorkerRegistry.unheard).
    if (worker.parked > 0 && worker.jobs.size === 0) worker.pingsIdle = true;
    if (unhealthy) {
      this.workers.markUnhealthy(endpointId, workerId);
      this.#log.warn('worker reported unhealthy', {
        endpointId, workerId, check: unhealthy.check || undefined, reason: unhealthy.reason || undefined,
      });
      for (const l of this.#listeners) l.workerUnhealthy?.(endpointId, workerId, unhealthy);
    }
    const listed = new Set(jobIds);
    const now = this.#clock.monotonic();
    const lease = now + this.settings.leaseMs;
    if (this.#restoredFences.size > 0) this.#adoptFences(worker);
    // A job taken away from this worker that it no longer lists may go back to it.
    for (const id of worker.fenced) if (!listed.has(id)) this.#unfence(worker, id);
    for (const id of worker.letGo) if (!listed.has(id)) worker.letGo.delete(id);
    for (const id of listed) {
      const found = this.#get(id);
      // A ping speaks for its own endpoint only (the worker key is scoped to it): another
      // endpoint's job id is unknown here, so it renews no lease and extends no fence.
      const job = found?.endpointId === endpointId ? found : undefined;
      if (job && job.status === 'IN_PROGRESS' && job.workerId === workerId) {
        job.leaseDeadline = lease;
        job.pinged = true;
        this.workers.dropStop(worker, id);
      } else if (job?.resultBy === workerId || worker.letGo.has(id) || (found === undefined && !worker.stops.has(id) && this.#postedBy(endpointId, workerId, id))) {
        // It posted its final result for the job: this heartbeat was made before the post
        // (runpod-python drops a job from its pings only after posting); nothing to stop.
        // A finished job may be out of memory (a restart, eviction): its row says who posted.
        // An id it was already told to stop is not looked up again: every ping would read one
        // row per such id (3,000 ids: about 18 ms of the loop per ping), and the else branch
        // below does nothing more for it.
      } else {
        const stop = worker.stops.get(id);
        // Listed, so registered: its first ping without the job ends the stop (#requestStop).
        if (stop) stop.keepUntil = 0;
        else {
          this.#requestStop(worker, id, 'not its job');
          // Running on another worker, while this one still runs an older attempt: the next
          // attempt is fenced from it while the stop is pending (#fenceOldRuns), and its row
          // names it too, so a restart keeps that (#bootFences) rather than forget it until this
          // worker's next ping. Written once, when the stop begins (not on every ping), in the
          // batch's next commit; its claim first if not written yet, so the row is running.
          if (job?.status === 'IN_PROGRESS' && worker.stops.has(id)) {
            this.#writeClaim(job);
            this.#batch.write(() => this.#repo.addRunningFence(id, workerId));
          }
        }
        // Still running a job it was fenced from: the fence lasts while its pings list the job.
        if (job?.fences?.has(workerId)) job.fences.set(workerId, lease);
        // A queued job it still runs, not fenced from it (its row predates migration 10, or the
        // fence ended while the old run went on): fenced from it the same way, beside any other
        // worker's fence, or the old run's late result would complete the next attempt. Written
        // too, so a restart keeps it (a /runsync job whose insert is deferred is inserted first).
        else if (job?.status === 'IN_QUEUE') {
          job.fences = new Map(job.fences ?? []).set(workerId, lease);
          worker.fenced.add(id);
          this.#insertDeferred(job);
          const fenced = encodeFences(job.fences.keys());
          job.writeSeq = this.#batch.write(() => this.#repo.setFence(id, fenced));
        }
      }
    }
    // A ping that no longer lists a job ends its stop, unless the worker took the job less than
    // a re-offer period ago and no ping of it has listed the job since: that ping may have been
    // made before the worker registered the job (and the SDK drops a stop for a job it has not
    // registered yet), so the stop would be lost. Once a ping listed it, a later one without it
    // was made after that one (a worker's heartbeat sends one ping at a time), so it says the
    // worker let go of the job: its handler stopped, and the SDK pings at once then.
    for (const [id, stop] of worker.stops) if (!listed.has(id) && now >= stop.keepUntil) this.#stopOver(worker, id);
    // It no longer runs a job flashd ended on it (its stop is over and this ping leaves it out).
    for (const id of worker.ended) if (!listed.has(id) && !worker.stops.has(id)) worker.ended.delete(id);
  }

  /** Whether the row of a job not in memory holds this worker's own posted result (postedByRow). */
  #postedBy(endpointId: string, workerId: string, jobId: string): boolean {
    const row = this.#repo.getWithoutInput(jobId);
    return row?.endpointId === endpointId && postedByRow(row, workerId);
  }

  /**
   * The worker no longer runs a job flashd ended: its stop is over. One left holding nothing is
   * idle from now, not from when flashd ended the job: it was busy running it until now, and
   * its idle timeout starts afresh (else it would be stopped at once).
   */
  #stopOver(worker: WorkerInfo, jobId: string): void {
    if (!this.workers.dropStop(worker, jobId)) return;
    if (worker.stops.size === 0 && worker.jobs.size === 0) worker.idleSince = this.#clock.monotonic();
  }

  /**
   * The fences of a new attempt of `job` (a requeue, a /retry): every worker whose stop for it is
   * pending, in the registry or retired (WorkerRegistry.stillRunning), may still run an old
   * attempt, and a job-take of it would be handed the new one, which clears the old attempt's
   * stop and lets its late result complete the new attempt. `holder`: the worker the job was
   * just taken from, fenced too if it `mayStillRun` (a lapsed lease), never if not (it is dead,
   * whatever stop was just put on it). Each fenced worker's record knows (WorkerInfo.fenced).
   */
  #fenceOldRuns(job: Job, holder?: WorkerInfo, mayStillRun = false): Map<string, number> | null {
    const until = this.#clock.monotonic() + this.settings.leaseMs;
    const fences = new Map<string, number>();
    const fence = (w: WorkerInfo): void => {
      fences.set(w.id, until);
      w.fenced.add(job.id);
    };
    if (holder && mayStillRun) fence(holder);
    for (const w of this.workers.stillRunning(job.endpointId, job.id)) if (w !== holder) fence(w);
    // Running at start, its row fenced from workers that have not pinged since (#bootFences):
    // fenced from each too; the worker's record, once it pings, takes the fence over (#adoptFences).
    const boot = this.#bootFences.get(job.id);
    if (boot !== undefined) {
      this.#bootFences.delete(job.id);
      if (this.#clock.monotonic() < this.#bootFencesUntil) {
        for (const workerId of boot) if (workerId !== holder?.id && !fences.has(workerId)) fences.set(workerId, until);
      }
    }
    return fences.size === 0 ? null : fences;
  }

  /** The worker let go of a job fenced from it: the job may go to it again (its other fences stay). */
  #unfence(worker: WorkerInfo, jobId: string): void {
    worker.fenced.delete(jobId);
    const job = this.#get(jobId);
    if (!job?.fences?.has(worker.id)) return;
    const rest = new Map(job.fences);
    rest.delete(worker.id);
    job.fences = rest.size === 0 ? null : rest;
    if (job.status !== 'IN_QUEUE') return;
    // The row's fence goes too, or a restart would fence the job from this worker again.
    const fenced = encodeFences(rest.keys());
    if (job.inserted) job.writeSeq = this.#batch.write(() => this.#repo.setFence(jobId, fenced));
    this.#dispatch(this.#queue(job.endpointId));
  }

  /** A fence read back from a queued row at start, for the worker's record once it calls (#adoptFences). */
  #addRestoredFence(endpointId: string, workerId: string, jobId: string): void {
    const key = `${endpointId} ${workerId}`;
    let ids = this.#restoredFences.get(key);
    if (!ids) this.#restoredFences.set(key, (ids = new Set()));
    ids.add(jobId);
  }

  /**
   * A worker's first ping since the start: the fences restored for it join its record, so a
   * ping that no longer lists the job ends the fence at once (the fence itself is on the job,
   * which job-take checks whether or not the worker has called yet). Not a retired record, out of
   * the registry (a retired worker's last ping): the fences wait for its record.
   */
  #adoptFences(worker: WorkerInfo): void {
    const key = `${worker.endpointId} ${worker.id}`;
    const ids = this.#restoredFences.get(key);
    if (!ids || this.workers.get(worker.endpointId, worker.id) !== worker) return;
    this.#restoredFences.delete(key);
    for (const id of ids) {
      if (this.#get(id)?.fences?.has(worker.id)) worker.fenced.add(id);
      // A job running at start: this ping says whether it still runs an older attempt (listed:
      // a stop, which fences the next attempt as any pending stop does) or not.
      const boot = this.#bootFences.get(id);
      if (boot?.delete(worker.id) && boot.size === 0) this.#bootFences.delete(id);
    }
  }

  /**
   * flashd ended `job` while `worker` ran it (a cancel, a timeout, attempts used up): it is told
   * to stop, and its late result for that attempt is discarded with a 200, even after a /retry
   * (WorkerInfo.ended). `say`: the listeners hear of it (endedOnWorker), for the endpoint log;
   * not for attempts used up, where the worker is gone or lost its lease (said elsewhere).
   */
  #endedOn(worker: WorkerInfo, job: Job, why: string, say = true): void {
    worker.ended.add(job.id);
    this.#requestStop(worker, job.id, why, job);
    if (say) for (const l of this.#listeners) l.endedOnWorker?.(job, worker.id, why);
  }

  /**
   * Asks `worker` to stop `jobId` (on job-stop). `job`: the job it held, whose claim time bounds
   * how long a ping without the job is taken for one made before the worker registered it,
   * unless a ping of it has listed the job in this run (`pinged`); without it, or once a ping
   * listed the job (the worker has registered it; see ping), a ping that no longer lists the
   * job ends the stop at once. `why`: how flashd ended the job for it (WorkerInfo.stops).
   */
  #requestStop(worker: WorkerInfo, jobId: string, why: string, job?: Job): void {
    // Its late result came first (a /cancel answers after its commit): nothing left to stop.
    if (worker.letGo.has(jobId)) return;
    const mono = this.#clock.monotonic();
    let keepUntil = 0;
    if (job && !(job.pinged && job.workerId === worker.id)) {
      const heldFor = job.startedAt === null ? 0 : Math.max(0, this.#clock.now() - job.startedAt);
      keepUntil = mono - heldFor + STOP_REOFFER_MS;
    }
    this.workers.addStop(worker, jobId, { keepUntil, offered: -1, since: mono, why });
    const waiters = worker.stopWaiters;
    worker.stopWaiters = [];
    for (const w of waiters) w();
  }

  /** Stops due to be offered now, marking them offered; and ms until the next one falls due. */
  #dueStops(worker: WorkerInfo): { ids: string[]; nextInMs: number } {
    const now = this.#clock.monotonic();
    let due = false;
    let nextInMs = Number.POSITIVE_INFINITY;
    for (const { offered } of worker.stops.values()) {
      if (offered < 0 || now - offered >= STOP_REOFFER_MS) due = true;
      else nextInMs = Math.min(nextInMs, STOP_REOFFER_MS - (now - offered));
    }
    if (!due) return { ids: [], nextInMs };
    for (const stop of worker.stops.values()) stop.offered = now;
    return { ids: [...worker.stops.keys()], nextInMs: STOP_REOFFER_MS };
  }

  /**
   * job-stop: the ids this worker must stop. Held until a stop falls due or `holdMs` passes; a
   * pending stop is offered again at most once a second (never in a tight loop).
   */
  stopSignals(endpointId: string, workerId: string, signal: AbortSignal, holdMs = this.settings.takeHoldMs, keyId?: string): Promise<string[]> {
    const worker = this.workers.seen(endpointId, workerId, false, keyId);
    const first = this.#dueStops(worker);
    if (first.ids.length || signal.aborted) return Promise.resolve(first.ids);
    if (worker.draining) return drained<string>(signal, Math.min(DRAIN_POLL_HOLD_MS, holdMs));
    return new Promise((resolve) => {
      let settled = false;
      let timer: NodeJS.Timeout | undefined;
      let holdTimer: NodeJS.Timeout | undefined;
      const finish = (ids: string[]) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearTimeout(holdTimer);
        signal.removeEventListener('abort', onAbort);
        const i = worker.stopWaiters.indexOf(check);
        if (i >= 0) worker.stopWaiters.splice(i, 1);
        resolve(ids);
      };
      const check = () => {
        const { ids, nextInMs } = this.#dueStops(worker);
        // Gone from the registry (its endpoint deleted, its run of flashd over): answered now, not
        // after the hold; the route then gives the 401 a new poll would get when its key went too.
        const gone = this.workers.get(endpointId, workerId) !== worker;
        if (ids.length || worker.draining || worker.revoked || this.#closing || gone) return finish(ids);
        if (!worker.stopWaiters.includes(check)) worker.stopWaiters.push(check);
        clearTimeout(timer);
        if (Number.isFinite(nextInMs)) timer = setTimeout(check, nextInMs);
      };
      const onAbort = () => finish([]);
      holdTimer = setTimeout(() => finish([]), holdMs);
      signal.addEventListener('abort', onAbort, { once: true });
      check();
    });
  }

  /**
   * This worker is to be replaced (stopPod, or a new configuration for a worker flashd
   * launched): a managed one gets no more jobs from now, so jobs submitted after a PATCH run on
   * the new configuration; it finishes what it holds and the autoscaler stops it once idle.
   */
  recycling(endpointId: string, workerId: string, asked = false): void {
    const worker = this.workers.get(endpointId, workerId);
    if (!worker) return;
    // A new configuration outranks the worker's own request: its replacement starts at once.
    worker.refresh = asked && (worker.refresh || !worker.recycle);
    worker.recycle = true;
    worker.retired = false;
    if (worker.managed) this.#answerTakes(worker);
  }

  /**
   * A busy worker flashd launched is above a lowered `workers.max`: like one that asked to be
   * recycled, it takes no new job, keeps its place under `max` and stops once idle, unless
   * `max` leaves room for it again first (unretire).
   */
  retireAboveMax(endpointId: string, workerId: string): void {
    this.recycling(endpointId, workerId, true);
    const worker = this.workers.get(endpointId, workerId);
    if (worker?.refresh) worker.retired = true;
  }

  /** A retired worker fits under `workers.max` again (raised, or others gone): it takes jobs again. */
  unretire(endpointId: string, workerId: string): void {
    const worker = this.workers.get(endpointId, workerId);
    if (!worker?.retired || worker.draining) return;
    worker.retired = false;
    worker.recycle = false;
    worker.refresh = false;
  }

  /**
   * An API key was revoked (AuthService.onRevoked): the workers that use it (WorkerRegistry.keyRevoked)
   * get their parked job-take and job-stop polls answered now, so the SDK meets the 401 at once
   * instead of at the end of the hold, and leave `/health` and the autoscaler's idle workers.
   * Jobs they hold stay theirs until their leases lapse (then requeued, as for any worker that
   * stopped calling). A managed worker (an admin revoked its key) is replaced, as for a new
   * configuration: stopped once idle, with a new key for its successor. Not called when flashd
   * revokes a stopped managed worker's key (revokeKeyById): that path is unchanged.
   */
  keyRevoked(keyId: string, named?: { endpointId: string; workerId: string }): void {
    for (const worker of this.workers.keyRevoked(keyId, named)) {
      this.#answerPolls(worker);
      if (worker.managed) {
        this.recycling(worker.endpointId, worker.id);
        for (const l of this.#listeners) l.recycleWorker?.(worker.endpointId, worker.id);
      }
      this.#log.info('worker key revoked: its polls answered, no longer counted', { endpointId: worker.endpointId, workerId: worker.id, keyId });
    }
  }

  /** Answers a worker's parked job-takes with no job. */
  #answerTakes(worker: WorkerInfo): void {
    const q = this.#queues.get(worker.endpointId);
    if (!q) return;
    const released = q.takers.filter((t) => t.worker === worker);
    if (released.length) q.takers = q.takers.filter((t) => t.worker !== worker);
    for (const t of released) t.resolve([]);
  }

  /**
   * flashd is stopping this worker (scale-down, recycle): it gets no more jobs, and its parked
   * job-take and job-stop polls are answered now. runpod-python's SIGTERM handler only takes
   * effect once those polls return, so without this it sat out a 55 s take and was SIGKILLed
   * after the stop grace period.
   */
  stopping(endpointId: string, workerId: string): void {
    const worker = this.workers.get(endpointId, workerId);
    if (!worker) return;
    worker.draining = true;
    this.#answerPolls(worker);
  }

  /** Answers a worker's parked job-take and job-stop polls now (it is stopping, or its key was revoked). */
  #answerPolls(worker: WorkerInfo): void {
    this.#answerTakes(worker);
    for (const wake of [...worker.stopWaiters]) wake();
  }

  // Final states ------------------------------------------------------------------------------

  /** Takes a running job off its worker; returns that worker (if still known). */
  #release(job: Job): WorkerInfo | undefined {
    this.#running.delete(job);
    const q = this.#queue(job.endpointId);
    q.inProgress--;
    if (job.lowPriority) q.lowInProgress--;
    const worker = job.workerId ? this.workers.get(job.endpointId, job.workerId) : undefined;
    if (worker) {
      worker.jobs.delete(job.id);
      worker.chunks.delete(job.id);
      if (worker.jobs.size === 0) worker.idleSince = this.#clock.monotonic();
    }
    return worker;
  }

  /**
   * Ends a job. `endedAt` (wall clock): when it ended by rule, a deadline that may have passed
   * while flashd was down, so its completedAt, and with it executionTime or delayTime, is the
   * deadline's and not the moment flashd noticed (never later than now). Its retention still
   * counts from now, when the result can first be read.
   */
  #finish(job: Job, status: JobStatus, output: string | null, error: string | null, endedAt = Infinity): void {
    const recorded = this.#clock.now();
    const now = Math.min(recorded, endedAt);
    if (job.status === 'IN_PROGRESS') this.#release(job);
    job.status = status;
    job.output = output;
    job.error = error;
    // Shown only while IN_PROGRESS (a last progress update may be as large as a result).
    job.progress = null;
    // Not shown once final; a /retry reads it back from SQLite.
    const input = job.input;
    job.input = null;
    this.#unhot(job);
    // A job that ends COMPLETED or CANCELLED can never be retried, so nothing needs its extra
    // keys any more, and s3Config's accessSecret is a credential: dropped here and from the row
    // in the same write (insertFinished writes the record as it is now). FAILED and TIMED_OUT
    // keep them for /retry. Nothing after the end reads them: /status and /stream render
    // statusBody, webhooks webhookBody, and neither shows them.
    const dropExtra = status === 'COMPLETED' || status === 'CANCELLED';
    if (dropExtra) job.extra = null;
    job.completedAt = now;
    job.expiresAt = recorded + job.retentionMs;
    if (this.#debug) {
      this.#log.debug('job ended', {
        jobId: job.id, endpointId: job.endpointId, status, workerId: job.workerId ?? undefined, attempt: job.attempt, by: job.resultBy === null ? 'flashd' : 'worker',
        ms: job.startedAt === null ? undefined : now - job.startedAt,
      });
    }
    // No longer active, so out of the floor walk's set (which is not pruned after a failed commit).
    this.#outOfOrder.delete(job);
    const { id, expiresAt, workerId, attempt, startedAt } = job;
    job.claimSaved = attempt;
    // A webhook is owed from the same commit on, so a stop or a crash before it is delivered
    // does not lose it (see webhooksOwed).
    const hook = job.webhook;
    if (hook !== null) this.#webhooksPending.set(id, (this.#webhooksPending.get(id) ?? 0) + 1);
    // FAILED by flashd, not by a worker's result (done() sets resultBy first): marked in the row,
    // so a late result of its worker read back from the row is not taken for a re-post (#owned).
    const byFlashd = status === 'FAILED' && job.resultBy === null;
    if (job.inserted) {
      job.writeSeq = this.#batch.write(() => {
        this.#repo.finish(id, status, output, error, now, expiresAt, workerId, attempt, startedAt, dropExtra);
        if (byFlashd) this.#repo.markEndedByFlashd(id);
        if (hook !== null) this.#repo.webhookOwed(id);
      });
    } else {
      // A /runsync job that finished before its insert was due: one row, written once.
      job.inserted = true;
      job.writeSeq = this.#batch.write(() => {
        job.rowid = this.#repo.insertFinished(job, input as string);
        if (job.rowid > this.#maxRowid) this.#maxRowid = job.rowid;
        if (byFlashd) this.#repo.markEndedByFlashd(id);
        if (hook !== null) this.#repo.webhookOwed(id);
      });
    }
    this.#count(job.endpointId, status, 1, job.retries);
    const seq = job.writeSeq;
    const ended = (): void => {
      wakeWaiters(job);
      // The webhook body carries the input: the one that was in memory, else (a job deep in
      // its queue, or one recovered after a restart) read back from its row.
      let body: string | undefined;
      const render = hook === null ? undefined
        : () => (body ??= webhookBody(job, input ?? this.#repo.inputOf(id), hook, this.#clock.now()));
      for (const l of this.#listeners) l.finished?.(job, render);
      // Durable now (or its sync failed): it may leave memory if finished jobs hold too many
      // bytes (#evict lets go only durable ones; the /runsync reply and the webhook above keep
      // their own reference).
      if (this.#finishedChars > this.settings.finishedBytesInMemory) this.#evict();
    };
    // After a failed sync (the commit itself succeeded) the end stands: SQLite has it and its
    // webhook owed, a restart sends it, and nothing makes the end again. So it is announced all
    // the same, though its own callers got a 500 (its durability is unknown).
    this.#batch.committed().then(ended, () => {
      if (!this.#batch.wasRolledBack(seq)) ended();
    });
    this.#finishedOrder.push(job);
    this.#finishedChars += heldChars(job);
    this.#evict();
  }

  /** Adds to an endpoint's finished-job counts, written once per commit (job_counts). */
  #count(endpointId: string, status: JobStatus, jobs: number, retries: number): void {
    let byStatus = this.#counts.get(endpointId);
    if (!byStatus) this.#counts.set(endpointId, (byStatus = new Map()));
    const c = byStatus.get(status);
    if (c) {
      c.jobs += jobs;
      c.retries += retries;
    } else {
      byStatus.set(status, { jobs, retries });
    }
    if (this.#countsQueued) return;
    this.#countsQueued = true;
    const seq = this.#batch.write(() => {
      this.#countsQueued = false;
      for (const [endpointId, m] of this.#counts) for (const [st, d] of m) this.#repo.addCount(endpointId, st, d.jobs, d.retries);
      this.#counts.clear();
    });
    // A failed commit must not stop all later counts. Its finishes were rolled back, so their
    // counts go too (when another write threw first, this one never ran and they are still here).
    // Not after a failed sync: the counts were committed, and those here now are later finishes'.
    this.#batch.committed().catch(() => {
      if (!this.#batch.wasRolledBack(seq)) return;
      this.#countsQueued = false;
      this.#counts.clear();
    });
  }

  /**
   * #finish, then its commit. A separate wait from #finish's own on purpose: the write batch
   * sizes its group-commit hold by the callers waiting, and sharing one wait measured about
   * 25 % slower in S2 with FULL (`npm run bench:profile -- s2`).
   */
  async #finishCommitted(job: Job, status: JobStatus, output: string | null, error: string | null): Promise<void> {
    this.#finish(job, status, output, error);
    await this.#batch.committed();
  }

  /**
   * Drops finished jobs from memory past the cap or their expiry (SQLite still has them, and
   * their unread stream chunks: a /stream poll reads those by id). Past the byte budget only
   * a job whose final write is durable goes, so a /status read of it from SQLite finds it
   * (a deferred /runsync job has no row before that commit); #finish calls again after it.
   */
  #evict(): void {
    const now = this.#clock.now();
    for (let j = this.#finishedOrder.peek(); j; j = this.#finishedOrder.peek()) {
      const over = this.#finishedOrder.size > this.settings.finishedInMemory
        || (this.#finishedChars > this.settings.finishedBytesInMemory && this.#batch.isDurable(j.writeSeq));
      if (!over && (j.expiresAt ?? 0) > now) break;
      this.#finishedOrder.shift();
      this.#finishedChars = Math.max(0, this.#finishedChars - heldChars(j));
      if (TERMINAL.has(j.status) && this.#jobs.get(j.id) === j) this.#jobs.delete(j.id);
    }
  }

  /**
   * Back to the queue after a lost lease or a dead worker, or FAILED past maxAttempts. An
   * attempt not `charged` (flashd's own shutdown stopped the worker) is given back.
   */
  #requeueOrFail(job: Job, reason: string, mayStillRun = false, charged = true): boolean {
    if (charged && job.attempt >= this.settings.maxAttempts) {
      const holder = job.workerId ? this.workers.get(job.endpointId, job.workerId) : undefined;
      const before = this.#liveState(job);
      this.#finish(job, 'FAILED', null, `${reason}; gave up after ${job.attempt} attempts`);
      this.#retryIfUnstored([{ job, endedAs: 'FAILED', before }]);
      if (holder) this.#endedOn(holder, job, 'failed: no attempt left', false);
      return false;
    }
    const q = this.#queue(job.endpointId);
    const held = this.#heldState(job);
    const unread = this.#unread.get(job.id);
    const worker = this.#release(job);
    if (worker) this.#requestStop(worker, job.id, 'taken back and queued again', job);
    // A lapsed lease: it may still be running the job, so not back to it until it lets go. Nor
    // to a worker still running an earlier attempt (requeued twice: its stop is pending); a dead
    // worker (workerGone) runs nothing.
    job.fences = this.#fenceOldRuns(job, worker, mayStillRun);
    this.#insertDeferred(job);
    job.status = 'IN_QUEUE';
    job.retries++;
    job.workerId = null;
    // The lost attempt held the job from its claim until now: not queue time (delayTime).
    if (job.startedAt !== null) job.lostMs += Math.max(0, this.#clock.now() - job.startedAt);
    job.startedAt = null;
    job.progress = null;
    if (!charged && job.attempt > 0) {
      job.attempt--;
      // The next claim reaches this attempt number again; it must still be written.
      job.claimSaved = -1;
    }
    const { id, retries, attempt, queuedAt, lostMs } = job;
    const fencedFrom = encodeFences(job.fences?.keys() ?? []);
    // The abandoned attempt's unread /stream chunks go in the same commit (as with /retry): the
    // rerun streams its own, and its late chunks are refused as stale. Chunks a client already
    // read stay read: it sees the rerun's from the start (at least once, like execution).
    this.#unread.delete(id);
    job.writeSeq = this.#batch.write(() => {
      // The fence goes in the same statement: a restart keeps it (migration 10).
      this.#repo.requeue(id, retries, attempt, queuedAt, lostMs, fencedFrom);
      this.#repo.dropAllChunks(id);
    });
    this.#log.info('job requeued', { jobId: id, endpointId: job.endpointId, attempt, reason });
    this.#enqueue(q, job, true);
    this.#batch.committed().catch(() => this.#unrequeue(job, held, unread));
    return true;
  }

  /**
   * A requeue whose commit failed (rolled back: the row still has the job running on the worker
   * that lost it): the job goes back to that worker in memory, its lease lapsed, so the next
   * reap pass requeues it again (or gives up) and writes it. A worker that took it meanwhile (a
   * parked take is handed it in the requeue's own turn) lets it go and is told to stop it.
   * Otherwise memory has it queued while the row does not: a new claim, written only on a
   * queued row, never reaches the row, and a restart gives the job back to the lost worker.
   */
  #unrequeue(job: Job, held: HeldState, unread: UnreadStream | undefined): void {
    if (this.#get(job.id) !== job || !this.#batch.wasRolledBack(job.writeSeq) || job.retries !== held.retries + 1) return;
    const q = this.#queue(job.endpointId);
    if (job.status === 'IN_QUEUE') {
      // Out of its queue's counts and of the retry deque (short); a purge holding it skips it
      // once it is running again.
      this.#leave(job);
      q.retry.retain((j) => j !== job);
    } else if (job.status === 'IN_PROGRESS') {
      const taker = this.#release(job);
      if (taker) this.#requestStop(taker, job.id, 'not stored (its commit failed)', job);
    } else {
      return; // ended since (a cancel), and that end is written or undone on its own
    }
    // The fences the requeue put on the workers go (the job is the lost worker's own again).
    for (const workerId of job.fences?.keys() ?? []) {
      if (held.fences?.has(workerId)) continue;
      this.workers.getOrRetired(job.endpointId, workerId)?.fenced.delete(job.id);
    }
    Object.assign(job, held);
    job.status = 'IN_PROGRESS';
    job.leaseDeadline = this.#clock.monotonic();
    this.#running.add(job);
    q.inProgress++;
    if (job.lowPriority) q.lowInProgress++;
    const worker = job.workerId ? this.workers.get(job.endpointId, job.workerId) : undefined;
    if (worker) worker.jobs.add(job.id);
    if (unread && !this.#unread.has(job.id)) this.#unread.set(job.id, unread);
  }

  /**
   * The runtime saw a worker die: its jobs go back to the queue at once (or fail, where that was
   * their last attempt). Returns the jobs it held, each with whether it went back (`requeued`).
   */
  workerGone(endpointId: string, workerId: string, reason: string, charged = true): { jobId: string; requeued: boolean }[] {
    const worker = this.workers.get(endpointId, workerId);
    if (!worker) return [];
    const released: { jobId: string; requeued: boolean }[] = [];
    for (const id of [...worker.jobs]) {
      const job = this.#get(id);
      if (job && job.status === 'IN_PROGRESS' && job.workerId === workerId) {
        released.push({ jobId: id, requeued: this.#requeueOrFail(job, reason, false, charged) });
      }
    }
    return released;
  }

  // Client operations -------------------------------------------------------------------------

  /** The job of this endpoint, from memory or SQLite; undefined when unknown or expired. */
  find(endpointId: string, jobId: string): JobSnapshot | undefined {
    const now = this.#clock.now();
    const job = this.#get(jobId);
    if (job) {
      if (job.endpointId !== endpointId || (job.expiresAt !== null && job.expiresAt <= now)) return undefined;
      return job;
    }
    const row = this.#repo.getWithoutInput(jobId);
    if (!row || row.endpointId !== endpointId || (row.expiresAt !== null && row.expiresAt <= now)) return undefined;
    return { ...row, progress: null };
  }

  /**
   * Resolves once every state change made so far is committed, so a reply built after it never
   * shows a result that a crash could still take back (at once when nothing is pending).
   */
  durable(): Promise<void> {
    return this.#batch.committed();
  }

  /**
   * The job as a crash could no longer take back: at once when its last write is durable (the
   * usual case for a polled job), else after the pending commits; undefined when unknown.
   *
   * A commit it waited on that failed (a full disk) may hold none of the job's writes, and one
   * that held them has its change put back in memory as SQLite has it by the path that made it
   * (#unfinishAll, #unrequeue, #unretry), in that path's own promise reactions, some of which
   * run after this one: the read waits those out (one macrotask) and looks again. Only a change
   * of the job that nothing put back, which is not on disk, makes it fail (a 500).
   */
  async findDurable(endpointId: string, jobId: string): Promise<JobSnapshot | undefined> {
    for (let round = 0; ; round++) {
      const job = this.#get(jobId);
      if (!job || this.#batch.isDurable(job.writeSeq) || round === 3) return this.find(endpointId, jobId);
      try {
        await this.#batch.committed();
      } catch (err) {
        await new Promise((resolve) => setImmediate(resolve));
        const now = this.#get(jobId);
        if (now && this.#batch.hasFailed(now.writeSeq)) throw err;
      }
    }
  }

  /**
   * A delivery of `jobId`'s webhook was made or gave up. The row goes with the last delivery in
   * flight: a /retry's run may finish while the first run's delivery is still retrying.
   */
  webhookSettled(jobId: string): void {
    const left = (this.#webhooksPending.get(jobId) ?? 1) - 1;
    if (left > 0) {
      this.#webhooksPending.set(jobId, left);
      return;
    }
    this.#webhooksPending.delete(jobId);
    const orphan = this.#hookOrphans.delete(jobId);
    try {
      this.#batch.write(() => {
        this.#repo.webhookSettled(jobId);
        if (orphan) this.#repo.deleteJob(jobId);
      });
    } catch {
      // The store is closed (a delivery that ended during shutdown): the next start sends it again.
    }
  }

  /**
   * A try of `jobId`'s webhook failed and another follows: the `tries` made so far are kept with
   * the owed webhook, so that a start after a stop or a crash goes on at the next try.
   */
  webhookTried(jobId: string, tries: number): void {
    try {
      this.#batch.write(() => this.#repo.webhookTried(jobId, tries));
    } catch {
      // The store is closed: the next start counts from the tries recorded before.
    }
  }

  /**
   * Webhooks a stop or a crash left undelivered (read at start): each job's id, URL and the tries
   * it made (none of them a 2xx), read without its input or output (thousands may be owed; a body
   * is built when its delivery's turn comes, webhookBody). A result that expired meanwhile is still there for it (the expiry
   * sweep keeps rows owed a webhook), and so is one whose endpoint was deleted (its row goes
   * once the delivery settles). An owed row whose job is gone (deleted by a version before
   * deletion kept them) is dropped.
   */
  webhooksOwed(): { jobId: string; url: string; tries: number }[] {
    const owed: { jobId: string; url: string; tries: number }[] = [];
    const gone: string[] = [];
    for (const { jobId, tries, status, webhook, endpointId } of this.#repo.owedWebhooks()) {
      // Ended by this start's recovery (a released worker's last attempt): its delivery is under way.
      if (this.#webhooksPending.has(jobId)) continue;
      if (status === null || !TERMINAL.has(status) || webhook === null || endpointId === null) {
        gone.push(jobId);
        continue;
      }
      owed.push({ jobId, url: webhook, tries });
      this.#webhooksPending.set(jobId, 1);
      if (!this.#endpointExists(endpointId)) this.#hookOrphans.add(jobId);
    }
    if (gone.length) this.#batch.write(() => { for (const id of gone) this.#repo.webhookSettled(id); });
    return owed;
  }

  /**
   * The body a try of `jobId`'s webhook POSTs, built from its row (input included) as #finish
   * built it, so the same text: called when a delivery's turn comes, so one waiting holds no
   * body (a deleted endpoint's job still owed one keeps its row for it). Undefined when there
   * is nothing to send: the row is gone or no longer final (a /retry began a new run).
   */
  webhookBody(jobId: string): string | undefined {
    // A webhook body never carries the extra keys (s3Config): they are not opened for it.
    const row = this.#repo.get(jobId, { extra: false });
    if (!row || !TERMINAL.has(row.status) || row.webhook === null) return undefined;
    return webhookBody({ ...row, progress: null }, row.input, row.webhook, this.#clock.now());
  }

  /** Live job object, when in memory. */
  live(jobId: string): Job | undefined {
    return this.#get(jobId);
  }

  /** Waits until the job is final or `ms` passes (runsync). The job goes on either way. */
  waitFinal(job: Job, ms: number, cancel: Cancellation): Promise<void> {
    if (TERMINAL.has(job.status) && job.waiters.length === 0) return Promise.resolve();
    return this.#park(job, ms, cancel);
  }

  /**
   * /stream `?wait=` (RunPod's Go SDK polls /stream in a loop with no pause of its own): resolves
   * when a chunk of the job can be read, the job ends, `ms` pass or the client goes away.
   */
  waitStream(job: Job, ms: number, cancel: Cancellation): Promise<void> {
    if (TERMINAL.has(job.status)) return Promise.resolve();
    let parked = this.#streamWaiters.get(job.id);
    if (!parked) this.#streamWaiters.set(job.id, (parked = new Set()));
    const chunks = parked;
    return this.#park(job, ms, cancel, (wake) => {
      chunks.add(wake);
      return () => {
        chunks.delete(wake);
        if (chunks.size === 0 && this.#streamWaiters.get(job.id) === chunks) this.#streamWaiters.delete(job.id);
      };
    });
  }

  /**
   * Resolves when the job's end wakes its waiters (a cancel, the endpoint's deletion and shutdown
   * do too), `ms` pass or the client goes away; `also` registers one more wake-up and returns
   * its removal.
   */
  #park(job: Job, ms: number, cancel: Cancellation, also?: (wake: () => void) => () => void): Promise<void> {
    return new Promise((resolve) => {
      let settled = false;
      let unhook = NOOP;
      let unpark = NOOP;
      const settle = () => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        unhook();
        unpark();
        const i = job.waiters.indexOf(settle);
        if (i >= 0) job.waiters.splice(i, 1);
        resolve();
      };
      const timer = setTimeout(settle, ms);
      if (also) unpark = also(settle);
      (job.waiters === NO_WAITERS ? (job.waiters = []) : job.waiters).push(settle);
      unhook = cancel.onAbort(settle);
    });
  }

  /**
   * /status `?ttl=`: the result is kept this long from now (or from completion, if still
   * running). Resolves once that is durable: the reply says the ttl was set, so a crash right
   * after it must not take the ttl back (a longer one would otherwise expire the result early).
   */
  setRetention(endpointId: string, jobId: string, ms: number): Promise<void> {
    const job = this.#get(jobId);
    const now = this.#clock.now();
    // Expired since the caller found it: gone for good (an expired row kept for its webhook has
    // already left job_counts, and a new expiry would have it counted off again when it goes).
    if (job && job.expiresAt !== null && job.expiresAt <= now) return Promise.resolve();
    if (job && job.endpointId === endpointId) {
      const changed = job.retentionMs !== ms;
      job.retentionMs = ms;
      if (job.completedAt !== null) {
        job.expiresAt = now + ms;
        const exp = job.expiresAt;
        // With the retention it came from: a /retry's run keeps it, also when read back from the row after a restart.
        job.writeSeq = this.#batch.write(() => this.#repo.setExpiry(jobId, exp, ms));
      } else if (job.inserted && (changed || this.#batch.hasFailed(job.writeSeq))) {
        // Not finished yet: its final write reads retentionMs, but a restart reads the row (a
        // client polling with the same ?ttl= writes it once, not once a poll; again when the
        // job's last write failed: the ttl in memory may be one that never reached the row).
        job.writeSeq = this.#batch.write(() => this.#repo.setRetention(jobId, ms));
      }
      return this.#batch.isDurable(job.writeSeq) ? Promise.resolve() : this.#batch.committed();
    }
    const row = this.#repo.getWithoutInput(jobId);
    if (!row || row.endpointId !== endpointId || row.completedAt === null || (row.expiresAt !== null && row.expiresAt <= now)) return Promise.resolve();
    this.#batch.write(() => this.#repo.setExpiry(jobId, now + ms, ms));
    return this.#batch.committed();
  }

  /**
   * Drains the chunks posted since the last poll: each one's JSON text (`{"output":…}`, with
   * `metrics` when sent), in order. SQLite is read only when there are acknowledged chunks not
   * handed out yet; they are deleted in the next commit. The reply does not wait for that
   * delete: memory already knows they were read, and a crash before it commits only hands them
   * out again after the restart (at least once), so a poll costs no disk wait.
   */
  drainStream(endpointId: string, jobId: string): { status: JobStatus; stream: string[] } | undefined {
    const snap = this.find(endpointId, jobId);
    const unread = this.#unread.get(jobId);
    if (!snap) {
      // Expired (its rows are gone or going): an entry left by a post acknowledged meanwhile goes too.
      if (unread?.endpointId === endpointId) this.#unread.delete(jobId);
      return undefined;
    }
    if (!unread || unread.endpointId !== endpointId || unread.read >= unread.upTo) return { status: snap.status, stream: [] };
    // At most STREAM_POLL_BYTES of them: the rest wait in SQLite for the next poll.
    const { chunks: stream, last: upTo } = this.#repo.chunks(jobId, unread.read, unread.upTo, STREAM_POLL_BYTES);
    unread.read = upTo;
    this.#batch.write(() => {
      this.#repo.dropChunks(jobId, upTo);
      // Nothing new since: forgotten. A chunk acknowledged later starts a new entry, and every
      // row up to `upTo` is deleted by then, so its read from -1 sees only the new ones.
      if (this.#unread.get(jobId) === unread && unread.read >= unread.upTo) this.#unread.delete(jobId);
    });
    // Chunks left for the next poll: not a final status yet, whatever the job's, so a client
    // that stops at the final status (runpod-sdk's stream(), runpod-python's AsyncioJob.stream())
    // polls again and gets them; the poll that hands out the last one says how the job ended.
    return { status: upTo < unread.upTo && TERMINAL.has(snap.status) ? 'IN_PROGRESS' : snap.status, stream };
  }

  async cancel(endpointId: string, jobId: string): Promise<JobSnapshot> {
    // An expired result may still be in memory (eviction goes in completion order): find() says 404 for it.
    const snap = this.find(endpointId, jobId);
    if (!snap) throw jobNotFound(jobId);
    const job = this.#get(jobId);
    if (!job || job.endpointId !== endpointId) return snap;
    // A cancel that is not stored (a full disk) leaves the job as it was: the caller gets a 500.
    const live = this.#liveState(job);
    if (job.status === 'IN_QUEUE') {
      this.#leave(job);
      await this.#finishCommitted(job, 'CANCELLED', null, null).catch((err: unknown) => {
        this.#unfinish(job, 'CANCELLED', live);
        throw err;
      });
    } else if (job.status === 'IN_PROGRESS') {
      const worker = job.workerId ? this.workers.get(endpointId, job.workerId) : undefined;
      try {
        await this.#finishCommitted(job, 'CANCELLED', null, null);
      } catch (err) {
        this.#unfinish(job, 'CANCELLED', live);
        throw err;
      } finally {
        // Also after a failed sync: the cancel stands (SQLite has it), so the worker stops.
        if (worker && (job.status as JobStatus) === 'CANCELLED') this.#endedOn(worker, job, 'cancelled');
      }
    }
    return job;
  }

  async retry(endpointId: string, jobId: string): Promise<JobSnapshot> {
    // Its first row is written by a pending commit, which sets the rowid on the record in memory:
    // the fresh record below copies it, so wait for that write first.
    if (this.#get(jobId)?.rowid === 0) await this.#batch.committed().catch(() => undefined);
    const snap = this.find(endpointId, jobId);
    if (!snap) throw jobNotFound(jobId);
    if (snap.status !== 'FAILED' && snap.status !== 'TIMED_OUT') {
      throw new AgentError('JOB_NOT_IN_STATE', `Only FAILED or TIMED_OUT jobs can be retried; job ${jobId} is ${snap.status}.`);
    }
    // A fresh record, never the finished one: a job that timed out in the queue is still in its
    // deque (deques drop ended jobs lazily), and reviving that object would put it back at its
    // old place in line, ahead of newer jobs and around any fence.
    const finished = this.#get(jobId);
    const job: Job = finished ? { ...finished } : this.#fromRow(this.#repo.get(jobId) as JobRow, this.#clock.monotonic(), this.#clock.now());
    this.#jobs.set(jobId, job);
    // It leaves the finished counts (job_counts) it was in.
    this.#count(endpointId, job.status, -1, -job.retries);
    job.status = 'IN_QUEUE';
    job.output = null;
    job.error = null;
    job.progress = null;
    // A new run: the old run's unread chunks go (below, in the same write).
    const unread = this.#unread.get(jobId);
    this.#unread.delete(jobId);
    job.workerId = null;
    job.resultBy = null;
    job.startedAt = null;
    job.completedAt = null;
    job.expiresAt = null;
    job.retries++;
    // A new run: attempts (maxAttempts), TTL and delayTime start again, and they are written
    // down, so a restart neither times it out against the first submit nor skips its claim.
    job.attempt = 0;
    job.claimSaved = 0;
    // The workers that ran ended attempts may still be running them (a timeout, or a lost lease,
    // ends a job on flashd's side; the stop is pending until its pings drop the job). A result
    // post carries no attempt number, so were the new run handed to such a worker, its late
    // result of the old run would complete the new one: the new run is fenced from each, like a
    // lapsed lease. Every one, not only the last holder: a job retried twice may still run on
    // both. (A worker that posted the old run's result itself is done with it, whatever its
    // pings say: it has no stop.) Retired records too (stopPod, with the old run's stop pending
    // on it): a job-take from it brings that record back, and the claim of the new run would
    // clear the old run's stop.
    job.fences = this.#fenceOldRuns(job);
    job.queuedAt = this.#clock.now();
    job.lostMs = 0;
    (job as { ttlDeadline: number }).ttlDeadline = this.#clock.monotonic() + job.ttlMs;
    const { retries, queuedAt } = job;
    const fencedFrom = encodeFences(job.fences?.keys() ?? []);
    const retried = job;
    job.writeSeq = this.#batch.write(() => {
      this.#repo.requeue(jobId, retries, 0, queuedAt, 0, fencedFrom);
      this.#repo.dropAllChunks(jobId);
      if (retried.rowid < this.#floor) this.#lowerFloor(retried.rowid);
    });
    // Queued behind newer jobs with its old rowid: out of the deque's rowid order.
    this.#outOfOrder.add(job);
    for (const l of this.#listeners) l.retried?.(job);
    this.#enqueue(this.#queue(endpointId), job, false);
    try {
      await this.#batch.committed();
    } catch (err) {
      this.#unretry(job, finished, snap.status, unread);
      throw err;
    }
    return job;
  }

  /**
   * A /retry whose commit failed (rolled back: the row still has the ended run): the new run's
   * record goes, off its queue or the worker a parked take handed it to (told to stop it), and
   * the ended record (or none: the row answers) is the job again, so the client's retry of the
   * /retry is written. Otherwise the unstored run went to a worker whose claim and result, both
   * conditional on a queued or running row, changed nothing, the retried /retry was refused 409,
   * and a restart found the old end. Its counts went with the commit (#count).
   */
  #unretry(job: Job, finished: Job | undefined, endedAs: JobStatus, unread: UnreadStream | undefined): void {
    if (this.#get(job.id) !== job || !this.#batch.wasRolledBack(job.writeSeq)) return;
    if (job.status === 'IN_QUEUE') {
      this.#leave(job);
    } else if (job.status === 'IN_PROGRESS') {
      const worker = this.#release(job);
      if (worker) this.#requestStop(worker, job.id, 'not stored (its commit failed)', job);
    } else {
      return; // ended meanwhile, and that end stored: it stands
    }
    // No longer live: its deque and TTL entries are dropped as stale, its claim is not written.
    job.status = endedAs;
    this.#outOfOrder.delete(job);
    if (finished) this.#jobs.set(job.id, finished);
    else this.#jobs.delete(job.id);
    if (unread && !this.#unread.has(job.id)) this.#unread.set(job.id, unread);
  }

  /**
   * Removes every queued job of the endpoint (they end CANCELLED); running jobs go on. All of
   * them leave the queue at once, so no worker takes one after the call; they are ended
   * PURGE_SLICE_JOBS per commit, so a backlog of a million is not one commit holding the event
   * loop (and every other endpoint) for seconds. Until its slice commits a job is still
   * IN_QUEUE in SQLite: the recovery floor is held, so a crash mid-purge requeues the rest
   * (the purge was not answered), and a failed commit puts them back on the queue.
   */
  async purge(endpointId: string): Promise<number> {
    const q = this.#queue(endpointId);
    // The queue's deques change hands whole (no walk here: a million jobs would hold the loop);
    // jobs of this generation still IN_QUEUE in them are the purge's, ended slice by slice.
    const taken = [q.retry, q.normal, q.low];
    const gen = q.gen;
    q.retry = new Deque();
    q.normal = new Deque();
    q.low = new Deque();
    // Every entry is of the purged generation (a job put back after a failed commit gets a new one).
    q.ttls = new MinHeap();
    q.gen = ++this.#queueGens;
    const count = q.queued + q.lowQueued;
    q.queued = 0;
    q.lowQueued = 0;
    q.queuedRetries = 0;
    const mine = (job: Job): boolean => job.status === 'IN_QUEUE' && job.queueGen === gen;
    if (count === 0) {
      // Nothing to end (or a purge under way holds it all): still answer after what is pending.
      await this.#batch.committed();
      return 0;
    }
    let removed = 0;
    let d = 0;
    // The slice whose commit failed: its jobs go back on the queue with the ones not reached.
    let unstored = null as Ending[] | null;
    this.#floorHeld++;
    // Deleting the endpoint meanwhile finds the jobs still in them here.
    q.held.push(taken);
    try {
      while (d < taken.length) {
        // The endpoint was deleted meanwhile: its rows are being deleted, nothing left to end.
        if (this.#queues.get(endpointId) !== q) break;
        const slice: Ending[] = [];
        for (let n = 0; n < PURGE_SLICE_JOBS && d < taken.length;) {
          const job = (taken[d] as Deque<Job>).shift();
          if (!job) {
            d++;
            continue;
          }
          if (!mine(job)) continue; // cancelled meanwhile, or ended before the purge
          slice.push({ job, endedAs: 'CANCELLED', before: this.#liveState(job) });
          this.#finish(job, 'CANCELLED', null, null);
          removed++;
          n++;
        }
        try {
          await this.#batch.committed();
        } catch (err) {
          unstored = slice;
          throw err;
        }
      }
    } finally {
      this.#floorHeld--;
      q.held.splice(q.held.indexOf(taken), 1);
      // Only after a failed commit: what was not ended goes back on its queue, behind jobs
      // submitted meanwhile, so out of rowid order (the floor walk reads them). Not when the
      // endpoint was deleted: its deletion took these deques (dropEndpoint) and empties them.
      if (this.#queues.get(endpointId) === q) {
        if (unstored) this.#unfinishAll(unstored);
        for (; d < taken.length; d++) {
          for (let job = (taken[d] as Deque<Job>).shift(); job; job = (taken[d] as Deque<Job>).shift()) {
            if (!mine(job)) continue;
            this.#outOfOrder.add(job);
            this.#enqueue(q, job, false);
          }
        }
      }
    }
    return removed;
  }

  health(endpointId: string): { jobs: Record<string, number>; workers: WorkerCounts } {
    const q = this.#queue(endpointId);
    // Finished jobs are counted in job_counts; the retries of queued and running jobs are here.
    const { byStatus, retried } = this.#repo.counts(endpointId);
    let activeRetries = q.queuedRetries;
    for (const job of this.#running) if (job.endpointId === endpointId && job.status === 'IN_PROGRESS') activeRetries += job.retries;
    return {
      jobs: {
        completed: byStatus.COMPLETED ?? 0,
        failed: (byStatus.FAILED ?? 0) + (byStatus.TIMED_OUT ?? 0),
        inProgress: q.inProgress,
        inQueue: q.queued + q.lowQueued,
        retried: retried + activeRetries,
      },
      workers: this.workers.counts(endpointId),
    };
  }

  /** What the autoscaler needs about one endpoint's queue (`inProgress`: normal-priority jobs only). */
  load(endpointId: string): { queued: number; lowQueued: number; inProgress: number; oldestWaitMs: number } {
    const q = this.#queues.get(endpointId);
    if (!q) return { queued: 0, lowQueued: 0, inProgress: 0, oldestWaitMs: 0 };
    let oldest = 0;
    const now = this.#clock.now();
    for (const d of [q.retry, q.normal]) {
      for (const job of d) {
        // Requeued low-priority jobs share the retry deque; they never cause a scale-up.
        if (job.status === 'IN_QUEUE' && !job.lowPriority) {
          oldest = Math.max(oldest, now - job.queuedAt);
          break;
        }
      }
    }
    return { queued: q.queued, lowQueued: q.lowQueued, inProgress: q.inProgress - q.lowInProgress, oldestWaitMs: oldest };
  }

  /**
   * Whether a worker runs a job that `load` counts (a normal-priority one): one busy only with
   * low-priority jobs, or with jobs flashd ended that its handler still runs, serves none of them.
   */
  runsCountedJob(worker: WorkerInfo): boolean {
    for (const id of worker.jobs) if (this.#get(id)?.lowPriority !== true) return true;
    return false;
  }

  /**
   * The endpoint is being deleted: wake everything parked on it and forget its jobs. Found
   * through the endpoint's own lists, never a walk of every job in memory (400k jobs of other
   * endpoints: ~30 ms of the event loop to delete an empty one). Its running and finished jobs
   * go now (few: bounded by its workers and finishedInMemory); its queue's deques, and those a
   * purge in flight holds, leave memory DROP_SLICE_JOBS a turn (#dropStep), and meanwhile every
   * lookup by id passes their jobs by (#get), so from this call on none is found, taken,
   * finished, streamed to or inserted (a deferred /runsync insert).
   */
  dropEndpoint(endpointId: string): void {
    const q = this.#queues.get(endpointId);
    if (q) {
      for (const t of q.takers.splice(0)) t.resolve([]);
      this.#queues.delete(endpointId);
      const lists = this.#dropping.get(endpointId) ?? [];
      for (const d of [q.retry, q.normal, q.low, ...q.held.flat()]) if (d.size > 0) lists.push(d);
      if (lists.length > 0) {
        this.#dropping.set(endpointId, lists);
        if (!this.#dropQueued) {
          this.#dropQueued = true;
          setImmediate(() => this.#dropStep());
        }
      }
    }
    // A running job is in #running only (the reaper would time it out or requeue it).
    for (const job of this.#running) {
      if (job.endpointId !== endpointId) continue;
      this.#running.delete(job);
      this.#forgetDropped(job);
    }
    // Finished jobs are on #finishedOrder (a /retry's new run is on a deque).
    if (this.#finishedOrder.size > 0) {
      this.#finishedOrder.retain((job) => {
        if (job.endpointId !== endpointId) return true;
        this.#finishedChars = Math.max(0, this.#finishedChars - heldChars(job));
        this.#forgetDropped(job);
        return false;
      });
    }
    // Their chunk rows go with the job rows (trigger).
    for (const [id, u] of this.#unread) if (u.endpointId === endpointId) this.#unread.delete(id);
    this.workers.dropEndpoint(endpointId);
    this.#counts.delete(endpointId);
    this.#repo.dropCounts(endpointId);
    // Jobs that ended before the deletion are owed their webhooks all the same (RunPod sends one
    // for every job that ended): their rows stay for the bodies until each delivery settles.
    for (const id of this.#repo.webhooksOwedOf(endpointId)) this.#hookOrphans.add(id);
    this.#deleteRows(endpointId);
  }

  /** A job of a deleted endpoint leaves memory; whoever waits on it is woken. */
  #forgetDropped(job: Job): void {
    if (this.#jobs.get(job.id) === job) this.#jobs.delete(job.id);
    this.#outOfOrder.delete(job);
    wakeWaiters(job);
  }

  /**
   * Takes the next DROP_SLICE_JOBS queued jobs of deleted endpoints out of memory, then the
   * next slice in a later turn. Stopping leaves the rest: the process is about to exit, and
   * close() wakes their waiters.
   */
  #dropStep(): void {
    this.#dropQueued = false;
    if (this.#closing) return;
    let budget = DROP_SLICE_JOBS;
    for (const [endpointId, lists] of this.#dropping) {
      while (budget > 0 && lists.length > 0) {
        const job = (lists[lists.length - 1] as Deque<Job>).shift();
        if (job === undefined) {
          lists.pop();
          continue;
        }
        this.#forgetDropped(job);
        budget--;
      }
      if (lists.length === 0) this.#dropping.delete(endpointId);
      if (budget === 0) break;
    }
    if (this.#dropping.size > 0) {
      this.#dropQueued = true;
      setImmediate(() => this.#dropStep());
    }
  }

  /**
   * Deletes an endpoint's rows in rowid slices (there is no per-endpoint index to find them
   * by): a small table at once, a large one through the write batch, DELETE_SLICE_ROWS rowids a
   * commit, so a deletion never stalls the loop for long.
   */
  #deleteRows(endpointId: string): void {
    const range = this.#repo.rowidRange();
    if (!range) return;
    const end = range.hi + 1;
    if (end - range.lo <= DELETE_SLICE_ROWS) {
      this.#repo.deleteSlice(endpointId, range.lo, end);
      return;
    }
    // Active rows memory no longer holds: the recovery floor stays below them until they are gone.
    this.#floorHeld++;
    this.#deletions.push({ endpointId, from: range.lo, end });
    if (!this.#deleteQueued) this.#deleteStep();
  }

  /**
   * Writes the next slice of the oldest deletion. The one after it is queued by the commit that
   * runs this one, in a later turn: a slice queued every turn regardless would pile up behind a
   * WAL sync in flight and commit together with the others (group commit), one long turn; and
   * deletions of several endpoints at once take turns, not a slice each per commit.
   */
  #deleteStep(): void {
    // Stopping: the store is about to close, and a write after that throws from this
    // setImmediate (an uncaught exception). The rows left go at the next start (active ones:
    // recover) or when their results expire (the sweep counts no deleted endpoint's).
    if (this.#closing) return;
    const d = this.#deletions[0];
    if (!d) return;
    const from = d.from;
    const to = Math.min(d.end, from + DELETE_SLICE_ROWS);
    d.from = to;
    this.#deleteQueued = true;
    let ran = false;
    this.#batch.write(() => {
      ran = true;
      // Cleared first: a slice that throws fails its commit and stops the chain here (its rows
      // go at the next start or when their results expire), and the next deletion starts it again.
      this.#deleteQueued = false;
      this.#repo.deleteSlice(d.endpointId, from, to);
      if (to >= d.end) {
        this.#deletions.shift();
        this.#floorHeld--;
      }
      if (this.#deletions.length) {
        this.#deleteQueued = true;
        setImmediate(() => this.#deleteStep());
      }
    });
    // Another write queued ahead of this slice in the same commit (a /run insert read in the
    // turn before) can fail it before the slice runs: nothing would queue the next one, and
    // #deleteQueued would hold off every later deletion too. The slice is written again.
    this.#batch.committed().catch(() => {
      if (ran || this.#closing) return;
      d.from = from;
      this.#deleteQueued = false;
      this.#deleteStep();
    });
  }

  // The recovery floor (see the file header) -------------------------------------------------

  /** Inside a write: an active row at `rowid` is below the floor, so the floor goes down to it. */
  #lowerFloor(rowid: number): void {
    this.#floor = rowid;
    this.#repo.setFloor(rowid);
  }

  /** Queues a write that raises the floor to the lowest active rowid, computed at commit time. */
  #raiseFloor(): void {
    // Checked now as well, so an idle server writes (and syncs) nothing.
    // After a failed commit memory may hold a row as ended that SQLite still has as active: the
    // floor stays where it is until a restart reads the rows again.
    if (this.#floorQueued || this.#floorHeld > 0 || this.#batch.failures > 0 || this.#lowestActiveRowid() <= this.#floor) return;
    this.#floorQueued = true;
    this.#batch.write(() => {
      this.#floorQueued = false;
      if (this.#floorHeld > 0 || this.#batch.failures > 0) return;
      const floor = this.#lowestActiveRowid();
      if (floor > this.#floor) {
        this.#floor = floor;
        this.#repo.setFloor(floor);
      }
    });
  }

  /**
   * The lowest rowid of a queued or running job, or one past the highest rowid when none is.
   * The normal and low-priority deques are in rowid order (jobs enter them in insert order,
   * recovery refills them in rowid order) except for the jobs in #outOfOrder (manual retries,
   * deferred /runsync inserts), so their first other queued job is their lowest; the retry
   * deque, running jobs and #outOfOrder are read whole. A job whose insert has not run yet
   * (rowid 0) will get a rowid above every row there is (or lower the floor itself).
   */
  #lowestActiveRowid(): number {
    let min = this.#maxRowid + 1;
    for (const q of this.#queues.values()) {
      for (const d of [q.normal, q.low]) {
        for (const job of d) {
          // Skipped: not inserted yet (rowid 0), and jobs out of rowid order (a deferred /runsync
          // job once written, a manual retry), which the loop below reads.
          if (job.status !== 'IN_QUEUE' || job.rowid === 0 || this.#outOfOrder.has(job)) continue;
          if (job.rowid < min) min = job.rowid;
          break;
        }
      }
      for (const job of q.retry) if (job.status === 'IN_QUEUE' && job.rowid > 0 && job.rowid < min) min = job.rowid;
    }
    for (const job of this.#running) if (job.rowid > 0 && job.rowid < min) min = job.rowid;
    for (const job of this.#outOfOrder) {
      if (job.status !== 'IN_QUEUE' && job.status !== 'IN_PROGRESS') this.#outOfOrder.delete(job);
      else if (job.rowid > 0 && job.rowid < min) min = job.rowid;
    }
    return min;
  }

  // Timers ------------------------------------------------------------------------------------

  /**
   * Sets the deadline timer for `at` (monotonic ms) unless it already fires by then: on the job
   * path one comparison, as running jobs' deadlines mostly come later than the earliest.
   */
  #armDeadline(at: number, mono: number): void {
    if (at >= this.#deadlineAt || this.#closing) return;
    if (this.#deadlineTimer) clearTimeout(this.#deadlineTimer);
    this.#deadlineAt = at;
    // +1: fire when the deadline has passed (reap compares with >=), within a timer's range.
    this.#deadlineTimer = setTimeout(() => {
      this.#deadlineTimer = null;
      this.#deadlineAt = Infinity;
      this.reap();
    }, Math.min(MAX_TIMER_MS, Math.max(0, at - mono) + 1)).unref();
  }

  /** Leases, execution timeouts and TTLs, measured on this server's monotonic clock. */
  reap(): void {
    const mono = this.#clock.monotonic();
    let next = Infinity;
    // This pass's ends, undone if their commit fails so that a later pass makes them again.
    let ends: Ending[] | undefined;
    // At most a slice of running jobs ended (REAP_RUNNING_SLICE_JOBS); the rest in the next pass,
    // after this one's commit. Every running job is still looked at (a comparison or three each),
    // so the deadline timer is armed for the earliest deadline not yet due.
    let slice = REAP_RUNNING_SLICE_JOBS;
    let more = false;
    for (const job of [...this.#running]) {
      if (job.status !== 'IN_PROGRESS') continue;
      const due = mono >= job.execDeadline || mono >= job.ttlDeadline;
      if (!due) next = Math.min(next, job.execDeadline, job.ttlDeadline);
      if (!due && mono < job.leaseDeadline) continue;
      if (slice === 0) {
        more = true;
        continue;
      }
      slice--;
      if (due) {
        (ends ??= []).push(this.#timeOut(job));
        continue;
      }
      // A worker still heard from whose heartbeats no longer list the job dropped it (runpod-python
      // does when the handler's output cannot be serialised): say so, not "no heartbeat".
      const worker = job.workerId ? this.workers.get(job.endpointId, job.workerId) : undefined;
      const why = worker && mono - worker.lastSeen < this.settings.leaseMs
        ? `worker ${job.workerId ?? '?'} lost its lease (its heartbeats stopped listing the job ${this.settings.leaseMs} ms ago without a result; a result the worker could not send, such as an output that is not JSON, ends this way)`
        : `worker ${job.workerId ?? '?'} lost its lease (no heartbeat for ${this.settings.leaseMs} ms)`;
      this.#requeueOrFail(job, why, true);
    }
    if (next < Infinity) this.#armDeadline(next, mono);
    let budget = EXPIRE_QUEUED_SLICE_JOBS;
    let skips = SKIP_TTL_ENTRIES;
    for (const q of this.#queues.values()) {
      // A fence that ran out lets a parked worker take the job it was fenced from (workers park
      // while jobs are queued only when those jobs are fenced from them).
      if (q.takers.length > 0 && q.queued + q.lowQueued > 0) this.#dispatch(q);
      let cut = false;
      const live = q.queued + q.lowQueued;
      // Mostly entries of jobs taken or cancelled: rebuilt from the live jobs, O(live) once per
      // as many stale entries, so the heap stays within about twice the backlog.
      if (q.ttls.size > DEAD_QUEUED_COMPACT && q.ttls.size > 2 * live) {
        const ids: string[] = [];
        const keys: number[] = [];
        const keep = (job: Job): void => {
          if (job.status !== 'IN_QUEUE' || job.queueGen !== q.gen) return;
          ids.push(job.id);
          keys.push(job.ttlDeadline);
        };
        q.retry.forEach(keep);
        q.normal.forEach(keep);
        q.low.forEach(keep);
        q.ttls.reset(ids, keys);
      }
      // The top entry is stale when its job left the queue (taken, cancelled, expired at a take,
      // evicted once finished) or its generation (purged): dropped, due or not, so a backlog
      // taken in order leaves none behind. A requeue leaves the job a second entry (stale once
      // it ends); a /retry's new record keeps the id with a later deadline, so an entry due
      // before it is its earlier run's. A live job not due ends the look: nothing after it is.
      for (let id = q.ttls.peek(); id !== undefined; id = q.ttls.peek()) {
        const job = this.#jobs.get(id);
        const at = q.ttls.peekKey();
        const queued = job !== undefined && job.status === 'IN_QUEUE' && job.queueGen === q.gen;
        if (queued && mono < at) break;
        // This pass's slice is used up: the next pass, after its commit, goes on.
        if (budget === 0 || skips === 0) {
          if (mono >= at) cut = true;
          break;
        }
        q.ttls.pop();
        if (!queued || job.ttlDeadline !== at) {
          skips--;
          continue;
        }
        budget--;
        q.left(job);
        (ends ??= []).push({ job, endedAs: 'TIMED_OUT', before: this.#liveState(job) });
        this.#finish(job, 'TIMED_OUT', null, queuedExpiry(job), job.queuedAt + job.ttlMs);
      }
      if (cut) more = true;
      // Jobs ended while queued (cancelled, expired) stay on their deque until a take passes
      // them; with no worker taking, they would hold their memory past their retention. Not
      // while an expiry goes on in slices: once, after its last pass.
      const ended = q.retry.size + q.normal.size + q.low.size - (q.queued + q.lowQueued);
      if (!cut && ended > DEAD_QUEUED_COMPACT && ended > q.queued + q.lowQueued) {
        for (const d of [q.retry, q.normal, q.low]) d.retain((job) => job.status === 'IN_QUEUE');
      }
    }
    if (ends) this.#retryIfUnstored(ends);
    if (more) this.#reapAfterCommit();
    // Restored fences of workers that have not called since the start, once no job holds them.
    if (this.#bootFences.size > 0 && this.#clock.monotonic() >= this.#bootFencesUntil) this.#bootFences.clear();
    for (const [key, ids] of this.#restoredFences) {
      const workerId = key.slice(key.indexOf(' ') + 1);
      for (const id of ids) if (!this.#get(id)?.fences?.has(workerId) && !this.#bootFences.get(id)?.has(workerId)) ids.delete(id);
      if (ids.size === 0) this.#restoredFences.delete(key);
    }
    this.workers.sweep();
    this.#evict();
    this.#raiseFloor();
  }

  /**
   * Ends running `job` TIMED_OUT (its execution timeout, else its TTL, has passed), dated at the
   * deadline, and tells its worker to stop it. Returns the end, for #retryIfUnstored.
   */
  #timeOut(job: Job): Ending {
    const end: Ending = { job, endedAs: 'TIMED_OUT', before: this.#liveState(job) };
    const worker = job.workerId ? this.workers.get(job.endpointId, job.workerId) : undefined;
    if (this.#clock.monotonic() >= job.execDeadline) {
      this.#finish(job, 'TIMED_OUT', null, `Execution timed out after ${job.executionTimeoutMs} ms.`, (job.startedAt ?? Infinity) + job.executionTimeoutMs);
      if (worker) this.#endedOn(worker, job, `timed out: execution timeout ${job.executionTimeoutMs / 1000} s`);
    } else {
      this.#finish(job, 'TIMED_OUT', null, 'Job exceeded its time to live (policy.ttl).', job.queuedAt + job.ttlMs);
      if (worker) this.#endedOn(worker, job, `timed out: policy.ttl ${job.ttlMs / 1000} s`);
    }
    return end;
  }

  /**
   * A running job past its execution timeout or TTL that the reaper has not reached yet (a pass
   * ends a slice of them, REAP_RUNNING_SLICE_JOBS, or its timer has not fired): ended now, as the
   * reaper would, before a post of its worker is judged, so a result after the deadline never
   * completes it. One whose lease lapsed is not requeued here: it is still its worker's attempt.
   */
  #endIfDue(job: Job): void {
    if (job.status !== 'IN_PROGRESS') return;
    const mono = this.#clock.monotonic();
    if (mono < job.execDeadline && mono < job.ttlDeadline) return;
    this.#retryIfUnstored([this.#timeOut(job)]);
  }

  /**
   * Ends flashd made itself (timeouts, TTLs, attempts used up): if their commit fails, the jobs
   * go back to what they were (#unfinishAll), so the reaper makes each end again once its rule
   * next applies (a deadline passed: the next pass; a lost lease: once the new lease lapses)
   * rather than memory keeping an end that nothing writes again until a restart.
   */
  #retryIfUnstored(ends: Ending[]): void {
    this.#batch.committed().catch(() => this.#unfinishAll(ends));
  }

  /** The next reap pass once this turn's writes are committed, with the event loop turning in between. */
  #reapAfterCommit(): void {
    if (this.#reapAgain || this.#closing) return;
    this.#reapAgain = true;
    const again = (): void => {
      setImmediate(() => {
        this.#reapAgain = false;
        if (!this.#closing) this.reap();
      });
    };
    // Not after a failed commit: the jobs of the pass are back as they were (#retryIfUnstored),
    // and a pass a turn would fail turn after turn on a disk that stays full. The interval
    // reaper goes on within a second.
    this.#batch.committed().then(again, () => {
      this.#reapAgain = false;
    });
  }

  /**
   * Deletes expired results from SQLite, EXPIRE_SLICE_ROWS per commit with the event loop
   * turning between slices: results that expire together (a burst of /run jobs, a purged
   * backlog) would otherwise be one DELETE holding every request for seconds.
   */
  expire(): void {
    if (this.#expiring || this.#closing) return;
    const now = this.#clock.now();
    // Nothing due: no write, so an idle server does not commit (and sync) every second.
    if (!this.#repo.anyExpired(now)) return;
    this.#expiring = true;
    const step = (): void => {
      if (this.#closing) {
        this.#expiring = false;
        return;
      }
      this.#batch.write(() => {
        const rows = this.#repo.deleteExpired(now, EXPIRE_SLICE_ROWS);
        const gone = new Map<string, { endpointId: string; status: JobStatus; jobs: number; retries: number }>();
        // Their unread stream chunks went with them (trigger).
        if (this.#unread.size) for (const r of rows) this.#unread.delete(r.id);
        // Kept for a webhook still owed, the others leave the counts at their expiry too (once the
        // slices are done: then the rows left expired and counted are only those). A row that
        // left them so is not counted when it goes (`counted`).
        const uncounted = rows.length < EXPIRE_SLICE_ROWS ? this.#repo.uncountOwed(now) : [];
        for (const r of [...rows, ...uncounted]) {
          // A deleted endpoint's rows go too, but its counts are gone already.
          if (('counted' in r && !r.counted) || !TERMINAL.has(r.status) || !this.#endpointExists(r.endpointId)) continue;
          const key = `${r.endpointId}\u0000${r.status}`;
          const g = gone.get(key) ?? { endpointId: r.endpointId, status: r.status, jobs: 0, retries: 0 };
          g.jobs--;
          g.retries -= r.retries;
          gone.set(key, g);
        }
        for (const g of gone.values()) this.#repo.addCount(g.endpointId, g.status, g.jobs, g.retries);
        if (rows.length < EXPIRE_SLICE_ROWS) this.#expiring = false;
        else setImmediate(step);
      });
      // A failed commit (this write's, or another's in the same transaction) ends the sweep: the next one starts over.
      this.#batch.committed().catch(() => {
        this.#expiring = false;
      });
    };
    step();
  }

  /**
   * flashd is stopping, first thing (before its own workers are stopped): no job goes to any
   * worker from now, external or flashd's own, so none starts that the stop would strand with
   * a result it cannot post until the restart. Parked job-takes get their 204 now. Results,
   * progress, stream chunks and pings of the jobs held are still taken, and /run and /runsync
   * still queue jobs (written, and run after the restart).
   */
  stopDispatch(): void {
    this.#dispatchStopped = true;
    for (const q of this.#queues.values()) for (const t of q.takers.splice(0)) t.resolve([]);
  }

  /** Rejects parked requests at shutdown so their connections close cleanly. */
  close(): void {
    for (const q of this.#queues.values()) for (const t of q.takers.splice(0)) t.resolve([]);
    // A clean stop writes every claim, so running jobs keep their workers across the restart.
    this.#closing = true;
    if (this.#claimTimer) clearTimeout(this.#claimTimer);
    if (this.#insertTimer) clearTimeout(this.#insertTimer);
    if (this.#deadlineTimer) clearTimeout(this.#deadlineTimer);
    this.#saveDeferred();
    this.#saveClaims();
    this.#raiseFloor();
    // Waiting /runsync calls get the id and current status now (their rows are written above)
    // rather than a connection closed with no reply.
    // Parked job-stop polls get their 204 too (else HttpServer.close sits out its grace).
    for (const w of this.workers.all()) for (const c of [...w.stopWaiters]) c();
    for (const job of this.#jobs.values()) wakeWaiters(job);
  }
}
