import t from 'tap';
import { createServer } from 'node:http';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startAgent, assertProblem, cpuBody, ADMIN_KEY, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { POLL_ERROR_HOLD_MS } from '../../src/api/worker.js';
import { DRAIN_POLL_HOLD_MS } from '../../src/queue/job-queue.js';
import { isPrivateAddress } from '../../src/queue/webhook.js';
import { ManualClock } from '../../src/core/clock.js';

async function endpoint(a: TestAgent, extra: Record<string, unknown> = {}): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 }, ...extra }) });
  if (r.status !== 201) throw new Error(r.text);
  return r.json.id as string;
}

const run = (a: TestAgent, ep: string, body: unknown = { input: { n: 1 } }) => a.req('POST', `/v2/${ep}/run`, { body });

t.test('run → take → progress → done → status, with RunPod shapes', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const r = await run(a, ep, { input: { prompt: 'hi' } });
  t.equal(r.status, 200);
  t.same(Object.keys(r.json).sort(), ['id', 'status']);
  t.equal(r.json.status, 'IN_QUEUE');
  const queued = await a.req('GET', `/v2/${ep}/status/${r.json.id}`);
  t.equal(queued.json.status, 'IN_QUEUE');
  const job = await w.take();
  t.same(job, { id: r.json.id, input: { prompt: 'hi' } }, 'a job carries id and input');
  const running = await a.req('GET', `/v2/${ep}/status/${r.json.id}`);
  t.equal(running.json.status, 'IN_PROGRESS');
  t.equal(running.json.workerId, w.workerId);
  t.equal((await w.done(r.json.id, { status: 'IN_PROGRESS', output: { pct: 50 } })).status, 200);
  const progress = await a.req('GET', `/v2/${ep}/status/${r.json.id}`);
  t.equal(progress.json.status, 'IN_PROGRESS', 'a progress update is not completion');
  t.same(progress.json.output, { pct: 50 }, 'progress shows as output');
  t.equal((await w.done(r.json.id, { output: { text: 'hello' } })).status, 200);
  const done = await a.req('GET', `/v2/${ep}/status/${r.json.id}`, { key: null, headers: { authorization: ADMIN_KEY } });
  t.equal(done.status, 200, 'Authorization without "Bearer " works');
  t.equal(done.json.status, 'COMPLETED');
  t.same(done.json.output, { text: 'hello' });
  t.type(done.json.delayTime, 'number');
  t.type(done.json.executionTime, 'number');
  t.equal(done.json.workerId, w.workerId);
  t.equal((await w.done(r.json.id, { status: 'IN_PROGRESS', output: 'late' })).status, 200);
  t.equal((await a.req('GET', `/v2/${ep}/status/${r.json.id}`)).json.status, 'COMPLETED', 'a late progress update never reopens a job');
});

t.test('job-take long-polls, wakes on submit and gives 204 after the hold', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 400 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const started = Date.now();
  t.equal(await w.take(), null, '204 when nothing arrives');
  t.ok(Date.now() - started >= 350, 'held for the hold time first');
  const b = await startAgent(t, { takeHoldMs: 60_000 });
  const ep2 = await endpoint(b);
  const w2 = await TestWorker.create(b, ep2);
  const parked = w2.take();
  await new Promise((r) => setTimeout(r, 50));
  const sent = await run(b, ep2, { input: { wake: true } });
  const job = await parked;
  t.equal(job?.id, sent.json.id, 'the parked take got the job (woken by submit, not by the 60 s hold)');
});

t.test('job-take-batch returns a JSON array', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  for (let i = 0; i < 3; i++) await run(a, ep, { input: { i } });
  const batch = await w.takeBatch(2);
  t.equal(batch.status, 200);
  t.equal(batch.jobs.length, 2);
  t.same(batch.jobs.map((j) => j.input), [{ i: 0 }, { i: 1 }], 'oldest first');
  const rest = await w.takeBatch(5);
  t.equal(rest.jobs.length, 1);
});

t.test('runsync returns the result, or the id and status after ?wait; disconnecting never cancels', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 5000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const worker = (async () => {
    const job = await w.take();
    if (job) await w.done(job.id, { output: { echo: job.input } });
  })();
  const r = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { x: 7 } } });
  await worker;
  t.equal(r.status, 200);
  t.equal(r.json.status, 'COMPLETED');
  t.same(r.json.output, { echo: { x: 7 } });
  t.equal(r.json.workerId, w.workerId);
  t.type(r.json.delayTime, 'number');
  t.type(r.json.executionTime, 'number');

  const slow = await a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { x: 8 } } });
  t.equal(slow.status, 200);
  t.equal(slow.json.status, 'IN_QUEUE', 'not done within wait: id and current status');
  t.type(slow.json.id, 'string');
  assertProblem(t, await a.req('POST', `/v2/${ep}/runsync?wait=999`, { body: { input: {} } }), 400);
  assertProblem(t, await a.req('POST', `/v2/${ep}/runsync?wait=300001`, { body: { input: {} } }), 400);

  const controller = new AbortController();
  const pending = fetch(`${a.url}/v2/${ep}/runsync`, {
    method: 'POST', signal: controller.signal,
    headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ input: { x: 9 } }),
  }).catch(() => undefined);
  await new Promise((r) => setTimeout(r, 100));
  controller.abort();
  await pending;
  const first = await w.take();
  const second = await w.take();
  t.same([first?.input, second?.input], [{ x: 8 }, { x: 9 }], 'the abandoned runsync job still runs');
});

t.test('errors end FAILED with the worker string; results from the wrong worker are refused', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = await endpoint(a);
  const w1 = await TestWorker.create(a, ep);
  const w2 = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id;
  const errText = JSON.stringify({ error_type: "<class 'ValueError'>", error_message: 'bad' });
  await w1.take();
  const stale = await w2.done(id, { output: 'not mine' });
  t.equal(stale.status, 409, 'another worker cannot finish the job');
  t.equal((await w1.done(id, { error: errText })).status, 200);
  const failed = await a.req('GET', `/v2/${ep}/status/${id}`);
  t.equal(failed.json.status, 'FAILED');
  t.equal(failed.json.error, errText, "the worker's error string, as sent");
  const again = await w1.done(id, { output: 'second try' });
  t.equal(again.status, 200);
  t.equal(again.json.duplicate, true, 'a re-post is acknowledged as a duplicate');
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'FAILED', 'completion is recorded once');

  const id2 = (await run(a, ep)).json.id;
  await w1.take();
  await w1.done(id2, { error: { code: 42 }, output: { partial: true } });
  const s2 = await a.req('GET', `/v2/${ep}/status/${id2}`);
  t.equal(s2.json.status, 'FAILED', 'any truthy error fails the job');
  t.equal(s2.json.error, '{"code":42}');
  t.same(s2.json.output, { partial: true });
  t.equal((await w1.done('00000000-nope', { output: 1 })).status, 404);
});

t.test('cancel removes queued jobs and stops running ones through job-stop', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const queued = (await run(a, ep, { input: { q: 1 } })).json.id;
  const c1 = await a.req('POST', `/v2/${ep}/cancel/${queued}`, { headers: { 'content-type': 'application/json' } });
  t.same(c1.json, { id: queued, status: 'CANCELLED' });
  const running = (await run(a, ep, { input: { q: 2 } })).json.id;
  const job = await w.take();
  t.equal(job?.id, running, 'the cancelled job is never handed out');
  const c2 = await a.req('POST', `/v2/${ep}/cancel/${running}`);
  t.same(c2.json, { id: running, status: 'CANCELLED' });
  t.same(await w.stops(), [running], 'job-stop tells the worker');
  const late = await w.done(running, { output: 'too late' });
  t.equal(late.status, 200, 'a result after cancel gets a 2xx (runpod-python logs every 4xx as an ERROR)');
  t.match(late.json, { ok: true, discarded: true }, 'and is discarded');
  t.equal((await a.req('GET', `/v2/${ep}/status/${running}`)).json.status, 'CANCELLED', 'CANCELLED even though the worker never answered');
  const stream = await a.req('GET', `/v2/${ep}/stream/${running}`);
  t.same(stream.json, { status: 'CANCELLED', stream: [] }, 'stream stays answerable');
  assertProblem(t, await a.req('POST', `/v2/${ep}/cancel/not-a-job`), 404);
});

t.test('retry: FAILED or TIMED_OUT only, same id, original input, output removed', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep, { input: { v: 'orig' } })).json.id;
  await w.take();
  await w.done(id, { error: 'boom', output: { junk: 1 } });
  const r = await a.req('POST', `/v2/${ep}/retry/${id}`);
  t.same(r.json, { id, status: 'IN_QUEUE' });
  const s = await a.req('GET', `/v2/${ep}/status/${id}`);
  t.equal(s.json.status, 'IN_QUEUE');
  t.notOk('output' in s.json, 'previous output removed');
  t.notOk('error' in s.json, 'previous error removed');
  const job = await w.take();
  t.same(job, { id, input: { v: 'orig' } }, 'same id and original input');
  await w.done(id, { output: 'ok now' });
  assertProblem(t, await a.req('POST', `/v2/${ep}/retry/${id}`), 409);
  const h = await a.req('GET', `/v2/${ep}/health`);
  t.equal(h.json.jobs.retried, 1, 'the retry counts in retried');
});

t.test('purge-queue removes queued jobs and leaves running ones', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const first = (await run(a, ep)).json.id;
  await w.take();
  for (let i = 0; i < 3; i++) await run(a, ep);
  const p = await a.req('POST', `/v2/${ep}/purge-queue`);
  t.same(p.json, { removed: 3, status: 'completed' });
  t.equal((await a.req('GET', `/v2/${ep}/status/${first}`)).json.status, 'IN_PROGRESS');
  t.equal(await w.take(), null, 'nothing left to take');
  t.equal((await w.done(first, { output: 1 })).status, 200, 'the running job finishes normally');
});

t.test('health counts jobs and all six worker states', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const ids = [(await run(a, ep)).json.id, (await run(a, ep)).json.id, (await run(a, ep)).json.id];
  await w.take();
  await w.done(ids[0], { output: 1 });
  await w.take();
  await w.done(ids[1], { error: 'x' });
  await run(a, ep);
  await w.take();
  const h = await a.req('GET', `/v2/${ep}/health`);
  t.same(h.json.jobs, { completed: 1, failed: 1, inProgress: 1, inQueue: 1, retried: 0 });
  t.same(Object.keys(h.json.workers).sort(), ['idle', 'initializing', 'ready', 'running', 'throttled', 'unhealthy']);
  t.equal(h.json.workers.running, 1);
});

t.test('stream returns the chunks since the last poll; large chunks are split', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id;
  await w.take();
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json, { status: 'IN_PROGRESS', stream: [] }, 'stream is always present');
  await w.stream(id, { text: ['a'] });
  await w.stream(id, { text: ['b'] });
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream, [{ output: { text: ['a'] } }, { output: { text: ['b'] } }]);
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream, [], 'drained by the previous poll');
  const big = 'x'.repeat(1.5 * 1024 * 1024);
  await w.stream(id, big);
  const chunks = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as { output: string }[];
  t.equal(chunks.length, 2, 'split in as few pieces as the 1 MB allows');
  t.ok(chunks.every((c) => JSON.stringify(c).length <= 1024 * 1024), 'each at most 1 MB');
  t.equal(JSON.stringify(chunks[0]).length, 1024 * 1024, 'the first one full');
  t.equal(chunks.map((c) => c.output).join(''), big, 'joined back they are the output');
  // A split never falls between the two halves of a surrogate pair: each piece is text on its own.
  const emoji = 'a'.repeat(128 * 1024 - 1) + '\u{1F600}'.repeat(300_000);
  await w.stream(id, emoji);
  const pieces = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as { output: string }[];
  t.equal(pieces.length, 2, 'split in two (1.3 MB of UTF-8)');
  t.ok(pieces.every((c) => Buffer.byteLength(JSON.stringify(c)) <= 1024 * 1024), 'each at most 1 MB of UTF-8');
  t.ok(pieces.every((c) => (c.output as unknown as { isWellFormed(): boolean }).isWellFormed()), 'no piece starts or ends with half an emoji');
  t.equal(pieces.map((c) => c.output).join(''), emoji, 'joined back they are the output');
  // Escapes count as what they take in JSON: control characters 6 bytes, quotes 2, 'é' 2, '€' 3.
  const mixed = '\u0001"é€a\n\ud800'.repeat(200_000);
  await w.stream(id, mixed);
  const parts = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as { output: string }[];
  const sizes = parts.map((c) => Buffer.byteLength(JSON.stringify(c)));
  t.ok(sizes.every((n) => n <= 1024 * 1024), `each at most 1 MB of UTF-8: ${sizes.join(', ')}`);
  t.ok(sizes.slice(0, -1).every((n) => n > 1024 * 1024 - 8), 'every piece but the last as full as a character allows');
  t.equal(parts.map((c) => c.output).join(''), mixed, 'joined back they are the output');
  await w.done(id, { output: [] }, true);
  t.equal((await a.req('GET', `/v2/${ep}/stream/${id}`)).json.status, 'COMPLETED');
});

t.test('a stream chunk with metrics counts them against the 1 MB limit too', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id;
  await w.take();
  const output = 'o'.repeat(700 * 1024);
  const metrics = { trace: 'm'.repeat(500 * 1024) };
  const res = await fetch(`${a.url}/v2/${ep}/job-stream/${w.workerId}/${id}?gpu=cpu`, {
    method: 'POST', headers: { authorization: w.key, 'content-type': 'application/json' }, body: JSON.stringify({ output, metrics }),
  });
  t.equal(res.status, 200);
  const chunks = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as { output: string; metrics?: unknown }[];
  t.ok(chunks.length >= 2, 'split');
  t.ok(chunks.every((c) => Buffer.byteLength(JSON.stringify(c)) <= 1024 * 1024), 'each chunk, metrics included, at most 1 MB');
  t.same(chunks[0]?.metrics, metrics, 'the first piece carries the metrics');
  t.equal(chunks.map((c) => c.output).join(''), output);
  // Metrics too large to go with the output are dropped; the output is kept as it was posted.
  const post = (body: unknown) => fetch(`${a.url}/v2/${ep}/job-stream/${w.workerId}/${id}?gpu=cpu`, {
    method: 'POST', headers: { authorization: w.key, 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const huge = { trace: 'm'.repeat(1100 * 1024) };
  t.equal((await post({ output: { token: 'hi' }, metrics: huge })).status, 200);
  t.equal((await post({ output: '\u0001'.repeat(300_000), metrics: { trace: 'm'.repeat(400 * 1024) } })).status, 200);
  const next = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as { output: unknown; metrics?: unknown }[];
  t.same(next[0], { output: { token: 'hi' } }, 'a small object output stays an object, without the metrics');
  t.ok(next.every((c) => Buffer.byteLength(JSON.stringify(c)) <= 1024 * 1024), 'every chunk at most 1 MB');
  t.equal(next.slice(1).map((c) => c.output).join(''), '\u0001'.repeat(300_000));
});

t.test("a Python worker's NaN and Infinity (json.dumps allows them) are stored as null, not refused", async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id;
  await w.take();
  const url = `${a.url}/v2/${ep}/job-done/${w.workerId}/${id}?gpu=cpu&isStream=false`;
  const res = await fetch(url, {
    method: 'POST', headers: { authorization: w.key, 'content-type': 'application/x-www-form-urlencoded' },
    body: '{"output": {"loss": NaN, "range": [-Infinity, Infinity], "note": "NaN stays in a string"}}',
  });
  t.equal(res.status, 200);
  const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'COMPLETED');
  t.same(s.output, { loss: null, range: [null, null], note: 'NaN stays in a string' });
  const bad = await fetch(url, { method: 'POST', headers: { authorization: w.key }, body: '{"output": nan}' });
  t.equal(bad.status, 400, 'other invalid JSON is still refused');
});

t.test('request validation and auth on the job API', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 500, maxBodyBytes: 4096 });
  const ep = await endpoint(a);
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { notInput: 1 } }), 400);
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: 'string' } }), 400);
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 10 } } }), 400);
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: 'ftp://x' } }), 400);
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {} }, key: null }), 401);
  assertProblem(t, await a.req('POST', `/v2/nosuchendpoint1/run`, { body: { input: {} } }), 404);
  const big = { input: { blob: 'x'.repeat(8192) } };
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: big })).status, 200, 'job bodies use their own limit, not the management one');
  const tooBig = { input: { blob: 'x'.repeat(10 * 1024 * 1024) } };
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: tooBig }), 413);
  const w = await TestWorker.create(a, ep);
  const asClient = await a.req('POST', `/v2/${ep}/run`, { body: { input: {} }, key: w.key });
  assertProblem(t, asClient, 403, 'a worker key cannot submit jobs');
  const other = await endpoint(a);
  const started = performance.now();
  const res = await fetch(`${a.url}/v2/${other}/job-take/${w.workerId}?gpu=cpu`, { headers: { authorization: w.key } });
  t.equal(res.status, 403, "a worker key cannot take another endpoint's jobs");
  // runpod-python re-polls job-take at once after any error: the error waits, so it cannot spin.
  t.ok(performance.now() - started >= POLL_ERROR_HOLD_MS - 50, `a job-take error is answered after ${POLL_ERROR_HOLD_MS} ms`);
  const bad = performance.now();
  t.equal((await fetch(`${a.url}/v2/${ep}/job-take/${w.workerId}?gpu=cpu`, { headers: { authorization: 'revoked-or-wrong' } })).status, 401);
  t.ok(performance.now() - bad >= POLL_ERROR_HOLD_MS - 50, 'so is a 401');
  const user = await a.req('POST', '/v2/api-keys', { body: { name: 'runner', scopes: ['jobs:run', 'jobs:read'] } });
  const take = await fetch(`${a.url}/v2/${ep}/job-take/wkr_x?gpu=cpu`, { headers: { authorization: user.json.key } });
  t.equal(take.status, 403, 'a user key cannot act as a worker');
  const readOnly = await a.req('POST', '/v2/api-keys', { body: { name: 'reader', scopes: ['jobs:read'] } });
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {} }, key: readOnly.json.key }), 403);
});

t.test('webhook receives the final status body', async (t) => {
  const received: unknown[] = [];
  /** A webhook receiver on `host`, recording each body in `received`; resolves its port. */
  const receiver = async (host: string): Promise<number> => {
    const hook = createServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        received.push(JSON.parse(body));
        res.end('ok');
      });
    });
    await new Promise<void>((r) => hook.listen(0, host, r));
    t.teardown(() => hook.close());
    return (hook.address() as { port: number }).port;
  };
  const port = await receiver('127.0.0.1');
  const a = await startAgent(t, { takeHoldMs: 1000, webhookAllowPrivate: true });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep, { input: { h: 1 }, webhook: `http://127.0.0.1:${port}/hook` })).json.id;
  await w.take();
  await w.done(id, { output: { fine: true } });
  for (let i = 0; i < 100 && received.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
  t.equal(received.length, 1);
  t.match(received[0], { id, status: 'COMPLETED', output: { fine: true } });

  // A host name: Node's HTTP client asks the pinned lookup for every address ({ all: true }).
  // 'localhost' binds the address a lookup of it gives first, the one flashd connects to.
  const namedPort = await receiver('localhost');
  const idNamed = (await run(a, ep, { input: { h: 2 }, webhook: `http://localhost:${namedPort}/byname` })).json.id;
  await w.take();
  await w.done(idNamed, { output: { named: true } });
  for (let i = 0; i < 100 && received.length === 1; i++) await new Promise((r) => setTimeout(r, 20));
  t.equal(received.length, 2, `delivered to a host name: ${a.logs.filter((l) => l.includes('webhook')).join(' | ')}`);
  t.match(received[1], { id: idNamed, status: 'COMPLETED', output: { named: true } });
  received.length = 1;

  // Without --webhook-allow-private these are refused at submit (and at connect time, for a name
  // or a URL stored before: test/queue/webhook-ssrf.test.ts).
  const strict = await startAgent(t, { takeHoldMs: 1000, webhookRetryDelayMs: 0 });
  const ep2 = await endpoint(strict);
  // The same loopback listener, spelled as IPv4 and as IPv4 inside IPv6 (the URL parser writes
  // [::ffff:127.0.0.1] as [::ffff:7f00:1]); a dual-stack connect to either reaches it.
  const hosts = ['127.0.0.1', '[::ffff:127.0.0.1]', '[::ffff:7f00:1]', '[0:0:0:0:0:ffff:7f00:1]', '[::1]', 'localhost'];
  for (const host of hosts) assertProblem(t, await run(strict, ep2, { input: {}, webhook: `http://${host}:${port}/hook` }), 400);
  await new Promise((r) => setTimeout(r, 200));
  t.equal(received.length, 1, 'private addresses are refused by default, in every spelling');
});

t.test('isPrivateAddress judges every spelling of an address', async (t) => {
  const cases: [string, boolean][] = [
    ['127.0.0.1', true], ['10.1.2.3', true], ['172.16.0.1', true], ['172.32.0.1', false], ['192.168.1.1', true],
    ['100.64.0.1', true], ['169.254.169.254', true], ['0.0.0.0', true], ['224.0.0.1', true], ['198.18.0.1', true],
    ['8.8.8.8', false], ['93.184.216.34', false], ['192.0.78.9', false], ['192.0.32.10', false], ['192.0.2.1', true],
    ['192.0.0.9', true], ['::ffff:192.0.78.9', false], ['::ffff:c000:250', true], ['2002:c000:4e09::', false],
    ['::1', true], ['::', true], ['[::1]', true], ['::ffff:127.0.0.1', true], ['::ffff:7f00:1', true], ['::FFFF:7F00:1', true],
    ['0:0:0:0:0:ffff:7f00:1', true], ['::ffff:a00:1', true], ['::ffff:c0a8:101', true], ['::ffff:808:808', false],
    ['::7f00:1', true], ['64:ff9b::7f00:1', true], ['64:ff9b::808:808', false], ['64:ff9b:1::1', true],
    ['2002:7f00:1::', true], ['2002:808:808::1', false], ['fc00::1', true], ['fd12:3456::1', true], ['fe80::1', true],
    ['febf::1', true], ['fec0::1', true], ['ff02::1', true], ['fe80::1%eth0', true],
    ['2606:4700:4700::1111', false], ['2001:4860:4860::8888', false], ['not-an-ip', true],
  ];
  for (const [ip, want] of cases) t.equal(isPrivateAddress(ip), want, `${ip}: ${want ? 'private' : 'public'}`);
});

t.test('low-priority jobs are taken after normal ones', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 500 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  await run(a, ep, { input: { p: 'low' }, policy: { lowPriority: true } });
  await run(a, ep, { input: { p: 'normal' } });
  t.same((await w.take())?.input, { p: 'normal' });
  t.same((await w.take())?.input, { p: 'low' });
});

t.test('/run answers IN_QUEUE even when a parked worker takes the job at once', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 5000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const parked = w.take();
  await new Promise((r) => setTimeout(r, 50));
  const r = await run(a, ep);
  t.same(r.json, { id: r.json.id, status: 'IN_QUEUE' });
  t.equal((await parked)?.id, r.json.id);
});

t.test('job-stop: a pending stop is re-offered at most once a second, and a new claim clears it', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 3000, leaseMs: 5000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id;
  await w.take();
  await a.req('POST', `/v2/${ep}/cancel/${id}`);
  t.same(await w.stops(), [id], 'offered at once');
  const started = Date.now();
  t.same(await w.stops(), [id], 'offered again while the worker may still hold it');
  t.ok(Date.now() - started >= 900, 'but not in a tight loop: held about a second first');
  await w.ping([]);
  const quiet = Date.now();
  t.same(await w.stops(), [], 'a ping that no longer lists the job clears the stop');
  t.ok(Date.now() - quiet >= 2500, 'and job-stop holds until its hold time');

  const other = await TestWorker.create(a, ep);
  const id2 = (await run(a, ep)).json.id;
  await other.take();
  await other.done(id2, { error: 'boom' });
  await w.ping([id2]);
  t.same(await w.stops(), [id2], 'a job the worker lists but does not hold is to be stopped');
  await a.req('POST', `/v2/${ep}/retry/${id2}`);
  // Its stop pending, it may still run an old run of the job: the retry is fenced from it for a
  // lease (its pings would extend that), then its parked take gets it.
  t.equal(await w.take(), null, 'fenced from the worker while it may still run an old run');
  t.equal((await w.take())?.id, id2, 'the retry goes to that worker once the fence runs out');
  await w.ping([id2]);
  const held = Date.now();
  t.same(await w.stops(), [], "the new attempt is not stopped by the old attempt's stop");
  t.ok(Date.now() - held >= 2500);
  t.equal((await w.done(id2, { output: 'second attempt' })).status, 200);
});

t.test('after /cancel, job-stop stops offering the job once its worker posted for it or a ping no longer lists it; no other worker gets it', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const other = await TestWorker.create(a, ep);
  const running = async () => {
    const id = (await run(a, ep)).json.id as string;
    t.equal((await w.take())?.id, id);
    t.equal(await w.ping([id]), 200);
    clock.advance(5000); // long registered by the worker
    t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).json.status, 'CANCELLED');
    return id;
  };

  const dropped = await running();
  t.same(await w.stops(), [dropped], 'the stop is offered');
  t.same(await other.stops(), [], 'not to a worker that never held the job');
  t.equal(await w.ping([]), 200, 'the worker dropped the job');
  clock.advance(1000); // a pending stop would be due again
  t.same(await w.stops(), [], 'a ping that no longer lists the job ends the stop at once');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 2, running: 0 }, 'and the worker is idle');

  const posted = await running();
  t.same(await w.stops(), [posted]);
  t.match((await w.done(posted, { output: 'late' })).json, { discarded: true });
  t.equal(await w.ping([posted]), 200, 'a heartbeat made before the post still lists it');
  clock.advance(1000);
  t.same(await w.stops(), [], 'the worker posted for the job: no stop');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 2, running: 0 });

  const own = (await run(a, ep)).json.id as string;
  t.equal((await w.take())?.id, own);
  t.equal((await w.done(own, { output: 'ok' })).status, 200);
  t.equal(await w.ping([own]), 200, 'a heartbeat made before its own result was posted');
  clock.advance(1000);
  t.same(await w.stops(), [], 'no stop for a job whose result it posted');
  t.same(await other.stops(), []);
});

t.test("deleting an endpoint revokes its workers' keys at once", async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  t.equal(await w.ping(), 200, 'the key works (and is now cached)');
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  t.equal(await w.ping(), 401, 'revoked, not merely pointing at a missing endpoint');
});

t.test('a worker flashd is stopping gets its parked polls answered at once and no more jobs', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 30_000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const other = await TestWorker.create(a, ep);
  const started = Date.now();
  const parkedTake = w.take();
  const parkedStop = w.stops();
  await new Promise((r) => setTimeout(r, 100));
  a.agent.queue.stopping(ep, w.workerId);
  t.equal(await parkedTake, null, 'the parked job-take ends with 204');
  t.same(await parkedStop, [], 'the parked job-stop ends too');
  t.ok(Date.now() - started < 5000, 'at once, not after the 30 s hold');
  const id = (await run(a, ep, { input: { after: 'stop' } })).json.id;
  const again = Date.now();
  t.equal(await w.take(), null, 'a stopping worker is given no job');
  const waited = Date.now() - again;
  t.ok(waited >= DRAIN_POLL_HOLD_MS - 20 && waited < 5000, `a poll after the stop waits briefly, not a tight loop and not the 30 s hold (${waited} ms)`);
  const stopAgain = Date.now();
  t.same(await w.stops(), [], 'its job-stop poll is empty');
  t.ok(Date.now() - stopAgain >= DRAIN_POLL_HOLD_MS - 20, 'and waits briefly too');
  t.equal((await other.take())?.id, id, 'the job goes to another worker');
});

t.test('an external worker that posts stopPod leaves /health at once', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 5000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id;
  t.equal((await w.take())?.id, id);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 });
  t.equal((await w.done(id, { output: 1, stopPod: true })).status, 200);
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 },
    'gone from the counts');
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'COMPLETED');
  // runpod-python's heartbeat process pings once more on the way out, and a job-stop poll may follow.
  t.equal(await w.ping([]), 200);
  t.same(await w.stops(), [], 'its last job-stop poll is answered at once');
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 },
    'a last ping or poll does not bring it back as an idle worker');
  // The same worker id asking for work again did not exit (or a supervisor restarted it): it serves on.
  const id2 = (await run(a, ep)).json.id;
  t.equal((await w.take())?.id, id2, 'a job-take brings it back');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 });
  t.equal((await w.done(id2, { output: 2 })).status, 200);
});

t.test('an external worker whose stopPod came with one of several jobs leaves /health once its last job ends', async (t) => {
  // Concurrency above 1: refresh_worker (or sys.exit) in one job while others still run. The SDK
  // stops taking, finishes them, posts them without stopPod, and exits: it was idle capacity for
  // 10 s, until the silence rule dropped it.
  const a = await startAgent(t, { takeHoldMs: 5000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) ids.push((await run(a, ep, { input: { i } })).json.id as string);
  t.equal((await w.takeBatch(3)).jobs.length, 3);
  t.equal((await w.done(ids[0] as string, { output: 0, stopPod: true })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 }, 'still running its other jobs');
  t.equal((await w.done(ids[1] as string, { error: 'e1' })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 });
  t.equal((await w.done(ids[2] as string, { output: 2 })).status, 200);
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 },
    'gone from the counts once it holds no job, though its last result carried no stopPod');
  t.equal(a.agent.queue.workers.get(ep, w.workerId), undefined, 'and from the autoscaler\'s workers');
  t.equal(await w.ping([]), 200);
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 },
    'its heartbeat\'s last ping does not bring it back');
  const statuses: string[] = [];
  for (const id of ids) statuses.push((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status);
  t.same(statuses, ['COMPLETED', 'FAILED', 'COMPLETED']);
});

t.test('an external worker whose stopPod came with one of several jobs leaves /health once flashd ends the rest (cancel, execution timeout)', async (t) => {
  // The rest end by flashd, not by a result: a /cancel (the SDK is told on job-stop, cancels the
  // task, posts nothing and exits) or the execution timeout. It showed as running, then idle,
  // until the 10 s silence rule dropped it, though it had exited.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const none = { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 };
  const ids: string[] = [];
  ids.push((await run(a, ep, { input: { i: 0 } })).json.id as string);
  ids.push((await run(a, ep, { input: { i: 1 } })).json.id as string);
  ids.push((await run(a, ep, { input: { i: 2 }, policy: { executionTimeout: 5000 } })).json.id as string);
  t.equal((await w.takeBatch(3)).jobs.length, 3);
  t.equal((await w.done(ids[0] as string, { output: 0, stopPod: true })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 }, 'still running its other jobs');
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${ids[1]}`)).json.status, 'CANCELLED');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 }, 'one job of its own left');
  t.equal(await w.ping([ids[1] as string, ids[2] as string]), 200);
  clock.advance(5001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${ids[2]}`)).json.status, 'TIMED_OUT');
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, none,
    'gone from the counts once flashd ended the last job it held, with no result from it');
  t.notOk(a.agent.queue.workers.list(ep).some((x) => !a.agent.queue.workers.silent(x)), 'and from the autoscaler\'s workers');
  t.same((await w.stops()).sort(), [ids[1], ids[2]].sort(), 'it is still told to stop the jobs flashd ended');
  t.equal(await w.ping([ids[2] as string]), 200);
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, none, 'its heartbeat does not bring it back');
  // A late result (runpod-python knows no job-stop) is discarded, as before.
  t.equal((await w.done(ids[2] as string, { output: 2 })).json.discarded, true);
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, none);
  // A job-take withdraws the request, as ever: a worker that did not exit.
  const next = (await run(a, ep)).json.id as string;
  t.equal((await w.take())?.id, next);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 }, 'back once it asks for work');
});

t.test('an external worker retired by its stopPod result is still told to stop a job flashd cancelled before it', async (t) => {
  // Concurrency 2: job B is cancelled, then A's result comes with stopPod before the worker's
  // job-stop poll. The result retires the worker (it holds nothing); its record went with it, so
  // its later polls got a fresh empty record and B's handler was never told to stop.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const none = { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 };
  const A = (await run(a, ep, { input: { i: 0 } })).json.id as string;
  const B = (await run(a, ep, { input: { i: 1 } })).json.id as string;
  t.equal((await w.takeBatch(2)).jobs.length, 2);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${B}`)).json.status, 'CANCELLED');
  t.equal((await w.done(A, { output: 0, stopPod: true })).status, 200);
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, none, 'retired at once: it holds no job');
  t.equal(a.agent.queue.workers.get(ep, w.workerId), undefined, 'and out of the autoscaler\'s workers');
  t.same(await w.stops(), [B], 'its job-stop poll is still told to stop the cancelled job');
  t.equal(await w.ping([B]), 200);
  clock.advance(1000);
  t.same(await w.stops(), [B], 'offered again while its pings list the job');
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, none, 'its calls do not bring it back');
  t.equal(await w.ping([]), 200);
  clock.advance(1000);
  t.same(await w.stops(), [], 'a ping without the job ends the stop');
  t.equal((await w.done(B, { output: 1 })).json.discarded, true, 'a late result for it is discarded');
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, none);
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'CANCELLED');
});

t.test('an external worker that takes again after its stopPod retired it is still told to stop a job flashd cancelled before it', async (t) => {
  // Concurrency 2: B is cancelled, A's result with stopPod retires the worker, and the worker asks
  // for work again (it did not exit). That take got a new, empty record: the stop for B, still
  // running there, was lost with the retired one, and /health showed it idle.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json.workers;
  const A = (await run(a, ep, { input: { i: 0 } })).json.id as string;
  const B = (await run(a, ep, { input: { i: 1 } })).json.id as string;
  t.equal((await w.takeBatch(2)).jobs.length, 2);
  t.equal(await w.ping([A, B]), 200);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${B}`)).json.status, 'CANCELLED');
  t.equal((await w.done(A, { output: 0, stopPod: true })).status, 200);
  t.equal(a.agent.queue.workers.get(ep, w.workerId), undefined, 'retired: it holds no job');
  // It did not exit: it asks for work again (nothing queued), B's handler still running.
  t.equal(await w.take(true), null);
  t.not(a.agent.queue.workers.get(ep, w.workerId), undefined, 'back in the registry');
  t.match(await health(), { running: 1, idle: 0 }, 'running: flashd still has it stop B');
  t.same(await w.stops(), [B], 'its job-stop poll is still told to stop the cancelled job');
  t.equal((await w.done(B, { output: 1 })).json.discarded, true, 'a late result for it is discarded as ended, not refused as stale');
  t.equal(await w.ping([]), 200);
  t.match(await health(), { running: 0, idle: 1 }, 'idle once a ping no longer lists it');
  clock.advance(1000);
  t.same(await w.stops(), [], 'the stop is over');
  const C = (await run(a, ep, { input: { i: 2 } })).json.id as string;
  t.equal((await w.take())?.id, C, 'it serves on: its stopPod was withdrawn');
  t.equal((await w.done(C, { output: 2 })).status, 200);
  t.match(await health(), { running: 0, idle: 1 }, 'and its results no longer retire it');
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'CANCELLED');
});

t.test('a /retry of a job whose stop is pending on a worker its stopPod retired is fenced from it: the old run is still told to stop, the new one never', async (t) => {
  // B timed out on a worker running two jobs; A's result with stopPod retired the worker before
  // it let go of B. /retry looked for B's last worker in the registry only, found none, and did
  // not fence the new run from it: the worker, still running the old run, asked for work again
  // and was handed B anew, which dropped the old run's stop (a claim clears the job's stop) and
  // let the old run's late result complete the new one.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const other = await TestWorker.create(a, ep);
  const A = (await run(a, ep, { input: { i: 0 } })).json.id as string;
  const B = (await run(a, ep, { input: { i: 1 }, policy: { executionTimeout: 5000 } })).json.id as string;
  t.equal((await w.takeBatch(2)).jobs.length, 2);
  t.equal(await w.ping([A, B]), 200);
  clock.advance(5001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'TIMED_OUT');
  t.equal((await w.done(A, { output: 0, stopPod: true })).status, 200);
  t.equal(a.agent.queue.workers.get(ep, w.workerId), undefined, 'retired: it holds no job');
  t.equal((await a.req('POST', `/v2/${ep}/retry/${B}`)).json.status, 'IN_QUEUE');
  t.same(await w.stops(), [B], 'the old run is still told to stop');
  // It did not exit and asks for work while the old run goes on, before its next ping.
  t.equal(await w.take(true), null, 'the new run is not handed to the worker still running the old one');
  t.equal(await w.ping([B]), 200);
  t.equal((await other.take())?.id, B, 'another worker takes it');
  clock.advance(1000);
  t.same(await w.stops(), [B], 'the old run is told to stop again while its pings list it');
  t.equal((await w.done(B, { output: 'old' })).json.discarded, true, 'the old run\'s late result is discarded');
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'IN_PROGRESS', 'and does not complete the new run');
  t.equal(await other.ping([B]), 200);
  t.same(await other.stops(), [], 'the new run is never told to stop');
  t.equal((await other.done(B, { output: 'new' })).status, 200);
  const done = await a.req('GET', `/v2/${ep}/status/${B}`);
  t.equal(done.json.status, 'COMPLETED');
  t.same(done.json.output, 'new');
});

t.test('a /retry taken by the same worker its stopPod retired, once it let go of the old run, is not stopped by the old run\'s stop', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const A = (await run(a, ep, { input: { i: 0 } })).json.id as string;
  const B = (await run(a, ep, { input: { i: 1 }, policy: { executionTimeout: 5000 } })).json.id as string;
  t.equal((await w.takeBatch(2)).jobs.length, 2);
  t.equal(await w.ping([A, B]), 200);
  clock.advance(5001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await w.done(A, { output: 0, stopPod: true })).status, 200);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${B}`)).json.status, 'IN_QUEUE');
  t.same(await w.stops(), [B], 'the old run is told to stop');
  // The old run stopped: its next ping leaves it out, which ends the stop and the fence.
  t.equal(await w.ping([]), 200);
  t.equal((await w.take(true))?.id, B, 'the same worker takes the new run');
  clock.advance(1000);
  t.equal(await w.ping([B]), 200);
  t.same(await w.stops(), [], 'the new run is not told to stop');
  t.equal((await w.done(B, { output: 'new' })).status, 200);
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'COMPLETED');
});

t.test('a job retried twice is fenced from every worker still running one of its old runs, not just the last one', async (t) => {
  // B timed out on w1, whose old run went on; /retry fenced the new run from w1; w2 took it and
  // it timed out there too. The second /retry fenced the new run from w2 only: w1, still running
  // the first run, was handed B at its next job-take, which cleared its stop and let that run's
  // late result complete the new run.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 30_000 }, { clock });
  const ep = await endpoint(a);
  const w1 = await TestWorker.create(a, ep);
  const w2 = await TestWorker.create(a, ep);
  const w3 = await TestWorker.create(a, ep);
  const B = (await run(a, ep, { input: { i: 1 }, policy: { executionTimeout: 5000 } })).json.id as string;
  t.equal((await w1.take())?.id, B);
  t.equal(await w1.ping([B]), 200);
  clock.advance(5001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'TIMED_OUT');
  t.equal((await a.req('POST', `/v2/${ep}/retry/${B}`)).json.status, 'IN_QUEUE');
  t.equal((await w2.take())?.id, B, 'w2 takes the first retry');
  // w1's heartbeat still lists the old run while w2 runs the new one.
  t.equal(await w1.ping([B]), 200);
  t.equal(await w2.ping([B]), 200);
  clock.advance(5001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'TIMED_OUT');
  t.equal((await a.req('POST', `/v2/${ep}/retry/${B}`)).json.status, 'IN_QUEUE');
  // w1 asks for work before its next ping.
  t.equal(await w1.take(true), null, 'not handed to w1, still running the first run');
  t.equal(await w2.take(true), null, 'nor to w2, still running the second');
  t.same(await w1.stops(), [B], 'w1 is still told to stop its old run');
  t.same(await w2.stops(), [B], 'so is w2');
  t.equal((await w3.take())?.id, B, 'w3 takes the new run');
  t.equal((await w1.done(B, { output: 'old1' })).json.discarded, true, 'the first run\'s late result is discarded');
  t.equal((await w2.done(B, { output: 'old2' })).json.discarded, true, 'the second run\'s too');
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'IN_PROGRESS', 'and neither completes the new run');
  t.equal(await w3.ping([B]), 200);
  t.same(await w3.stops(), [], 'the new run is never told to stop');
  t.equal((await w3.done(B, { output: 'new' })).status, 200);
  const done = await a.req('GET', `/v2/${ep}/status/${B}`);
  t.equal(done.json.status, 'COMPLETED');
  t.same(done.json.output, 'new');
  t.equal((await w3.done(B, { output: 'new' })).json.duplicate, true, 'completed once');
});

t.test('a job requeued twice is fenced from every worker still running one of its lost attempts, not just the last one', async (t) => {
  // w1 lost its lease on B but its old attempt went on (its pings list B while w2 runs it); w2
  // lost its lease too. The requeue fenced B from w2 only: w1's next job-take was handed it.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 30_000, maxAttempts: 5 }, { clock });
  const ep = await endpoint(a);
  const w1 = await TestWorker.create(a, ep);
  const w2 = await TestWorker.create(a, ep);
  const w3 = await TestWorker.create(a, ep);
  const B = (await run(a, ep, { input: { i: 1 } })).json.id as string;
  t.equal((await w1.take())?.id, B);
  clock.advance(30_001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'IN_QUEUE', 'requeued: w1 lost its lease');
  t.equal((await w2.take())?.id, B, 'w2 takes the second attempt');
  // w1's old attempt goes on: its pings list B, running on w2 now.
  t.equal(await w1.ping([B]), 200);
  t.same(await w1.stops(), [B]);
  clock.advance(20_000);
  t.equal(await w1.ping([B]), 200);
  clock.advance(10_001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'IN_QUEUE', 'requeued: w2 lost its lease');
  t.equal(await w1.take(true), null, 'not handed to w1, still running the first attempt');
  t.equal(await w2.take(true), null, 'nor to w2, which may still run the second');
  t.equal((await w3.take())?.id, B, 'w3 takes the third attempt');
  t.same(await w1.stops(), [B], 'w1 is still told to stop its old attempt');
  t.equal((await w1.done(B, { output: 'old1' })).status, 409, 'the first attempt\'s late result is refused');
  t.equal((await a.req('GET', `/v2/${ep}/status/${B}`)).json.status, 'IN_PROGRESS', 'and does not complete the new attempt');
  t.equal(await w3.ping([B]), 200);
  t.same(await w3.stops(), [], 'the new attempt is never told to stop');
  t.equal((await w3.done(B, { output: 'new' })).status, 200);
  const done = await a.req('GET', `/v2/${ep}/status/${B}`);
  t.equal(done.json.status, 'COMPLETED');
  t.same(done.json.output, 'new');
});

t.test('an external worker that takes a job after its stopPod did not exit: its later results keep it', async (t) => {
  // A worker is free to ignore stopPod; one that asks for work again after it stays a worker.
  const a = await startAgent(t, { takeHoldMs: 5000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const first = [(await run(a, ep)).json.id as string, (await run(a, ep)).json.id as string];
  t.equal((await w.takeBatch(2)).jobs.length, 2);
  t.equal((await w.done(first[0] as string, { output: 0, stopPod: true })).status, 200);
  const next = (await run(a, ep)).json.id as string;
  t.equal((await w.take(true))?.id, next, 'it takes again');
  t.equal((await w.done(first[1] as string, { output: 1 })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { running: 1 }, 'still counted, running its new job');
  t.equal((await w.done(next, { output: 2 })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 1, running: 0 }, 'idle once it holds nothing: its stopPod was withdrawn');
  t.equal(a.agent.queue.workers.get(ep, w.workerId)?.recycle, false);
  // A stopPod after that retires it as before.
  const last = (await run(a, ep)).json.id as string;
  t.equal((await w.take())?.id, last);
  t.equal((await w.done(last, { output: 3, stopPod: true })).status, 200);
  t.equal(a.agent.queue.workers.get(ep, w.workerId), undefined, 'retired at its next stopPod');
});

t.test('stopPod on a late result for a job flashd ended still recycles the worker', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 5000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const cancelled = (await run(a, ep)).json.id;
  t.equal((await w.take())?.id, cancelled);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${cancelled}`)).json.status, 'CANCELLED');
  // runpod-python knows no job-stop: its handler runs on, posts with refresh_worker, then exits.
  const late = await w.done(cancelled, { output: 1, stopPod: true });
  t.equal(late.status, 200);
  t.equal(late.json.discarded, true, 'the result is discarded');
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 },
    'the recycle request stands: the worker is gone from the counts');
  t.equal(a.agent.queue.workers.get(ep, w.workerId)?.recycle ?? true, true, 'and is not kept as a worker to hand jobs to');
  t.equal((await a.req('GET', `/v2/${ep}/status/${cancelled}`)).json.status, 'CANCELLED', 'the job stays cancelled');
});

t.test('a ping made before the worker registered its job does not cancel a fresh stop', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id;
  t.equal((await w.take())?.id, id);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).json.status, 'CANCELLED');
  // The heartbeat composed just before the job was registered: it lists nothing.
  t.equal(await w.ping([]), 200);
  t.same(await w.stops(), [id], 'the stop is still offered');
  await new Promise((r) => setTimeout(r, 1100));
  t.equal(await w.ping([]), 200);
  t.same(await w.stops(), [], 'a later ping without the job ends it');
});

t.test('a stop for a job a ping listed ends at the first ping without it, also within a second of the take', async (t) => {
  // A job cancelled within a second of its take: the SDK stops the handler and pings at once,
  // without the job. That ping was taken for one made before the worker registered the job, so
  // the stop (and /health's running) lasted until the next regular ping, 10 s on.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json.workers;
  // Listed by a ping before the cancel.
  const first = (await run(a, ep)).json.id as string;
  t.equal((await w.take())?.id, first);
  t.equal(await w.ping([first]), 200);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${first}`)).json.status, 'CANCELLED');
  t.same(await w.stops(), [first]);
  t.match(await health(), { running: 1, idle: 0 }, 'running while its handler stops');
  t.equal(await w.ping([]), 200);
  t.match(await health(), { running: 0, idle: 1 }, 'idle at the ping after its handler stopped');
  clock.advance(1000);
  t.same(await w.stops(), [], 'the stop is over');
  // Listed only by the ping the SDK sends when it acts on the stop, its handler still running.
  const second = (await run(a, ep)).json.id as string;
  t.equal((await w.take())?.id, second);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${second}`)).json.status, 'CANCELLED');
  t.same(await w.stops(), [second]);
  t.equal(await w.ping([second]), 200);
  t.equal(await w.ping([]), 200);
  t.match(await health(), { running: 0, idle: 1 }, 'idle once its handler stopped');
  clock.advance(1000);
  t.same(await w.stops(), [], 'the stop is over');
  // Never listed: a ping without it may predate the worker's registering it, and keeps the stop.
  const third = (await run(a, ep)).json.id as string;
  t.equal((await w.take())?.id, third);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${third}`)).json.status, 'CANCELLED');
  t.equal(await w.ping([]), 200);
  t.same(await w.stops(), [third], 'still offered');
  t.match(await health(), { running: 1 });
});

t.test('a job handed to a parked job-take leaves in one TCP segment, not one per header', { skip: process.platform !== 'linux' && 'TCP_INFO is read on Linux' }, async (t) => {
  // uWS corks only one socket at a time: written from inside the /run request's callback, the
  // job-take reply went out as 19 sends. Linux counts the data segments a socket received.
  const a = await startAgent(t, { takeHoldMs: 10_000 });
  const ep = await endpoint(a);
  const env = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json as { workerId: string; env: Record<string, string> };
  const take = `${(env.env['RUNPOD_WEBHOOK_GET_JOB'] as string).replace('$ID', env.workerId)}&job_in_progress=0`;
  const script = fileURLToPath(new URL('../fixtures/net/take-segments.py', import.meta.url));
  const out = await new Promise<string>((resolve, reject) => {
    execFile('python3', [script, take, `${a.url}/v2/${ep}/run`, env.env['RUNPOD_AI_API_KEY'] as string, ADMIN_KEY], { timeout: 20_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout));
  });
  const r = JSON.parse(out) as { status: string; segments: number; id: string; run: string };
  t.equal(r.status, 'HTTP/1.1 200 OK', 'the parked take got a job');
  t.equal(r.run, 'HTTP/1.1 200 OK', 'the /run was accepted');
  t.equal(r.segments, 1, 'status line, headers and body in one segment');
});

t.test('a /runsync waiting when its endpoint is deleted gets a 404, not a job that no longer exists', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const waiting = a.req('POST', `/v2/${ep}/runsync?wait=10000`, { body: { input: {} } });
  await new Promise((r) => setTimeout(r, 300));
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  const started = Date.now();
  const r = await waiting;
  assertProblem(t, r, 404);
  t.match(r.json.detail, /deleted/);
  t.ok(Date.now() - started < 5000, 'answered at once, not after the wait');
});

for (const [what, poll] of [['a /status-sync', 'status-sync'], ['a /stream?wait= poll', 'stream']] as const) {
  t.test(`${what} waiting when its endpoint is deleted gets the 404 /runsync gets, saying the endpoint was deleted`, async (t) => {
    const a = await startAgent(t, { takeHoldMs: 1000 });
    const ep = await endpoint(a);
    const id = (await run(a, ep)).json.id as string;
    const waiting = a.req('GET', `/v2/${ep}/${poll}/${id}?wait=10000`);
    await new Promise((r) => setTimeout(r, 300));
    t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
    const started = Date.now();
    const r = await waiting;
    assertProblem(t, r, 404);
    t.equal(r.json.detail, `Endpoint ${ep} was deleted while job ${id} waited; the job is gone.`, 'not "unknown, or its result expired"');
    t.ok(Date.now() - started < 5000, 'answered at once, not after the wait');
  });
}

t.test('/health stops counting a result within about a second of its expiry', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = (await run(a, ep)).json.id as string;
  await w.take();
  await w.done(id, { error: 'boom' });
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}?ttl=1000`)).json.status, 'FAILED', 'kept one more second');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.failed, 1);
  await new Promise((resolve) => setTimeout(resolve, 2300));
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).status, 404, 'expired');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.failed, 0, 'and no longer counted');
});
