/**
 * Adaptive polling before the event loop sleeps.
 *
 * When Node's loop has nothing to do it blocks in epoll_wait, and the next request has to wake
 * the thread first. On a KVM guest that wake-up is an IPI to a halted vCPU and costs tens of
 * microseconds on each hop; a loopback round trip to a bare uWS server measured 80–120 µs p50
 * here with the server sleeping between requests and about 30 µs with it polling. A /runsync
 * cycle is four such hops. Bare metal pays the same in deep C-state exits.
 *
 * So after a request, flashd keeps the loop turning (a chain of setImmediate callbacks, which
 * makes libuv poll with a zero timeout) for a window before it lets the loop sleep. The window
 * adapts the way KVM's halt-polling does (virt/kvm/kvm_main.c, `grow_halt_poll_ns`): when a
 * request arrived after the loop had gone to sleep but within `maxUs` of the last activity,
 * polling a little longer would have caught it, so the window doubles (from 10 µs, up to
 * `maxUs`); when one arrived more than `maxUs` after the last activity, polling was wasted, so
 * the window halves (to 0 below 10 µs). Under sparse traffic (a ping every few seconds, jobs of
 * seconds) the window stays at 0 and flashd sleeps as before; under steady traffic whose gaps
 * are shorter than `maxUs` the core polls instead of sleeping. `maxUs` 0 turns it off.
 */

/** The window's first step, µs (KVM's halt_poll_ns_grow_start). */
export const SPIN_GROW_START_US = 10;

/**
 * The next polling window after the loop slept for `idleUs` since its last activity (the
 * window it had included). Pure, so the policy is table-tested.
 */
export function nextSpinWindow(windowUs: number, idleUs: number, maxUs: number): number {
  if (maxUs <= 0) return 0;
  // Caught while polling: the window is right.
  if (idleUs <= windowUs) return windowUs;
  // Nothing would have caught it: polling only burned the CPU.
  if (idleUs > maxUs) {
    const half = windowUs / 2;
    return half < SPIN_GROW_START_US ? 0 : half;
  }
  // Polling a little longer would have caught it.
  return windowUs === 0 ? Math.min(SPIN_GROW_START_US, maxUs) : Math.min(windowUs * 2, maxUs);
}

export class LoopSpinner {
  readonly #maxUs: number;
  readonly #now: () => number;
  /** Current window, µs. */
  #windowUs = 0;
  /** When the loop last finished a busy turn (ms, performance.now()). */
  #lastActive = Number.NEGATIVE_INFINITY;
  /** A spin callback is queued. */
  #queued = false;
  /** Activity since the spin callback last ran: that turn was busy. */
  #busy = false;

  constructor(maxUs: number, now: () => number = () => performance.now()) {
    this.#maxUs = Math.max(0, maxUs);
    this.#now = now;
  }

  get windowUs(): number {
    return this.#windowUs;
  }

  /** The loop is being kept turning (a spin callback is queued). */
  get polling(): boolean {
    return this.#queued;
  }

  /** Called for each I/O event (a request's head, a body chunk). */
  activity(): void {
    if (this.#maxUs === 0) return;
    this.#busy = true;
    if (this.#queued) return;
    // The loop slept (or never polled): judge the window by how long it slept.
    this.#windowUs = nextSpinWindow(this.#windowUs, (this.#now() - this.#lastActive) * 1000, this.#maxUs);
    this.#queued = true;
    setImmediate(this.#spin);
  }

  readonly #spin = (): void => {
    const now = this.#now();
    if (this.#busy) {
      // Runs in the check phase, after the turn's callbacks: the idle time counts from here.
      this.#busy = false;
      this.#lastActive = now;
    }
    if ((now - this.#lastActive) * 1000 < this.#windowUs) setImmediate(this.#spin);
    else this.#queued = false;
  };
}
