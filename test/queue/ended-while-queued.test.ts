/**
 * Jobs that end while queued (cancelled, expired in the queue) leave their endpoint's deque
 * even when no worker takes from it: the reaper compacts a deque that holds more ended jobs
 * than live ones, so their records go once their results expire.
 */
import t from 'tap';
import v8 from 'node:v8';
import vm from 'node:vm';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;
const settle = async () => {
  for (let i = 0; i < 5; i++) {
    gc();
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
};

t.test('cancelled and queue-expired jobs are let go with no worker taking, and the live ones keep their order', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { sqliteSynchronous: 'normal', takeHoldMs: 300 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const submit = (ttlMs: number, input = '{}') =>
    a.agent.queue.submit({ endpointId: ep, input, extra: null, webhook: null, executionTimeoutMs: 600_000, ttlMs, lowPriority: false, retentionMs: 60_000 });
  const N = 3000;
  const first = await submit(86_400_000, '{"live":1}');
  const cancelled = await Promise.all(Array.from({ length: N }, () => submit(86_400_000)));
  await Promise.all(cancelled.map((j) => a.agent.queue.cancel(ep, j.id)));
  const expiring = await Promise.all(Array.from({ length: N }, () => submit(10_000)));
  const last = await submit(86_400_000, '{"live":2}');
  const refs = [...cancelled, ...expiring].map((j) => new WeakRef(j));
  cancelled.length = 0;
  expiring.length = 0;
  clock.advance(11_000);
  a.agent.queue.reap(); // the queued jobs past their TTL end TIMED_OUT, a slice per pass
  for (let i = 0; i < 20 && (a.agent.queue.health(ep).jobs.inQueue ?? 0) > 2; i++) await new Promise((resolve) => setImmediate(resolve));
  await a.agent.queue.durable();
  clock.advance(61_000); // and every result expires
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal(a.agent.queue.health(ep).jobs.inQueue, 2, 'two live jobs queued');
  await settle();
  t.equal(refs.filter((r) => r.deref() !== undefined).length, 0, 'no ended job is still referenced');
  const w = await TestWorker.create(a, ep);
  t.equal((await w.take())?.id, first.id, 'the live jobs are taken in order');
  t.equal((await w.take())?.id, last.id);
});
