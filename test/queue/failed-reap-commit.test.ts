/**
 * An end flashd makes itself (an execution timeout, a TTL that ran out while the job was queued
 * or running, attempts used up after lost leases) whose commit fails (a full disk, an I/O
 * error): before, memory held the job ended while its row stayed queued or running, and nothing
 * wrote it again. /status and /health showed an end SQLite did not have, a /runsync waiting on
 * the job was never answered with it, its webhook was never sent, and only a restart found the
 * job again (queued or running). Now the job goes back to what it was and the reaper ends it
 * again on a later pass, once a commit succeeds. The failure is made with a temporary SQLite
 * trigger, as in failed-commit.test.ts.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { EXPIRE_QUEUED_SLICE_JOBS } from '../../src/queue/job-queue.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const rowOf = (a: TestAgent, id: string) => a.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').pluck().get(id);
const failEnd = (a: TestAgent, status: string) =>
  a.agent.db.exec(`CREATE TEMP TRIGGER end_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = '${status}'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
const allowEnd = (a: TestAgent) => a.agent.db.exec('DROP TRIGGER end_fails');

async function scene(t: Test, config: Record<string, unknown> = {}) {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const settings = { takeHoldMs: 100, leaseMs: 600_000, ...config };
  let a = await startAgent(t, settings, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  return {
    clock, ep, w,
    get a() { return a; },
    status: async (id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json,
    health: async () => (await a.req('GET', `/v2/${ep}/health`)).json.jobs,
    /** What memory holds now, read at once: the interval reaper may end the job again any time. */
    now: (id: string) => ({ status: a.agent.queue.find(ep, id)?.status, ...a.agent.queue.health(ep).jobs }),
    /** One reaper pass, and its commit. */
    reap: async () => {
      a.agent.queue.reap();
      await a.agent.queue.durable().catch(() => undefined);
    },
    restart: async () => {
      await a.agent.close();
      a = await startAgent(t, settings, { clock, dir });
    },
  };
}

t.test('an execution timeout whose commit failed: the job stays running until a later pass stores the timeout', async (t) => {
  const s = await scene(t);
  const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {}, policy: { executionTimeout: 5000 } } })).json.id as string;
  t.equal((await s.w.take())?.id, id);
  s.clock.advance(200);
  await sleep(250); // its claim is written (CLAIM_SAVE_DELAY_MS)
  t.equal(rowOf(s.a, id), 'IN_PROGRESS');
  s.clock.advance(5000);
  failEnd(s.a, 'TIMED_OUT');
  await s.reap();
  allowEnd(s.a);
  t.equal(rowOf(s.a, id), 'IN_PROGRESS', 'the timeout is not in the row');
  t.match(s.now(id), { status: 'IN_PROGRESS', inProgress: 1 }, 'memory holds what SQLite has');

  await s.reap();
  t.equal(rowOf(s.a, id), 'TIMED_OUT', 'the next pass stores the timeout');
  t.match(await s.status(id), { status: 'TIMED_OUT', error: /Execution timed out after 5000 ms/ });
  t.match(await s.health(), { inProgress: 0 });
  t.equal(await s.w.ping([id]), 200);
  t.same(await s.w.stops(), [id], 'its worker is told to stop it');
});

t.test('a TTL that ran out in the queue whose commit failed: the job stays queued until a later pass stores the expiry', async (t) => {
  const s = await scene(t);
  const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {}, policy: { ttl: 10_000 } } })).json.id as string;
  const other = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {} } })).json.id as string;
  s.clock.advance(11_000);
  failEnd(s.a, 'TIMED_OUT');
  await s.reap();
  allowEnd(s.a);
  t.equal(rowOf(s.a, id), 'IN_QUEUE', 'the expiry is not in the row');
  t.match(s.now(id), { status: 'IN_QUEUE', inQueue: 2 }, 'memory holds what SQLite has');

  await s.reap();
  t.equal(rowOf(s.a, id), 'TIMED_OUT', 'the next pass stores the expiry');
  t.equal((await s.status(id)).status, 'TIMED_OUT');
  t.equal((await s.health()).inQueue, 1);
  t.equal((await s.w.take())?.id, other, 'a worker gets the other job only');
  t.equal(await s.w.take(), null);
});

t.test('a TTL that ran out while running, whose commit failed, is stored by a later pass', async (t) => {
  const s = await scene(t);
  const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {}, policy: { ttl: 10_000 } } })).json.id as string;
  t.equal((await s.w.take())?.id, id);
  s.clock.advance(11_000);
  failEnd(s.a, 'TIMED_OUT');
  await s.reap();
  allowEnd(s.a);
  t.match(s.now(id), { status: 'IN_PROGRESS', inProgress: 1 }, 'memory holds what SQLite has');
  await s.reap();
  t.equal(rowOf(s.a, id), 'TIMED_OUT');
  t.match(await s.status(id), { status: 'TIMED_OUT', error: /time to live/ });
});

t.test('attempts used up whose commit failed: the job stays running until a later pass stores the failure', async (t) => {
  const s = await scene(t, { maxAttempts: 1, leaseMs: 3000 });
  const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await s.w.take())?.id, id);
  s.clock.advance(200);
  await sleep(250); // its claim is written (CLAIM_SAVE_DELAY_MS)
  t.equal(rowOf(s.a, id), 'IN_PROGRESS');
  s.clock.advance(3000); // no ping: the lease lapses, and the one attempt is used up
  failEnd(s.a, 'FAILED');
  await s.reap();
  allowEnd(s.a);
  t.equal(rowOf(s.a, id), 'IN_PROGRESS', 'the failure is not in the row');
  t.match(s.now(id), { status: 'IN_PROGRESS', inProgress: 1 }, 'memory holds what SQLite has');
  s.clock.advance(3500);
  await s.reap();
  t.equal(rowOf(s.a, id), 'FAILED', 'a later pass stores it');
  t.match(await s.status(id), { status: 'FAILED', error: /gave up after 1 attempts/ });
  await s.restart();
  t.equal((await s.status(id)).status, 'FAILED', 'and a restart finds it');
});

t.test('a backlog expiring in slices on a disk that stays full: memory keeps what SQLite has, and no pass a turn spins on the failures', async (t) => {
  const s = await scene(t, { sqliteSynchronous: 'normal' });
  const n = EXPIRE_QUEUED_SLICE_JOBS + 10;
  const ids = (await Promise.all(Array.from({ length: n }, (_, i) => s.a.agent.queue.submit({
    endpointId: s.ep, input: `{"i":${i}}`, extra: null, webhook: null, executionTimeoutMs: 600_000, ttlMs: 10_000, lowPriority: false, retentionMs: 600_000,
  })))).map((j) => j.id);
  s.clock.advance(11_000);
  let tries = 0;
  s.a.agent.db.function('tried', () => ++tries);
  s.a.agent.db.exec(`CREATE TEMP TRIGGER end_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'TIMED_OUT' AND tried() > 0
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  await s.reap();
  await sleep(600);
  // The first pass, and at most one of the interval reaper's (once a second).
  t.ok(tries <= 2, `failed passes are not repeated turn after turn (${tries} in 600 ms)`);
  await s.a.agent.queue.durable().catch(() => undefined); // an interval pass's commit, if one is pending
  t.equal(s.a.agent.queue.health(s.ep).jobs.inQueue, n, 'every job is queued in memory, as in SQLite');
  allowEnd(s.a);
  for (let i = 0; i < 5 && (s.a.agent.queue.health(s.ep).jobs.inQueue ?? 0) > 0; i++) await s.reap();
  t.equal(s.a.agent.queue.health(s.ep).jobs.inQueue, 0);
  const timedOut = s.a.agent.db.prepare("SELECT count(*) FROM jobs WHERE endpoint_id = ? AND status = 'TIMED_OUT'").pluck().get(s.ep);
  t.equal(timedOut, n, 'every expiry is stored');
  t.equal((await s.status(ids[0] as string)).status, 'TIMED_OUT');
});
