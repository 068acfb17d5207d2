/**
 * Request bodies being received are bounded together, not only each by its route's limit:
 * uploads cut off near their end (2,000 /runsync bodies of 20 MiB) held gigabytes. The chunk
 * that passes the cap gets a 503 with Retry-After and its connection closed; bodies that
 * complete or abort stop counting, so the server takes bodies again once they are gone.
 */
import t from 'tap';
import { connect, type Socket } from 'node:net';
import { createHttpServer } from '../../src/http/index.js';
import { createLogger } from '../../src/core/logger.js';

const log = createLogger({ level: 'error', sink: { write: () => undefined } });
const KiB = 1024;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

t.test('past the cap on bodies in flight a body gets 503 with Retry-After; once the others abort a body is taken again', async (t) => {
  const server = createHttpServer({
    host: '127.0.0.1', port: 0, log, maxBodyBytesInFlight: 4096 * KiB,
    resolve: (_method, path) => ({ maxBodyBytes: (path === '/small' ? 2 : 10) * 1024 * KiB, handle: (req) => ({ status: 200, headers: { 'content-type': 'text/plain' }, body: `got ${req.body.length}` }) }),
    onEarlyError: (kind, detail) => ({ status: kind === 'unavailable' ? 503 : 500, headers: { 'content-type': 'application/problem+json' }, body: JSON.stringify({ title: kind, status: 503, detail }) }),
  });
  const { port } = await server.listen();
  t.teardown(() => server.close());
  const sockets: Socket[] = [];
  const replies: string[] = [];
  /** Declares 8 MiB and sends `bytes` of it, then waits. */
  const partial = async (bytes: number): Promise<number> => {
    const s = await new Promise<Socket>((resolve) => { const c = connect(port, '127.0.0.1', () => resolve(c)); });
    const i = sockets.push(s) - 1;
    replies[i] = '';
    s.on('data', (d) => (replies[i] += d.toString()));
    s.on('error', () => undefined);
    s.write(`POST /up HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${8 * 1024 * KiB}\r\n\r\n`);
    s.write(Buffer.alloc(bytes, 'a'));
    await sleep(150);
    return i;
  };
  for (let n = 0; n < 4; n++) await partial(900 * KiB);
  t.ok(replies.every((r) => r === ''), 'four partial bodies within the cap wait for their rest');
  const over = await partial(900 * KiB);
  t.match(replies[over], /^HTTP\/1\.1 503/, 'the body that passes the cap gets 503');
  t.match(replies[over], /retry-after: 5/i);
  t.match(replies[over], /connection: close/i);
  t.match(replies[over], /receiving more than 4194304 bytes of request bodies at once/);
  for (const s of sockets) s.destroy();
  await sleep(150);
  const ok = await fetch(`http://127.0.0.1:${port}/up`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: 'b'.repeat(3 * 1024 * KiB) });
  t.equal(ok.status, 200, 'after they aborted, a body near the cap is taken');
  t.equal(await ok.text(), `got ${3 * 1024 * KiB}`);
  const again = await fetch(`http://127.0.0.1:${port}/up`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: 'c'.repeat(3 * 1024 * KiB) });
  t.equal(again.status, 200, 'and a completed body no longer counts');
  const chunked = async function* () {
    for (let n = 0; n < 12; n++) yield Buffer.alloc(256 * KiB, 'd');
  };
  const tooLarge = await fetch(`http://127.0.0.1:${port}/small`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chunked(), duplex: 'half' } as unknown as RequestInit).catch(() => undefined);
  t.not(tooLarge?.status, 200, 'a chunked body over the route limit (2 MiB) is refused (413, or the connection closed under the upload)');
  await sleep(150);
  const after = await fetch(`http://127.0.0.1:${port}/up`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: 'e'.repeat(3 * 1024 * KiB) });
  t.equal(after.status, 200, 'and what it held no longer counts');
});
