/**
 * The only importer of uWebSockets.js. Handlers never see uWS objects: they get a plain
 * `IncomingRequest` and return an `OutgoingReply`. Rules kept here (uWS requirements):
 * headers are copied synchronously, `onAborted` and `onData` are registered before the first
 * await, every write happens inside `cork()`, and large bodies honour backpressure.
 */
import type { HttpRequest, HttpResponse, us_listen_socket } from 'uWebSockets.js';
import { randomBytes } from 'node:crypto';
import { createServer as createNetServer } from 'node:net';
import { loadUws, uwsIdleTimeoutS, uwsPatchSkipped, uwsSplitHeaderLimit } from '../core/native.js';
import { LoopSpinner } from '../core/loop-spin.js';
import type { Cancellation } from '../core/abort.js';
import type { Logger } from '../core/logger.js';

const uws = loadUws();

export interface IncomingRequest {
  readonly id: string;
  /** Upper-case method. */
  readonly method: string;
  /** Raw path, without the query string. */
  readonly path: string;
  readonly query: URLSearchParams;
  /** Lower-case header names. */
  readonly headers: Readonly<Record<string, string>>;
  /** The peer address, read when first asked for. */
  readonly remoteAddress: string;
  /** Aborted when the client goes away before the reply is sent. */
  readonly signal: AbortSignal;
  /** The same event without an AbortController, for the hot long-poll paths. */
  readonly cancel: Cancellation;
  /** The whole body (empty for bodiless requests), already bounded by the route's limit. */
  readonly body: Buffer;
}

/** A reply streamed in pieces (log follow, server-sent data). */
export interface StreamWriter {
  /**
   * Sends a chunk. False when the client is not keeping up (uWS buffered the chunk in memory):
   * write nothing more until `drained` calls back, or the buffer grows without bound.
   */
  write(chunk: string | Buffer): boolean;
  end(): void;
  /**
   * `cb` runs once the socket takes data again (the last call's callback only). A client that
   * takes nothing for STREAM_STALL_MS is disconnected (`signal` aborts).
   */
  drained(cb: () => void): void;
  readonly signal: AbortSignal;
}

export interface OutgoingReply {
  status: number;
  headers?: Record<string, string>;
  body?: string | Buffer;
  /** When set, headers go out at once and the function writes the body over time. */
  stream?: (writer: StreamWriter) => void;
  /**
   * Non-empty bytes sent first when `stream` writes nothing before it returns; a newline when
   * not given (a blank NDJSON line). uWS ends the header block only with the first non-empty
   * chunk (an empty write is a no-op), so without them the client would get an incomplete
   * header block until the stream's first write.
   */
  streamOpen?: string;
}

export interface RouteDecision {
  /** Largest body accepted for this request, in bytes. */
  maxBodyBytes: number;
  /** Called with the complete request once the body is in. */
  handle(req: IncomingRequest): Promise<OutgoingReply> | OutgoingReply;
  /** The reply to a body over `maxBodyBytes` (the request has headers, no body); a plain 413 without it. */
  tooLarge?(req: IncomingRequest): Promise<OutgoingReply> | OutgoingReply;
  /**
   * What the headers alone decide, asked before the first byte of a body is read (a request
   * without a body goes straight to `handle`, which decides it there): a reply here (401, 403,
   * 404, 429) is sent at once and the body that follows is read and dropped, never kept.
   */
  admit?(req: IncomingRequest): OutgoingReply | undefined;
}

export interface HttpServerOptions {
  host: string;
  port: number;
  log: Logger;
  /** Synchronous route choice, so the body limit is known before any byte is read. */
  resolve(method: string, path: string, headers: Readonly<Record<string, string>>): RouteDecision;
  /** Turns a payload-too-large or internal failure into a reply (problem+json lives in api/). */
  onEarlyError(kind: 'payload-too-large' | 'bad-request' | 'internal' | 'unavailable', detail: string, requestId: string): OutgoingReply;
  /** Longest adaptive polling window before the loop sleeps, µs (core/loop-spin.ts); 0 turns it off. */
  pollSpinUs?: number;
  /** Bytes of request bodies being received at once, over all requests (BODIES_IN_FLIGHT_MAX_BYTES). */
  maxBodyBytesInFlight?: number;
}

const STATUS_TEXT: Record<number, string> = {
  200: 'OK', 201: 'Created', 202: 'Accepted', 204: 'No Content', 400: 'Bad Request', 401: 'Unauthorized',
  403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 409: 'Conflict', 410: 'Gone',
  413: 'Payload Too Large', 415: 'Unsupported Media Type', 422: 'Unprocessable Content',
  429: 'Too Many Requests', 431: 'Request Header Fields Too Large', 500: 'Internal Server Error',
  502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout',
};

export interface HttpServer {
  listen(): Promise<{ port: number }>;
  close(): Promise<void>;
}

/** Request ids: a random per-process prefix and a counter (unique, and cheaper than a UUID per request). */
const ID_PREFIX = randomBytes(6).toString('hex');
let idCounter = 0;

/**
 * Status lines and frequent header names and values as bytes: uWS copies a JS string argument
 * into a temporary UTF-8 buffer on every call, while a Buffer is read in place.
 */
const STATUS_LINE: Record<number, Buffer> = {};
for (const [code, text] of Object.entries(STATUS_TEXT)) STATUS_LINE[Number(code)] = Buffer.from(`${code} ${text}`);
const X_REQUEST_ID = Buffer.from('x-request-id');
const encoded = new Map<string, Buffer>();
/** `s` as bytes, remembered (header names, and content types: values that repeat). */
function bytesOf(s: string): Buffer | string {
  let b = encoded.get(s);
  if (b === undefined) {
    if (s.length > 64 || encoded.size >= 256) return s;
    encoded.set(s, (b = Buffer.from(s)));
  }
  return b;
}

/**
 * `x-request-id` goes out on every non-2xx reply (it is also the problem body's `instance`) and
 * whenever the client sent one; a plain success of the job or worker path carries no id nobody
 * asked for (each header is a native call on the hottest path).
 */
function writeHead(res: HttpResponse, reply: OutgoingReply, requestId: string, echoId: boolean): void {
  res.writeStatus(STATUS_LINE[reply.status] ?? `${reply.status} Status`);
  if (echoId || reply.status >= 300) res.writeHeader(X_REQUEST_ID, requestId);
  const headers = reply.headers;
  if (headers) {
    for (const k in headers) {
      const v = headers[k] as string;
      res.writeHeader(bytesOf(k), k === 'content-type' ? bytesOf(v) : v);
    }
  }
}

const EMPTY_BODY = Buffer.alloc(0);

/** Bodies up to this size are handed to uWS whole (it buffers what the socket does not take). */
const SMALL_BODY = 64 * 1024;
/**
 * A body over its route's limit is read and dropped up to this many bytes past that limit
 * before the 413 goes out. Clients that send the whole body before reading (Python's
 * http.client under requests and the runpod SDK, aiohttp) saw a broken pipe instead of the 413
 * when it came first and the connection closed under them. Beyond it (an absurd size) the 413
 * goes out at once with the connection closed. The margin is past each route's own limit, so
 * a body just over the largest (a worker's 64 MiB post) is drained too. (`Expect:
 * 100-continue` changes nothing: uWS answers `100 Continue` itself before flashd sees the
 * request.)
 */
const DRAIN_MARGIN_BYTES = 64 * 1024 * 1024;

/**
 * Bytes of request bodies being received at once, over every request: each route's limit
 * bounds one body, this bounds them together (2,000 /runsync uploads of 20 MiB cut off near
 * their end held gigabytes). The chunk that would pass it gets a 503 with Retry-After and its
 * connection closed; a body's bytes stop counting once it is complete, aborted or refused.
 */
const BODIES_IN_FLIGHT_MAX_BYTES = 512 * 1024 * 1024;

/** Retry-After (s) of the 503 for a body over BODIES_IN_FLIGHT_MAX_BYTES. */
const BODIES_IN_FLIGHT_RETRY_S = '5';

/** A streamed reply whose client takes no data for this long (ms) after a held-back write is closed. */
const STREAM_STALL_MS = 60_000;

/** Sends a complete body, continuing through onWritable when the socket is backed up. */
function sendWhole(res: HttpResponse, state: { aborted: boolean; done: boolean }, body: Buffer, closeConnection: boolean, sent: () => void): void {
  if (closeConnection) {
    res.end(body, true);
    state.done = true;
    sent();
    return;
  }
  const base = res.getWriteOffset();
  const [ok, done] = res.tryEnd(body, body.length);
  state.done = done;
  if (done) sent();
  if (done || ok) return;
  res.onWritable((offset) => {
    if (state.aborted) return true;
    const [more, finished] = res.tryEnd(body.subarray(offset - base), body.length);
    state.done = finished;
    if (finished) sent();
    return more;
  });
}

/** How long close() waits for requests already received to be answered (ms). */
const CLOSE_GRACE_MS = 3000;

/** uWS ListenOptions.LIBUS_LISTEN_EXCLUSIVE_PORT: no SO_REUSEPORT on the listening socket. */
const LISTEN_EXCLUSIVE_PORT = 1;

/**
 * Why uWS could not listen: it reports a failure without an errno, so the same host and port
 * are tried again with Node's net (listened on, then closed at once) and its error code is
 * said. The text follows `cannot listen on HOST:PORT`.
 */
function listenFailure(host: string, port: number): Promise<string> {
  return new Promise((resolve) => {
    const probe = createNetServer();
    probe.once('error', (err: NodeJS.ErrnoException) => {
      switch (err.code) {
        case 'EADDRINUSE':
          resolve(': address already in use (another flashd or program listens there; pick --port)');
          return;
        case 'EACCES':
          resolve(': permission denied: ports below 1024 need root or CAP_NET_BIND_SERVICE');
          return;
        case 'EADDRNOTAVAIL':
          resolve(`: ${host} is not an address of this machine (pick --host)`);
          return;
        case 'ENOTFOUND':
          resolve(`: ${host} does not resolve to an address (ENOTFOUND; pick --host)`);
          return;
        default:
          resolve(`: ${err.code ?? err.message}`);
      }
    });
    probe.listen({ host, port, exclusive: true }, () => {
      // Free a moment later: whatever held it has let go.
      probe.close(() => resolve(' (refused, but free when tried again; start flashd again)'));
    });
  });
}

export function createHttpServer(options: HttpServerOptions): HttpServer {
  const app = uws.App();
  let listenSocket: us_listen_socket | null = null;
  const log = options.log;
  if (uwsPatchSkipped !== null) {
    log.warn('request headers over 4 KB that arrive in more than one read will be refused (large worker pings included), '
      + 'and idle connections close after 8–12 s (a runpod-python worker whose sync handler runs 10–15 s can lose its result)', {
      splitHeaderLimit: uwsSplitHeaderLimit, idleTimeoutS: uwsIdleTimeoutS, reason: uwsPatchSkipped,
    });
  }
  /** Requests received and not yet answered or aborted; close() waits for them. */
  let open = 0;
  let closing = false;
  /** Bytes of request bodies received and not yet complete, over every request. */
  let bodiesInFlight = 0;
  const maxInFlight = options.maxBodyBytesInFlight ?? BODIES_IN_FLIGHT_MAX_BYTES;
  let whenIdle: (() => void) | null = null;

  /**
   * uWS corks the socket whose callback is running, and only one socket can be corked at a
   * time: a reply to another socket written from inside that callback or its promise jobs (a
   * job handed from a /runsync request to a parked job-take) went out uncorked, one send(2)
   * for the status line, each header and the body (19 for a job-take), each a TCP segment the
   * peer has to read. So from the first uWS callback of a loop turn until the turn's check
   * phase, a reply to any exchange other than the one whose callback ran last waits for that
   * check phase (setImmediate), where it corks its own socket and leaves in one send, with
   * the others deferred in that turn. Deferring is always safe; it costs one array entry.
   */
  let corked: Exchange | null = null;
  let deferred: { ex: Exchange; reply: OutgoingReply; close: boolean }[] = [];
  const turnEnd = (): void => {
    corked = null;
    const list = deferred;
    deferred = [];
    for (const d of list) {
      // One failed write must not strand the replies after it; its own client gets a closed
      // connection rather than a wait.
      try {
        d.ex.reply(d.reply, d.close);
      } catch (err) {
        log.error('deferred reply failed', { err, requestId: d.ex.id });
        d.ex.closeConnection();
      }
    }
  };
  const spinner = new LoopSpinner(options.pollSpinUs ?? 0);
  const enter = (ex: Exchange): void => {
    if (corked === null) setImmediate(turnEnd);
    corked = ex;
    spinner.activity();
  };

  /**
   * One request: its state, its `IncomingRequest` view (getters on the prototype), its body and
   * its reply. It is also the request's `cancel`, so a request allocates no closure or
   * AbortController for that.
   */
  class Exchange implements IncomingRequest, Cancellation {
    aborted = false;
    done = false;
    /** Made on first use of `signal` (most requests never look at it). */
    #controller: AbortController | undefined = undefined;
    /** Callbacks registered through `onAbort`. */
    #hooks: (() => void)[] | null = null;
    readonly id: string;
    readonly method: string;
    readonly path: string;
    readonly headers: Record<string, string>;
    body: Buffer = EMPTY_BODY;
    readonly echoId: boolean;
    readonly #res: HttpResponse;
    readonly #rawQuery: string;
    #query: URLSearchParams | undefined = undefined;
    #remote: string | undefined = undefined;
    decision: RouteDecision | undefined = undefined;
    #chunks: Buffer[] | null = null;
    #received = 0;
    /** Bytes of its body counted in bodiesInFlight. */
    #held = 0;
    #refused = false;
    /** Over the limit: the rest of the body is read and dropped, and the 413 sent at its end. */
    #draining = false;
    /** Refused from its headers and answered: the body that follows is read and dropped. */
    #answered = false;
    /** A refusal from the headers held until the end of a chunked body (refuseEarly). */
    #early: OutgoingReply | undefined = undefined;
    #settled = false;

    constructor(res: HttpResponse, uReq: HttpRequest) {
      open++;
      this.#res = res;
      this.method = uReq.getCaseSensitiveMethod().toUpperCase();
      this.path = uReq.getUrl();
      this.#rawQuery = uReq.getQuery() ?? '';
      const headers: Record<string, string> = {};
      uReq.forEach((k, v) => {
        headers[k] = headers[k] === undefined ? v : `${headers[k]}, ${v}`;
      });
      this.headers = headers;
      const given = headers['x-request-id'];
      this.echoId = given !== undefined && /^[A-Za-z0-9._-]{1,64}$/.test(given);
      this.id = this.echoId ? (given as string) : `${ID_PREFIX}-${(++idCounter).toString(36)}`;
    }

    get query(): URLSearchParams {
      return (this.#query ??= new URLSearchParams(this.#rawQuery));
    }

    get remoteAddress(): string {
      if (this.#remote === undefined) {
        try {
          this.#remote = this.aborted ? '' : Buffer.from(this.#res.getRemoteAddressAsText()).toString();
        } catch {
          this.#remote = '';
        }
      }
      return this.#remote;
    }

    get signal(): AbortSignal {
      if (!this.#controller) {
        this.#controller = new AbortController();
        if (this.aborted) this.#controller.abort();
      }
      return this.#controller.signal;
    }

    get cancel(): Cancellation {
      return this;
    }

    onAbort(cb: () => void): () => void {
      if (this.aborted) {
        cb();
        return () => undefined;
      }
      (this.#hooks ??= []).push(cb);
      return () => {
        const i = this.#hooks?.indexOf(cb) ?? -1;
        if (i >= 0) this.#hooks?.splice(i, 1);
      };
    }

    /** Answered (its reply handed to uWS) or gone: close() no longer waits for it. */
    #settle(): void {
      if (this.#settled) return;
      this.#settled = true;
      if (--open === 0 && whenIdle) whenIdle();
    }

    /** The client went away (uWS onAborted). */
    abort(): void {
      this.aborted = true;
      this.#release();
      this.#settle();
      this.#controller?.abort();
      const hooks = this.#hooks;
      this.#hooks = null;
      if (hooks) for (const h of hooks) h();
    }

    reply(reply: OutgoingReply, closeConnection = false): void {
      if (this.aborted || this.done) return;
      if (corked !== null && corked !== this) {
        deferred.push({ ex: this, reply, close: closeConnection });
        return;
      }
      const res = this.#res;
      // Shutting down: no further request on this connection (a large body keeps it open until
      // sent through backpressure; app.close() ends the connection after that).
      const raw = reply.body ?? '';
      if (closing && raw.length <= SMALL_BODY / 4) closeConnection = true;
      if (this.method === 'HEAD') {
        this.#replyHead(reply, raw, closeConnection);
        return;
      }
      if (reply.stream) {
        // The status line and headers are buffered here; uWS completes the block (with
        // Transfer-Encoding: chunked and the blank line) only with the first non-empty chunk.
        res.cork(() => writeHead(res, reply, this.id, this.echoId));
        const ex = this;
        let wrote = false;
        let onDrain: (() => void) | null = null;
        let hooked = false;
        let stall: NodeJS.Timeout | null = null;
        const writer: StreamWriter = {
          get signal() {
            return ex.signal;
          },
          write: (chunk) => {
            if (this.aborted || this.done || chunk.length === 0) return true;
            wrote = true;
            let ok = true;
            res.cork(() => {
              ok = res.write(chunk);
            });
            return ok;
          },
          drained: (cb) => {
            if (this.aborted || this.done) return;
            onDrain = cb;
            // uWS resets the idle timeout on every write, and nothing is written while waiting
            // here, but a client that keeps its connection open without reading (a stopped
            // pager) would hold it for ever: it gets STREAM_STALL_MS, then the connection closes.
            stall ??= setTimeout(() => {
              stall = null;
              if (!this.aborted && !this.done) res.close();
            }, STREAM_STALL_MS).unref();
            if (hooked) return;
            hooked = true;
            res.onWritable(() => {
              if (stall) clearTimeout(stall);
              stall = null;
              const f = onDrain;
              onDrain = null;
              if (f && !this.aborted && !this.done) f();
              return true;
            });
          },
          end: () => {
            if (stall) clearTimeout(stall);
            stall = null;
            if (this.aborted || this.done) return;
            this.done = true;
            res.cork(() => res.end(undefined, closing));
            this.#settle();
          },
        };
        reply.stream(writer);
        // Nothing to send yet: the header block must still go out now (a client waiting for
        // headers would otherwise wait for the first line, or give up).
        if (!wrote && !this.done && !this.aborted) writer.write(reply.streamOpen || '\n');
        return;
      }
      let whole = false;
      res.cork(() => {
        writeHead(res, reply, this.id, this.echoId);
        if (reply.status === 204 || reply.status === 304) {
          res.endWithoutBody(0, closeConnection);
          this.done = true;
        } else if (raw.length <= SMALL_BODY / 4) {
          // Small (even at 4 bytes per character): no Buffer, no backpressure bookkeeping.
          res.end(raw, closeConnection);
          this.done = true;
        } else {
          whole = true;
          sendWhole(res, this, Buffer.isBuffer(raw) ? raw : Buffer.from(raw), closeConnection, () => this.#settle());
        }
      });
      // A large body under backpressure is settled once its last byte went out (or on abort).
      if (!whole) this.#settle();
    }

    /**
     * HEAD (routed as GET): the GET's status and headers with its Content-Length, and no body
     * (RFC 9110 §9.3.2). A body here was read by a keep-alive client as the start of the next
     * response (Node's http client: "Parse Error: Expected HTTP/"). A stream is not started.
     * `endWithoutBody` takes no length here: given one, this uWS writes its own Content-Length
     * and, for a non-zero value, closes the connection without sending anything; so the header
     * is written by hand, except on a reply that closes the connection (Content-Length: 0).
     */
    #replyHead(reply: OutgoingReply, raw: string | Buffer, closeConnection: boolean): void {
      const res = this.#res;
      res.cork(() => {
        writeHead(res, reply, this.id, this.echoId);
        if (closeConnection) {
          res.endWithoutBody(0, true);
          return;
        }
        if (!reply.stream && reply.status !== 204 && reply.status !== 304) res.writeHeader('content-length', String(Buffer.byteLength(raw)));
        res.endWithoutBody();
      });
      this.done = true;
      this.#settle();
    }

    /** Drops the connection (after a write that failed half way). */
    closeConnection(): void {
      if (this.aborted || this.done) return;
      this.done = true;
      this.#settle();
      try {
        this.#res.close();
      } catch {
        // Already gone.
      }
    }

    run(): void {
      let result: Promise<OutgoingReply> | OutgoingReply;
      try {
        result = (this.decision as RouteDecision).handle(this);
      } catch (err) {
        result = Promise.reject(err);
      }
      if (result instanceof Promise) result.then((r) => this.reply(r), (err: unknown) => this.failed(err));
      else this.reply(result);
    }

    failed(err: unknown): void {
      log.error('unhandled handler failure', { err, requestId: this.id, method: this.method, path: this.path });
      this.reply(options.onEarlyError('internal', 'The server failed to handle this request.', this.id));
    }

    tooLarge(): void {
      const decision = this.decision as RouteDecision;
      // The client may still be sending: close the connection after the 413.
      const fallback = () => options.onEarlyError('payload-too-large', `The request body is larger than the ${decision.maxBodyBytes} bytes this route accepts.`, this.id);
      const hook = decision.tooLarge;
      if (!hook) {
        this.reply(fallback(), true);
        return;
      }
      Promise.resolve()
        .then(() => hook(this))
        .then((r) => this.reply(r, true), (err: unknown) => {
          log.error('too-large handler failed', { err, requestId: this.id });
          this.reply(fallback(), true);
        });
    }

    /** A 413 is on its way (refuseBody). */
    get refusing(): boolean {
      return this.#refused;
    }

    /** The declared body is over the limit: read and drop it, then answer 413 (DRAIN_MARGIN_BYTES). */
    refuseBody(): void {
      this.#refused = true;
      this.#draining = true;
    }

    /**
     * Refused from its headers (admit) with its body still to come: flashd keeps none of it.
     * With a Content-Length (within the route's limit, or the 413 came first) the reply goes
     * out now and uWS reads the rest of the body and drops it, keeping the connection for the
     * next request: a client that sends its whole body before reading gets the reply, not a
     * broken pipe. A chunked body has no end known in advance and a response once ended can no
     * longer close its connection: it is read and dropped, and the reply goes out at its last
     * chunk, or with the connection closed once it passes the route's limit.
     */
    refuseEarly(reply: OutgoingReply, chunked: boolean): void {
      this.#refused = true;
      if (chunked) {
        this.#early = reply;
        return;
      }
      this.#answered = true;
      this.reply(reply);
    }

    /** Its body's bytes no longer count in bodiesInFlight (complete, aborted or refused). */
    #release(): void {
      bodiesInFlight -= this.#held;
      this.#held = 0;
    }

    data(ab: ArrayBuffer, isLast: boolean): void {
      this.#received += ab.byteLength;
      // Answered already: uWS still hands over the rest of the body, to drop.
      if (this.#answered) return;
      const early = this.#early;
      if (early !== undefined) {
        if (isLast || this.#received > (this.decision as RouteDecision).maxBodyBytes) {
          this.#early = undefined;
          this.#answered = true;
          this.reply(early, !isLast);
        }
        return;
      }
      if (this.#refused) {
        if (this.#draining && (isLast || this.#received > (this.decision as RouteDecision).maxBodyBytes + DRAIN_MARGIN_BYTES)) {
          this.#draining = false;
          this.tooLarge();
        }
        return;
      }
      if (this.#received > (this.decision as RouteDecision).maxBodyBytes) {
        this.#refused = true;
        this.#release();
        this.#chunks = null;
        if (isLast || this.#received > (this.decision as RouteDecision).maxBodyBytes + DRAIN_MARGIN_BYTES) this.tooLarge();
        else this.#draining = true;
        return;
      }
      if (bodiesInFlight + ab.byteLength > maxInFlight) {
        this.#release();
        this.#chunks = null;
        this.#refused = true;
        this.#answered = true;
        log.warn('request body refused: too many bytes of bodies in flight', { requestId: this.id, method: this.method, path: this.path, inFlight: bodiesInFlight, limit: maxInFlight });
        const early = options.onEarlyError('unavailable', `The server is receiving more than ${maxInFlight} bytes of request bodies at once; send the request again later.`, this.id);
        this.reply({ ...early, headers: { ...early.headers, 'retry-after': BODIES_IN_FLIGHT_RETRY_S } }, true);
        return;
      }
      bodiesInFlight += ab.byteLength;
      this.#held += ab.byteLength;
      if (isLast) this.#release();
      // uWS reuses the ArrayBuffer after this callback returns: copy it (small copies come
      // from Node's shared buffer pool, not a fresh ArrayBuffer each).
      const copy = Buffer.allocUnsafe(ab.byteLength);
      copy.set(new Uint8Array(ab));
      if (isLast && this.#chunks === null) {
        this.body = copy;
        this.run();
        return;
      }
      (this.#chunks ??= []).push(copy);
      if (isLast) {
        this.body = Buffer.concat(this.#chunks, this.#received);
        this.#chunks = null;
        this.run();
      }
    }
  }

  app.any('/*', (res, uReq) => {
    const ex = new Exchange(res, uReq);
    res.onAborted(() => ex.abort());
    enter(ex);
    start(ex, res);
  });

  function start(ex: Exchange, res: HttpResponse): void {
    if (closing) {
      // A request on a kept-alive connection after close() began: the queue no longer takes work.
      ex.reply(options.onEarlyError('unavailable', 'The server is shutting down; retry against its next start.', ex.id), true);
      return;
    }
    try {
      ex.decision = options.resolve(ex.method, ex.path, ex.headers);
    } catch (err) {
      log.error('route resolution failed', { err });
      ex.reply(options.onEarlyError('internal', 'The server could not route this request.', ex.id));
      return;
    }
    // Repeated Content-Length headers arrive joined by ", ". uWS frames the body by the first;
    // different values are a framing error (RFC 9112 §6.3): the bytes after the first length
    // would be read as the next request, where a proxy that took another value sees a body.
    let lengthHeader = ex.headers['content-length'];
    if (lengthHeader !== undefined && lengthHeader.includes(',')) {
      const values = lengthHeader.split(',').map((v) => v.trim());
      if (values.some((v) => v !== values[0])) {
        ex.reply(options.onEarlyError('bad-request', `The request has Content-Length headers with different values (${values.join(', ')}).`, ex.id), true);
        return;
      }
      lengthHeader = values[0];
    }
    const declared = lengthHeader === undefined ? undefined : Number(lengthHeader);
    const te = ex.headers['transfer-encoding'];
    const chunked = te !== undefined && /chunked/i.test(te);
    if (declared !== undefined && Number.isFinite(declared) && declared > ex.decision.maxBodyBytes) {
      if (declared > ex.decision.maxBodyBytes + DRAIN_MARGIN_BYTES) {
        ex.tooLarge();
        return;
      }
      ex.refuseBody();
    }
    if (!chunked && (declared === undefined || declared === 0)) {
      ex.run();
      return;
    }
    res.onData((ab, isLast) => {
      enter(ex);
      ex.data(ab, isLast);
    });
    if (!ex.refusing && ex.decision.admit) {
      let early: OutgoingReply | undefined;
      try {
        early = ex.decision.admit(ex);
      } catch (err) {
        log.error('request admission failed', { err, requestId: ex.id });
        early = options.onEarlyError('internal', 'The server failed to handle this request.', ex.id);
      }
      if (early) ex.refuseEarly(early, chunked);
    }
  }

  return {
    listen: () =>
      new Promise((resolve, reject) => {
        // uWS sets SO_REUSEPORT by default: a second flashd on the same port would start and the
        // kernel would split connections between the two. LIBUS_LISTEN_EXCLUSIVE_PORT (1) makes
        // the second one fail. The (host, port, options, cb) form is in the binary, not the typings.
        (app as unknown as { listen(host: string, port: number, options: number, cb: (token: us_listen_socket | false) => void): void }).listen(options.host, options.port, LISTEN_EXCLUSIVE_PORT, (token) => {
          if (!token) {
            void listenFailure(options.host, options.port).then((why) => reject(new Error(`cannot listen on ${options.host}:${options.port}${why}`)));
            return;
          }
          listenSocket = token;
          resolve({ port: uws.us_socket_local_port(token) });
        });
      }),
    close: async () => {
      closing = true;
      if (listenSocket) {
        uws.us_listen_socket_close(listenSocket);
        listenSocket = null;
      }
      // Requests already received get their answers first (the queue has just answered its
      // parked polls and waiting /runsync calls); a connection still busy after the grace is cut.
      if (open > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, CLOSE_GRACE_MS);
          whenIdle = () => {
            clearTimeout(timer);
            // Not from inside a uWS callback: the last reply may still sit in the socket's cork
            // buffer, flushed when that callback returns; app.close() now would drop it.
            setImmediate(resolve);
          };
        });
      }
      // close() exists on the v20.30 binary but not in its typings.
      (app as unknown as { close(): void }).close();
    },
  };
}
