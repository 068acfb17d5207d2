/**
 * A request flashd will refuse from its headers (no or a bad key, a key without the scope, a
 * worker key on a user route or of another worker, an endpoint that is not the caller's) is
 * answered before its body is read, and the body is dropped as it comes, never kept: otherwise
 * anyone who can reach the port makes flashd hold up to 10 / 20 / 64 MiB per connection.
 */
import t, { type Test } from 'tap';
import { connect, type Socket } from 'node:net';
import { ADMIN_KEY, assertProblem, cpuBody, startAgent, type Reply } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { POLL_ERROR_HOLD_MS } from '../../src/api/worker.js';

const MB = 1024 * 1024;

/** A raw HTTP/1.1 client on one connection: replies parsed by Content-Length, in order. */
class Conn {
  readonly socket: Socket;
  #buf = Buffer.alloc(0);
  #waiters: (() => void)[] = [];
  closed = false;

  constructor(url: string) {
    const u = new URL(url);
    this.socket = connect(Number(u.port), u.hostname);
    this.socket.on('data', (d: Buffer) => {
      this.#buf = Buffer.concat([this.#buf, d]);
      for (const w of this.#waiters.splice(0)) w();
    });
    this.socket.on('error', () => undefined);
    this.socket.on('close', () => {
      this.closed = true;
      for (const w of this.#waiters.splice(0)) w();
    });
  }

  send(method: string, path: string, headers: Record<string, string>, body: Buffer | string = ''): Promise<void> {
    const head = `${method} ${path} HTTP/1.1\r\nHost: x\r\n${Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`;
    return new Promise((resolve) => this.socket.write(Buffer.concat([Buffer.from(head), Buffer.from(body)]), () => resolve()));
  }

  /** The next complete reply, or null when none comes within `ms` (or the connection closed first). */
  async reply(ms = 10_000): Promise<Reply | null> {
    const deadline = Date.now() + ms;
    for (;;) {
      const end = this.#buf.indexOf('\r\n\r\n');
      if (end >= 0) {
        const head = this.#buf.subarray(0, end).toString();
        const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (this.#buf.length >= end + 4 + length) {
          const text = this.#buf.subarray(end + 4, end + 4 + length).toString();
          this.#buf = this.#buf.subarray(end + 4 + length);
          const headers = new Headers();
          for (const line of head.split('\r\n').slice(1)) {
            const i = line.indexOf(':');
            headers.append(line.slice(0, i), line.slice(i + 1).trim());
          }
          let json: unknown;
          try {
            json = JSON.parse(text);
          } catch {
            json = undefined;
          }
          return { status: Number(head.split(' ')[1]), headers, text, json };
        }
      }
      const left = deadline - Date.now();
      if (this.closed || left <= 0) return null;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.#waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }
}

async function setup(t: Test) {
  const a = await startAgent(t, { maxBodyBytes: 4096 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const other = (await a.req('POST', '/v2/serverless', { body: cpuBody({ name: 'other', workers: { min: 0, max: 0 } }) })).json.id as string;
  const worker = await TestWorker.create(a, ep);
  const otherWorker = await TestWorker.create(a, other);
  const reader = (await a.req('POST', '/v2/api-keys', { body: { name: 'dashboard', scopes: ['jobs:read'] } })).json.key as string;
  return { a, ep, worker, otherWorker, reader };
}

t.test('a request refused from its headers is answered before its body is sent', async (t) => {
  const { a, ep, worker, otherWorker, reader } = await setup(t);
  const json = { 'content-type': 'application/json' };
  const cases: [string, string, string, Record<string, string>, number, number][] = [
    ['/run without a key', 'POST', `/v2/${ep}/run`, json, 10 * MB - 1, 401],
    ['/runsync with an unknown key', 'POST', `/v2/${ep}/runsync`, { ...json, authorization: 'Bearer not-a-key-at-all' }, 20 * MB - 1, 401],
    ['/run with a jobs:read key', 'POST', `/v2/${ep}/run`, { ...json, authorization: reader }, 10 * MB - 1, 403],
    ['/run with a worker key', 'POST', `/v2/${ep}/run`, { ...json, authorization: worker.key }, 10 * MB - 1, 403],
    ['/run for an endpoint that does not exist', 'POST', '/v2/nosuchendpoint1/run', { ...json, authorization: ADMIN_KEY }, 10 * MB - 1, 404],
    ['job-done without a key', 'POST', `/v2/${ep}/job-done/${worker.workerId}/job1`, {}, 64 * MB - 1, 401],
    ['job-done with a user key', 'POST', `/v2/${ep}/job-done/${worker.workerId}/job1`, { authorization: reader }, 64 * MB - 1, 403],
    ['job-done with another endpoint\'s worker key', 'POST', `/v2/${ep}/job-done/${worker.workerId}/job1`, { authorization: otherWorker.key }, 64 * MB - 1, 403],
    ['job-stream as another worker', 'POST', `/v2/${ep}/job-stream/someone-else/job1`, { authorization: worker.key }, 64 * MB - 1, 403],
    ['a management POST without a key', 'POST', '/v2/serverless', json, 4000, 401],
    ['a management PATCH with a jobs:read key', 'PATCH', `/v2/serverless/${ep}`, { ...json, authorization: reader }, 4000, 403],
  ];
  for (const [label, method, path, headers, length, status] of cases) {
    const c = new Conn(a.url);
    // The headers and the first bytes of a body that is never finished.
    await c.send(method, path, { ...headers, 'content-length': String(length) }, '{"input": "' + 'a'.repeat(1000));
    const r = await c.reply();
    t.ok(r, `${label}: answered with most of the body still to come`);
    if (r) assertProblem(t, r, status, `${label}: ${status}`);
    c.socket.destroy();
  }
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 0, 'nothing was queued');
});

t.test('a client that sends its whole body before reading gets the refusal, and the connection goes on', async (t) => {
  const { a, ep } = await setup(t);
  const c = new Conn(a.url);
  const body = Buffer.from(JSON.stringify({ input: { text: 'a'.repeat(MB) } }));
  await c.send('POST', `/v2/${ep}/run`, { 'content-type': 'application/json', 'content-length': String(body.length) }, body);
  const r = await c.reply();
  t.ok(r, 'a reply');
  if (r) assertProblem(t, r, 401);
  // The body was read and dropped by its Content-Length: the next request on the connection is answered.
  await c.send('GET', '/healthz', {});
  const next = await c.reply();
  t.equal(next?.status, 200, 'the next request on the same connection is answered');
  c.socket.destroy();

  // Chunked: the end is not known in advance, so the refusal comes at the last chunk, or with
  // the connection closed once the body passes the route's limit.
  const chunked = new Conn(a.url);
  await chunked.send('POST', '/v2/serverless', { 'content-type': 'application/json', 'transfer-encoding': 'chunked' }, ['{"name": "xxxxx', '"}', ''].map((p) => `${p.length.toString(16)}\r\n${p}\r\n`).join(''));
  const small = await chunked.reply();
  t.ok(small, 'a chunked body: a reply at its end');
  if (small) assertProblem(t, small, 401);
  await chunked.send('GET', '/healthz', {});
  t.equal((await chunked.reply())?.status, 200, 'and the connection goes on');
  chunked.socket.destroy();
  const long = new Conn(a.url);
  const piece = 'a'.repeat(1000);
  await long.send('POST', '/v2/serverless', { 'content-type': 'application/json', 'transfer-encoding': 'chunked' }, `${(1000).toString(16)}\r\n${piece}\r\n`.repeat(5));
  const over = await long.reply();
  t.ok(over, 'a chunked body past the limit: a reply before its end');
  if (over) assertProblem(t, over, 401);
  t.equal(over?.headers.get('connection'), 'close', 'and the connection closes');
  long.socket.destroy();
});

t.test('bodies of refused requests are not kept in memory', async (t) => {
  const { a, ep } = await setup(t);
  const length = 10 * MB;
  const chunk = Buffer.alloc(256 * 1024, 'a');
  const conns: Conn[] = [];
  const before = process.memoryUsage().arrayBuffers;
  let peak = before;
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().arrayBuffers)), 5);
  // Eight uploads of all but the last byte of a 10 MiB body: buffered, that is 80 MiB in this process.
  await Promise.all(Array.from({ length: 8 }, async () => {
    const c = new Conn(a.url);
    conns.push(c);
    await c.send('POST', `/v2/${ep}/run`, { 'content-type': 'application/json', 'content-length': String(length) });
    for (let sent = 0; sent < length - 1;) {
      const n = Math.min(chunk.length, length - 1 - sent);
      sent += n;
      await new Promise<void>((resolve) => c.socket.write(chunk.subarray(0, n), () => resolve()));
    }
  }));
  // Whatever the kernel still held has reached flashd once a request behind it is answered.
  const probe = await a.req('GET', '/healthz', { key: null });
  t.equal(probe.status, 200);
  await new Promise((resolve) => setTimeout(resolve, 500));
  clearInterval(sampler);
  const grew = peak - before;
  t.ok(grew < length, `array buffers grew by ${(grew / MB).toFixed(1)} MiB, less than one body (${length / MB} MiB) for eight of them`);
  for (const c of conns) c.socket.destroy();
});

t.test('a job-take refused keeps its error wait even when it has a body', async (t) => {
  const { a } = await setup(t);
  const gone = (await a.req('POST', '/v2/serverless', { body: cpuBody({ name: 'gone', workers: { min: 0, max: 0 } }) })).json.id as string;
  const worker = await TestWorker.create(a, gone);
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204, 'its endpoint is deleted');
  // runpod-python re-polls at once after an error: answered at once, a worker would spin.
  for (const body of ['', '{}']) {
    const c = new Conn(a.url);
    const started = performance.now();
    await c.send('GET', `/v2/${gone}/job-take/${worker.workerId}`, { authorization: worker.key, 'content-length': String(body.length) }, body);
    const r = await c.reply();
    const waited = performance.now() - started;
    t.ok(r && r.status >= 400, `with ${body ? 'a' : 'no'} body: refused (${r?.status})`);
    t.ok(waited >= POLL_ERROR_HOLD_MS - 50, `with ${body ? 'a' : 'no'} body: after the ${POLL_ERROR_HOLD_MS} ms wait (${Math.round(waited)} ms)`);
    c.socket.destroy();
  }
});
