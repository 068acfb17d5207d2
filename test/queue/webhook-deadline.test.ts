/**
 * A webhook try has a deadline as a whole, not only between bytes: a receiver that keeps the
 * connection busy (a header dripped byte by byte, a body read a byte at a time) does not hold
 * a try, and with it the delivery and its outbox row, for ever.
 */
import t from 'tap';
import { createServer, type Socket } from 'node:net';
import { WebhookSender, webhookUrlForLog } from '../../src/queue/webhook.js';
import { createLogger } from '../../src/core/logger.js';
import { until } from '../helpers/wait.js';

/** A TCP receiver that answers every connection with `drip` called once a tick. */
async function tarpit(t: { teardown(fn: () => void): void }, drip: (s: Socket) => void) {
  const connections: number[] = [];
  const sockets = new Set<Socket>();
  const server = createServer((s) => {
    connections.push(Date.now());
    sockets.add(s);
    s.on('error', () => undefined);
    const timer = setInterval(() => drip(s), 100);
    s.on('close', () => {
      clearInterval(timer);
      sockets.delete(s);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    for (const s of sockets) s.destroy();
    server.close();
  });
  return { connections, sockets, url: `http://127.0.0.1:${(server.address() as { port: number }).port}/hook` };
}

/** Each job's body, read again by every try. */
const bodies = new Map<string, string>();

const sender = (settled: string[], lines: string[]) => new WebhookSender({
  allowPrivate: true, retryDelayMs: 50, attempts: 2, timeoutMs: 1000, deadlineMs: 1500, maxInFlight: 64, maxInFlightPerHost: 32,
  log: createLogger({ level: 'warn', sink: { write: (line) => lines.push(line) } }),
  bodyOf: (jobId) => bodies.get(jobId),
  onSettled: (jobId) => settled.push(jobId),
});

t.test('a receiver dripping its answer gets a new try after the deadline, and the delivery ends', async (t) => {
  const msg = 'HTTP/1.1 200 OK\r\nX-Slow: ' + 'a'.repeat(10_000);
  const pit = await tarpit(t, (s) => {
    const i = (s as Socket & { at?: number }).at ?? 0;
    (s as Socket & { at?: number }).at = i + 1;
    s.write(msg[i % msg.length] as string);
  });
  const settled: string[] = [];
  const lines: string[] = [];
  const w = sender(settled, lines);
  t.teardown(() => w.close());
  bodies.set('j1', '{"id":"j1","status":"COMPLETED"}');
  w.send(pit.url, 'j1');
  await until('the delivery to end', async () => settled.length === 1, 8000);
  t.equal(pit.connections.length, 2, 'two tries');
  t.ok(pit.connections[1]! - pit.connections[0]! < 2500, 'the second try came after the deadline, not never');
  t.match(lines.join('\n'), /webhook gave up.*deadline/, 'the reason is logged');
});

t.test('a receiver reading the body a byte at a time gets a new try after the deadline', async (t) => {
  // It reads nothing and never answers, but keeps the connection alive with a byte now and then.
  const pit = await tarpit(t, (s) => {
    s.pause();
    s.write('');
  });
  const settled: string[] = [];
  const lines: string[] = [];
  const w = sender(settled, lines);
  t.teardown(() => w.close());
  // Far more than the socket buffers hold: the write is pending until the receiver reads.
  bodies.set('j2', JSON.stringify({ id: 'j2', output: 'x'.repeat(64 << 20) }));
  w.send(pit.url, 'j2');
  // Read a little now and then: progress on the socket, so the idle timeout never fires.
  const reader = setInterval(() => {
    for (const s of pit.sockets) {
      s.resume();
      setTimeout(() => s.pause(), 5);
    }
  }, 300);
  t.teardown(() => clearInterval(reader));
  await until('the delivery to end', async () => settled.length === 1, 8000);
  t.equal(pit.connections.length, 2, 'two tries');
});

t.test('an answer whose body never ends settles the delivery and is cut at the deadline', async (t) => {
  let closed = 0;
  const pit = await tarpit(t, (s) => {
    const started = (s as Socket & { started?: boolean }).started;
    if (!started) {
      (s as Socket & { started?: boolean }).started = true;
      s.on('close', () => closed++);
      s.write('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n');
    }
    s.write('1\r\na\r\n');
  });
  const settled: string[] = [];
  const w = sender(settled, []);
  t.teardown(() => w.close());
  bodies.set('j3', '{}');
  w.send(pit.url, 'j3');
  await until('settled on the 200', async () => settled.length === 1, 2000);
  await until('the endless answer to be cut', async () => closed === 1, 4000);
  t.equal(pit.connections.length, 1, 'one try: it was a 2xx');
});

t.test('each failed try is logged with the destination, never its query or userinfo', async (t) => {
  const { createServer: createHttpServer } = await import('node:http');
  const server = createHttpServer((_req, res) => {
    res.statusCode = 500;
    res.end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  const port = (server.address() as { port: number }).port;
  const settled: string[] = [];
  const lines: string[] = [];
  const w = new WebhookSender({
    allowPrivate: true, retryDelayMs: 50, attempts: 3, timeoutMs: 1000, deadlineMs: 1500, maxInFlight: 64, maxInFlightPerHost: 32,
    log: createLogger({ level: 'info', sink: { write: (line) => lines.push(line) } }),
    bodyOf: (jobId) => bodies.get(jobId),
    onSettled: (jobId) => settled.push(jobId),
  });
  t.teardown(() => w.close());
  bodies.set('j5', '{"id":"j5","status":"COMPLETED"}');
  w.send(`http://user:pw@127.0.0.1:${port}/hooks/done?token=s3cret`, 'j5');
  await until('the delivery to end', async () => settled.length === 1, 8000);
  const text = lines.join('\n');
  t.notMatch(text, /s3cret|token|user|pw@|hooks\/done/, 'no path, query or userinfo in the log');
  const dest = webhookUrlForLog(`http://127.0.0.1:${port}/hooks/done?token=s3cret`);
  t.match(dest, new RegExp(`^http://127\\.0\\.0\\.1:${port}/\\(hidden:[0-9a-f]{8}\\)$`));
  const tries = lines.filter((l) => l.includes('webhook try failed'));
  t.equal(tries.length, 2, 'one line per try that is retried');
  t.ok(tries[0]!.includes(`url=${dest} `), `names the destination: ${tries[0]}`);
  t.match(tries[0]!, /attempt=1 attempts=3 retryInMs=50 reason="status 500"/);
  t.match(tries[1]!, /attempt=2 attempts=3/);
  const gave = lines.filter((l) => l.includes('webhook gave up'));
  t.equal(gave.length, 1);
  t.ok(gave[0]!.includes(`url=${dest} `), `names the destination: ${gave[0]}`);
});
