/**
 * Requests exactly as RunPod's own clients send them (runpod-python's `runpod.Endpoint`, the
 * `runpod-sdk` npm package, curl as RunPod's docs show), against a real flashd.
 */
import t from 'tap';
import { startAgent, assertProblem, cpuBody, ADMIN_KEY, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

async function endpoint(a: TestAgent): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) });
  if (r.status !== 201) throw new Error(r.text);
  return r.json.id as string;
}

/** runpod-sdk 1.1.2's headers (src/index.ts getAuthHeader). */
const SDK_HEADERS = { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', 'user-agent': 'RunPod-JS-SDK/1.1.2 (Unknown Environment)' };

t.test('runpod-sdk runSync: a job not done within ?wait is polled on GET /status-sync/{id}?wait=', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  // runSync(request, 1500): POST /runsync?wait=1500, then GET /status-sync/{id}?wait=<1000–90000>.
  const first = await fetch(`${a.url}/v2/${ep}/runsync?wait=1000`, { method: 'POST', headers: SDK_HEADERS, body: JSON.stringify({ input: { n: 1 } }) });
  t.equal(first.status, 200);
  const { id, status } = (await first.json()) as { id: string; status: string };
  t.equal(status, 'IN_QUEUE', 'no worker took it within the wait');

  const queued = await fetch(`${a.url}/v2/${ep}/status-sync/${id}?wait=1000`, { headers: SDK_HEADERS });
  t.equal(queued.status, 200, 'status-sync is served');
  t.equal(queued.headers.get('content-type'), 'application/json');
  const q = (await queued.json()) as Record<string, unknown>;
  t.equal(q.id, id);
  t.equal(q.status, 'IN_QUEUE', 'still queued after the wait');

  // A poll that is parked when the result arrives answers at once with it.
  const started = Date.now();
  const parked = fetch(`${a.url}/v2/${ep}/status-sync/${id}?wait=60000`, { headers: SDK_HEADERS });
  const job = await w.take();
  t.equal(job?.id, id);
  t.equal((await w.done(id, { output: { text: 'hi' } })).status, 200);
  const done = await parked;
  t.equal(done.status, 200);
  const d = (await done.json()) as Record<string, unknown>;
  t.ok(Date.now() - started < 30_000, 'answered when the job ended, not after the 60 s wait');
  t.equal(d.status, 'COMPLETED');
  t.same(d.output, { text: 'hi' });
  t.equal(d.workerId, w.workerId);
  t.type(d.delayTime, 'number');
  t.type(d.executionTime, 'number');

  const again = await fetch(`${a.url}/v2/${ep}/status-sync/${id}`, { headers: SDK_HEADERS });
  t.equal(again.status, 200, 'a finished job answers at once; wait is optional');
  t.equal(((await again.json()) as { status: string }).status, 'COMPLETED');
});

t.test('status-sync: unknown job, bad wait, another endpoint', async (t) => {
  const a = await startAgent(t);
  const ep = await endpoint(a);
  const other = await endpoint(a);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status-sync/nope?wait=1000`), 404);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status-sync/nope?wait=10`), 400);
  const r = await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  assertProblem(t, await a.req('GET', `/v2/${other}/status-sync/${r.json.id}?wait=1000`), 404, 'a job of another endpoint is not found');
});

/** runpod/go-sdk's getApiResponse: every call has these headers, and an empty body where none is given. */
const GO_HEADERS = { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', 'user-agent': 'Go-http-client/1.1' };

t.test('go-sdk: Status, StatusSync and Stream are POSTs with an empty JSON body', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const go = (path: string) => fetch(`${a.url}/v2/${ep}/${path}`, { method: 'POST', headers: GO_HEADERS, body: '' });
  const run = await fetch(`${a.url}/v2/${ep}/run`, { method: 'POST', headers: GO_HEADERS, body: JSON.stringify({ input: { n: 1 } }) });
  const { id } = (await run.json()) as { id: string };

  const queued = await go(`status/${id}`);
  t.equal(queued.status, 200, 'POST /status is served');
  t.equal(queued.headers.get('content-type'), 'application/json');
  t.match(await queued.json(), { id, status: 'IN_QUEUE' });

  t.equal((await w.take())?.id, id);
  t.equal(await w.stream(id, 'tok-1'), 200);
  const stream = await go(`stream/${id}?wait=1000`);
  t.equal(stream.status, 200, 'POST /stream is served');
  t.same(await stream.json(), { status: 'IN_PROGRESS', stream: [{ output: 'tok-1' }] });

  const parked = go(`status-sync/${id}?wait=30000`);
  t.equal((await w.done(id, { output: 'done' })).status, 200);
  const done = await parked;
  t.equal(done.status, 200, 'POST /status-sync is served');
  t.match(await done.json(), { id, status: 'COMPLETED', output: 'done', workerId: w.workerId });

  t.match(await (await go(`status/${id}`)).json(), { id, status: 'COMPLETED', output: 'done' });
  const missing = await go('status/nope');
  t.equal(missing.status, 404, 'an unknown job is a 404 on POST too');
  t.equal(missing.headers.get('content-type'), 'application/problem+json');
  await missing.arrayBuffer();
  // Still no other method on these paths.
  t.equal((await fetch(`${a.url}/v2/${ep}/status/${id}`, { method: 'DELETE', headers: GO_HEADERS })).status, 405);
});

t.test('go-sdk Stream: /stream?wait= holds an empty poll until a chunk comes, the job ends or wait passes', async (t) => {
  // Stream() loops on POST /stream/{id}?wait=<ms> with no pause of its own: an empty reply at once
  // makes it spin until the endpoint's /stream quota (2000 per 10 s) answers 429 and Stream fails.
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const go = (path: string) => fetch(`${a.url}/v2/${ep}/${path}`, { method: 'POST', headers: GO_HEADERS, body: '' });
  const run = await fetch(`${a.url}/v2/${ep}/run`, { method: 'POST', headers: GO_HEADERS, body: JSON.stringify({ input: {} }) });
  const { id } = (await run.json()) as { id: string };
  t.equal((await w.take())?.id, id);

  let started = Date.now();
  const empty = await go(`stream/${id}?wait=1500`);
  t.same(await empty.json(), { status: 'IN_PROGRESS', stream: [] });
  t.ok(Date.now() - started >= 1400, `an empty poll waited (${Date.now() - started} ms)`);

  started = Date.now();
  const parked = go(`stream/${id}?wait=60000`);
  await new Promise((r) => setTimeout(r, 200));
  t.equal(await w.stream(id, 'tok-1'), 200);
  t.same(await (await parked).json(), { status: 'IN_PROGRESS', stream: [{ output: 'tok-1' }] }, 'woken by the chunk');
  t.ok(Date.now() - started < 30_000, 'answered when the chunk came, not after the wait');

  t.equal(await w.stream(id, 'tok-2'), 200);
  started = Date.now();
  t.same(await (await go(`stream/${id}?wait=60000`)).json(), { status: 'IN_PROGRESS', stream: [{ output: 'tok-2' }] }, 'chunks already there: at once');
  t.ok(Date.now() - started < 30_000);

  const last = go(`stream/${id}?wait=60000`);
  await new Promise((r) => setTimeout(r, 200));
  t.equal((await w.done(id, { output: [] }, true)).status, 200);
  t.same(await (await last).json(), { status: 'COMPLETED', stream: [] }, 'woken by the end of the job');
  t.ok(Date.now() - started < 30_000);

  started = Date.now();
  t.same(await (await go(`stream/${id}?wait=60000`)).json(), { status: 'COMPLETED', stream: [] }, 'a finished job: at once');
  t.ok(Date.now() - started < 30_000);
  // Without ?wait, as runpod-python and runpod-sdk poll: at once, as before.
  started = Date.now();
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json, { status: 'COMPLETED', stream: [] });
});

t.test('/stream?wait=: a client that goes away leaves the chunks for the next poll', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const { id } = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json as { id: string };
  t.equal((await w.take())?.id, id);
  const ac = new AbortController();
  const gone = fetch(`${a.url}/v2/${ep}/stream/${id}?wait=60000`, { headers: SDK_HEADERS, signal: ac.signal }).catch(() => 'aborted');
  await new Promise((r) => setTimeout(r, 200));
  ac.abort();
  t.equal(await gone, 'aborted');
  await new Promise((r) => setTimeout(r, 200));
  t.equal(await w.stream(id, 'kept'), 200);
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json, { status: 'IN_PROGRESS', stream: [{ output: 'kept' }] });
});
