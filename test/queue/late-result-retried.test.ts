/**
 * A late result for an attempt flashd ended while the worker held it (a timeout, a cancel,
 * attempts used up) is discarded with a 200 (runpod-python logs every 4xx on a result post as an
 * ERROR), also when the job has since been retried: queued again, or taken by another worker.
 * It got 409 STALE_ATTEMPT once a /retry had queued the job. The new run is untouched: the late
 * result never completes it, and its chunk posts and pings change nothing. A result from a worker
 * that lost its lease (no end by flashd) still gets 409.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const LEASE = 3000;

t.test('a late result of a timed-out attempt after a /retry is discarded with a 200, and the new run is untouched', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 100, leaseMs: LEASE }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const w2 = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 }, policy: { executionTimeout: 5000 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal(await w.ping([id]), 200);
  clock.advance(2500);
  t.equal(await w.ping([id]), 200);
  clock.advance(2600);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'TIMED_OUT');
  const retry = await a.req('POST', `/v2/${ep}/retry/${id}`);
  t.equal(retry.status, 200, retry.text);
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'IN_QUEUE', retries: 1, workerId: '' });

  // The first run's worker still runs it: its heartbeat, a chunk and its result.
  t.equal(await w.ping([id]), 200, 'a ping listing the old attempt');
  t.equal(await w.stream(id, 'old chunk'), 200, 'a chunk of the old attempt: 200');
  const late = await w.done(id, { output: { old: true } });
  t.equal(late.status, 200, JSON.stringify(late.json));
  t.match(late.json, { ok: true, discarded: true });
  const again = await w.done(id, { output: { old: true } });
  t.match(again, { status: 200, json: { discarded: true } }, 'a re-post of it (lost answer) too');
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'IN_QUEUE', retries: 1, workerId: '' }, 'the new run is untouched');
  t.notOk((await a.req('GET', `/v2/${ep}/status/${id}`)).json.output);
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream, [], 'the old chunk is not in the new run');

  // Another worker takes the new run: the old worker's late posts still change nothing.
  t.equal((await w2.take())?.id, id);
  t.match(await w.done(id, { output: { old: 2 } }), { status: 200, json: { discarded: true } }, 'late result while another worker runs it');
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'IN_PROGRESS', workerId: w2.workerId });
  t.equal((await w2.done(id, { output: { new: true } })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', workerId: w2.workerId, output: { new: true } });
  t.match(await w.done(id, { output: { old: 3 } }), { status: 200, json: { discarded: true } }, 'and once the new run completed');
  t.same((await a.req('GET', `/v2/${ep}/status/${id}`)).json.output, { new: true });
});

t.test('a result after a lost lease is still a 409, with or without a later run', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 100, leaseMs: LEASE }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const w2 = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  clock.advance(LEASE + 1);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'IN_QUEUE', retries: 1 });
  t.equal((await w.done(id, { output: 1 })).status, 409, 'queued again after the lost lease');
  t.equal((await w2.take())?.id, id);
  t.equal((await w.done(id, { output: 1 })).status, 409, 'taken by another worker');
  t.equal((await w2.done(id, { output: 2 })).status, 200);
  t.same((await a.req('GET', `/v2/${ep}/status/${id}`)).json.output, 2);
});

t.test('the worker that ran the timed-out attempt takes the retried run once it let go: its result completes it', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 100, leaseMs: LEASE }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 3 }, policy: { executionTimeout: 5000 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal(await w.ping([id]), 200);
  clock.advance(5100);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
  t.same(await w.stops(), [id], 'told to stop the old attempt');
  clock.advance(1000);
  t.equal(await w.ping([]), 200, 'it let go of the old attempt');
  t.equal((await w.take())?.id, id, 'the new run goes to it');
  t.equal((await w.done(id, { output: 'new' })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', output: 'new', workerId: w.workerId });
});
