/**
 * Endpoint logs: worker output lines go to SQLite through the group-commit batch and, once
 * committed, to anyone following the endpoint's log.
 */
import type { Clock } from '../core/clock.js';
import type { LogLine, LogsRepo, WriteBatch } from '../store/index.js';

export class LogHub {
  readonly #repo: LogsRepo;
  readonly #batch: WriteBatch;
  readonly #clock: Clock;
  readonly #followers = new Map<string, Set<(line: LogLine) => void>>();
  readonly #written = new Map<string, number>();
  readonly #keep: number;

  constructor(repo: LogsRepo, batch: WriteBatch, clock: Clock, keepPerEndpoint = 10_000) {
    this.#repo = repo;
    this.#batch = batch;
    this.#clock = clock;
    this.#keep = keepPerEndpoint;
  }

  append(endpointId: string, workerId: string | null, stream: LogLine['stream'], line: string): void {
    const at = this.#clock.now();
    let seq = 0;
    this.#batch.write(() => {
      seq = this.#repo.insert(endpointId, workerId, stream, line, at);
    });
    const n = (this.#written.get(endpointId) ?? 0) + 1;
    this.#written.set(endpointId, n);
    if (n % 1000 === 0) this.#batch.write(() => this.#repo.prune(endpointId, this.#keep));
    const followers = this.#followers.get(endpointId);
    if (followers?.size) {
      this.#batch.committed().then(
        () => {
          for (const f of followers) f({ seq, endpointId, workerId, stream, line, at });
        },
        () => undefined,
      );
    }
  }

  follow(endpointId: string, listener: (line: LogLine) => void): () => void {
    let set = this.#followers.get(endpointId);
    if (!set) this.#followers.set(endpointId, (set = new Set()));
    set.add(listener);
    return () => set.delete(listener);
  }
}
