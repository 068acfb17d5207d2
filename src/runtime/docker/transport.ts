/**
 * HTTP/1.1 over the engine's unix socket with `node:http`: JSON requests, streamed replies
 * (pull progress, wait) and upgraded connections (attach). Every failure becomes a
 * `DockerError` with the socket error or the engine's reply as `cause`.
 */
import http from 'node:http';
import type { Duplex, Readable } from 'node:stream';
import { DockerError, codeForStatus } from './errors.js';

export type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOptions {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE' | 'HEAD';
  path: string;
  query?: Query;
  /** Sent as JSON. */
  body?: unknown;
  headers?: Record<string, string>;
  /** Idle timeout of the socket in ms; 0: none (wait, attach, pull). */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Statuses below 200 or above 299 that are not failures (e.g. 304 "already started"). */
  accept?: readonly number[];
  /** Without the /vX.YY prefix (`/_ping`, `/version`, used before the version is known). */
  unversioned?: boolean;
}

/** Socket errors that mean "the engine is not there". */
const UNREACHABLE = new Set(['ENOENT', 'ECONNREFUSED', 'EACCES', 'EPERM', 'ECONNRESET', 'EPIPE', 'ENOTSOCK']);

export class Transport {
  readonly socketPath: string;
  readonly #agent: http.Agent;
  readonly #defaultTimeoutMs: number;
  #prefix = '';

  constructor(socketPath: string, defaultTimeoutMs: number) {
    this.socketPath = socketPath;
    this.#defaultTimeoutMs = defaultTimeoutMs;
    this.#agent = new http.Agent({ keepAlive: true });
  }

  /** Prefixes later paths with `/v<version>` (API version negotiation). */
  setVersion(version: string): void {
    this.#prefix = `/v${version}`;
  }

  #url(o: RequestOptions): string {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(o.query ?? {})) if (v !== undefined) params.set(k, String(v));
    const qs = params.toString();
    return `${o.unversioned ? '' : this.#prefix}${o.path}${qs ? `?${qs}` : ''}`;
  }

  /**
   * Sends a request and resolves with the reply head once it arrives. A failure status
   * rejects (after reading the engine's message). `retry`: once more on a reset of a reused
   * keep-alive socket, which the engine may close between requests.
   */
  #send(o: RequestOptions, upgrade: boolean, retry = true): Promise<{ res: http.IncomingMessage; socket?: Duplex; head?: Buffer }> {
    const what = `${o.method} ${o.path}`;
    const payload = o.body === undefined ? undefined : Buffer.from(JSON.stringify(o.body));
    const headers: Record<string, string> = { host: 'docker', ...o.headers };
    if (payload) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(payload.length);
    }
    if (upgrade) Object.assign(headers, { connection: 'Upgrade', upgrade: 'tcp' });
    return new Promise((resolve, reject) => {
      const req = http.request({
        socketPath: this.socketPath, method: o.method, path: this.#url(o), headers,
        ...(upgrade ? {} : { agent: this.#agent }),
      });
      let settled = false;
      const fail = (err: DockerError): void => {
        if (settled) return;
        settled = true;
        req.destroy();
        reject(err);
      };
      const timeoutMs = o.timeoutMs ?? this.#defaultTimeoutMs;
      if (timeoutMs > 0) {
        req.setTimeout(timeoutMs, () => fail(new DockerError('DOCKER_PROTOCOL', `${what}: no reply within ${timeoutMs} ms`, { request: what })));
      }
      const onAbort = (): void => fail(new DockerError('DOCKER_PROTOCOL', `${what}: aborted`, { request: what, cause: o.signal?.reason }));
      if (o.signal?.aborted) return onAbort();
      o.signal?.addEventListener('abort', onAbort, { once: true });
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (settled) return;
        if (retry && err.code === 'ECONNRESET' && req.reusedSocket) {
          settled = true;
          o.signal?.removeEventListener('abort', onAbort);
          this.#send(o, upgrade, false).then(resolve, reject);
          return;
        }
        const code = UNREACHABLE.has(err.code ?? '') ? 'DOCKER_UNREACHABLE' : 'DOCKER_PROTOCOL';
        fail(new DockerError(code, `${what}: cannot reach the engine at ${this.socketPath}: ${err.message}`, { request: what, cause: err }));
      });
      const done = (res: http.IncomingMessage, socket?: Duplex, head?: Buffer): void => {
        o.signal?.removeEventListener('abort', onAbort);
        if (settled) return;
        const status = res.statusCode ?? 0;
        if ((status >= 200 && status < 300) || status === 101 || o.accept?.includes(status)) {
          settled = true;
          if (timeoutMs > 0) req.setTimeout(0);
          resolve({ res, ...(socket ? { socket } : {}), ...(head ? { head } : {}) });
          return;
        }
        settled = true;
        readAll(res).then((buf) => reject(replyError(what, status, buf)), (err: unknown) => reject(new DockerError(codeForStatus(status), `${what}: ${status}`, { status, request: what, cause: err })));
      };
      req.on('response', (res) => done(res));
      if (upgrade) req.on('upgrade', (res, socket, head) => done(res, socket, head));
      req.end(payload);
    });
  }

  /** A request whose reply is JSON (or empty: undefined). */
  async json<T>(o: RequestOptions): Promise<{ status: number; body: T }> {
    const what = `${o.method} ${o.path}`;
    const { res } = await this.#send(o, false);
    const buf = await readAll(res);
    if (buf.length === 0) return { status: res.statusCode ?? 0, body: undefined as T };
    try {
      return { status: res.statusCode ?? 0, body: JSON.parse(buf.toString('utf8')) as T };
    } catch (err) {
      throw new DockerError('DOCKER_PROTOCOL', `${what}: reply is not JSON`, { status: res.statusCode ?? 0, request: what, cause: err });
    }
  }

  /** A request whose reply is plain text (`/_ping`). */
  async text(o: RequestOptions): Promise<string> {
    return (await readAll((await this.#send(o, false)).res)).toString('utf8');
  }

  /**
   * A request whose reply body is consumed as a stream by the caller. The signal keeps working
   * after the headers: it ends the body with an error (a pull's progress stream can run for
   * minutes, and a shutdown must not wait for it).
   */
  async stream(o: RequestOptions): Promise<http.IncomingMessage> {
    const { res } = await this.#send(o, false);
    const signal = o.signal;
    if (signal) {
      const onAbort = (): void => {
        res.destroy(new DockerError('DOCKER_PROTOCOL', `${o.method} ${o.path}: aborted`, { request: `${o.method} ${o.path}`, cause: signal.reason }));
      };
      if (signal.aborted) onAbort();
      else {
        signal.addEventListener('abort', onAbort, { once: true });
        res.once('close', () => signal.removeEventListener('abort', onAbort));
      }
    }
    return res;
  }

  /**
   * A hijacked connection (attach): the raw socket after `101 Switching Protocols`. Docker
   * and Podman both upgrade when asked; an engine that answers 200 instead streams the same
   * bytes in the reply body, which is handed back in its place.
   */
  async upgrade(o: RequestOptions): Promise<Readable> {
    const { res, socket, head } = await this.#send({ ...o, timeoutMs: 0 }, true);
    if (!socket) return res;
    if (head && head.length) socket.unshift(head);
    return socket;
  }

  close(): void {
    this.#agent.destroy();
  }
}

function readAll(res: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    res.on('data', (c: Buffer) => chunks.push(c));
    res.on('end', () => resolve(Buffer.concat(chunks)));
    res.on('error', reject);
    res.on('aborted', () => reject(new Error('reply aborted')));
  });
}

/** The engine's `{ "message": ... }` (Docker) or `{ "cause", "message" }` (Podman) as an error. */
function replyError(what: string, status: number, buf: Buffer): DockerError {
  let message = buf.toString('utf8').trim().slice(0, 2000);
  let body: unknown = message;
  try {
    body = JSON.parse(message);
    const m = (body as { message?: unknown }).message;
    if (typeof m === 'string') message = m;
  } catch {
    // plain text reply
  }
  return new DockerError(codeForStatus(status), `${what}: ${status} ${message || http.STATUS_CODES[status] || ''}`.trim(), {
    status, request: what, cause: body,
  });
}
