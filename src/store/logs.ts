import type { Statement } from 'better-sqlite3';
import { jsonStringBytes } from '../core/json-raw.js';
import type { Db } from './db.js';

export interface LogLine {
  seq: number;
  endpointId: string;
  workerId: string | null;
  stream: 'stdout' | 'stderr' | 'system';
  line: string;
  at: number;
}

/** Worker output per endpoint. Rows go away with their endpoint (ON DELETE CASCADE). */
export class LogsRepo {
  readonly #insert: Statement;
  readonly #since: Statement;
  readonly #tail: Statement;
  readonly #pruneFrom: Statement;
  readonly #prune: Statement;
  readonly #pruned: Statement;
  readonly #prunedThrough: Statement;

  constructor(db: Db) {
    this.#insert = db.prepare('INSERT INTO endpoint_logs (endpoint_id, worker_id, stream, line, at) VALUES (?, ?, ?, ?, ?)');
    this.#since = db.prepare(`SELECT seq, endpoint_id, worker_id, stream, line, at FROM endpoint_logs
      WHERE endpoint_id = ? AND seq > ? ORDER BY seq LIMIT ?`);
    this.#tail = db.prepare(`SELECT seq, endpoint_id, worker_id, stream, line, at FROM endpoint_logs
      WHERE endpoint_id = ? ORDER BY seq DESC LIMIT ?`);
    this.#pruneFrom = db.prepare('SELECT seq FROM endpoint_logs WHERE endpoint_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?').pluck();
    this.#prune = db.prepare('DELETE FROM endpoint_logs WHERE endpoint_id = ? AND seq <= ?');
    this.#pruned = db.prepare(`INSERT INTO endpoint_logs_pruned (endpoint_id, through) VALUES (?, ?)
      ON CONFLICT (endpoint_id) DO UPDATE SET through = MAX(through, excluded.through)`);
    this.#prunedThrough = db.prepare('SELECT through FROM endpoint_logs_pruned WHERE endpoint_id = ?').pluck();
  }

  insert(endpointId: string, workerId: string | null, stream: LogLine['stream'], line: string, at: number): number {
    return Number(this.#insert.run(endpointId, workerId, stream, line, at).lastInsertRowid);
  }

  /**
   * Lines after `seq` (oldest first), or the last `limit` lines when `seq` is undefined; no more
   * of them than fit in `maxBytes` bytes of line text as a JSON reply writes it (UTF-8, escapes
   * included: a NUL is 1 character and 6 bytes, `\u0000`; at least one line): the oldest after
   * `seq`, or the newest. `cut.truncated` is set when `maxBytes` left out a line that `limit`
   * would have taken.
   */
  read(endpointId: string, afterSeq: number | undefined, limit: number, maxBytes = Infinity, cut?: { truncated: boolean }): LogLine[] {
    const rows = (afterSeq === undefined ? this.#tail.iterate(endpointId, limit) : this.#since.iterate(endpointId, afterSeq, limit)) as IterableIterator<{
      seq: number; endpoint_id: string; worker_id: string | null; stream: LogLine['stream']; line: string; at: number;
    }>;
    const lines: LogLine[] = [];
    let size = 0;
    for (const r of rows) {
      // Counted in characters, control characters or invalid UTF-8 (U+FFFD, 3 bytes) made a
      // reply up to 6 times the cap: 96 MiB for ?limit=10000 of `head -c 20000000 /dev/zero`.
      const bytes = maxBytes === Infinity ? 0 : jsonStringBytes(r.line);
      if (lines.length > 0 && size + bytes > maxBytes) {
        if (cut) cut.truncated = true;
        break;
      }
      size += bytes;
      lines.push({ seq: r.seq, endpointId: r.endpoint_id, workerId: r.worker_id, stream: r.stream, line: r.line, at: r.at });
    }
    return afterSeq === undefined ? lines.reverse() : lines;
  }

  /** Keeps the newest `keep` lines of an endpoint, and notes the newest line deleted. */
  prune(endpointId: string, keep: number): void {
    const through = this.#pruneFrom.get(endpointId, keep) as number | undefined;
    if (through === undefined) return;
    this.#prune.run(endpointId, through);
    this.#pruned.run(endpointId, through);
  }

  /**
   * The seq of the newest deleted line when it is after `afterSeq` (lines the caller has not
   * seen were deleted), else null.
   */
  droppedAfter(endpointId: string, afterSeq: number): number | null {
    const through = this.#prunedThrough.get(endpointId) as number | undefined;
    return through !== undefined && through > afterSeq ? through : null;
  }
}
