/**
 * `/health` `jobs` after each way a job can end or go back to the queue, and across a restart:
 * `failed` counts FAILED and TIMED_OUT, a CANCELLED job is in no counter, `retried` sums the
 * requeues and /retries of the jobs queued, running or whose results are still kept.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

t.test('health job counters through requeue, cancel, timeouts, retry, restart and expiry', async (t) => {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000, maxAttempts: 3 }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const [w1, w2] = [await TestWorker.create(a, ep), await TestWorker.create(a, ep)];
  const health = async (agent = a) => (await agent.req('GET', `/v2/${ep}/health`)).json.jobs;
  const run = async (body: Record<string, unknown> = {}) => (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, ...body } })).json.id as string;

  // A lost lease: requeued, counted in retried while queued and once it completes.
  const r = await run();
  t.equal((await w1.take())?.id, r);
  clock.advance(3500);
  a.agent.queue.reap();
  t.same(await health(), { completed: 0, failed: 0, inProgress: 0, inQueue: 1, retried: 1 }, 'requeued');
  t.equal((await w2.take())?.id, r);
  t.same(await health(), { completed: 0, failed: 0, inProgress: 1, inQueue: 0, retried: 1 }, 'running again');
  await w2.done(r, { output: 1 });
  t.same(await health(), { completed: 1, failed: 0, inProgress: 0, inQueue: 0, retried: 1 }, 'completed');

  // Cancelled queued and running: in no counter.
  const cq = await run();
  await a.req('POST', `/v2/${ep}/cancel/${cq}`);
  const cr = await run();
  t.equal((await w2.take())?.id, cr);
  await a.req('POST', `/v2/${ep}/cancel/${cr}`);
  t.same(await health(), { completed: 1, failed: 0, inProgress: 0, inQueue: 0, retried: 1 }, 'cancelled jobs are in no counter');

  // TIMED_OUT in the queue (TTL) and running (executionTimeout): failed.
  const tq = await run({ policy: { ttl: 10_000 } });
  clock.advance(10_000);
  a.agent.queue.reap();
  const tr = await run({ policy: { executionTimeout: 5000 } });
  t.equal((await w2.take())?.id, tr);
  await w2.ping([tr]);
  clock.advance(2500);
  await w2.ping([tr]);
  clock.advance(2500);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${tq}`)).json.status, 'TIMED_OUT');
  t.equal((await a.req('GET', `/v2/${ep}/status/${tr}`)).json.status, 'TIMED_OUT');
  t.same(await health(), { completed: 1, failed: 2, inProgress: 0, inQueue: 0, retried: 1 }, 'TIMED_OUT counts as failed');

  // A handler error, then /retry: out of failed, into retried, then completed.
  const f = await run();
  t.equal((await w1.take())?.id, f);
  await w1.done(f, { error: 'boom' });
  t.same(await health(), { completed: 1, failed: 3, inProgress: 0, inQueue: 0, retried: 1 }, 'FAILED');
  await a.req('POST', `/v2/${ep}/retry/${f}`);
  t.same(await health(), { completed: 1, failed: 2, inProgress: 0, inQueue: 1, retried: 2 }, 'retried: queued again');
  t.equal((await w1.take())?.id, f);
  await w1.done(f, { output: 2 });
  const before = await health();
  t.same(before, { completed: 2, failed: 2, inProgress: 0, inQueue: 0, retried: 2 }, 'the retried job completed');

  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  t.same(await health(b), before, 'the same counters after a restart');

  // Results expire (30 min for /run): the counters fall with them.
  clock.advance(30 * 60_000 + 1000);
  b.agent.queue.expire();
  await b.agent.queue.durable();
  t.same(await health(b), { completed: 0, failed: 0, inProgress: 0, inQueue: 0, retried: 0 }, 'expired results leave the counters');
  await b.agent.close();
});

t.test('after a restart, results that expired and queued jobs whose TTL ran out while flashd was down are out of the counts at once', async (t) => {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const done = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, done);
  await w.done(done, { output: 1 });
  const queued = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { ttl: 60_000 } } })).json.id as string;
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.jobs, { completed: 1, failed: 0, inProgress: 0, inQueue: 1, retried: 0 });
  await a.agent.close();

  // Down past the result's 30 minutes and the queued job's TTL.
  clock.advance(30 * 60_000 + 1000);
  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  const [health, status] = await Promise.all([b.req('GET', `/v2/${ep}/health`), b.req('GET', `/v2/${ep}/status/${done}`)]);
  t.equal(status.status, 404, 'the expired result is gone');
  t.same(health.json.jobs, { completed: 0, failed: 1, inProgress: 0, inQueue: 0, retried: 0 }, 'and out of completed; the expired queued job is failed, not queued');
  t.equal((await b.req('GET', `/v2/${ep}/status/${queued}`)).json.status, 'TIMED_OUT');
  await b.agent.close();
});
