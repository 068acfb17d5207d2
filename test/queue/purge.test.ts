/**
 * Work on a long backlog never holds the event loop in one commit. purge-queue: every queued
 * job leaves the queue at once, but they are ended a slice per commit, with the event loop
 * running between slices; the recovery floor stays below the rows not yet ended, so a crash
 * mid-purge loses no job. The expiry sweep deletes results that expire together a slice per
 * commit too.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { EXPIRE_SLICE_ROWS, PURGE_SLICE_JOBS } from '../../src/queue/job-queue.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const N = 10 * PURGE_SLICE_JOBS + 17;

/** Queues one job straight through the queue (no HTTP), as a /run would. */
const submitOne = (a: TestAgent, ep: string, input: string, lowPriority = false) =>
  a.agent.queue.submit({
    endpointId: ep, input, extra: null, webhook: null, executionTimeoutMs: 600_000, ttlMs: 86_400_000, lowPriority, retentionMs: 600_000,
  });

async function backlog(a: TestAgent, ep: string, n: number, withLow = true): Promise<string[]> {
  const jobs = [];
  for (let i = 0; i < n; i++) jobs.push(submitOne(a, ep, `{"i":${i}}`, withLow && i % 5 === 0));
  return (await Promise.all(jobs)).map((j) => j.id);
}

const count = (a: TestAgent, ep: string, status: string): number =>
  a.agent.db.prepare('SELECT count(*) FROM jobs WHERE endpoint_id = ? AND status = ?').pluck().get(ep, status) as number;
const floorOf = (a: TestAgent): number =>
  Number(a.agent.db.prepare("SELECT value FROM settings WHERE key = 'jobs.recovery_floor'").pluck().get());
const lowestQueued = (a: TestAgent, ep: string): number | null =>
  a.agent.db.prepare("SELECT min(rowid) FROM jobs WHERE endpoint_id = ? AND status = 'IN_QUEUE'").pluck().get(ep) as number | null;

t.test('a purge ends a long backlog a slice per commit, the event loop turning between slices', async (t) => {
  // NORMAL: a commit answers at once (no sync, no group-commit hold), so the turns are exact.
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 200, sqliteSynchronous: 'normal' }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const ids = await backlog(a, ep, N);
  const w = await TestWorker.create(a, ep);
  const cancelledMidway = ids[N - 1] as string;

  let settled = false;
  const purge = a.agent.queue.purge(ep).finally(() => (settled = true));
  t.equal(a.agent.queue.health(ep).jobs.inQueue, 0, 'the whole backlog left the queue at once');
  const take = w.take();

  await new Promise((resolve) => setImmediate(resolve));
  t.notOk(settled, 'one loop turn later the purge is still going');
  t.equal(count(a, ep, 'CANCELLED'), PURGE_SLICE_JOBS, 'one slice is committed');
  t.equal(count(a, ep, 'IN_QUEUE'), N - PURGE_SLICE_JOBS, 'the rest is still queued in SQLite');

  // The reaper would raise the floor past every row it no longer holds in a queue.
  clock.advance(10);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  const low = lowestQueued(a, ep);
  t.ok(low !== null && low >= floorOf(a), `the floor (${floorOf(a)}) stays at or below the rows not yet ended (${low}): a crash now requeues them`);
  t.notOk(settled, 'still going');
  t.equal((await a.agent.queue.cancel(ep, cancelledMidway)).status, 'CANCELLED', 'a job of the backlog can still be cancelled on its own');

  t.equal(await purge, N - 1, 'the purge counts what it ended');
  t.equal(await take, null, 'a worker asking during the purge got none of the backlog');
  t.equal(count(a, ep, 'CANCELLED'), N, 'every row is CANCELLED');
  t.equal(count(a, ep, 'IN_QUEUE'), 0);
  t.equal(a.agent.queue.health(ep).jobs.inQueue, 0, 'the queue counters did not go negative');
  t.equal((await a.req('GET', `/v2/${ep}/status/${ids[0]}`)).json.status, 'CANCELLED');

  clock.advance(10);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.ok(floorOf(a) > (a.agent.db.prepare('SELECT max(rowid) FROM jobs WHERE endpoint_id = ?').pluck().get(ep) as number), 'the floor rises past the purged rows once it is over');

  const after = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { after: true } } })).json.id as string;
  t.equal((await w.take())?.id, after, 'the queue works on after a purge');
});

t.test('a purge does not walk the backlog before it answers its first slice: its call touches one slice of jobs', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const jobs = [];
  for (let i = 0; i < N; i++) jobs.push(submitOne(a, ep, `{"i":${i}}`, i % 5 === 0));
  // Counts the reads of each job's status (the real job objects, watched from outside).
  let reads = 0;
  for (const job of await Promise.all(jobs)) {
    let status = job.status;
    Object.defineProperty(job, 'status', { get: () => (reads++, status), set: (v) => (status = v), configurable: true, enumerable: true });
  }
  const purge = a.agent.queue.purge(ep);
  const synchronous = reads;
  t.ok(synchronous <= 4 * PURGE_SLICE_JOBS, `the call itself touched ${synchronous} job statuses for a backlog of ${N}, not every job`);
  t.equal(a.agent.queue.health(ep).jobs.inQueue, 0, 'the whole backlog left the queue at once all the same');
  t.equal(await purge, N);
  t.equal(count(a, ep, 'CANCELLED'), N);
});

t.test('a purge started twice ends each job once', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  await backlog(a, ep, PURGE_SLICE_JOBS + 5);
  const [first, second] = await Promise.all([a.agent.queue.purge(ep), a.agent.queue.purge(ep)]);
  t.equal(first, PURGE_SLICE_JOBS + 5, 'the first purge takes the backlog');
  t.equal(second, 0, 'the second finds the queue empty');
  const counted = a.agent.db.prepare("SELECT jobs FROM job_counts WHERE endpoint_id = ? AND status = 'CANCELLED'").pluck().get(ep);
  t.equal(counted, PURGE_SLICE_JOBS + 5, 'job_counts counts each job once');
});

t.test('results that expire together are deleted a slice per commit, and job_counts follows', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { sqliteSynchronous: 'normal' }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const n = 2 * EXPIRE_SLICE_ROWS + 5;
  await backlog(a, ep, n);
  t.equal(await a.agent.queue.purge(ep), n);
  const counted = () => a.agent.db.prepare("SELECT jobs FROM job_counts WHERE endpoint_id = ? AND status = 'CANCELLED'").pluck().get(ep);
  t.equal(counted(), n);
  const rows = () => a.agent.db.prepare('SELECT count(*) FROM jobs WHERE endpoint_id = ?').pluck().get(ep) as number;

  clock.advance(600_001); // past the backlog's retention
  a.agent.queue.expire();
  await new Promise((resolve) => setImmediate(resolve));
  t.equal(rows(), n - EXPIRE_SLICE_ROWS, 'one loop turn: one slice deleted');
  a.agent.queue.expire(); // one sweep at a time: this one is a no-op
  for (let i = 0; i < 10 && rows() > 0; i++) await new Promise((resolve) => setImmediate(resolve));
  t.equal(rows(), 0, 'then the rest');
  t.equal(counted(), 0, 'job_counts lost exactly the deleted rows');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.completed, 0);
});

t.test('deleting the endpoint during a purge ends the purge early; nothing goes back on a queue and every row goes', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  await backlog(a, ep, N);
  const purge = a.agent.queue.purge(ep);
  await new Promise((resolve) => setImmediate(resolve));
  a.agent.queue.dropEndpoint(ep);
  const removed = await purge;
  t.ok(removed >= PURGE_SLICE_JOBS && removed < N, `the purge stopped after the slices already under way (${removed} of ${N})`);
  t.equal(a.agent.queue.health(ep).jobs.inQueue, 0, 'nothing was put back');
  for (let i = 0; i < 50 && count(a, ep, 'IN_QUEUE') + count(a, ep, 'CANCELLED') > 0; i++) {
    await new Promise((resolve) => setImmediate(resolve)); // the deletion goes a slice per turn
    await a.agent.queue.durable();
  }
  t.equal(count(a, ep, 'IN_QUEUE') + count(a, ep, 'CANCELLED'), 0, "the endpoint's rows are deleted");
  t.equal(a.agent.db.prepare('SELECT count(*) FROM job_counts WHERE endpoint_id = ?').pluck().get(ep), 0, 'and no count of it is left');
});

t.test('a purge whose commit fails loses nothing: the rest goes back on the queue, the floor stays down, a restart recovers every queued row', async (t) => {
  const dir = testDataDir(t);
  const clock = new ManualClock();
  const a = await startAgent(t, { sqliteSynchronous: 'normal' }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const n = 4 * PURGE_SLICE_JOBS;
  await backlog(a, ep, n, false);
  // A real failed commit: the third slice's updates abort inside SQLite (as a full disk would).
  const third = a.agent.db.prepare('SELECT rowid FROM jobs WHERE endpoint_id = ? ORDER BY rowid LIMIT 1 OFFSET ?').pluck().get(ep, 2 * PURGE_SLICE_JOBS) as number;
  a.agent.db.exec(`CREATE TEMP TRIGGER purge_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'CANCELLED' AND OLD.rowid >= ${third}
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  const purge = a.agent.queue.purge(ep).then(() => 'resolved', (err: Error) => err.message);
  await new Promise((resolve) => setImmediate(resolve)); // slice 1 committed, slice 2 queued
  const late = (await submitOne(a, ep, '{"late":true}')).id; // committed with slice 2, queued behind nothing
  t.match(await purge, /simulated write failure/, 'the purge fails with the commit');
  a.agent.db.exec('DROP TRIGGER purge_fails');

  const queuedRows = count(a, ep, 'IN_QUEUE');
  t.ok(queuedRows > PURGE_SLICE_JOBS, `rows are still queued in SQLite (${queuedRows})`);
  clock.advance(10);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  const low = lowestQueued(a, ep);
  t.ok(low !== null && low >= floorOf(a), `the floor (${floorOf(a)}) did not pass a queued row (${low})`);
  t.ok((a.agent.queue.health(ep).jobs.inQueue ?? 0) > 0, 'the jobs not reached are back on the queue');

  await a.agent.close();
  const b = await startAgent(t, { sqliteSynchronous: 'normal' }, { clock, dir });
  t.equal(b.agent.queue.health(ep).jobs.inQueue, queuedRows, 'after a restart every row SQLite holds as queued is queued again');
  t.equal((await b.req('GET', `/v2/${ep}/status/${late}`)).json.status, 'IN_QUEUE', 'the job submitted during the purge too');
});

t.test('an expiry sweep whose commit fails because of another write starts over at the next sweep', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { sqliteSynchronous: 'normal' }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  await backlog(a, ep, 10);
  await a.agent.queue.purge(ep);
  clock.advance(600_001);
  // The insert queued before the sweep's delete fails, and the whole group commit with it.
  a.agent.db.exec(`CREATE TEMP TRIGGER insert_fails BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  const submit = submitOne(a, ep, '{}').then(() => 'resolved', (err: Error) => err.message);
  a.agent.queue.expire();
  t.match(await submit, /simulated write failure/);
  await new Promise((resolve) => setImmediate(resolve));
  a.agent.db.exec('DROP TRIGGER insert_fails');
  t.equal(count(a, ep, 'CANCELLED'), 10, 'nothing was deleted by the failed commit');
  a.agent.queue.expire();
  await a.agent.queue.durable();
  t.equal(count(a, ep, 'CANCELLED'), 0, 'the next sweep runs and deletes them');
});

t.test('a job whose insert fails while a purge holds it leaves the queue counts right', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  await backlog(a, ep, PURGE_SLICE_JOBS, false);
  a.agent.db.exec(`CREATE TEMP TRIGGER insert_fails BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  // Same turn: the job is queued behind the backlog, the purge takes it for its second slice,
  // and the first slice's commit, which carries the job's insert, fails.
  const submit = submitOne(a, ep, '{}').then(() => 'resolved', (err: Error) => err.message);
  const purge = a.agent.queue.purge(ep).then(() => 'resolved', (err: Error) => err.message);
  t.match(await submit, /simulated write failure/, 'the submit fails');
  t.match(await purge, /simulated write failure/, 'and the purge with it');
  a.agent.db.exec('DROP TRIGGER insert_fails');
  // The failed slice's jobs are back on the queue (their rows are still queued); the forgotten
  // job is not, and is not taken off the counts a second time.
  t.equal(count(a, ep, 'IN_QUEUE'), PURGE_SLICE_JOBS);
  t.equal(a.agent.queue.health(ep).jobs.inQueue, PURGE_SLICE_JOBS, 'the forgotten job is not taken off the counts a second time');
});

t.test('finished-job counts go on being written after a commit that failed because of another write', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const [first, second] = await backlog(a, ep, 2, false);
  const cancelled = () => a.agent.db.prepare("SELECT jobs FROM job_counts WHERE endpoint_id = ? AND status = 'CANCELLED'").pluck().get(ep) ?? 0;
  a.agent.db.exec(`CREATE TEMP TRIGGER insert_fails BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  // Same turn: an insert that fails, then a cancel whose count write comes after it in the commit.
  const submit = submitOne(a, ep, '{}').then(() => 'resolved', (err: Error) => err.message);
  const cancel = a.agent.queue.cancel(ep, first as string).then(() => 'resolved', (err: Error) => err.message);
  t.match(await submit, /simulated write failure/);
  t.match(await cancel, /simulated write failure/);
  a.agent.db.exec('DROP TRIGGER insert_fails');
  t.equal(cancelled(), 0, 'the failed commit wrote no count');
  await a.agent.queue.cancel(ep, second as string);
  t.equal(cancelled(), 1, 'the next cancel is counted');
});
