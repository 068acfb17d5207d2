/**
 * The one error catalogue (fastify `lib/errors.js`, undici `lib/core/errors.js` style).
 * Code branches on `err.code`, never on message text. `api/problem.ts` turns any
 * thrown value into RFC 9457 problem+json in one place.
 */

export interface ErrorSpec {
  readonly status: number;
  readonly title: string;
}

export const ERROR_CODES = {
  VALIDATION_FAILED: { status: 400, title: 'Request validation failed' },
  BAD_REQUEST: { status: 400, title: 'Bad request' },
  INVALID_JSON: { status: 400, title: 'Malformed JSON body' },
  UNAUTHENTICATED: { status: 401, title: 'Unauthorized' },
  FORBIDDEN: { status: 403, title: 'Forbidden' },
  NOT_FOUND: { status: 404, title: 'Not found' },
  ROUTE_NOT_FOUND: { status: 404, title: 'Route not found' },
  METHOD_NOT_ALLOWED: { status: 405, title: 'Method not allowed' },
  CONFLICT: { status: 409, title: 'Conflict' },
  STALE_ATTEMPT: { status: 409, title: 'Stale job attempt' },
  JOB_NOT_IN_STATE: { status: 409, title: 'Job is not in a state that allows this' },
  GONE: { status: 410, title: 'Gone' },
  PAYLOAD_TOO_LARGE: { status: 413, title: 'Payload too large' },
  UNSUPPORTED_MEDIA_TYPE: { status: 415, title: 'Unsupported media type' },
  UNPROCESSABLE: { status: 422, title: 'Unprocessable request' },
  RATE_LIMITED: { status: 429, title: 'Too many requests' },
  HEADERS_TOO_LARGE: { status: 431, title: 'Request header fields too large' },
  INTERNAL: { status: 500, title: 'Internal server error' },
  UNAVAILABLE: { status: 503, title: 'Service unavailable' },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERROR_CODES;

export interface AgentErrorOptions {
  /** Individual validation failures, one human-readable string each. */
  errors?: string[];
  /** Extra problem+json members (RFC 9457 extensions), e.g. `window`. */
  extensions?: Record<string, unknown>;
  /** Extra response headers, e.g. `Retry-After`. */
  headers?: Record<string, string>;
  cause?: unknown;
  /** Public ids for the server's debug log only (a refused key's id), never in a reply. */
  logFields?: Record<string, string>;
}

export class AgentError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly title: string;
  readonly errors: string[] | undefined;
  readonly extensions: Record<string, unknown> | undefined;
  readonly headers: Record<string, string> | undefined;
  readonly logFields: Record<string, string> | undefined;

  constructor(code: ErrorCode, detail: string, options: AgentErrorOptions = {}) {
    super(detail, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'AgentError';
    this.code = code;
    this.status = ERROR_CODES[code].status;
    this.title = ERROR_CODES[code].title;
    this.errors = options.errors;
    this.extensions = options.extensions;
    this.headers = options.headers;
    this.logFields = options.logFields;
  }
}

export function isAgentError(value: unknown): value is AgentError {
  return value instanceof AgentError;
}

/** Shorthand for the common validation failure with a list of reasons. */
export function validationError(errors: string[], status: 400 | 422 = 400): AgentError {
  const detail = errors.length === 1 ? (errors[0] as string) : `${errors.length} validation errors: ${errors.join('; ')}`;
  return new AgentError(status === 422 ? 'UNPROCESSABLE' : 'VALIDATION_FAILED', detail, { errors });
}

/**
 * SQLite's code when `err` says the database cannot be written for a reason of the machine, not
 * of the request: the filesystem is full (SQLITE_FULL), an I/O error (SQLITE_IOERR_*), or the file
 * or its filesystem turned read-only (SQLITE_READONLY_*). It passes once space is freed or the disk
 * is fixed; undefined for anything else (a constraint, a bug).
 */
export function storageFailureCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null | undefined)?.code;
  if (typeof code !== 'string') return undefined;
  return code === 'SQLITE_FULL' || code.startsWith('SQLITE_IOERR') || code.startsWith('SQLITE_READONLY') ? code : undefined;
}

/** Seconds a client is told to wait before sending again a request the database could not take. */
const STORAGE_RETRY_AFTER_S = 10;

/**
 * The 503 for a write SQLite refused and rolled back for a reason of the machine (see
 * storageFailureCode), or undefined for any other error: the request changed nothing and may be
 * sent again later, unlike a 500, which RunPod's clients take as final.
 */
export function storageUnavailable(err: unknown): AgentError | undefined {
  const code = storageFailureCode(err);
  if (code === undefined) return undefined;
  const why = code === 'SQLITE_FULL' ? 'the disk holding its data directory is full'
    : code.startsWith('SQLITE_IOERR') ? 'the disk holding its data directory reported an I/O error'
      : 'its database file or the filesystem holding it is read-only';
  return new AgentError('UNAVAILABLE', `flashd could not write its database: ${why} (${code}). Nothing was stored; send the request again later.`, {
    headers: { 'retry-after': String(STORAGE_RETRY_AFTER_S) },
    cause: err,
  });
}
