/**
 * FlashBoot: which stopped worker containers are kept for a fast restart, and which go.
 * Pure bookkeeping (no engine calls, time passed in) so the policy is table-tested; the
 * runtime removes what this returns. The policy, also in ARCHITECTURE.md ("FlashBoot"):
 *
 * - `OFF` keeps nothing. `FLASHBOOT` keeps up to 2 stopped containers per endpoint for 10
 *   minutes; `PRIORITY_FLASHBOOT` up to 8 for 60 minutes. At most 32 are kept in all.
 * - A restart takes the most recently kept container of the endpoint whose config hash
 *   equals the launch's (warmest page cache). Kept containers of the endpoint with another
 *   hash can never be used again (the configuration changed) and are discarded then.
 * - Room is made by evicting, in order: the endpoint's own oldest kept container when it is
 *   at its limit; then, across endpoints, the oldest `FLASHBOOT` ones, then the oldest
 *   `PRIORITY_FLASHBOOT` ones. A container is discarded when its time is up.
 */
import type { Flashboot } from '../types.js';

export type KeepMode = Exclude<Flashboot, 'OFF'>;

export interface FlashbootPolicy {
  /** Stopped containers kept per endpoint. */
  maxPerEndpoint: number;
  /** How long one is kept after it stopped, in ms. */
  ttlMs: number;
}

export interface KeptPoolOptions {
  policies: Record<KeepMode, FlashbootPolicy>;
  /** Kept containers across all endpoints. */
  maxTotal: number;
}

export const DEFAULT_KEPT_POOL: KeptPoolOptions = {
  policies: {
    FLASHBOOT: { maxPerEndpoint: 2, ttlMs: 10 * 60_000 },
    PRIORITY_FLASHBOOT: { maxPerEndpoint: 8, ttlMs: 60 * 60_000 },
  },
  maxTotal: 32,
};

export interface KeptEntry<T> {
  workerId: string;
  endpointId: string;
  configHash: string;
  mode: KeepMode;
  /** When it was kept (ms, caller's clock); the order of eviction. */
  keptAt: number;
  /** When it is to be discarded. */
  expiresAt: number;
  value: T;
}

const RANK: Record<KeepMode, number> = { FLASHBOOT: 0, PRIORITY_FLASHBOOT: 1 };

export class KeptPool<T> {
  readonly #o: KeptPoolOptions;
  readonly #entries = new Map<string, KeptEntry<T>>();

  constructor(options: KeptPoolOptions = DEFAULT_KEPT_POOL) {
    this.#o = options;
  }

  get size(): number {
    return this.#entries.size;
  }

  ttlMs(mode: KeepMode): number {
    return this.#o.policies[mode].ttlMs;
  }

  /**
   * Keeps a stopped container. `kept` is false when there is no room for it even after
   * evicting (it ranks lowest); `evicted` lists what made room, for the caller to remove.
   */
  add(entry: Omit<KeptEntry<T>, 'expiresAt'>): { kept: boolean; evicted: KeptEntry<T>[] } {
    const policy = this.#o.policies[entry.mode];
    const full: KeptEntry<T> = { ...entry, expiresAt: entry.keptAt + policy.ttlMs };
    if (policy.maxPerEndpoint <= 0 || this.#o.maxTotal <= 0) return { kept: false, evicted: [] };
    const evicted: KeptEntry<T>[] = [];
    const own = this.#sorted((e) => e.endpointId === entry.endpointId);
    while (own.length >= policy.maxPerEndpoint) evicted.push(this.#take(own.shift() as KeptEntry<T>));
    if (this.#entries.size >= this.#o.maxTotal) {
      // The lowest rank goes first, oldest first within a rank; the newcomer is the newest.
      const victim = this.#sorted(() => true).sort((a, b) => RANK[a.mode] - RANK[b.mode])[0] as KeptEntry<T>;
      if (RANK[victim.mode] > RANK[entry.mode]) return { kept: false, evicted };
      evicted.push(this.#take(victim));
    }
    this.#entries.set(entry.workerId, full);
    return { kept: true, evicted };
  }

  /**
   * The most recently kept container of the endpoint with this config hash (removed from the
   * pool), and the endpoint's kept containers with another hash (removed too: stale).
   */
  take(endpointId: string, configHash: string): { hit: KeptEntry<T> | undefined; stale: KeptEntry<T>[] } {
    const own = this.#sorted((e) => e.endpointId === endpointId);
    const stale = own.filter((e) => e.configHash !== configHash).map((e) => this.#take(e));
    const match = own.filter((e) => e.configHash === configHash).pop();
    return { hit: match ? this.#take(match) : undefined, stale };
  }

  /** The entry `take` would hit now (not removed): what a launch with this hash restarts. */
  peek(endpointId: string, configHash: string): KeptEntry<T> | undefined {
    return this.#sorted((e) => e.endpointId === endpointId && e.configHash === configHash).pop();
  }

  /** Removes one entry (its time is up); undefined when it is no longer kept. */
  remove(workerId: string): KeptEntry<T> | undefined {
    const e = this.#entries.get(workerId);
    return e ? this.#take(e) : undefined;
  }

  /** Every entry of an endpoint (deleted endpoint), removed. */
  removeEndpoint(endpointId: string): KeptEntry<T>[] {
    return this.#sorted((e) => e.endpointId === endpointId).map((e) => this.#take(e));
  }

  /** Every entry (shutdown), removed. */
  drain(): KeptEntry<T>[] {
    return this.#sorted(() => true).map((e) => this.#take(e));
  }

  /** Every entry, oldest first (not removed). */
  list(): KeptEntry<T>[] {
    return this.#sorted(() => true);
  }

  /** Oldest first. */
  #sorted(pred: (e: KeptEntry<T>) => boolean): KeptEntry<T>[] {
    return [...this.#entries.values()].filter(pred).sort((a, b) => a.keptAt - b.keptAt);
  }

  #take(e: KeptEntry<T>): KeptEntry<T> {
    this.#entries.delete(e.workerId);
    return e;
  }
}
