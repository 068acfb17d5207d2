/**
 * JobRateLimiter on its own: RunPod's documented quotas (research worker-protocol.md §4), 10 s
 * windows aligned to the wall clock, and state bounded by the endpoints in recent use.
 */
import t from 'tap';
import { JOB_RATE_QUOTAS, JOB_RATE_WINDOW_SECONDS, JobRateLimiter } from '../../src/auth/index.js';
import { ManualClock } from '../../src/core/clock.js';

const START = Date.UTC(2026, 0, 1);

t.test("the quotas are RunPod's per 10 s table", async (t) => {
  t.equal(JOB_RATE_WINDOW_SECONDS, 10);
  t.same(JOB_RATE_QUOTAS.map((q) => [q.group, q.quota]), [['run', 1000], ['runsync', 2000], ['status', 2000], ['cancel', 100], ['purge-queue', 2]]);
});

t.test('counts per endpoint and group in wall-clock windows; refusals use no quota', async (t) => {
  const clock = new ManualClock(START + 4_500);
  const l = new JobRateLimiter(clock);
  for (let i = 0; i < 100; i++) t.equal(l.take('ep-a', 'cancel').allowed, true);
  const refused = l.take('ep-a', 'cancel');
  t.same({ allowed: refused.allowed, retryAfter: refused.retryAfter, headers: refused.headers }, {
    allowed: false, retryAfter: 6,
    headers: { 'ratelimit-policy': '"cancel";q=100;w=10', ratelimit: '"cancel";r=0;t=6', 'retry-after': '6' },
  });
  t.equal(l.take('ep-a', 'status').allowed, true, 'another group');
  t.equal(l.take('ep-b', 'cancel').allowed, true, 'another endpoint');
  clock.advance(5_499);
  t.equal(l.take('ep-a', 'cancel').retryAfter, 1, 'Retry-After is at least 1 s');
  clock.advance(1);
  const fresh = l.take('ep-a', 'cancel');
  t.same(fresh.headers, { 'ratelimit-policy': '"cancel";q=100;w=10', ratelimit: '"cancel";r=99;t=10' }, 'the window resets on the 10 s boundary');
});

t.test('memory: deleted and idle endpoints are dropped', async (t) => {
  const clock = new ManualClock(START);
  const l = new JobRateLimiter(clock);
  for (let i = 0; i < 5_000; i++) l.take(`ep-${i}`, 'status');
  t.equal(l.size, 5_000);
  l.forget('ep-0');
  t.equal(l.size, 4_999, 'forget drops one endpoint');
  clock.advance(10_000);
  l.take('ep-1', 'run');
  t.equal(l.size, 4_999, 'endpoints used in the previous window are kept');
  clock.advance(10_000);
  l.take('ep-2', 'run');
  t.equal(l.size, 2, 'endpoints idle for a whole window are swept (ep-1 was used in the last one)');
  clock.advance(600_000);
  l.take('ep-3', 'run');
  t.equal(l.size, 1);
});

t.test('--job-rate-limit-percent scales every quota; 0 turns the limiter off', async (t) => {
  const clock = new ManualClock(START);
  const ten = new JobRateLimiter(clock, 1000);
  for (let i = 0; i < 20; i++) t.equal(ten.take('ep', 'purge-queue').allowed, true);
  t.equal(ten.take('ep', 'purge-queue').allowed, false, '2 x 10 purges');
  t.equal(ten.take('ep', 'status').headers['ratelimit-policy'], '"status";q=20000;w=10');
  t.equal(new JobRateLimiter(clock, 1).take('ep', 'purge-queue').headers['ratelimit-policy'], '"purge-queue";q=1;w=10', 'never below 1');
  t.equal(new JobRateLimiter(clock).enabled, true);
  t.equal(new JobRateLimiter(clock, 0).enabled, false);
});
