/**
 * Every non-2xx response leaves through here as RFC 9457 `application/problem+json`:
 * `type` (a stable URI per code), `title`, `status`, `detail`, `instance` (the request id),
 * plus `code` and `errors[]` (the individual failures of a validation error; empty otherwise). Unknown failures become a generic 500; the
 * stack goes to the log only, never into a body. A write SQLite refused for a full disk, an I/O
 * error or a read-only file becomes a 503 with Retry-After: SQLite rolled it back, so the request
 * may be sent again once the disk is fixed.
 */
import { AgentError, ERROR_CODES, storageUnavailable, type ErrorCode } from '../core/errors.js';
import type { OutgoingReply } from '../http/index.js';

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';
const TYPE_BASE = 'https://flashd.dev/problems/';

export function problemType(code: ErrorCode): string {
  if (code === 'RATE_LIMITED') return 'https://iana.org/assignments/http-problem-types#quota-exceeded';
  return TYPE_BASE + code.toLowerCase().replace(/_/g, '-');
}

/** The most characters of an id from the URL that a problem's `detail` repeats (echoId). */
export const ECHO_ID_CHARS = 64;

/** `value` as an error message repeats it: at most ECHO_ID_CHARS characters, then `…`. */
export function echoId(value: string): string {
  return value.length > ECHO_ID_CHARS ? `${value.slice(0, ECHO_ID_CHARS)}…` : value;
}

/** The most characters of a request path that a problem's `detail` repeats (echoPath). */
export const ECHO_PATH_CHARS = 256;

/** A request path as an error message repeats it: at most ECHO_PATH_CHARS characters, then `…`. */
export function echoPath(path: string): string {
  return path.length > ECHO_PATH_CHARS ? `${path.slice(0, ECHO_PATH_CHARS)}…` : path;
}

/**
 * `detail` with each path parameter over ECHO_ID_CHARS (a job, worker or endpoint id: none
 * that flashd makes is that long) cut by echoId wherever it is repeated, so a 100,000-character
 * id in the URL is not sent back whole.
 */
function cutEchoedIds(detail: string, params: Readonly<Record<string, string>>): string {
  for (const k in params) {
    const v = params[k] as string;
    if (v.length > ECHO_ID_CHARS) detail = detail.split(v).join(echoId(v));
  }
  return detail;
}

export function problemReply(err: AgentError, requestId: string, extraHeaders: Record<string, string> = {}, params?: Readonly<Record<string, string>>): OutgoingReply {
  const body: Record<string, unknown> = {
    type: problemType(err.code),
    title: err.title,
    status: err.status,
    detail: params === undefined ? err.message : cutEchoedIds(err.message, params),
    instance: requestId,
    code: err.code,
  };
  // Always present, so a client reads one shape: the individual failures of a validation error,
  // empty for every other problem (its detail says it all).
  body['errors'] = err.errors ?? [];
  if (err.extensions) Object.assign(body, err.extensions);
  return {
    status: err.status,
    headers: { 'content-type': PROBLEM_CONTENT_TYPE, ...extraHeaders, ...err.headers },
    body: JSON.stringify(body),
  };
}

export function toAgentError(err: unknown): AgentError {
  if (err instanceof AgentError) return err;
  return storageUnavailable(err) ?? new AgentError('INTERNAL', 'The server failed to handle this request. The incident is in the server log under this request id.', { cause: err });
}

export function allCodes(): ErrorCode[] {
  return Object.keys(ERROR_CODES) as ErrorCode[];
}
