/**
 * HttpServer.close(): the listener goes at once, requests already received are answered
 * before the connections close (up to a grace), and a request that arrives on a kept-alive
 * connection meanwhile gets a 503 problem and the connection closes.
 */
import t from 'tap';
import { connect, type Socket } from 'node:net';
import { createHttpServer } from '../../src/http/index.js';
import { createLogger } from '../../src/core/logger.js';

const log = createLogger({ level: 'error', sink: { write: () => undefined } });

/** Sends one request on `socket` and reads one whole reply (Content-Length bodies only). */
function exchange(socket: Socket, path: string): Promise<{ head: string; body: string }> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const onData = (d: Buffer) => {
      buf += d.toString();
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const head = buf.slice(0, end);
      const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
      if (buf.length < end + 4 + length) return;
      socket.off('data', onData);
      resolve({ head, body: buf.slice(end + 4, end + 4 + length) });
    };
    socket.on('data', onData);
    socket.once('error', reject);
    socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\n\r\n`);
  });
}

t.test('close answers what it has received, refuses new requests with 503, then closes', async (t) => {
  let release: () => void = () => undefined;
  const held = new Promise<void>((resolve) => (release = resolve));
  const server = createHttpServer({
    host: '127.0.0.1', port: 0, log,
    resolve: (_method, path) => ({
      maxBodyBytes: 1024,
      handle: async () => {
        if (path === '/slow') await held;
        return { status: 200, headers: { 'content-type': 'text/plain' }, body: `done ${path}` };
      },
    }),
    onEarlyError: (kind, detail) => ({ status: kind === 'unavailable' ? 503 : 500, headers: { 'content-type': 'application/problem+json' }, body: JSON.stringify({ title: kind, status: 503, detail }) }),
  });
  const { port } = await server.listen();
  const open = () => new Promise<Socket>((resolve) => { const s = connect(port, '127.0.0.1', () => resolve(s)); });
  const idle = await open();
  t.match((await exchange(idle, '/fast')).body, 'done /fast', 'a kept-alive connection, idle now');
  const busy = await open();
  const slow = exchange(busy, '/slow');
  await new Promise((resolve) => setTimeout(resolve, 50));
  let closed = false;
  const closing = server.close().then(() => (closed = true));
  await new Promise((resolve) => setTimeout(resolve, 50));
  t.equal(closed, false, 'close waits for the request in flight');
  const refused = await exchange(idle, '/late');
  t.match(refused.head, /^HTTP\/1\.1 503/);
  t.match(refused.head, /connection: close/i);
  t.match(JSON.parse(refused.body), { status: 503, detail: /shutting down/ });
  const idleEnded = new Promise((resolve) => idle.once('close', resolve));
  await idleEnded;
  t.pass('the refused connection is closed');
  release();
  const r = await slow;
  t.match(r.head, /^HTTP\/1\.1 200/);
  t.equal(r.body, 'done /slow', 'the request in flight is answered');
  await closing;
  t.ok(closed);
  busy.destroy();
  const err = await new Promise((resolve) => { const s = connect(port, '127.0.0.1'); s.once('error', resolve); s.once('connect', () => resolve(null)); });
  t.match(err, { code: 'ECONNREFUSED' }, 'no longer listening');
});
