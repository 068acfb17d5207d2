/**
 * What a webhook POSTs: the job's final status body, then its `input` as submitted (raw JSON)
 * and the `webhook` URL itself, as RunPod's hosted service sends them (runpod-python#409:
 * receivers read `input` to tie a result to their request). /status is unchanged, and a body
 * sent again by a restart is the one the live delivery sent, byte for byte.
 */
import t from 'tap';
import { createServer } from 'node:http';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

/** A loopback receiver keeping each raw body; answers `state.status`. */
async function receiver(t: Parameters<typeof startAgent>[0]) {
  const state = { status: 200, received: [] as string[] };
  const server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      state.received.push(body);
      res.statusCode = state.status;
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  return { state, url: `http://127.0.0.1:${(server.address() as { port: number }).port}/hook` };
}

// Spacing, a float written 1.0, an integer past 2^53 and non-ASCII text: a re-encoded input would lose each.
const INPUT = '{ "prompt": "café ☕", "scale": 1.0, "seed": 12345678901234567890, "nested": {"a": [1, 2.50]} }';
const raw = (input: string, webhook: string, extra = '') => `{"input": ${input}, "webhook": ${JSON.stringify(webhook)}${extra}}`;

const endpoint = async (a: TestAgent) => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
const submit = async (a: TestAgent, ep: string, body: string) => {
  const r = await a.req('POST', `/v2/${ep}/run`, { raw: body, headers: { 'content-type': 'application/json' } });
  t.equal(r.status, 200, r.text);
  return r.json.id as string;
};

t.test('a completed and a failed job: the status body, then input as submitted and the webhook URL', async (t) => {
  const hook = await receiver(t);
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);

  // s3Config goes to the worker, never to the webhook.
  const ok = await submit(a, ep, raw(INPUT, hook.url, ', "s3Config": {"accessId": "AKIA-SECRET", "accessSecret": "s3-secret-key", "bucketName": "b", "endpointUrl": "https://s3.example"}'));
  t.equal((await w.take())?.id, ok);
  t.equal((await w.done(ok, { output: { image: 'done' } })).status, 200);
  await until('the completed job\'s webhook', async () => hook.state.received.length === 1);
  const done = hook.state.received[0] as string;
  t.ok(done.includes(`,"input":${INPUT},`), `input raw as submitted: ${done}`);
  t.notOk(/SECRET|s3-secret|s3Config/i.test(done), 'no s3Config in the webhook body');
  const body = JSON.parse(done);
  t.same(Object.keys(body), ['id', 'status', 'delayTime', 'executionTime', 'workerId', 'output', 'input', 'webhook'], 'the status fields first, then input and webhook');
  t.match(body, { id: ok, status: 'COMPLETED', workerId: w.workerId, output: { image: 'done' }, input: { prompt: 'café ☕', nested: { a: [1, 2.5] } }, webhook: hook.url });
  // /status keeps the spec's shape.
  const status = await a.req('GET', `/v2/${ep}/status/${ok}`);
  t.same(Object.keys(status.json), ['id', 'status', 'delayTime', 'executionTime', 'workerId', 'output']);
  t.equal(done, `${status.text.slice(0, -1)},"input":${INPUT},"webhook":${JSON.stringify(hook.url)}}`, 'the webhook body is the /status body plus input and webhook');

  const bad = await submit(a, ep, raw('{"n": 7}', `${hook.url}?job=2`));
  t.equal((await w.take())?.id, bad);
  t.equal((await w.done(bad, { error: 'handler raised' })).status, 200);
  await until('the failed job\'s webhook', async () => hook.state.received.length === 2);
  const failed = JSON.parse(hook.state.received[1] as string);
  t.same(Object.keys(failed), ['id', 'status', 'delayTime', 'executionTime', 'workerId', 'error', 'input', 'webhook']);
  t.match(failed, { id: bad, status: 'FAILED', error: 'handler raised', input: { n: 7 }, webhook: `${hook.url}?job=2` });
});

t.test('a cancelled job and one timed out deep in the queue (its input in SQLite only) carry their input too', async (t) => {
  const hook = await receiver(t);
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true }, { clock });
  const ep = await endpoint(a);
  const cancelled = await submit(a, ep, raw('{"which": "cancelled"}', hook.url));
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${cancelled}`)).status, 200);
  await until('the cancelled job\'s webhook', async () => hook.state.received.length === 1);
  t.match(JSON.parse(hook.state.received[0] as string), { id: cancelled, status: 'CANCELLED', input: { which: 'cancelled' }, webhook: hook.url });

  // Past 64 queued jobs an input waits in SQLite only, not in memory (job-queue HOT_QUEUE_DEPTH).
  for (let i = 0; i < 70; i++) await a.req('POST', `/v2/${ep}/run`, { body: { input: { filler: i } } });
  const expiring = await submit(a, ep, `{"input": {"which": "expired", "x": 1.50}, "webhook": ${JSON.stringify(hook.url)}, "policy": {"ttl": 10000}}`);
  t.equal(a.agent.queue.live(expiring)?.input, null, 'its input is not in memory');
  clock.advance(11_000);
  a.agent.queue.reap();
  await until('the expired job\'s webhook', async () => hook.state.received.length === 2);
  const expired = hook.state.received[1] as string;
  t.ok(expired.includes(',"input":{"which": "expired", "x": 1.50},'), expired);
  t.match(JSON.parse(expired), { id: expiring, status: 'TIMED_OUT', webhook: hook.url });
});

t.test('a webhook sent again after a restart carries input, and is the body the live try sent', async (t) => {
  const hook = await receiver(t);
  hook.state.status = 503;
  const dir = testDataDir(t);
  // The first try fails and the next one is a minute away when the server stops.
  const first = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir });
  const ep = await endpoint(first);
  const w = await TestWorker.create(first, ep);
  const id = await submit(first, ep, raw(INPUT, hook.url));
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { output: [1, 2, 3] })).status, 200);
  await until('the first try', async () => hook.state.received.length === 1);
  await first.agent.close();
  hook.state.status = 200;
  const second = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir });
  await until('the delivery after the restart', async () => hook.state.received.length === 2);
  const [live, replayed] = hook.state.received as [string, string];
  t.ok(replayed.includes(`,"input":${INPUT},`), `input in the replayed body: ${replayed}`);
  t.match(JSON.parse(replayed), { id, status: 'COMPLETED', output: [1, 2, 3], webhook: hook.url });
  t.equal(replayed, live, 'byte for byte the body of the live try');
  await second.agent.close();
});
