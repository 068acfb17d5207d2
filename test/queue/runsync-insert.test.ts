/**
 * A /runsync job is written once, by its final state, when it finishes within 100 ms; a slower
 * one is inserted after 100 ms, and its row is durable before the caller is told its id.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

const rowOf = (a: TestAgent, id: string) =>
  a.agent.db.prepare('SELECT status, input, output, worker_id AS workerId, attempt, started_at AS startedAt FROM jobs WHERE id = ?').get(id) as
    { status: string; input: string; output: string | null; workerId: string | null; attempt: number; startedAt: number | null } | undefined;

async function setup(t: Parameters<typeof startAgent>[0], dir?: string, clock?: ManualClock) {
  const a = await startAgent(t, { takeHoldMs: 2000 }, { ...(dir ? { dir } : {}), ...(clock ? { clock } : {}) });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  return { a, ep, w: await TestWorker.create(a, ep) };
}

t.test('a quick /runsync job has no row until its final state, which is written whole', async (t) => {
  const { a, ep, w } = await setup(t);
  const reply = a.req('POST', `/v2/${ep}/runsync`, { body: { input: { quick: 1 } } });
  const job = await w.take();
  t.ok(job);
  await a.agent.queue.durable();
  t.equal(rowOf(a, job!.id), undefined, 'running, not written yet');
  t.equal((await w.done(job!.id, { output: { ok: true } })).status, 200);
  const r = await reply;
  t.equal(r.json.status, 'COMPLETED');
  t.match(rowOf(a, job!.id), { status: 'COMPLETED', input: '{"quick":1}', output: '{"ok":true}', workerId: w.workerId, attempt: 1 },
    'one row with the input, the result and the claim');
  t.type(rowOf(a, job!.id)?.startedAt, 'number');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.jobs, { completed: 1, inQueue: 0, inProgress: 0 });
});

t.test('a slower /runsync job is inserted after 100 ms, and is written before ?wait gives its id away', async (t) => {
  const { a, ep, w } = await setup(t);
  const reply = a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { slow: 1 } } });
  const job = await w.take();
  await until('the deferred insert', async () => rowOf(a, job!.id) !== undefined, 2000);
  t.match(rowOf(a, job!.id), { input: '{"slow":1}' }, 'inserted while it runs');
  const r = await reply;
  t.equal(r.json.status, 'IN_PROGRESS', 'the wait ran out');
  t.equal(r.json.id, job!.id);
  t.equal(rowOf(a, job!.id)?.status, 'IN_PROGRESS', 'its claim is written too');
  t.equal((await w.done(job!.id, { output: 2 })).status, 200);
  t.equal((await a.req('GET', `/v2/${ep}/status/${job!.id}`)).json.output, 2);
});

t.test('a queued /runsync job whose wait runs out is in SQLite when the caller gets its id', async (t) => {
  // On a clock that does not move, the deferred insert never comes due: the wait's end writes it.
  const { a, ep } = await setup(t, undefined, new ManualClock());
  const r = await a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { waiting: 1 } } });
  t.equal(r.json.status, 'IN_QUEUE');
  t.match(rowOf(a, r.json.id), { status: 'IN_QUEUE', input: '{"waiting":1}' }, 'written before the reply');
});

t.test('a clean stop writes deferred /runsync jobs, and the restart runs them', async (t) => {
  const dir = testDataDir(t);
  const { a, ep, w } = await setup(t, dir);
  const reply = a.req('POST', `/v2/${ep}/runsync`, { body: { input: { across: 'restart' } } }).catch(() => undefined);
  await until('the job is queued', async () => (await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue === 1, 2000);
  await a.agent.close();
  await reply;
  const b = await startAgent(t, { takeHoldMs: 2000 }, { dir });
  const w2 = w.rebase(a.url, b.url);
  t.same((await w2.take())?.input, { across: 'restart' }, 'queued again after the restart');
});

t.test('a lost lease requeues a /runsync job that was never written, writing it first', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 2000, leaseMs: 1000 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const reply = a.req('POST', `/v2/${ep}/runsync?wait=3000`, { body: { input: { lease: 1 } } });
  const job = await w.take();
  t.equal(rowOf(a, job!.id), undefined);
  clock.advance(1001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.match(rowOf(a, job!.id), { status: 'IN_QUEUE', input: '{"lease":1}' }, 'requeued, and written');
  await w.ping([]); // it let go of the job, so it may take it again
  const again = await w.take();
  t.equal(again?.id, job!.id);
  await w.done(job!.id, { output: 'second' });
  t.equal((await reply).json.output, 'second');
});
