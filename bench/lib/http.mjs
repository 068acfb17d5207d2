/**
 * A minimal HTTP/1.1 keep-alive client over one TCP connection, one request in flight at a
 * time (no pipelining). The load generator and the simulated workers share one core, so the
 * client must cost less than node:http or undici per request: requests are written as one
 * pre-rendered string and responses are parsed with a few byte searches. It speaks plain
 * HTTP/1.1 (Content-Length or chunked bodies) and nothing else; loopback only.
 */
import net from 'node:net';

const CRLF2 = Buffer.from('\r\n\r\n');

export class HttpError extends Error {
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}

export class Conn {
  /**
   * @param {string} host
   * @param {number} port
   */
  constructor(host, port) {
    this.host = host;
    this.port = port;
    this.socket = null;
    this.buf = null;
    this.pending = null;
    this.closed = true;
    this.timer = null;
  }

  /** Connects (or reconnects); resolves when the socket is open. */
  connect(timeoutMs = 5000) {
    return new Promise((resolve, reject) => {
      const s = net.connect({ host: this.host, port: this.port });
      s.setNoDelay(true);
      const t = setTimeout(() => {
        s.destroy();
        reject(new HttpError(`connect timeout ${this.host}:${this.port}`, 'ETIMEDOUT'));
      }, timeoutMs);
      s.once('connect', () => {
        clearTimeout(t);
        this.socket = s;
        this.closed = false;
        this.buf = null;
        s.on('data', (chunk) => this.#onData(chunk));
        s.on('close', () => this.#onClose(new HttpError('connection closed', 'ECONNRESET')));
        s.on('error', (err) => this.#onClose(new HttpError(err.message, err.code ?? 'ECONNRESET')));
        resolve(this);
      });
      s.once('error', (err) => {
        clearTimeout(t);
        reject(new HttpError(err.message, err.code ?? 'ECONNREFUSED'));
      });
    });
  }

  /**
   * Sends one request. `head` is the request line and headers without the final blank line
   * and without Content-Length (added here). Resolves {status, body: Buffer}.
   * @param {string} head e.g. "POST /v2/x/run HTTP/1.1\r\nHost: h\r\nAuthorization: k"
   * @param {string|undefined} body
   * @param {number} [timeoutMs] 0 = none
   */
  request(head, body, timeoutMs = 0) {
    if (this.closed) return Promise.reject(new HttpError('not connected', 'ENOTCONN'));
    if (this.pending) return Promise.reject(new Error('request already in flight on this connection'));
    return new Promise((resolve, reject) => {
      this.pending = { resolve, reject };
      if (timeoutMs > 0) {
        this.timer = setTimeout(() => {
          this.timer = null;
          this.close();
          this.#fail(new HttpError(`request timeout after ${timeoutMs} ms`, 'ETIMEDOUT'));
        }, timeoutMs);
      }
      if (body === undefined) this.socket.write(`${head}\r\n\r\n`);
      else this.socket.write(`${head}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
  }

  close() {
    if (this.socket) this.socket.destroy();
    this.closed = true;
  }

  #fail(err) {
    const p = this.pending;
    this.pending = null;
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    if (p) p.reject(err);
  }

  #onClose(err) {
    this.closed = true;
    this.buf = null;
    this.#fail(err);
  }

  #onData(chunk) {
    this.buf = this.buf === null ? chunk : Buffer.concat([this.buf, chunk]);
    for (;;) {
      const buf = this.buf;
      if (buf === null) return;
      const end = buf.indexOf(CRLF2);
      if (end < 0) return;
      const headText = buf.toString('latin1', 0, end);
      const status = (buf[9] - 48) * 100 + (buf[10] - 48) * 10 + (buf[11] - 48);
      const bodyStart = end + 4;
      let body;
      let consumed;
      const cl = /\r\ncontent-length:\s*(\d+)/i.exec(headText);
      if (cl) {
        const len = Number(cl[1]);
        if (buf.length < bodyStart + len) return;
        body = buf.subarray(bodyStart, bodyStart + len);
        consumed = bodyStart + len;
      } else if (/\r\ntransfer-encoding:\s*chunked/i.test(headText)) {
        const parts = [];
        let at = bodyStart;
        for (;;) {
          const lineEnd = buf.indexOf('\r\n', at);
          if (lineEnd < 0) return;
          const size = parseInt(buf.toString('latin1', at, lineEnd), 16);
          if (buf.length < lineEnd + 2 + size + 2) return;
          if (size === 0) {
            at = lineEnd + 4;
            break;
          }
          parts.push(buf.subarray(lineEnd + 2, lineEnd + 2 + size));
          at = lineEnd + 2 + size + 2;
        }
        body = Buffer.concat(parts);
        consumed = at;
      } else {
        body = buf.subarray(bodyStart, bodyStart);
        consumed = bodyStart;
      }
      this.buf = consumed === buf.length ? null : buf.subarray(consumed);
      const p = this.pending;
      this.pending = null;
      if (this.timer) {
        clearTimeout(this.timer);
        this.timer = null;
      }
      if (p) p.resolve({ status, body });
      if (/\r\nconnection:\s*close/i.test(headText)) this.close();
    }
  }
}

/** Renders the head of a request (no trailing blank line). */
export function head(method, path, host, auth, json = false) {
  let h = `${method} ${path} HTTP/1.1\r\nHost: ${host}`;
  if (auth) h += `\r\nAuthorization: ${auth}`;
  if (json) h += '\r\nContent-Type: application/json';
  return h;
}

/** One-off JSON request on a fresh connection (setup calls). */
export async function call(base, method, path, auth, body, timeoutMs = 30_000) {
  const u = new URL(base);
  const c = new Conn(u.hostname, Number(u.port));
  await c.connect();
  try {
    const r = await c.request(head(method, path, u.host, auth, body !== undefined), body === undefined ? undefined : JSON.stringify(body), timeoutMs);
    const text = r.body.toString('utf8');
    let parsed;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = text;
    }
    return { status: r.status, body: parsed };
  } finally {
    c.close();
  }
}
