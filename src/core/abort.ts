/**
 * A cheap way to hear that a client went away. Long-polls (job-take, job-stop) and /runsync
 * waits need it on every request, and an AbortController with its listener costs a few µs
 * each; this is one array push. The HTTP adapter implements it per request.
 */
export interface Cancellation {
  readonly aborted: boolean;
  /** Calls `cb` once when the client goes away; the returned function unregisters it. */
  onAbort(cb: () => void): () => void;
}

/** A cancellation that never fires (internal callers, tests). */
export const NEVER_CANCELLED: Cancellation = { aborted: false, onAbort: () => () => undefined };

/** Adapts an AbortSignal. */
export function cancellationOf(signal: AbortSignal): Cancellation {
  return {
    get aborted() {
      return signal.aborted;
    },
    onAbort(cb) {
      signal.addEventListener('abort', cb, { once: true });
      return () => signal.removeEventListener('abort', cb);
    },
  };
}
