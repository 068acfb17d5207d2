/**
 * runpod-sdk (npm, 1.1.2) types its /run and /runsync payload as
 * `{input, webhook?, webhookV2?, s3Config?, policy?}` and posts it as it is. `webhookV2` is a
 * webhook URL delivered as `webhook` is (the same body, the same tries, the same address rules);
 * both at once must be the same URL, else a 400 says to give one.
 */
import t from 'tap';
import { createServer } from 'node:http';
import { startAgent, assertProblem, cpuBody, ADMIN_KEY, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';

/** runpod-sdk 1.1.2's headers (src/index.ts getAuthHeader); its body is JSON.stringify(request). */
const SDK_HEADERS = { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', 'user-agent': 'RunPod-JS-SDK/1.1.2 (Unknown Environment)' };

async function receiver(t: Parameters<typeof startAgent>[0]) {
  const received: any[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      received.push({ path: req.url, body: JSON.parse(body) });
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  return { received, base: `http://127.0.0.1:${(server.address() as { port: number }).port}` };
}

const endpoint = async (a: TestAgent) => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;

t.test("runpod-sdk's run({input, webhookV2}): accepted, and the final status is POSTed to it", async (t) => {
  const hook = await receiver(t);
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const url = `${hook.base}/v2`;
  const r = await fetch(`${a.url}/v2/${ep}/run`, { method: 'POST', headers: SDK_HEADERS, body: JSON.stringify({ input: { n: 1 }, webhookV2: url }) });
  t.equal(r.status, 200, await r.clone().text());
  const { id } = (await r.json()) as { id: string };
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { output: { ok: true } })).status, 200);
  await until('the webhook', async () => hook.received.length === 1);
  t.match(hook.received[0], { path: '/v2', body: { id, status: 'COMPLETED', output: { ok: true }, input: { n: 1 }, webhook: url } });

  // Both, the same URL: one delivery. runSync's payload is the same object.
  const both = await fetch(`${a.url}/v2/${ep}/runsync?wait=1000`, { method: 'POST', headers: SDK_HEADERS, body: JSON.stringify({ input: { n: 2 }, webhook: url, webhookV2: url }) });
  t.equal(both.status, 200);
  const id2 = ((await both.json()) as { id: string }).id;
  t.equal((await w.take())?.id, id2);
  t.equal((await w.done(id2, { output: 2 })).status, 200);
  await until('the second webhook', async () => hook.received.length === 2);
  await new Promise((resolve) => setTimeout(resolve, 200));
  t.equal(hook.received.length, 2, 'sent once');
});

t.test('webhookV2 is checked as webhook is; two different URLs are refused', async (t) => {
  const a = await startAgent(t, {});
  const ep = await endpoint(a);
  const submit = (body: unknown) => a.req('POST', `/v2/${ep}/run`, { body });
  let r = await submit({ input: {}, webhookV2: 'http://127.0.0.1:9/hook' });
  assertProblem(t, r, 400);
  t.match(r.json?.detail, /^webhookV2 must not point at a loopback, private/);
  t.match(r.json?.errors, [/^\/webhookV2: /]);
  r = await submit({ input: {}, webhookV2: 'ftp://hooks.example.com/x' });
  assertProblem(t, r, 400);
  t.match(r.json?.detail, /^webhookV2 must use http or https/);
  assertProblem(t, await submit({ input: {}, webhookV2: `https://hooks.example.com/${'x'.repeat(2048)}` }), 400);
  assertProblem(t, await submit({ input: {}, webhookV2: 7 }), 400);
  assertProblem(t, await submit({ input: {}, webhookV2: '' }), 400);
  r = await submit({ input: {}, webhook: 'https://hooks.example.com/a', webhookV2: 'https://hooks.example.com/b' });
  assertProblem(t, r, 400);
  t.match(r.json?.detail, /webhook and webhookV2/);
  t.equal((await submit({ input: {}, webhookV2: 'https://hooks.example.com/x' })).status, 200);
});
