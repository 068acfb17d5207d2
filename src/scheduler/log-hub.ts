/**
 * Endpoint logs: worker output lines go to SQLite through the group-commit batch and, once
 * committed, to anyone following the endpoint's log.
 */
import type { Clock } from '../core/clock.js';
import type { LogLine, LogsRepo, WriteBatch } from '../store/index.js';

/**
 * Lines read from SQLite at a time for that catch-up (at most 1 MB of 16 KB lines): a follower
 * that lets go after a few (its client reads slowly and comes back here each time it drains)
 * must not cost a read of the whole log each time.
 */
const CATCH_UP_PAGE = 64;
/**
 * The most line text one read of the log returns, in bytes of the JSON reply (UTF-8, escapes
 * included; about 1,000 lines of the longest plain kind, 170 of 16 KB of NULs).
 */
export const READ_BYTES = 16 * 1024 * 1024;

const NOOP = (): void => undefined;

interface Follower {
  line(line: LogLine): void;
  end(): void;
}

export class LogHub {
  readonly #repo: LogsRepo;
  readonly #batch: WriteBatch;
  readonly #clock: Clock;
  readonly #followers = new Map<string, Set<Follower>>();
  readonly #written = new Map<string, number>();
  /** Deleted endpoints: their late lines are dropped (ids are never reused). */
  readonly #dropped = new Set<string>();
  readonly #keep: number;
  #closed = false;

  constructor(repo: LogsRepo, batch: WriteBatch, clock: Clock, keepPerEndpoint = 10_000) {
    this.#repo = repo;
    this.#batch = batch;
    this.#clock = clock;
    this.#keep = keepPerEndpoint;
  }

  append(endpointId: string, workerId: string | null, stream: LogLine['stream'], line: string): void {
    // A stopping worker of a deleted endpoint may still print: its row would fail the foreign
    // key and, with it, the whole group commit around it.
    if (this.#dropped.has(endpointId)) return;
    const at = this.#clock.now();
    let seq = 0;
    this.#batch.write(() => {
      seq = this.#repo.insert(endpointId, workerId, stream, line, at);
    });
    const n = (this.#written.get(endpointId) ?? 0) + 1;
    this.#written.set(endpointId, n);
    // Every 1,000 lines, and at an endpoint's first line of this run: the count starts at 0 at
    // each start, so one that printed fewer than 1,000 lines between restarts was never trimmed.
    // Once per endpoint that prints again, not every endpoint at start.
    if (n === 1 || n % 1000 === 0) this.#batch.write(() => this.#repo.prune(endpointId, this.#keep));
    const followers = this.#followers.get(endpointId);
    if (followers?.size) {
      this.#batch.committed().then(
        () => {
          for (const f of followers) f.line({ seq, endpointId, workerId, stream, line, at });
        },
        () => undefined,
      );
    }
  }

  /**
   * Lines after `afterSeq` (oldest first), or the last `limit` lines when it is undefined, at
   * most READ_BYTES of line text: 10,000 lines of 16 KB made a 160 MB reply, held in memory until
   * its client read it (a client that reads nothing held it for good).
   */
  read(endpointId: string, afterSeq: number | undefined, limit: number): LogLine[] {
    return this.readPage(endpointId, afterSeq, limit).lines;
  }

  /**
   * `read`, saying whether READ_BYTES cut it short (fewer than `limit` lines, with more there):
   * a reader must not take the short reply for the end of the log.
   */
  readPage(endpointId: string, afterSeq: number | undefined, limit: number): { lines: LogLine[]; truncated: boolean } {
    const cut = { truncated: false };
    const lines = this.#repo.read(endpointId, afterSeq, limit, READ_BYTES, cut);
    return { lines, truncated: cut.truncated };
  }

  /**
   * The seq of the newest line trimmed away (beyond the kept lines per endpoint) when it is after
   * `afterSeq`: a reader that had read up to `afterSeq` missed lines. Else null.
   */
  droppedAfter(endpointId: string, afterSeq: number): number | null {
    return this.#repo.droppedAfter(endpointId, afterSeq);
  }

  /**
   * New lines of an endpoint after `afterSeq` (the last line the caller already has), as they are
   * committed; `end` when the endpoint goes away. A line appended before this call but not yet
   * committed notified no follower, and a read made before it did not see it: once the pending
   * commit is done, whatever came after `afterSeq` is read back, and lines at or below the last
   * one delivered are skipped, so the hand-over from a snapshot to the stream loses nothing and
   * repeats nothing.
   */
  follow(endpointId: string, afterSeq: number, line: (line: LogLine) => void, end: () => void): () => void {
    // A deleted endpoint's log has ended (a follow that paused for a slow client comes back here).
    if (this.#closed || this.#dropped.has(endpointId)) {
      end();
      return NOOP;
    }
    let set = this.#followers.get(endpointId);
    if (!set) this.#followers.set(endpointId, (set = new Set()));
    let last = afterSeq;
    const follower: Follower = {
      line: (l) => {
        if (l.seq <= last) return;
        last = l.seq;
        line(l);
      },
      end,
    };
    set.add(follower);
    const live = set;
    this.#batch.committed().then(
      () => {
        // Every line kept after `last` (up to the retention plus the 999 appended before the next
        // trim), not a fixed count: a catch-up that stopped at 10,000 lines skipped the rest, as
        // the live lines after them went on. It ends sooner when the follower lets go (a client
        // that does not keep up), and nothing is committed while it runs.
        while (live.has(follower)) {
          const page = this.#repo.read(endpointId, last, CATCH_UP_PAGE);
          for (const l of page) {
            if (!live.has(follower)) return;
            follower.line(l);
          }
          if (page.length < CATCH_UP_PAGE) return;
        }
      },
      () => undefined,
    );
    return () => live.delete(follower);
  }

  /**
   * flashd is stopping: every follower's stream ends properly (a complete chunked response, so
   * `curl` exits 0 rather than reporting a cut transfer), and later follows end at once. The
   * streams end once the pending commit is done, after the lines appended before the stop (the
   * workers' last output and their exit lines, written while they were stopped) reach them;
   * await it before the listener closes (a stream ended after that is cut).
   */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#batch.committed().catch(() => undefined);
    const all = [...this.#followers.values()];
    this.#followers.clear();
    for (const set of all) for (const f of set) f.end();
  }

  /** The endpoint was deleted: its followers' streams end. */
  drop(endpointId: string): void {
    this.#dropped.add(endpointId);
    const set = this.#followers.get(endpointId);
    this.#followers.delete(endpointId);
    this.#written.delete(endpointId);
    for (const f of set ?? []) f.end();
  }
}
