/**
 * Queued jobs with a short policy.ttl among a long backlog of default-TTL ones: each expires at
 * its own deadline and only those do, also after a requeue, a /retry, a purge, a restart and
 * many takes; and the reaper looks only at the jobs that expire. It kept a lower bound of the
 * deadlines and walked the whole backlog whenever the bound was due, so one short-TTL job a
 * second among 600k queued jobs made every pass a walk of all of them.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import type { Job } from '../../src/queue/types.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const LONG = 86_400_000;
const config = { takeHoldMs: 100, leaseMs: 3000, sqliteSynchronous: 'normal' as const };

async function scene(t: Test, overrides: Record<string, unknown> = {}) {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, { ...config, ...overrides }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  return { a, ep, clock, dir };
}

/** Queues one job straight through the queue (no HTTP), as a /run would. */
const submit = async (a: TestAgent, ep: string, ttlMs: number, i: number, lowPriority = false): Promise<string> =>
  (await a.agent.queue.submit({
    endpointId: ep, input: `{"i":${i}}`, extra: null, webhook: null, executionTimeoutMs: LONG, ttlMs, lowPriority, retentionMs: 2 * LONG,
  })).id;

/** `n` jobs, every `every`-th of them (from the `at`-th) with `shortTtl`, the rest a day's; some low priority. */
async function backlog(a: TestAgent, ep: string, n: number, shortTtl: number, every = 100, at = 0): Promise<{ long: string[]; short: string[] }> {
  const long: string[] = [];
  const short: string[] = [];
  const jobs = [];
  for (let i = 0; i < n; i++) {
    const isShort = i % every === at;
    jobs.push(submit(a, ep, isShort ? shortTtl : LONG, i, i % 7 === 3).then((id) => (isShort ? short : long).push(id)));
  }
  await Promise.all(jobs);
  return { long, short };
}

/** `n` jobs with a day's TTL, none low priority. */
const longs = (a: TestAgent, ep: string, n: number): Promise<string[]> => Promise.all(Array.from({ length: n }, (_, i) => submit(a, ep, LONG, i)));

/** Time passes and the reaper runs, with the passes that follow a slice; then it is all committed. */
async function step(a: TestAgent, clock: ManualClock, ms: number): Promise<void> {
  clock.advance(ms);
  a.agent.queue.reap();
  for (let i = 0; i < 5; i++) {
    await a.agent.queue.durable();
    await new Promise((resolve) => setImmediate(resolve));
  }
}

const statusOf = (a: TestAgent, id: string): string => a.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').pluck().get(id) as string;
const statuses = (a: TestAgent, ids: string[]): Set<string> => new Set(ids.map((id) => statusOf(a, id)));
const inQueue = (a: TestAgent, ep: string): number | undefined => a.agent.queue.health(ep).jobs.inQueue;

t.test('short-TTL jobs among a long backlog expire at their deadlines, only they, and the reaper reads no other job', async (t) => {
  const { a, ep, clock } = await scene(t);
  const first = await backlog(a, ep, 3000, 10_000);
  await step(a, clock, 5_000);
  const later = await backlog(a, ep, 1000, 10_000, 50, 7); // due at 15 s
  const slower = await backlog(a, ep, 1000, 30_000, 50, 9); // due at 35 s
  const long = [...first.long, ...later.long, ...slower.long];

  // Every read of a long job's TTL deadline is counted from here on.
  let reads = 0;
  for (const id of long) {
    const job = a.agent.queue.live(id) as Job;
    const at = job.ttlDeadline;
    Object.defineProperty(job, 'ttlDeadline', { get: () => (reads++, at), configurable: true });
  }

  await step(a, clock, 4_999);
  t.same(statuses(a, first.short), new Set(['IN_QUEUE']), 'none expires before its deadline');
  await step(a, clock, 2);
  t.same(statuses(a, first.short), new Set(['TIMED_OUT']), 'the 10 s jobs queued first expired at 10 s');
  t.same(statuses(a, later.short), new Set(['IN_QUEUE']), 'those queued 5 s later not yet');
  await step(a, clock, 5_000);
  t.same(statuses(a, later.short), new Set(['TIMED_OUT']), 'and at 15 s they did');
  for (let s = 0; s < 20; s++) await step(a, clock, 1_000);
  t.same(statuses(a, slower.short), new Set(['TIMED_OUT']), 'the 30 s ones at 35 s');
  t.same(statuses(a, long), new Set(['IN_QUEUE']), 'every long-TTL job is still queued');
  t.equal(inQueue(a, ep), long.length, '/health counts what is left');
  t.equal(reads, 0, 'the reaper passes read no long-TTL job (a walk of the backlog would read each of them every pass)');

  await step(a, clock, LONG);
  t.same(statuses(a, long), new Set(['TIMED_OUT']), 'the long ones expire at theirs');
  t.equal(inQueue(a, ep), 0);
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.failed, 5000, 'each job counted once');
});

t.test('a requeued short-TTL job expires at its first deadline, once; one taken again is not expired', async (t) => {
  const { a, ep, clock } = await scene(t);
  const ids = [await submit(a, ep, 10_000, 0), await submit(a, ep, 10_000, 1)];
  const long = await longs(a, ep, 200);
  const w1 = await TestWorker.create(a, ep);
  const w2 = await TestWorker.create(a, ep);
  t.equal((await w1.take())?.id, ids[0]);
  t.equal((await w1.take())?.id, ids[1]);
  await step(a, clock, 3_001);
  t.same(statuses(a, ids), new Set(['IN_QUEUE']), 'both lost their lease and are queued again');
  t.equal((await w2.take())?.id, ids[0], 'one is taken again (by another worker: the first is fenced)');
  t.equal((await w2.ping([ids[0] as string])), 200);
  await step(a, clock, 2_000);
  t.equal((await w2.ping([ids[0] as string])), 200);
  await step(a, clock, 2_000);
  t.equal((await w2.done(ids[0] as string, { output: 'ok' })).status, 200);
  await step(a, clock, 3_000);
  t.equal(statusOf(a, ids[1] as string), 'TIMED_OUT', 'the one still queued expired at its first deadline');
  t.match((await a.req('GET', `/v2/${ep}/status/${ids[1]}`)).json.error, /expired in the queue/);
  t.equal(statusOf(a, ids[0] as string), 'COMPLETED', 'the one that ran is not touched by its old entries');
  t.equal(inQueue(a, ep), long.length, '/health counts every long job, and the expired one left it once');
  await step(a, clock, 60_000);
  t.same(statuses(a, long), new Set(['IN_QUEUE']));
  t.equal(inQueue(a, ep), long.length);
});

t.test('a /retry of an expired short-TTL job queues it with a new deadline, counted from the retry', async (t) => {
  const { a, ep, clock } = await scene(t);
  await longs(a, ep, 100);
  const id = await submit(a, ep, 10_000, 0);
  const long = await longs(a, ep, 100);
  await step(a, clock, 10_001);
  t.equal(statusOf(a, id), 'TIMED_OUT');
  await step(a, clock, 4_999); // 15 s
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
  await step(a, clock, 9_999);
  t.equal(statusOf(a, id), 'IN_QUEUE', 'not expired by its first run\'s deadline');
  await step(a, clock, 2);
  t.equal(statusOf(a, id), 'TIMED_OUT', 'expired 10 s after the retry');
  t.same(statuses(a, long), new Set(['IN_QUEUE']));
  t.equal(inQueue(a, ep), 200);
});

t.test('a job retried before the reaper saw it leave is not expired at its first run\'s deadline', async (t) => {
  const { a, ep, clock } = await scene(t);
  const id = await submit(a, ep, 10_000, 0);
  const long = await longs(a, ep, 100);
  const w = await TestWorker.create(a, ep);
  clock.advance(1_000);
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { error: 'boom' })).status, 200);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200, 'retried at 1 s, with no reaper pass since the take');
  await step(a, clock, 9_001);
  t.equal(statusOf(a, id), 'IN_QUEUE', 'the entry of its first run (due at 10 s) does not expire the new run');
  await step(a, clock, 1_000);
  t.equal(statusOf(a, id), 'TIMED_OUT', 'the new run expires 10 s after the retry');
  t.same(statuses(a, long), new Set(['IN_QUEUE']));
  t.equal(inQueue(a, ep), 100);
});

t.test('after a purge, the purged short-TTL jobs stay cancelled and the ones queued since expire on time', async (t) => {
  const { a, ep, clock } = await scene(t);
  const before = await backlog(a, ep, 500, 10_000, 10);
  t.equal(await a.agent.queue.purge(ep), 500);
  await step(a, clock, 1_000);
  const after = await backlog(a, ep, 500, 10_000, 10, 3);
  await step(a, clock, 9_001);
  t.same(statuses(a, [...before.short, ...before.long]), new Set(['CANCELLED']), 'purged jobs are not expired');
  t.same(statuses(a, after.short), new Set(['IN_QUEUE']), 'the new ones are not due before their own deadline');
  await step(a, clock, 1_000);
  t.same(statuses(a, after.short), new Set(['TIMED_OUT']));
  t.same(statuses(a, after.long), new Set(['IN_QUEUE']));
  t.equal(inQueue(a, ep), after.long.length);
});

t.test('after a restart, short-TTL jobs expire at the deadline counted from their submit, and only they', async (t) => {
  const { a, ep, clock, dir } = await scene(t);
  const { long, short } = await backlog(a, ep, 2000, 10_000, 20);
  await step(a, clock, 4_000);
  await a.agent.close();
  const b = await startAgent(t, config, { clock, dir });
  await step(b, clock, 5_999);
  t.same(statuses(b, short), new Set(['IN_QUEUE']));
  await step(b, clock, 2);
  t.same(statuses(b, short), new Set(['TIMED_OUT']), 'expired 10 s after their submit');
  t.same(statuses(b, long), new Set(['IN_QUEUE']));
  t.equal(inQueue(b, ep), long.length);
});

t.test('after most of a backlog was taken or cancelled, the jobs left expire on time and /health stays right', async (t) => {
  // Long leases: the taken jobs stay with their worker through the test.
  const { a, ep, clock } = await scene(t, { leaseMs: 600_000 });
  const taken = await longs(a, ep, 2400);
  const { long, short } = await backlog(a, ep, 600, 10_000, 10);
  const w = await TestWorker.create(a, ep);
  let got = 0;
  while (got < 2400) got += (await w.takeBatch(Math.min(256, 2400 - got))).jobs.length;
  t.same(new Set(taken.map((id) => a.agent.queue.live(id)?.status)), new Set(['IN_PROGRESS']), 'the first 2,400 were taken');
  const cancelled = short.slice(0, 20);
  for (const id of cancelled) t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).status, 200);
  await step(a, clock, 1_000); // the reaper drops what was taken and cancelled
  const more = await backlog(a, ep, 100, 10_000, 10, 5); // due at 11 s
  await step(a, clock, 9_001);
  t.same(statuses(a, short.slice(20)), new Set(['TIMED_OUT']));
  t.same(statuses(a, cancelled), new Set(['CANCELLED']));
  t.same(statuses(a, more.short), new Set(['IN_QUEUE']));
  await step(a, clock, 1_000);
  t.same(statuses(a, more.short), new Set(['TIMED_OUT']));
  t.same(statuses(a, [...long, ...more.long]), new Set(['IN_QUEUE']));
  t.equal(inQueue(a, ep), long.length + more.long.length);
  t.equal(a.agent.queue.health(ep).jobs.inProgress, 2400);
});
