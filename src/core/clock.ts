/** Time source injected everywhere so tests never sleep to wait for a window or lease. */
export interface Clock {
  /** Wall-clock milliseconds since the epoch (for records shown to users). */
  now(): number;
  /** Monotonic milliseconds (for timeouts, leases and windows). */
  monotonic(): number;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
};

/** A clock tests can move by hand. */
export class ManualClock implements Clock {
  #wall: number;
  #mono = 0;
  constructor(start = Date.UTC(2026, 0, 1)) {
    this.#wall = start;
  }
  now(): number {
    return this.#wall + this.#mono;
  }
  monotonic(): number {
    return this.#mono;
  }
  advance(ms: number): void {
    this.#mono += ms;
  }
}
