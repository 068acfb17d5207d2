/**
 * RunPod's request body: "Along with an input key, other top-level inputs can also be included
 * [...] If a key is passed in at the top level and not included here, it will be discarded and
 * unavailable to your handler" (runpod/docs, serverless/endpoints/send-requests). A payload
 * written for RunPod that carries another top-level key is accepted and the key dropped: it
 * never reaches the worker, /status or a webhook. The known members are still checked.
 */
import t from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, assertProblem, cpuBody, ADMIN_KEY } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const HEADERS = { authorization: ADMIN_KEY, 'content-type': 'application/json' };

t.test('an unknown top-level key of /run and /runsync is accepted and discarded', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 500 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);

  const r = await fetch(`${a.url}/v2/${ep}/run`, { method: 'POST', headers: HEADERS, body: JSON.stringify({ input: { n: 1 }, stream: true, metadata: { user: 'u1' } }) });
  t.equal(r.status, 200, await r.clone().text());
  const { id, status } = (await r.json()) as { id: string; status: string };
  t.equal(status, 'IN_QUEUE');
  const job = await w.take();
  t.same(job, { id, input: { n: 1 } }, 'the worker gets id and input only');
  t.equal((await w.done(id, { output: 'ok' })).status, 200);
  const s = await a.req('GET', `/v2/${ep}/status/${id}`);
  t.same(Object.keys(s.json).sort(), ['delayTime', 'executionTime', 'id', 'output', 'status', 'workerId']);

  const sync = fetch(`${a.url}/v2/${ep}/runsync?wait=5000`, { method: 'POST', headers: HEADERS, body: JSON.stringify({ input: { n: 2 }, extra: 1 }) });
  const job2 = await w.take();
  t.same(job2?.input, { n: 2 });
  t.equal((await w.done(job2?.id as string, { output: 2 })).status, 200);
  const sr = await sync;
  t.equal(sr.status, 200);
  t.match(await sr.json(), { id: job2?.id, status: 'COMPLETED', output: 2 });
});

t.test('the known members are still checked', async (t) => {
  const a = await startAgent(t, {});
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { extra: 1 } }), 400, 'input still required');
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, extra: 1, policy: { ttl: 'x' } } }), 400, 'a bad policy still refused');
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, extra: 1, webhook: 'not a url' } }), 400, 'a bad webhook still refused');
});

t.test('a policy executionTimeout or ttl under its floor says it is in milliseconds, as an endpoint timeout does', async (t) => {
  // RunPod's console shows both in seconds; its API, like flashd's, takes milliseconds: a client
  // that sends 600 meaning ten minutes is told what 600 is and what it most likely meant.
  const a = await startAgent(t, {});
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const exec = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 600 } } });
  assertProblem(t, exec, 400, 'executionTimeout 600');
  t.same(exec.json.errors, ['/policy/executionTimeout: must be >= 5000 (5 s): it is in milliseconds, so 600 is 0.6 s; did you mean 600000?']);
  t.equal(exec.json.detail, exec.json.errors[0], 'the detail is that one error');
  const ttl = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: {}, policy: { ttl: 3600 } } });
  assertProblem(t, ttl, 400, 'ttl 3600');
  t.same(ttl.json.errors, ['/policy/ttl: must be >= 10000 (10 s): it is in milliseconds, so 3600 is 3.6 s; did you mean 3600000?']);
  const tiny = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 2, ttl: 5 } } });
  t.same(tiny.json.errors, [
    '/policy/executionTimeout: must be >= 5000 (5 s): it is in milliseconds, so 2 is 0.002 s',
    '/policy/ttl: must be >= 10000 (10 s): it is in milliseconds, so 5 is 0.005 s',
  ], 'no suggestion where 1000 times the value is still under the floor; both members named');
  const zero = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 0 } } });
  t.same(zero.json.errors, ['/policy/executionTimeout: must be >= 5000'], '0 was meant in no unit: no hint');
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 0, 'nothing was queued');
});

t.test('null webhook, webhookV2, policy and s3Config are taken as left out', async (t) => {
  // a Python client that builds its body with `"webhook": None`
  const a = await startAgent(t, { takeHoldMs: 500 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const body = { input: { n: 3 }, webhook: null, webhookV2: null, policy: null, s3Config: null };
  const r = await a.req('POST', `/v2/${ep}/run`, { body });
  t.equal(r.status, 200, JSON.stringify(r.json));
  const job = await w.take();
  t.same(job, { id: r.json.id, input: { n: 3 } }, 'no s3Config reaches the worker');
  t.equal((await w.done(r.json.id as string, { output: 'ok' })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${r.json.id}`)).json, { status: 'COMPLETED', output: 'ok' });
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: null, webhookV2: 'not a url' } }), 400, 'the other name still checked');
});

t.test('inside policy too: a null member is left out, and an unknown one is accepted and dropped', async (t) => {
  // a Python client's policy={"ttl": None, ...}, and a client written for a newer RunPod policy field
  const a = await startAgent(t, {});
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 }, timeout: 120000 }) })).json.id as string;
  const nulls = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: null, ttl: null, lowPriority: null } } });
  t.equal(nulls.status, 200, `null members: ${nulls.text.slice(0, 300)}`);
  const newer = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 6000, ttl: 20000, lowPriority: true, newRunPodField: { x: 1 } } } });
  t.equal(newer.status, 200, `an unknown member: ${newer.text.slice(0, 300)}`);
  const bad = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 1000, newRunPodField: 1 } } });
  assertProblem(t, bad, 400, 'a present value is still checked');
  t.same(bad.json.errors, ['/policy/executionTimeout: must be >= 5000 (5 s): it is in milliseconds, so 1000 is 1 s; did you mean 1000000?']);
  assertProblem(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { lowPriority: 'true' } } }), 400, 'and its type');
  await a.agent.close();
  const db = new Database(join(a.dir, 'flashd.db'), { readonly: true });
  const row = (id: string) => db.prepare('SELECT execution_timeout_ms AS e, ttl_ms AS ttl, low_priority AS low FROM jobs WHERE id = ?').get(id);
  t.same(row(nulls.json.id as string), { e: 120000, ttl: 86_400_000, low: 0 }, 'null members take the defaults: the endpoint timeout, 24 h, normal priority');
  t.same(row(newer.json.id as string), { e: 6000, ttl: 20000, low: 1 }, 'the known members beside an unknown one apply');
  db.close();
});
