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

/** Resolves after `ms`, or at once when the client goes away (a held error reply, a paced poll). */
export function pause(ms: number, cancel: Cancellation): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      unhook();
      resolve();
    };
    const timer = setTimeout(done, ms);
    const unhook = cancel.onAbort(done);
  });
}
