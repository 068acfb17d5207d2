/**
 * Leases, execution timeouts, TTL and retention, on a manual clock: the test moves time and
 * runs the reaper, so nothing sleeps for a lease to expire.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, assertProblem, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

async function setup(t: Test, overrides: Record<string, unknown> = {}, epExtra: Record<string, unknown> = {}) {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000, ...overrides }, { clock });
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 }, ...epExtra }) });
  const ep = r.json.id as string;
  const step = (ms: number) => {
    clock.advance(ms);
    a.agent.queue.reap();
  };
  return { a, ep, clock, step, worker: () => TestWorker.create(a, ep) };
}

const status = async (a: TestAgent, ep: string, id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json;

t.test('a lost lease puts the job back; the old worker is fenced off and told to stop', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const w1 = await worker();
  const w2 = await worker();
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { k: 1 } } })).json.id;
  await w1.take();
  step(2000);
  t.equal((await w1.ping([id])), 200);
  step(2000);
  t.equal((await status(a, ep, id)).status, 'IN_PROGRESS', 'a ping renewed the lease');
  step(3001);
  const back = await status(a, ep, id);
  t.equal(back.status, 'IN_QUEUE', 'no heartbeat for a lease: back in the queue');
  t.equal(back.retries, 1);
  const again = await w2.take();
  t.same(again, { id, input: { k: 1 } }, 'same id and input for the next worker');
  await w1.ping([id]);
  t.same(await w1.stops(), [id], 'the first worker is told to stop the job');
  t.equal((await w1.done(id, { output: 'zombie' })).status, 409, "the first worker's late result is refused");
  await w1.ping([id]);
  step(1000);
  t.same(await w1.stops(), [], 'and once it posted for the job, a heartbeat made before that brings no stop back');
  t.equal((await w2.done(id, { output: 'real' })).status, 200);
  const final = await status(a, ep, id);
  t.equal(final.status, 'COMPLETED');
  t.equal(final.output, 'real', 'exactly one result recorded');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.retried, 1);
});

t.test('a job whose workers keep losing it fails after maxAttempts', async (t) => {
  const { a, ep, step, worker } = await setup(t, { maxAttempts: 2 });
  const w1 = await worker();
  const w2 = await worker();
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id;
  await w1.take();
  step(3001);
  t.equal((await w2.take())?.id, id, 'the second attempt');
  step(3001);
  const s = await status(a, ep, id);
  t.equal(s.status, 'FAILED');
  t.match(s.error, /gave up after 2 attempts/);
  t.equal(await w1.take(), null, 'not queued again');
  t.same(await w2.stops(), [id], 'the worker that held it last is told to stop it');
});

t.test('a job whose lease lapsed is not handed back to the same worker until it lets go of it', async (t) => {
  // RunPod's protocol carries no attempt number: were the job given back to the worker that may
  // still run it, that run's late result could not be told from the new attempt's.
  const { a, ep, step, worker } = await setup(t);
  const w = await worker();
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { f: 1 } } })).json.id;
  await w.take();
  step(3001);
  t.equal((await status(a, ep, id)).status, 'IN_QUEUE', 'requeued');
  t.equal(await w.take(), null, 'not back to the worker that lost it');
  t.equal(await w.ping([id]), 200);
  t.same(await w.stops(), [id], 'which is told to stop it');
  t.equal(await w.take(), null, 'still not, while its pings list the job');
  const other = await worker();
  t.same(await other.take(), { id, input: { f: 1 } }, 'another worker gets it at once');
  t.equal((await w.done(id, { output: 'old run' })).status, 409, "the old run's result is refused");
  t.equal((await other.done(id, { output: 'new run' })).status, 200);
  t.equal((await status(a, ep, id)).output, 'new run');

  const id2 = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { f: 2 } } })).json.id;
  await w.take();
  step(3001);
  t.equal(await w.ping([]), 200, 'a ping that no longer lists the job: the worker let go');
  t.same(await w.take(), { id: id2, input: { f: 2 } }, 'so it may take it again');
  t.equal((await w.done(id2, { output: 2 })).status, 200);

  const id3 = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { f: 3 } } })).json.id;
  await w.take();
  step(3001);
  const parked = w.take();
  await until('the take to park', async () => a.agent.queue.workers.get(ep, w.workerId)?.parked === 1);
  step(3001); // a lease period later the fence runs out: the reaper hands it to the parked take
  t.same(await parked, { id: id3, input: { f: 3 } }, 'or a lease period later, without a ping');
  t.equal((await w.done(id3, { output: 3 })).status, 200);

  const id4 = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { f: 4 } } })).json.id;
  await w.take();
  step(3001);
  for (let i = 0; i < 3; i++) {
    t.equal(await w.ping([id4]), 200);
    step(2000);
  }
  t.equal(await w.take(), null, 'no: while its pings still list the job, the fence lasts past a lease period');
  t.equal(await w.ping([]), 200);
  t.same(await w.take(), { id: id4, input: { f: 4 } });
});

t.test('a job running past the endpoint timeout or policy.executionTimeout is TIMED_OUT', async (t) => {
  const { a, ep, step, worker } = await setup(t, { leaseMs: 600_000 }, { timeout: 20_000 });
  const w = await worker();
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id;
  await w.take();
  step(19_000);
  t.equal((await status(a, ep, id)).status, 'IN_PROGRESS');
  step(1001);
  const s = await status(a, ep, id);
  t.equal(s.status, 'TIMED_OUT');
  t.same(await w.stops(), [id], 'the worker is told to stop');
  const late = await w.done(id, { output: 'late' });
  t.match([late.status, late.json], [200, { discarded: true }], 'its late result is discarded without an error');
  t.equal((await status(a, ep, id)).status, 'TIMED_OUT', 'and changes nothing');
  const r = await a.req('POST', `/v2/${ep}/retry/${id}`);
  t.equal(r.json.status, 'IN_QUEUE', 'TIMED_OUT jobs can be retried');
  await w.take();
  const id2 = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 5000 } } })).json.id;
  t.equal((await w.take())?.id, id2);
  step(5001);
  t.equal((await status(a, ep, id2)).status, 'TIMED_OUT', 'policy.executionTimeout overrides the endpoint timeout');
});

t.test('policy.ttl bounds the time in the queue', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { ttl: 10_000 } } })).json.id;
  step(9_000);
  t.equal((await status(a, ep, id)).status, 'IN_QUEUE');
  step(1001);
  const s = await status(a, ep, id);
  t.equal(s.status, 'TIMED_OUT');
  t.match(s.error, /expired in the queue/);
  const w = await worker();
  t.equal(await w.take(), null, 'an expired job is never handed out');
});

t.test('queued jobs with different TTLs expire each at its own deadline, whichever was queued first', async (t) => {
  // The reaper skips the walk of a backlog until the earliest TTL deadline can have passed:
  // that bound must fall with every shorter-lived job queued, and be found again after a walk.
  const { a, ep, step } = await setup(t);
  const run = async (ttl: number) => (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { ttl } } })).json.id as string;
  const long = await run(60_000);
  const short = await run(20_000);
  step(19_000);
  t.equal((await status(a, ep, short)).status, 'IN_QUEUE');
  step(1_001);
  t.equal((await status(a, ep, short)).status, 'TIMED_OUT', 'the short one, queued after the long one, expired on time');
  t.equal((await status(a, ep, long)).status, 'IN_QUEUE');
  const shorter = await run(10_000);
  step(10_001);
  t.equal((await status(a, ep, shorter)).status, 'TIMED_OUT', 'a job queued after the walk lowers the bound again');
  t.equal((await status(a, ep, long)).status, 'IN_QUEUE');
  step(30_000);
  t.equal((await status(a, ep, long)).status, 'TIMED_OUT', 'and the long one expires at its own deadline');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 0);
});

t.test('results are kept 30 min after /run, 1 min after /runsync (up to 5 with ?wait), or ?ttl', async (t) => {
  const { a, ep, step, worker } = await setup(t, { takeHoldMs: 2000 });
  const w = await worker();
  const serve = async () => {
    const job = await w.take();
    if (job) await w.done(job.id, { output: 'ok' });
  };
  const runId = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id;
  await serve();
  const [sync] = await Promise.all([a.req('POST', `/v2/${ep}/runsync`, { body: { input: {} } }), serve()]);
  const [waited] = await Promise.all([a.req('POST', `/v2/${ep}/runsync?wait=120000`, { body: { input: {} } }), serve()]);
  const ttlId = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id;
  await serve();
  t.equal((await a.req('GET', `/v2/${ep}/status/${ttlId}?ttl=5000`)).status, 200);
  step(5001);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status/${ttlId}`), 404, '?ttl shortened the retention');
  step(55_000);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status/${sync.json.id}`), 404, 'runsync result gone after 1 min');
  t.equal((await a.req('GET', `/v2/${ep}/status/${waited.json.id}`)).status, 200, 'runsync with wait=120000 keeps it longer');
  step(60_000);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status/${waited.json.id}`), 404);
  t.equal((await a.req('GET', `/v2/${ep}/status/${runId}`)).status, 200, '/run result still there');
  step(30 * 60_000);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status/${runId}`), 404, '/run result gone after 30 min');
  assertProblem(t, await a.req('POST', `/v2/${ep}/retry/${runId}`), 404, 'expired jobs cannot be retried');
  a.agent.queue.expire();
  await new Promise((r) => setImmediate(r));
  await new Promise((r) => setImmediate(r));
  const left = a.agent.db.prepare('SELECT count(*) AS n FROM jobs WHERE endpoint_id = ?').get(ep) as { n: number };
  t.equal(left.n, 0, 'expired rows are deleted');
});

t.test('a restart keeps queued jobs in order and lets a surviving worker finish its job', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id;
  const w = await TestWorker.create(a, ep);
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) ids.push((await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).json.id);
  const running = await w.take();
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const w2 = w.rebase(a.url, b.url);
  t.equal((await b.req('GET', `/v2/${ep}/status/${ids[0]}`)).json.status, 'IN_PROGRESS', 'the running job is reclaimed with its worker');
  t.equal((await w2.done(running!.id, { output: 'survived' })).status, 200, 'the worker that outlived the restart finishes it');
  const next = [];
  for (let i = 0; i < 4; i++) next.push((await w2.take())?.input);
  t.same(next, [{ i: 1 }, { i: 2 }, { i: 3 }, { i: 4 }], 'queued jobs come back in order');
  t.equal((await b.req('GET', `/v2/${ep}/status/${ids[0]}`)).json.output, 'survived');
});

t.test('deleting an endpoint removes its jobs and logs', async (t) => {
  const { a, ep } = await setup(t);
  await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  a.agent.logs.append(ep, null, 'system', 'hello');
  await new Promise((r) => setImmediate(r));
  // (The 1 s loop may add its line that the job waits with workers.max 0.)
  t.equal(((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).filter((l) => l.line === 'hello').length, 1);
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  const jobs = a.agent.db.prepare('SELECT count(*) AS n FROM jobs WHERE endpoint_id = ?').get(ep) as { n: number };
  const logs = a.agent.db.prepare('SELECT count(*) AS n FROM endpoint_logs WHERE endpoint_id = ?').get(ep) as { n: number };
  t.same([jobs.n, logs.n], [0, 0]);
});

t.test('a claim is written once the job has run 100 ms, or by its final state', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const row = (id: string) => a.agent.db.prepare('SELECT status, attempt, worker_id AS workerId, started_at AS startedAt FROM jobs WHERE id = ?').get(id) as
    { status: string; attempt: number; workerId: string | null; startedAt: number | null };
  const slow = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { k: 'slow' } } })).json.id as string;
  t.equal((await w.take())?.id, slow);
  await a.agent.queue.durable();
  t.equal(row(slow).status, 'IN_QUEUE', 'right after the take the claim is not written yet');
  t.equal((await status(a, ep, slow)).status, 'IN_PROGRESS', 'though the job is running');
  await new Promise((r) => setTimeout(r, 250));
  await a.agent.queue.durable();
  t.match(row(slow), { status: 'IN_PROGRESS', attempt: 1, workerId: w.workerId }, 'a job still running after 100 ms has its claim written');

  const quick = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { k: 'quick' } } })).json.id as string;
  t.equal((await w.take())?.id, quick);
  t.equal((await w.done(quick, { output: 1 })).status, 200);
  const r = row(quick);
  t.match(r, { status: 'COMPLETED', attempt: 1, workerId: w.workerId }, 'a quick job is written once, claim included');
  t.type(r.startedAt, 'number');
});

t.test('health counts of finished jobs survive a restart and leave with retries and expiry', async (t) => {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const ids: string[] = [];
  for (let i = 0; i < 4; i++) ids.push((await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).json.id);
  await w.take();
  await w.done(ids[0] as string, { output: 1 });
  await w.take();
  await w.done(ids[1] as string, { output: 2 });
  await w.take();
  await w.done(ids[2] as string, { error: 'no' });
  const health = async (x: TestAgent) => (await x.req('GET', `/v2/${ep}/health`)).json.jobs;
  t.match(await health(a), { completed: 2, failed: 1, inQueue: 1, retried: 0 });
  t.same(a.agent.db.prepare('SELECT status, jobs FROM job_counts WHERE endpoint_id = ? ORDER BY status').all(ep),
    [{ status: 'COMPLETED', jobs: 2 }, { status: 'FAILED', jobs: 1 }], 'kept in job_counts, committed with the results');

  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300 }, { clock, dir });
  t.match(await health(b), { completed: 2, failed: 1, inQueue: 1, retried: 0 }, 'the same after a restart');
  t.equal((await b.req('POST', `/v2/${ep}/retry/${ids[2]}`)).status, 200);
  t.match(await health(b), { completed: 2, failed: 0, inQueue: 2, retried: 1 }, 'a retried job leaves failed and counts in retried');

  clock.advance(31 * 60_000);
  b.agent.queue.expire();
  await b.agent.queue.durable();
  t.match(await health(b), { completed: 0, failed: 0, inQueue: 2, retried: 1 }, 'expired results leave the counts');
});

t.test('deleting an endpoint with many rows deletes them in slices, leaving other endpoints alone', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const mk = async () => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const gone = await mk();
  const kept = await mk();
  const keptJob = (await a.req('POST', `/v2/${kept}/run`, { body: { input: { keep: 1 } } })).json.id as string;
  // Finished rows as a busy endpoint leaves them (written directly: the HTTP path is not under test).
  const insert = a.agent.db.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, created_at, completed_at, expires_at)
    VALUES (?, ?, 'COMPLETED', '{}', 1000, 1000, 1000, 0, 0, 9999999999999)`);
  a.agent.db.transaction(() => {
    for (let i = 0; i < 45_000; i++) insert.run(`bulk-${i}`, i % 9 === 0 ? kept : gone);
  })();
  const count = (ep: string) => (a.agent.db.prepare('SELECT count(*) AS n FROM jobs WHERE endpoint_id = ?').get(ep) as { n: number }).n;
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  t.ok(count(gone) > 0, 'a large table is not deleted in one go');
  await until('every row of the deleted endpoint', async () => count(gone) === 0, 10_000);
  t.equal(count(kept), 5001, 'the other endpoint keeps its rows');
  t.equal((await a.req('GET', `/v2/${kept}/status/${keptJob}`)).json.status, 'IN_QUEUE');
});

t.test('after a restart, a late result for a job flashd ended is still discarded with a 2xx, and a stranger still gets 409', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const other = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await w.take();
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).json.status, 'CANCELLED');
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const late = await w.rebase(a.url, b.url).done(id, { output: 'late' });
  t.match([late.status, late.json], [200, { discarded: true }], 'read from the row: discarded');
  t.equal((await other.rebase(a.url, b.url).done(id, { output: 'x' })).status, 409, 'another worker: stale');
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'CANCELLED');
});

t.test('a late result for a job flashd failed after its attempts ran out is discarded, not a duplicate, in memory and read from the row', async (t) => {
  const dir = testDataDir(t);
  // Today's wall time: the restart below runs on the real clock and expires, before it listens,
  // the results whose retention has passed by then.
  const clock = new ManualClock(Date.now());
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000, maxAttempts: 1 }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const lost = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, lost);
  clock.advance(3001);
  a.agent.queue.reap();
  t.match(await status(a, ep, lost), { status: 'FAILED', error: /gave up after 1 attempts/ });
  const again = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  clock.advance(3001);
  a.agent.queue.reap();
  t.equal((await w.take())?.id, again);
  clock.advance(3001);
  a.agent.queue.reap();
  t.match((await w.done(again, { output: 'late' })).json, { ok: true, discarded: true, reason: /attempts were used up/ }, 'in memory: discarded');
  const own = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 3 } } })).json.id as string;
  t.equal((await w.take())?.id, own);
  t.equal((await w.done(own, { error: 'boom' })).status, 200, "the worker's own FAILED result");
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const wb = w.rebase(a.url, b.url);
  const late = await wb.done(lost, { output: 'late' });
  t.equal(late.status, 200, 'a 2xx: runpod-python logs every 4xx on a result post');
  t.match(late.json, { ok: true, discarded: true }, 'read from the row: discarded');
  t.notOk(late.json.duplicate, 'not a duplicate: no result of this worker was recorded');
  t.same((await wb.done(own, { error: 'boom' })).json, { ok: true, duplicate: true }, "a re-post of the worker's own FAILED result is still a duplicate");
});

t.test('low-priority jobs, queued, running or requeued, never count toward a scale-up', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const w = await worker();
  const low = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { lowPriority: true } } })).json.id;
  await w.take();
  t.match(a.agent.queue.load(ep), { inProgress: 0, queued: 0 }, 'a running low-priority job is not in the scaler load');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inProgress, 1, 'though /health counts it');
  step(3001); // its lease lapses: back to the (shared) retry deque
  t.equal((await status(a, ep, low)).status, 'IN_QUEUE');
  step(60_000);
  t.match(a.agent.queue.load(ep), { lowQueued: 1, queued: 0, oldestWaitMs: 0 }, 'a requeued low-priority job has no queue delay');
  const normal = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id;
  const other = await worker();
  t.equal((await other.take())?.id, normal, 'the normal job first, though the low-priority one was requeued');
  t.equal((await w.take())?.id, low);
  t.match(a.agent.queue.load(ep), { inProgress: 1, lowQueued: 0, queued: 0 }, 'of the two running, the normal job counts');
});

t.test('an external worker that went silent (no job, no take open) leaves /health and the idle count', async (t) => {
  const { a, ep, step, worker } = await setup(t, { leaseMs: 30_000 }); // the sweep forgets it only after 2 leases
  const w = await worker();
  t.equal(await w.take(), null, 'one take, then it stops polling (killed, or exited)');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 1 });
  step(9000);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 1 }, 'a moment between polls is not silence');
  step(1001);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 0, ready: 0 }, 'after 10 s of silence it is no longer counted');
  const parked = w.take();
  await until('the take to park', async () => a.agent.queue.workers.get(ep, w.workerId)?.parked === 1);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 1 }, 'a take brings it back');
  await parked;
});

t.test('a finished job with unread stream chunks leaves memory at the cap like any other; its chunks are read from SQLite until its result expires', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  // A small cap (2,000 by default) so a few jobs push a finished one off the in-memory list.
  a.agent.queue.settings.finishedInMemory = 5;
  const w = await worker();
  const finishMany = async (n: number) => {
    for (let i = 0; i < n; i++) {
      const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
      await w.take();
      await w.done(id, { output: 1 });
    }
  };
  const streamed = async () => {
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
    await w.take();
    t.equal(await w.stream(id, 'x'.repeat(100_000)), 200);
    t.equal((await w.done(id, { output: 'all' })).status, 200);
    return id;
  };
  const read = await streamed();
  await finishMany(10);
  t.notOk(a.agent.queue.live(read), 'not held past the cap for its unread chunks (they are in SQLite)');
  t.equal((await a.req('GET', `/v2/${ep}/stream/${read}`)).json.stream.length, 1, 'which can still be read');
  const unread = await streamed();
  await finishMany(10);
  t.notOk(a.agent.queue.live(unread), 'an unread one is not held either');
  step(31 * 60_000);
  await finishMany(1);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status/${unread}`), 404);
  assertProblem(t, await a.req('GET', `/v2/${ep}/stream/${unread}`), 404, 'its chunks are no longer served once its result expired');
});

t.test('/cancel of a job whose result expired is a 404, like /status', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const w = await worker();
  // A /run result (kept 30 min) finishes first, so eviction in completion order stops at it.
  const runId = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await w.take();
  await w.done(runId, { output: 1 });
  const sync = a.req('POST', `/v2/${ep}/runsync`, { body: { input: {} } });
  const job = await w.take();
  await w.done(job!.id, { output: 2 });
  const syncId = (await sync).json.id as string;
  step(5 * 60_000);
  assertProblem(t, await a.req('GET', `/v2/${ep}/status/${syncId}`), 404);
  assertProblem(t, await a.req('POST', `/v2/${ep}/cancel/${syncId}`), 404);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${runId}`)).json.status, 'COMPLETED', 'a live result still answers');
});

t.test('a job retried after its TTL ran out in the queue goes behind the jobs queued before the retry', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const j = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 'J' }, policy: { ttl: 10_000 } } })).json.id as string;
  await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 'K1' } } });
  step(11_000);
  t.equal((await status(a, ep, j)).status, 'TIMED_OUT');
  await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 'K2' } } });
  t.equal((await a.req('POST', `/v2/${ep}/retry/${j}`)).json.status, 'IN_QUEUE');
  const w = await worker();
  const order: unknown[] = [];
  for (let i = 0; i < 3; i++) {
    const job = await w.take();
    order.push((job?.input as { n: string }).n);
    await w.done(job!.id, { output: 1 });
  }
  t.same(order, ['K1', 'K2', 'J'], 'the retry is queued at the back');
  t.equal(await w.take(), null, 'and taken once');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.jobs, { inQueue: 0, completed: 3 });
});

t.test('a low-priority job that lost its lease still waits for the normal jobs queued meanwhile', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const w1 = await worker();
  const w2 = await worker();
  const low = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { kind: 'low' }, policy: { lowPriority: true } } })).json.id;
  t.equal((await w1.take())?.id, low);
  const normal = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { kind: 'normal' } } })).json.id;
  const laterLow = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { kind: 'later low' }, policy: { lowPriority: true } } })).json.id;
  step(3001);
  t.equal((await status(a, ep, low)).status, 'IN_QUEUE', 'back in the queue');
  t.equal((await w2.take())?.id, normal, 'the normal job first');
  t.equal((await w2.take())?.id, low, 'then the requeued low-priority job, ahead of the later low-priority one');
  t.equal((await w2.take())?.id, laterLow);
});

t.test('a worker still running a job that timed out counts as running, not idle, until its pings drop it', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const w = await worker();
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 5000 } } })).json.id;
  await w.take();
  step(5001);
  t.equal((await status(a, ep, id)).status, 'TIMED_OUT');
  t.equal(await w.ping([id]), 200, 'its handler goes on (a sync handler cannot be interrupted)');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 0, running: 1 }, 'busy, so a queued job gets another worker');
  step(2000);
  t.equal(await w.ping([]), 200, 'the handler ended');
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 1, running: 0 });
});

t.test('a late heartbeat that still lists a job the worker itself finished leaves the worker idle, with no stop', async (t) => {
  const { a, ep, worker } = await setup(t, { takeHoldMs: 100 });
  const w = await worker();
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id;
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { output: 'fast' })).status, 200);
  // The SDK pings from its own process: the ping it sent when it took the job lands after the result.
  t.equal(await w.ping([id]), 200);
  t.match((await a.req('GET', `/v2/${ep}/health`)).json.workers, { idle: 1, running: 0 }, 'idle: it holds nothing');
  t.same(await w.stops(), [], 'nothing to stop');
  t.equal(a.agent.queue.workers.state(a.agent.queue.workers.get(ep, w.workerId)!), 'idle', 'the autoscaler sees it idle too');
});

t.test('a /retry of a job its worker may still be running is fenced from that worker: a late result of the old run cannot complete the new one', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const w = await worker();
  const timedOut = async (n: string) => {
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n }, policy: { executionTimeout: 5000 } } })).json.id as string;
    t.equal((await w.take(true))?.id, id);
    t.equal(await w.ping([id]), 200);
    step(2500);
    t.equal(await w.ping([id]), 200);
    step(2600); // past executionTimeout: TIMED_OUT, and w is asked to stop it
    t.equal((await status(a, ep, id)).status, 'TIMED_OUT');
    t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).json.status, 'IN_QUEUE');
    return id;
  };

  // w still runs the old run (it ignores job-stop, as runpod-python 1.7 does).
  const j = await timedOut('J');
  t.equal(await w.take(true), null, 'the new run is not handed to the worker still running the old one');
  const late = await w.done(j, { output: 'late result of the old run' });
  // Discarded with a 200 (runpod-python logs a 4xx as an error): flashd ended that attempt on it.
  t.match(late, { status: 200, json: { ok: true, discarded: true } }, `the late result is discarded: ${late.status}`);
  t.equal((await status(a, ep, j)).status, 'IN_QUEUE', 'and the new run untouched');
  const other = await worker();
  t.equal((await other.take())?.id, j, 'another worker takes the new run');
  t.equal((await other.done(j, { output: 'new run' })).status, 200);
  t.match(await status(a, ep, j), { status: 'COMPLETED', output: 'new run' });

  // Once w's pings no longer list the job, it let go: the fence lifts.
  const k = await timedOut('K');
  t.equal(await w.ping([]), 200);
  t.equal((await w.take(true))?.id, k, 'the worker that let go may run the new run');
  t.equal((await w.done(k, { output: 'k' })).status, 200);

  // Its late result of the old run, posted after the /retry: discarded, and it let go at once.
  const m = await timedOut('M');
  t.equal(await w.take(true), null, 'fenced');
  t.match(await w.done(m, { output: 'late' }), { status: 200, json: { discarded: true } }, 'the late result is discarded');
  t.equal((await status(a, ep, m)).status, 'IN_QUEUE', 'the new run untouched');
  t.equal((await w.take(true))?.id, m, 'the worker that posted its late result may run the new run at once');
  t.equal((await w.done(m, { output: 'm' })).status, 200);
  t.match(await status(a, ep, m), { status: 'COMPLETED', output: 'm' });

  // Posted before the /retry (discarded with a 2xx): nothing to fence.
  const n = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 'N' }, policy: { executionTimeout: 5000 } } })).json.id as string;
  t.equal((await w.take(true))?.id, n);
  t.equal(await w.ping([n]), 200);
  step(2500);
  t.equal(await w.ping([n]), 200);
  step(2600);
  t.equal((await status(a, ep, n)).status, 'TIMED_OUT');
  t.equal((await w.done(n, { output: 'late' })).status, 200, 'a late result of a job flashd ended is discarded with a 2xx');
  t.equal((await a.req('POST', `/v2/${ep}/retry/${n}`)).json.status, 'IN_QUEUE');
  t.equal((await w.take(true))?.id, n, 'the retry is not fenced from a worker that already posted its late result');
  t.equal((await w.done(n, { output: 'n' })).status, 200);

  // A worker that never says: the fence runs out after a lease, and a parked take is woken.
  const l = await timedOut('L');
  const parked = w.take(true);
  await until('the take to park', async () => (a.agent.queue.workers.get(ep, w.workerId)?.parked ?? 0) > 0, 250);
  step(3100);
  t.equal((await parked)?.id, l, 'after the fence ran out the reaper hands it over');
});

t.test('a lease lost while the worker keeps pinging without the job says so (a dropped result), not "no heartbeat"', async (t) => {
  const { a, ep, step, worker } = await setup(t);
  const pinging = await worker();
  const silent = await worker();
  const dropped = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await pinging.take())?.id, dropped);
  const lost = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await silent.take())?.id, lost);
  t.equal(await pinging.ping([]), 200);
  step(2000);
  t.equal(await pinging.ping([]), 200);
  step(1100); // both leases lapse
  t.equal((await status(a, ep, dropped)).status, 'IN_QUEUE');
  t.equal((await status(a, ep, lost)).status, 'IN_QUEUE');
  const reason = (id: string) => a.logs.find((l) => l.includes('job requeued') && l.includes(id)) ?? '';
  t.match(reason(dropped), /heartbeats stopped listing the job/, reason(dropped));
  t.match(reason(lost), /no heartbeat for 3000 ms/, reason(lost));
});
