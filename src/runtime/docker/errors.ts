/**
 * Typed errors of the Docker Engine API client. Callers branch on `code`, never on message
 * text (the one exception, the disk-limit probe in container-runtime.ts, is documented there).
 * The foreign error that caused one (a socket error, the engine's reply) is kept as `cause`.
 */

export type DockerErrorCode =
  /** The socket cannot be reached (missing, refused, permission denied, reset before a reply). */
  | 'DOCKER_UNREACHABLE'
  /** 404: no such container, image, volume or network. */
  | 'DOCKER_NOT_FOUND'
  /** 409: name in use, container running, volume in use. */
  | 'DOCKER_CONFLICT'
  /** 400: the engine refused the request body or parameters. */
  | 'DOCKER_BAD_REQUEST'
  /** Any other failure reply (5xx, 401/403), or an error inside a 200 progress stream (pull). */
  | 'DOCKER_API'
  /** The reply could not be understood (bad JSON, unexpected upgrade refusal), or it timed out. */
  | 'DOCKER_PROTOCOL';

export class DockerError extends Error {
  readonly code: DockerErrorCode;
  /** HTTP status of the engine's reply, when there was one. */
  readonly status: number | undefined;
  /** `METHOD /path` of the request (never a header: X-Registry-Auth stays out of errors). */
  readonly request: string;

  constructor(code: DockerErrorCode, message: string, options: { status?: number; request: string; cause?: unknown }) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'DockerError';
    this.code = code;
    this.status = options.status;
    this.request = options.request;
  }
}

export function isDockerError(value: unknown, code?: DockerErrorCode): value is DockerError {
  return value instanceof DockerError && (code === undefined || value.code === code);
}

/** The error code for an HTTP failure status of the engine. */
export function codeForStatus(status: number): DockerErrorCode {
  if (status === 404) return 'DOCKER_NOT_FOUND';
  if (status === 409) return 'DOCKER_CONFLICT';
  if (status === 400) return 'DOCKER_BAD_REQUEST';
  return 'DOCKER_API';
}
