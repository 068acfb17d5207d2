/**
 * `delayTime` is the time a job waited in the queue for a worker (RunPod: "the duration a
 * request spends waiting in the queue before it is picked up by a worker"); `executionTime` the
 * time its last run took. A job requeued after its worker lost it (a lapsed lease, a dead
 * worker) waited twice: its delayTime is both waits, never the time the lost run held it, and
 * that survives a restart. TTL still counts from the submit (or the last /retry).
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const LEASE = 3000;

async function setup(t: Test, dir = testDataDir(t), clock = new ManualClock()) {
  const a = await startAgent(t, { takeHoldMs: 200, leaseMs: LEASE, maxAttempts: 3 }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  return { a, dir, clock, ep };
}

const status = async (a: TestAgent, ep: string, id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json;

/** Takes `id` with `w`, then lets its lease lapse (held `heldMs` in all) so the reaper requeues it. */
async function loseLease(t: Test, a: TestAgent, clock: ManualClock, w: TestWorker, id: string, heldMs = LEASE + 500): Promise<void> {
  t.equal((await w.take())?.id, id, `${w.workerId} takes the job`);
  clock.advance(heldMs);
  a.agent.queue.reap();
  await a.agent.queue.durable();
}

t.test('a job requeued after a lost lease: delayTime is its time in the queue, not the lost run', async (t) => {
  const { a, clock, ep } = await setup(t);
  const [w1, w2] = [await TestWorker.create(a, ep), await TestWorker.create(a, ep)];
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  clock.advance(300);
  await loseLease(t, a, clock, w1, id);
  let s = await status(a, ep, id);
  t.match(s, { status: 'IN_QUEUE', delayTime: 300, executionTime: 0, retries: 1 }, 'just requeued: the 300 ms it waited before the first run');
  clock.advance(200);
  t.equal((await status(a, ep, id)).delayTime, 500, 'and the wait since the requeue adds to it');
  t.equal((await w2.take())?.id, id);
  clock.advance(100);
  t.match((await status(a, ep, id)), { status: 'IN_PROGRESS', delayTime: 500, executionTime: 100 }, 'running again');
  t.equal((await w2.done(id, { output: 'ok' })).status, 200);
  s = await status(a, ep, id);
  t.match(s, { status: 'COMPLETED', delayTime: 500, executionTime: 100, retries: 1 }, 'final: both waits, and the run that finished it');
});

t.test('the requeued wait survives a restart, queued or running again', async (t) => {
  const { a, dir, clock, ep } = await setup(t);
  const [w1, w2] = [await TestWorker.create(a, ep), await TestWorker.create(a, ep)];
  const queued = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 'queued' } } })).json.id as string;
  const running = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 'running' } } })).json.id as string;
  clock.advance(100);
  await loseLease(t, a, clock, w1, queued);
  await loseLease(t, a, clock, w1, running, LEASE + 1000);
  // queued: waited 100 ms, its run held it 3500, then it waited again while
  // `running` ran (4000). running: waited 3600 behind it, then its own run held it 4000.
  t.equal((await status(a, ep, queued)).delayTime, 4100, 'queued: the first wait and the time since its requeue');
  t.equal((await status(a, ep, running)).delayTime, 3600, 'running: its one wait so far');
  const taken = [(await w2.take())?.id, (await w2.take())?.id].sort();
  t.same(taken, [queued, running].sort(), 'w2 takes both');
  clock.advance(300); // past the claim-save delay
  a.agent.queue.reap();
  await a.agent.close(); // a clean stop writes every claim

  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: LEASE }, { clock, dir });
  const w2b = w2.rebase(a.url, b.url);
  t.match(await status(b, ep, queued), { status: 'IN_PROGRESS', delayTime: 4100, executionTime: 300 }, 'after the restart, running again');
  t.equal((await w2b.done(queued, { output: 1 })).status, 200);
  t.match(await status(b, ep, queued), { status: 'COMPLETED', delayTime: 4100, executionTime: 300 });
  t.match(await status(b, ep, running), { status: 'IN_PROGRESS', delayTime: 3600, executionTime: 300 });
  await b.agent.close();
});

t.test('a requeued job still queued at a restart keeps its wait; its TTL still counts from the submit', async (t) => {
  const { a, dir, clock, ep } = await setup(t);
  const [w1, w2] = [await TestWorker.create(a, ep), await TestWorker.create(a, ep)];
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 }, policy: { ttl: 10_000 } } })).json.id as string;
  clock.advance(250);
  await loseLease(t, a, clock, w1, id);
  clock.advance(50);
  t.equal((await status(a, ep, id)).delayTime, 300);
  await a.agent.close();

  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: LEASE }, { clock, dir });
  t.match(await status(b, ep, id), { status: 'IN_QUEUE', delayTime: 300, retries: 1 }, 'the same wait after the restart');
  clock.advance(10_000 - 250 - (LEASE + 500) - 50); // exactly the TTL since the submit
  b.agent.queue.reap();
  await b.agent.queue.durable();
  const s = await status(b, ep, id);
  t.match(s, { status: 'TIMED_OUT', executionTime: 0 }, 'TTL counts from the submit, not the requeue');
  t.equal(s.delayTime, 10_000 - (LEASE + 500), 'its delayTime is the TTL less the lost run');
  t.equal(await w2.rebase(a.url, b.url).take(), null);
  await b.agent.close();
});

t.test('FAILED after the last attempt: delayTime is the waits of all attempts', async (t) => {
  const { a, clock, ep } = await setup(t);
  const ws = [await TestWorker.create(a, ep), await TestWorker.create(a, ep), await TestWorker.create(a, ep)];
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  for (const w of ws) {
    clock.advance(100);
    await loseLease(t, a, clock, w, id);
  }
  const s = await status(a, ep, id);
  t.match(s, { status: 'FAILED', delayTime: 300, executionTime: LEASE + 500, retries: 2 }, 'three waits of 100 ms; the last run');
});

t.test('a /retry starts a new run: delayTime counts from the retry, whatever earlier runs lost', async (t) => {
  const { a, clock, ep } = await setup(t);
  const [w1, w2] = [await TestWorker.create(a, ep), await TestWorker.create(a, ep)];
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  await loseLease(t, a, clock, w1, id);
  t.equal((await w2.take())?.id, id);
  clock.advance(100);
  t.equal((await w2.done(id, { error: 'boom' })).status, 200);
  clock.advance(1000);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).json.status, 'IN_QUEUE');
  clock.advance(400);
  t.match(await status(a, ep, id), { status: 'IN_QUEUE', delayTime: 400, executionTime: 0, retries: 2 });
  t.equal((await w2.take())?.id, id);
  clock.advance(50);
  t.equal((await w2.done(id, { output: 'again' })).status, 200);
  t.match(await status(a, ep, id), { status: 'COMPLETED', delayTime: 400, executionTime: 50 });
});
