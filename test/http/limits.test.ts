/**
 * The request limits of the bundled uWS v20.30 (with flashd's patched 128 KiB split-header limit),
 * pinned at their exact values as README "HTTP limits" documents them. uWS applies them before
 * flashd sees a request, and answers none of them: no hook exists to send a 431 or 400, so the
 * client gets a closed connection or no reply. If a uWS upgrade changes any of them, this test
 * fails and the README table must change with it.
 */
import t from 'tap';
import { connect } from 'node:net';
import { createHttpServer } from '../../src/http/index.js';
import { createLogger } from '../../src/core/logger.js';
import { UWS_ADDON } from '../../src/core/native.js';

const log = createLogger({ level: 'error', sink: { write: () => undefined } });
// The 128 KiB value comes from the patch, which exists for this build only.
const skipPatched = UWS_ADDON === 'uws_linux_x64_115.node' ? false : `no uWS patch for ${UWS_ADDON}`;

interface Outcome {
  /** The status line, '' when nothing came back. */
  status: string;
  /** Whether the server closed the connection within `waitMs`. */
  closed: boolean;
}

/** Sends `parts` (50 ms apart, so each is its own read) and reports what came back within `waitMs`. */
function exchange(port: number, parts: string[], waitMs = 1000): Promise<Outcome> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.setNoDelay(true);
    let got = '';
    let closed = false;
    const timer = setTimeout(() => {
      s.destroy();
      resolve({ status: got.split('\r\n')[0] as string, closed });
    }, waitMs);
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', () => {
      closed = true;
      clearTimeout(timer);
      resolve({ status: got.split('\r\n')[0] as string, closed });
    });
    s.on('connect', async () => {
      for (let i = 0; i < parts.length; i++) {
        if (i) await new Promise((r) => setTimeout(r, 50));
        if (!s.destroyed) s.write(parts[i] as string);
      }
    });
  });
}

/** A GET whose header block (request line to blank line) is `lines` header lines, Host and Connection included. */
function withLines(lines: number): string {
  const extra = Array.from({ length: lines - 2 }, (_, i) => `X-H${i}: v\r\n`).join('');
  return `GET /x HTTP/1.1\r\nHost: x\r\n${extra}Connection: close\r\n\r\n`;
}

/** A GET whose whole header block is exactly `bytes` long, padded in a Cookie header (or the URL). */
function ofSize(bytes: number, where: 'cookie' | 'url'): string {
  const base = (pad: string) => where === 'cookie'
    ? `GET /x HTTP/1.1\r\nHost: x\r\nCookie: a=${pad}\r\nConnection: close\r\n\r\n`
    : `GET /x?q=${pad} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`;
  const head = base('a'.repeat(bytes - base('').length));
  if (head.length !== bytes) throw new Error('size');
  return head;
}

t.test('uWS request limits, at their exact thresholds', async (t) => {
  const server = createHttpServer({
    host: '127.0.0.1', port: 0, log,
    resolve: () => ({ maxBodyBytes: 1024, handle: () => ({ status: 200, body: 'ok' }) }),
    onEarlyError: () => ({ status: 500 }),
  });
  const { port } = await server.listen();
  t.teardown(() => server.close());
  const answered = { status: 'HTTP/1.1 200 OK', closed: true };

  t.test('header lines: 48 answered; 49 get no reply and the connection is held (closed after the idle timeout)', async (t) => {
    t.same(await exchange(port, [withLines(48)]), answered);
    t.same(await exchange(port, [withLines(49)]), { status: '', closed: false });
    t.same(await exchange(port, [withLines(60)]), { status: '', closed: false });
  });

  t.test('header block split across reads: 131,072 bytes answered; 131,073 closed with no reply', { skip: skipPatched }, async (t) => {
    for (const where of ['cookie', 'url'] as const) {
      const ok = ofSize(131_072, where);
      const over = ofSize(131_073, where);
      t.same(await exchange(port, [ok.slice(0, 100), ok.slice(100)]), answered, `${where}: 131,072`);
      t.same(await exchange(port, [over.slice(0, 100), over.slice(100)]), { status: '', closed: true }, `${where}: 131,073`);
    }
  });

  t.test('a 10 KB Cookie or Authorization header is answered, in one read or split', { skip: skipPatched }, async (t) => {
    for (const h of [`Cookie: s=${'c'.repeat(10_240)}`, `Authorization: Bearer ${'k'.repeat(10_240)}`]) {
      const head = `GET /x HTTP/1.1\r\nHost: x\r\n${h}\r\nConnection: close\r\n\r\n`;
      t.same(await exchange(port, [head]), answered, `${h.slice(0, 13)} in one read`);
      t.same(await exchange(port, [head.slice(0, 1448), head.slice(1448)]), answered, `${h.slice(0, 13)} cut at one MSS`);
    }
  });

  t.test('requests the parser refuses: closed at once, or no reply', async (t) => {
    const refusedAtOnce = { status: '', closed: true };
    const noReply = { status: '', closed: false };
    t.same(await exchange(port, ['FOO /x HTTP/1.1\r\nHost: x\r\n\r\n']), refusedAtOnce, 'unknown method');
    t.same(await exchange(port, ['get /x HTTP/1.1\r\nHost: x\r\n\r\n']), refusedAtOnce, 'lower-case method');
    t.same(await exchange(port, ['POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}']), refusedAtOnce, 'Content-Length not a number');
    t.same(await exchange(port, ['POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n']), refusedAtOnce, 'Content-Length and chunked');
    t.same(await exchange(port, ['POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n']), refusedAtOnce, 'bad chunk size');
    t.same(await exchange(port, ['GET /x HTTP/1.0\r\nHost: x\r\n\r\n']), noReply, 'HTTP/1.0');
    t.same(await exchange(port, ['GET /x HTTP/1.1\r\n\r\n']), noReply, 'no Host header');
    t.same(await exchange(port, ['GET /x HTTP/1.1\nHost: x\n\n']), noReply, 'bare LF line ends');
    t.same(await exchange(port, ['\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03']), noReply, 'a TLS ClientHello');
  });
});

t.test('pipelining: a request that arrives while the one before it awaits its reply closes the connection, unanswered', async (t) => {
  // uWS answers pipelined requests only when each is answered inside its own callback (flashd's
  // /healthz, a 404 or 405, /health); one answered later (a /run waits for its commit) has the
  // connection closed under it when the next request arrives, and neither gets a reply. The
  // request already read still runs: a pipelined /run queues its job unacknowledged.
  const handled: string[] = [];
  const server = createHttpServer({
    host: '127.0.0.1', port: 0, log,
    resolve: (_m, path) => ({
      maxBodyBytes: 1024,
      handle: path === '/sync'
        ? () => ({ status: 200, body: 'ok' })
        : async () => {
          handled.push(path);
          await new Promise((r) => setTimeout(r, 20));
          return { status: 200, body: 'ok' };
        },
    }),
    onEarlyError: () => ({ status: 500 }),
  });
  const { port } = await server.listen();
  t.teardown(() => server.close());
  const post = (path: string) => `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}`;
  const get = (path: string) => `GET ${path} HTTP/1.1\r\nHost: x\r\n\r\n`;
  t.same(await exchange(port, [post('/async') + get('/sync')]), { status: '', closed: true }, 'an async POST then a GET in one write: closed, no reply');
  t.same(handled, ['/async'], 'the first request still ran');
  t.same(await exchange(port, [get('/async') + get('/async')]), { status: '', closed: true }, 'two async GETs: the same');
  t.same(await exchange(port, [get('/sync') + get('/sync') + get('/sync')], 300), { status: 'HTTP/1.1 200 OK', closed: false }, 'requests answered in their own callback: answered, the connection kept');
  t.same(await exchange(port, [post('/async'), post('/async')]), { status: 'HTTP/1.1 200 OK', closed: false }, 'the same requests sent one after the other\'s reply: answered');
});
