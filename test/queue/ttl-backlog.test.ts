/**
 * A backlog whose policy.ttl runs out together (a weekend without workers, or a restart after
 * it) is expired a slice per reaper pass and commit, with the event loop turning between
 * slices, not in one pass and one commit that holds every request for seconds.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { EXPIRE_QUEUED_SLICE_JOBS } from '../../src/queue/job-queue.js';
import { startAgent, cpuBody } from '../helpers/agent.js';

const N = 5 * EXPIRE_QUEUED_SLICE_JOBS + 17;

t.test('queued jobs whose TTL ran out together expire a slice per pass, and all of them do', async (t) => {
  // NORMAL: a commit answers at once (no sync, no group-commit hold), so the turns are exact.
  const clock = new ManualClock();
  const a = await startAgent(t, { sqliteSynchronous: 'normal' }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const jobs = [];
  for (let i = 0; i < N; i++) {
    jobs.push(a.agent.queue.submit({
      endpointId: ep, input: `{"i":${i}}`, extra: null, webhook: null, executionTimeoutMs: 600_000, ttlMs: 10_000, lowPriority: i % 7 === 0, retentionMs: 600_000,
    }));
  }
  await Promise.all(jobs);
  const count = (status: string): number =>
    a.agent.db.prepare('SELECT count(*) FROM jobs WHERE endpoint_id = ? AND status = ?').pluck().get(ep, status) as number;

  clock.advance(10_001);
  a.agent.queue.reap();
  t.equal(a.agent.queue.health(ep).jobs.inQueue, N - EXPIRE_QUEUED_SLICE_JOBS, 'one pass expires one slice');
  await a.agent.queue.durable();
  // The next pass starts once that commit is in, and may be committed too by the time this
  // continuation runs: whole slices only.
  const committed = count('TIMED_OUT');
  t.ok(committed >= EXPIRE_QUEUED_SLICE_JOBS && committed % EXPIRE_QUEUED_SLICE_JOBS === 0, `and commits it (${committed} committed)`);

  // The next passes follow on their own, a commit and a loop turn apart.
  for (let i = 0; i < 100 && count('IN_QUEUE') > 0; i++) await new Promise((resolve) => setImmediate(resolve));
  t.equal(count('IN_QUEUE'), 0, 'then the rest, without waiting for the interval reaper');
  t.equal(count('TIMED_OUT'), N, 'every job expired, each once');
  const health = (await a.req('GET', `/v2/${ep}/health`)).json.jobs;
  t.equal(health.inQueue, 0);
  t.equal(health.failed, N, '/health counts every expired job once');

  const after = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { after: true } } })).json.id as string;
  t.equal((await a.req('GET', `/v2/${ep}/status/${after}`)).json.status, 'IN_QUEUE', 'a job submitted afterwards waits as usual');
});
