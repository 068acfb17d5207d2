/**
 * A node holding many jobs dies and every lease lapses together (64,000 jobs over 1,000 workers):
 * the reaper requeued all of them in one pass and one commit, holding the event loop about 2 s
 * (every HTTP request waited). It now ends REAP_RUNNING_SLICE_JOBS running jobs per pass (lease
 * requeues, execution timeouts and TTLs alike), the next pass following once that commit is in,
 * with the loop turning in between, as the queued-TTL expiry does (ttl-backlog.test.ts). A job
 * whose slice has not come is still IN_PROGRESS on its attempt, as a moment before: its worker's
 * ping renews the lease and its result completes it; one past its execution timeout is ended
 * first, as at its deadline. Real SQLite, a manual clock.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { REAP_RUNNING_SLICE_JOBS } from '../../src/queue/job-queue.js';
import type { ClaimedJob } from '../../src/queue/job-queue.js';
import { startAgent, cpuBody } from '../helpers/agent.js';

const LEASE = 30_000;
const N = 3 * REAP_RUNNING_SLICE_JOBS + 17;
const WORKERS = 30;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const turn = () => new Promise((resolve) => setImmediate(resolve));
const never = { aborted: false, onAbort: () => () => undefined };

/** N running jobs over WORKERS workers, their claims written; in claim order, each with its worker. */
async function scene(t: Test, executionTimeoutMs = 3_600_000) {
  // NORMAL: a commit answers at once (no sync, no group-commit hold), so the turns are exact.
  const T0 = Date.now();
  const clock = new ManualClock();
  const a = await startAgent(t, { sqliteSynchronous: 'normal', leaseMs: LEASE, maxAttempts: 3 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const q = a.agent.queue;
  await Promise.all(Array.from({ length: N }, (_, i) => q.submit({
    endpointId: ep, input: `{"i":${i}}`, extra: null, webhook: null, executionTimeoutMs, ttlMs: 86_400_000, lowPriority: i % 7 === 0, retentionMs: 600_000,
  })));
  t.comment(`submitted ${Date.now() - T0} ms`);
  const claimed: { job: ClaimedJob; worker: string }[] = [];
  for (let w = 0; w < WORKERS; w++) {
    const worker = `worker-${w}`;
    for (const job of await q.take(ep, worker, Math.ceil(N / WORKERS), never)) claimed.push({ job, worker });
  }
  t.equal(claimed.length, N, 'every job runs');
  t.comment(`taken ${Date.now() - T0} ms`);
  clock.advance(200);
  await sleep(250); // the claims are written (CLAIM_SAVE_DELAY_MS)
  await q.durable();
  const count = (where: string): number => a.agent.db.prepare(`SELECT count(*) FROM jobs WHERE endpoint_id = ? AND ${where}`).pluck().get(ep) as number;
  t.equal(count("status = 'IN_PROGRESS'"), N, 'every claim is in its row');
  return { a, q, ep, clock, claimed, count };
}

t.test('leases lapsing together are requeued a slice per pass, the next pass after the commit, every job once', async (t) => {
  const { a, q, ep, clock, claimed, count } = await scene(t);
  clock.advance(LEASE + 1);
  q.reap();
  t.match(q.health(ep).jobs, { inQueue: REAP_RUNNING_SLICE_JOBS, inProgress: N - REAP_RUNNING_SLICE_JOBS }, 'one pass requeues one slice');

  // In the same turn, before the next pass: the jobs it did not reach are still their workers'.
  const first = claimed[0] as { job: ClaimedJob; worker: string };
  const done = claimed[N - 1] as { job: ClaimedJob; worker: string };
  const pinged = claimed[N - 2] as { job: ClaimedJob; worker: string };
  t.equal(q.find(ep, first.job.id)?.status, 'IN_QUEUE', 'a job of the first slice is queued again');
  t.equal(q.find(ep, done.job.id)?.status, 'IN_PROGRESS', 'a job past the slice is still running');
  const late = q.done(ep, done.worker, done.job.id, { output: { ok: true } });
  q.ping(ep, pinged.worker, [pinged.job.id]);
  // A requeued job's lost worker is refused, as before: the job moved on without it.
  const stale = q.done(ep, first.worker, first.job.id, { output: { late: true } });
  t.equal(await late, 'accepted', "its worker's result completes it, as a moment earlier");
  t.equal(await stale, 'stale', "a requeued job's old run is refused");

  await q.durable();
  // The next pass starts once that commit is in, and may be committed too by now: whole slices.
  const requeued = count("status = 'IN_QUEUE'");
  t.ok(requeued >= REAP_RUNNING_SLICE_JOBS && requeued % REAP_RUNNING_SLICE_JOBS === 0, `and commits it (${requeued} committed)`);

  // The next passes follow on their own, a commit and a loop turn apart (not the interval reaper).
  for (let i = 0; i < 100 && count("status = 'IN_QUEUE'") < N - 2; i++) await turn();
  t.equal(count("status = 'IN_QUEUE'"), N - 2, 'then the rest, without waiting for the interval reaper');
  t.equal(count("status = 'IN_QUEUE' AND retries = 1 AND attempt = 1 AND worker_id IS NULL"), N - 2, 'each requeued once, its attempt counted');
  // Each fenced from the worker that lost it, in the same write (a restart keeps it).
  // (Not `first`: its worker's refused late result said it let go, which ends the fence.)
  const unfenced = claimed.filter(({ job, worker }) => job.id !== first.job.id && job.id !== done.job.id && job.id !== pinged.job.id
    && a.agent.db.prepare('SELECT fenced_from FROM jobs WHERE id = ?').pluck().get(job.id) !== worker);
  t.equal(unfenced.length, 0, 'each fenced from its lost worker');
  t.equal(a.agent.db.prepare('SELECT fenced_from FROM jobs WHERE id = ?').pluck().get(first.job.id), null, 'but the one whose worker posted its late result');
  t.equal(count(`status = 'COMPLETED' AND id = '${done.job.id}' AND retries = 0`), 1, 'the result stands');
  t.equal(count(`status = 'IN_PROGRESS' AND id = '${pinged.job.id}'`), 1, 'the pinged job, its lease renewed, still runs');
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.jobs, { completed: 1, failed: 0, inProgress: 1, inQueue: N - 2, retried: N - 2 }, '/health counts each requeue once');

  // Another worker takes them all; the lost ones get none of their own back (fenced for a lease).
  const got = await q.take(ep, 'fresh', N, never);
  t.equal(got.length, N - 2, 'a fresh worker gets every requeued job');
  t.equal((await q.take(ep, claimed[1]?.worker as string, 1, never, undefined, 0)).length, 0, 'nothing is left for a lost worker');
});

t.test('execution timeouts falling due together end a slice per pass; a result after the deadline never completes a job its slice has not reached', async (t) => {
  const { a, q, ep, clock, claimed, count } = await scene(t, 5_000);
  clock.advance(5_001);
  q.reap();
  t.match(q.health(ep).jobs, { inProgress: N - REAP_RUNNING_SLICE_JOBS }, 'one pass ends one slice');
  const last = claimed[N - 1] as { job: ClaimedJob; worker: string };
  t.equal(q.find(ep, last.job.id)?.status, 'IN_PROGRESS', 'a job past the slice is not ended yet');
  t.equal(await q.done(ep, last.worker, last.job.id, { output: { late: true } }), 'ended', 'its late result is discarded: the job ends at its deadline first');
  t.equal(q.find(ep, last.job.id)?.status, 'TIMED_OUT');
  for (let i = 0; i < 100 && count("status = 'TIMED_OUT'") < N; i++) await turn();
  t.equal(count("status = 'TIMED_OUT'"), N, 'every job timed out, each once, without waiting for the interval reaper');
  t.equal(count("status = 'TIMED_OUT' AND output IS NULL AND error LIKE 'Execution timed out after 5000 ms.'"), N);
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.jobs, { completed: 0, failed: N, inProgress: 0, inQueue: 0, retried: 0 }, '/health counts each end once');
});

t.test('a slice whose commit fails: its jobs are back on their workers, no pass spins on it, and a later pass requeues them all', async (t) => {
  const { a, q, ep, clock, count } = await scene(t);
  clock.advance(LEASE + 1);
  a.agent.db.exec(`CREATE TEMP TRIGGER requeue_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'IN_QUEUE'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  q.reap();
  await q.durable().catch(() => undefined);
  for (let i = 0; i < 20; i++) await turn();
  a.agent.db.exec('DROP TRIGGER requeue_fails');
  t.equal(count("status = 'IN_QUEUE'"), 0, 'nothing requeued in SQLite');
  t.match(q.health(ep).jobs, { inQueue: 0, inProgress: N }, 'nor in memory: the slice went back to its workers, and no next pass followed the failure');
  q.reap();
  for (let i = 0; i < 100 && count("status = 'IN_QUEUE'") < N; i++) await turn();
  t.equal(count("status = 'IN_QUEUE' AND retries = 1 AND attempt = 1"), N, 'a later pass requeues them all, each once');
  t.match(q.health(ep).jobs, { inQueue: N, inProgress: 0, retried: N });
});
