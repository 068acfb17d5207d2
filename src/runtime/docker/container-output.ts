/**
 * One run of a container's output, every byte delivered once, across engine hiccups.
 *
 * The output comes from the attach made before the start (from the first byte, and never a
 * previous run's output). When that stream ends while the container still runs, or a broken
 * connection to the engine was seen (an engine restart), the rest comes from the engine's own
 * copy, `GET /containers/{id}/logs?timestamps=1`, once the engine answers again:
 *
 * - Catch-up (once): the log of this run, with each stream's bytes already delivered skipped.
 *   The attach and the log carry the same bytes (checked on Podman: partial lines, CR, long
 *   lines the engine splits into several records, multi-byte characters). The last bytes
 *   delivered are compared with the log at that offset; when they differ (the engine rotated
 *   this run's start out of its log file, past 10 MB) the catch-up resumes after the last place
 *   those bytes occur, or at the log's start, and a system line says output may be missing.
 * - Then `logs?follow=1` from the last record seen: records up to it are skipped by timestamp
 *   and by how many carried that timestamp (Podman's have whole seconds), so a later break
 *   resumes the same way.
 *
 * Bytes go to `onData` in order per stream, into the runtime's line splitters.
 */
import type { Logger } from '../../core/logger.js';
import type { ContainerState } from './api-types.js';
import type { DockerClient } from './client.js';
import { isDockerError } from './errors.js';
import type { StreamName } from './multiplex.js';

/** The last bytes delivered on each stream, kept to check where the engine's log continues them. */
const TAIL_BYTES = 4096;
const NS = 1_000_000_000n;

/** An engine log timestamp (RFC 3339, any fraction, `Z` or an offset) in ns since the epoch; null when it is not one. */
export function timestampNs(ts: string | undefined): bigint | null {
  const m = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$/.exec(ts ?? '');
  if (!m) return null;
  const ms = Date.parse(`${m[1]}${m[3]}`);
  if (Number.isNaN(ms)) return null;
  return BigInt(ms) * 1_000_000n + BigInt((m[2] ?? '').padEnd(9, '0'));
}

/** A `since` value for the logs endpoint: seconds with nanoseconds, as Docker and Podman parse it. */
export function sinceParam(ns: bigint): string {
  return `${ns / NS}.${(ns % NS).toString().padStart(9, '0')}`;
}

/**
 * Where this run's log (one stream's bytes) continues what was delivered: how many of its bytes
 * to skip, and whether that place is certain. `tail` is the last bytes delivered (at most
 * `delivered`).
 */
export function resumeOffset(log: Buffer, delivered: number, tail: Buffer): { skip: number; exact: boolean } {
  if (delivered === 0) return { skip: 0, exact: true };
  if (log.length >= delivered && log.subarray(delivered - tail.length, delivered).equals(tail)) return { skip: delivered, exact: true };
  // The log does not hold this run from its first byte: resume after the last copy of the tail
  // (never before the true place, so nothing is repeated), else from the log's start.
  const at = tail.length ? log.lastIndexOf(tail) : -1;
  return { skip: at >= 0 ? at + tail.length : 0, exact: false };
}

/** One record of the engine's log: the bytes of one write (or part of a long line) with its timestamp. */
interface LogRecord {
  stream: StreamName;
  /** ns since the epoch; null when the record had no timestamp the parser knows. */
  at: bigint | null;
  data: Buffer;
}

function parseRecord(stream: StreamName, payload: Buffer): LogRecord {
  const space = payload.indexOf(0x20);
  const at = space > 0 && space <= 40 ? timestampNs(payload.subarray(0, space).toString('latin1')) : null;
  return { stream, at, data: at === null ? payload : payload.subarray(space + 1) };
}

interface StreamState {
  /** Bytes of this run delivered. */
  delivered: number;
  /** The last chunks delivered, at least TAIL_BYTES of them when there are (not copied: output can be fast). */
  recent: Buffer[];
  recentBytes: number;
  /** The last log record seen (delivered or skipped): its timestamp and how many records carried it. */
  mark: { at: bigint; count: number } | null;
}

export interface ContainerOutputOptions {
  client: DockerClient;
  containerId: string;
  /** The container's bytes, in order per stream. */
  onData(stream: StreamName, chunk: Buffer): void;
  /** A line flashd writes into the worker's log (output that may be missing). */
  onNotice(line: string): void;
  log: Logger;
  /**
   * The previous run's `State.FinishedAt` when a stopped container is restarted (FlashBoot), ''
   * when unknown; null for a new container, whose whole log is this run's.
   */
  previousFinish: string | null;
  /** Whether flashd is shutting down (an unreachable engine is not waited for then). */
  closing(): boolean;
  /** Pause between inspects while the engine is unreachable, in ms. @defaultValue 1000 */
  retryMs?: number;
}

export class ContainerOutput {
  readonly #o: ContainerOutputOptions;
  readonly #streams: Record<StreamName, StreamState> = {
    stdout: { delivered: 0, recent: [], recentBytes: 0, mark: null },
    stderr: { delivered: 0, recent: [], recentBytes: 0, mark: null },
  };
  readonly #abort = new AbortController();
  #attach: { ended: Promise<Error | null>; detach(): void } | null = null;
  #closed = false;
  #broken = false;
  /** Caught up with the engine's log: from here on, output is read from it by timestamp. */
  #fromLog = false;
  /** Lower bound of this run's log records (ns); null: the whole log. Known at the first catch-up. */
  #runSince: bigint | null | undefined;
  #ended: Promise<void> = Promise.resolve();

  private constructor(o: ContainerOutputOptions) {
    this.#o = o;
  }

  /** Attaches to a created or stopped container (before its start: nothing is missed). */
  static async attach(o: ContainerOutputOptions): Promise<ContainerOutput> {
    const out = new ContainerOutput(o);
    out.#attach = await o.client.attach(o.containerId, (stream, payload) => out.#deliver(stream, payload));
    return out;
  }

  /**
   * Supervises the output once the container started. `exit` resolves when the runtime learnt
   * that the container stopped. Returns at once; `ended` resolves when the output is complete.
   */
  follow(exit: Promise<unknown>): void {
    this.#ended = this.#supervise(exit).catch((err: unknown) => {
      this.#o.log.warn('container output lost', { containerId: this.#o.containerId, reason: (err as Error).message });
    });
  }

  /** Resolves once all of this run's output was delivered, or the engine cannot give more. */
  get ended(): Promise<void> {
    return this.#ended;
  }

  /** Whether a broken engine connection was seen: the output is then caught up from the engine's log. */
  get broken(): boolean {
    return this.#broken;
  }

  /** The connection to the engine broke (the runtime's wait failed): look again once the output ends. */
  markBroken(): void {
    this.#broken = true;
  }

  /** Lets go: nothing is delivered after this. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#abort.abort();
    this.#attach?.detach();
  }

  #deliver(stream: StreamName, chunk: Buffer): void {
    if (this.#closed || chunk.length === 0) return;
    const s = this.#streams[stream];
    s.delivered += chunk.length;
    s.recent.push(chunk);
    s.recentBytes += chunk.length;
    while (s.recentBytes - (s.recent[0] as Buffer).length >= TAIL_BYTES) s.recentBytes -= (s.recent.shift() as Buffer).length;
    if (s.recent.length > 256) {
      // Many small chunks: one copy of the tail instead.
      const tail = Buffer.concat(s.recent);
      s.recent = [tail.subarray(Math.max(0, tail.length - TAIL_BYTES))];
      s.recentBytes = (s.recent[0] as Buffer).length;
    }
    this.#o.onData(stream, chunk);
  }

  /** Notes a record of the engine's log as seen (delivered or skipped). */
  #see(r: LogRecord): void {
    const s = this.#streams[r.stream];
    const at = r.at ?? s.mark?.at ?? 0n;
    if (s.mark?.at === at) s.mark.count++;
    else s.mark = { at, count: 1 };
  }

  async #supervise(exit: Promise<unknown>): Promise<void> {
    let exited = false;
    void exit.then(() => (exited = true));
    if (await this.#attach?.ended) this.#broken = true;
    let failuresAfterExit = 0;
    for (;;) {
      if (this.#closed) return;
      // The usual end: the container stopped, and its wait says so right after its output ends.
      if (!exited) await Promise.race([exit, sleep(1000)]);
      if (this.#closed || (exited && !this.#broken)) return;
      const state = await this.#state();
      if (!state || this.#closed) return;
      if (!state.Running && !this.#broken) return;
      // The stream ended while the container runs, or the engine was away: read its log.
      if (!this.#broken) this.#o.log.info('container output ended while the container runs; reading its log', { containerId: this.#o.containerId });
      this.#broken = true;
      try {
        if (!this.#fromLog) await this.#catchUp(state);
        await this.#readLog(state.Running);
        if (!state.Running) return;
      } catch (err) {
        if (this.#closed || isDockerError(err, 'DOCKER_NOT_FOUND')) return;
        this.#o.log.debug('cannot read the container log; retrying', { containerId: this.#o.containerId, reason: (err as Error).message });
        if (!state.Running && ++failuresAfterExit >= 3) throw err;
        await sleep(this.#o.retryMs ?? 1000);
      }
    }
  }

  /** The container's state once the engine answers; null when it is gone or not worth waiting for. */
  async #state(): Promise<ContainerState | null> {
    for (;;) {
      if (this.#closed) return null;
      try {
        return (await this.#o.client.inspectContainer(this.#o.containerId)).State;
      } catch (err) {
        if (isDockerError(err, 'DOCKER_NOT_FOUND')) return null;
        this.#broken = true;
        if (this.#o.closing() && isDockerError(err, 'DOCKER_UNREACHABLE')) return null;
      }
      await sleep(this.#o.retryMs ?? 1000);
    }
  }

  /** This run's records start after this (ns): between the previous run's finish and this start. */
  #since(state: ContainerState): bigint | null {
    if (this.#o.previousFinish === null) return null;
    const started = timestampNs(state.StartedAt);
    const finished = timestampNs(this.#o.previousFinish);
    if (started !== null && finished !== null && finished > 0n && finished < started) return (started + finished) / 2n;
    return started;
  }

  /** Delivers what this run's log holds beyond what the attach delivered. */
  async #catchUp(state: ContainerState): Promise<void> {
    this.#runSince ??= this.#since(state);
    const records: LogRecord[] = [];
    await this.#o.client.logs(this.#o.containerId, (stream, payload) => records.push(parseRecord(stream, payload)), {
      timestamps: true, signal: this.#abort.signal, ...(this.#runSince !== null ? { since: sinceParam(this.#runSince) } : {}),
    });
    if (this.#closed) return;
    const skip = {} as Record<StreamName, number>;
    let exact = true;
    for (const name of ['stdout', 'stderr'] as const) {
      const s = this.#streams[name];
      const log = Buffer.concat(records.filter((r) => r.stream === name).map((r) => r.data));
      const recent = Buffer.concat(s.recent);
      const at = resumeOffset(log, s.delivered, recent.subarray(Math.max(0, recent.length - TAIL_BYTES)));
      skip[name] = at.skip;
      exact &&= at.exact;
      s.mark = null;
    }
    const seen = { stdout: 0, stderr: 0 };
    for (const r of records) {
      const from = Math.max(0, skip[r.stream] - seen[r.stream]);
      seen[r.stream] += r.data.length;
      this.#see(r);
      if (from < r.data.length) this.#deliver(r.stream, r.data.subarray(from));
    }
    this.#fromLog = true;
    if (!exact) {
      this.#o.onNotice('the connection to the container engine broke, and the engine\'s log no longer holds all of this worker\'s output since its start: some lines around the break may be missing');
    }
    (exact ? this.#o.log.info : this.#o.log.warn).call(this.#o.log, 'container output caught up from the engine log', { containerId: this.#o.containerId, exact });
  }

  /** Reads the engine's log after the last record seen (following it while the container runs). */
  async #readLog(follow: boolean): Promise<void> {
    const marks = (['stdout', 'stderr'] as const).map((n) => this.#streams[n].mark?.at).filter((m): m is bigint => m !== undefined);
    // Whole seconds, one back: Podman's timestamps have no fraction, and since= must not pass a mark.
    const since = marks.length ? (marks.reduce((a, b) => (a < b ? a : b)) / NS - 1n) * NS : this.#runSince ?? null;
    const skip = {
      stdout: this.#streams.stdout.mark ? { ...this.#streams.stdout.mark } : null,
      stderr: this.#streams.stderr.mark ? { ...this.#streams.stderr.mark } : null,
    };
    await this.#o.client.logs(this.#o.containerId, (stream, payload) => {
      const r = parseRecord(stream, payload);
      const k = skip[stream];
      if (k) {
        const at = r.at ?? k.at;
        if (at < k.at) return;
        if (at === k.at && k.count > 0) {
          k.count--;
          return;
        }
        skip[stream] = null;
      }
      this.#see(r);
      this.#deliver(stream, r.data);
    }, { follow, timestamps: true, signal: this.#abort.signal, ...(since !== null && since > 0n ? { since: sinceParam(since) } : {}) });
  }
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms).unref());
