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
