/**
 * Order of a take: requeued normal jobs, normal jobs, requeued low-priority jobs, low-priority
 * jobs. A normal job fenced from the asking worker does not keep it from a requeued
 * low-priority one.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

t.test('a fenced normal job does not keep its worker from a requeued low-priority job', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const step = (ms: number) => {
    clock.advance(ms);
    a.agent.queue.reap();
  };
  const w = await TestWorker.create(a, ep);
  const normal = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { kind: 'normal' } } })).json.id as string;
  const low = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { kind: 'low' }, policy: { lowPriority: true } } })).json.id as string;
  const got = await w.takeBatch(2);
  t.same(got.jobs.map((j) => j.id).sort(), [normal, low].sort(), 'the worker runs both');
  step(3001); // both leases lapse: both requeued, fenced from w
  // w is stuck in the normal job's handler (it lists it) and finished the low one.
  t.equal(await w.ping([normal]), 200);
  step(2000);
  t.equal(await w.ping([normal]), 200);
  step(1500); // the low job's fence ran out; the normal job's is renewed by the pings
  const next = await w.take();
  t.equal(next?.id, low, 'the worker gets the requeued low-priority job (before: it did)');
});
