/**
 * Limits of the queue job API (`/v2/{endpoint_id}/run|runsync|status|stream|cancel|retry|
 * purge-queue|health`): RunPod's per-endpoint quotas per 10 s by operation group (research
 * worker-protocol.md §4), not the management API's per-user minute/hour/day windows, which a
 * runpod client polling /status once a second per job used up in a minute. Real HTTP on
 * loopback; the clock is a ManualClock, so no test waits for a window.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { assertProblem, queueBody, startAgent, type Reply, type TestAgent } from '../helpers/agent.js';
import { makeUser, mustCreate } from '../helpers/expect.js';
import { TestWorker } from '../helpers/worker.js';

const START = Date.UTC(2026, 0, 1); // a day boundary, so every window starts here

function limits(r: Reply): { policy: string | null; state: string | null } {
  return { policy: r.headers.get('ratelimit-policy'), state: r.headers.get('ratelimit') };
}

function assertJob429(t: Test, r: Reply, endpointId: string, group: string, quota: number, retryAfter: number): void {
  assertProblem(t, r, 429, `429 for the "${group}" group of ${endpointId}`);
  t.equal(r.json.code, 'RATE_LIMITED');
  t.equal(r.json.type, 'https://iana.org/assignments/http-problem-types#quota-exceeded', 'the IANA quota-exceeded type');
  t.equal(r.headers.get('retry-after'), String(retryAfter), 'Retry-After in integer seconds until the 10 s window resets');
  t.same(limits(r), { policy: `"${group}";q=${quota};w=10`, state: `"${group}";r=0;t=${retryAfter}` }, 'the headers describe the per-endpoint limit that applied');
  t.ok(r.json.detail.includes(endpointId), 'the detail names the endpoint');
  t.ok(r.json.detail.includes(`"${group}"`), 'the detail names the operation group');
  t.match(r.json.detail, /per 10 s window/, 'the detail names the window');
  t.same(
    { endpointId: r.json.endpointId, group: r.json.group, window: r.json.window, violated: r.json['violated-policies'] },
    { endpointId, group, window: '10s', violated: [group] },
    'problem members',
  );
}

async function endpoint(t: Test, a: TestAgent, key?: string): Promise<string> {
  return (await mustCreate(t, a, queueBody(), key)).id as string;
}

t.test('700 /status polls in a minute from one user get no 429 (ten runpod.Endpoint jobs polling once a second)', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, {}, { clock }); // default per-user quota: 600 a minute
  const ep = await endpoint(t, a);
  const ids: string[] = [];
  for (let i = 0; i < 10; i++) {
    const r = await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } });
    t.equal(r.status, 200, `run ${i + 1}`);
    ids.push(r.json.id);
  }
  const statuses = new Map<number, number>();
  let first: Reply | undefined;
  for (let i = 0; i < 700; i++) {
    const r = await a.req('GET', `/v2/${ep}/status/${ids[i % ids.length]}`);
    first ??= r;
    statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
    clock.advance(85); // 700 polls over 59.5 s, all within one wall-clock minute
  }
  t.same(Object.fromEntries(statuses), { 200: 700 }, 'every poll answered 200');
  t.same(limits(first as Reply), { policy: '"status";q=2000;w=10', state: '"status";r=1999;t=10' }, 'a job route reports the per-endpoint limit');
  const mgmt = await a.req('GET', '/v2/serverless');
  t.equal(mgmt.status, 200);
  t.match(mgmt.headers.get('ratelimit'), /^"minute";r=598;t=1, "hour";r=17998;/, 'the runs and polls used none of the per-user quota (the create and this list did)');
});

t.test('a group over its per-endpoint quota gets 429; other endpoints and groups are unaffected', async (t) => {
  const clock = new ManualClock(START + 3_000); // 7 s before the 10 s window ends
  const a = await startAgent(t, {}, { clock });
  const epA = await endpoint(t, a);
  const epB = await endpoint(t, a);

  // purge-queue: 2 per 10 s.
  const p1 = await a.req('POST', `/v2/${epA}/purge-queue`);
  t.equal(p1.status, 200);
  t.same(limits(p1), { policy: '"purge-queue";q=2;w=10', state: '"purge-queue";r=1;t=7' });
  t.equal((await a.req('POST', `/v2/${epA}/purge-queue`)).status, 200, 'the second purge of the window');
  assertJob429(t, await a.req('POST', `/v2/${epA}/purge-queue`), epA, 'purge-queue', 2, 7);
  const other = await a.req('POST', `/v2/${epB}/purge-queue`);
  t.equal(other.status, 200, 'another endpoint of the same user has its own quota');
  t.same(limits(other), { policy: '"purge-queue";q=2;w=10', state: '"purge-queue";r=1;t=7' });
  const status = await a.req('GET', `/v2/${epA}/status/no-such-job`);
  t.equal(status.status, 404, 'another group of the same endpoint goes on');
  t.same(limits(status), { policy: '"status";q=2000;w=10', state: '"status";r=1999;t=7' }, 'with its own count (a 404 counts)');
  clock.advance(6_000);
  assertJob429(t, await a.req('POST', `/v2/${epA}/purge-queue`), epA, 'purge-queue', 2, 1);
  clock.advance(1_000);
  const next = await a.req('POST', `/v2/${epA}/purge-queue`);
  t.equal(next.status, 200, 'a fresh window on the 10 s boundary');
  t.same(limits(next), { policy: '"purge-queue";q=2;w=10', state: '"purge-queue";r=1;t=10' }, 'refused requests used no quota');

  // cancel: 100 per 10 s.
  for (let i = 0; i < 100; i++) {
    const r = await a.req('POST', `/v2/${epA}/cancel/job-${i}`);
    if (r.status !== 404) t.fail(`cancel ${i + 1}: ${r.status} ${r.text}`);
  }
  assertJob429(t, await a.req('POST', `/v2/${epA}/cancel/job-x`), epA, 'cancel', 100, 10);
  t.equal((await a.req('POST', `/v2/${epB}/cancel/job-x`)).status, 404, 'endpoint B can still cancel');

  // /retry counts with /run; /health with /status and /stream; /runsync has its own.
  t.match((await a.req('POST', `/v2/${epA}/run`, { body: { input: {} } })).headers.get('ratelimit'), /^"run";r=999;/);
  t.match((await a.req('POST', `/v2/${epA}/retry/no-such-job`)).headers.get('ratelimit'), /^"run";r=998;/, '/retry takes from the run group');
  t.match((await a.req('GET', `/v2/${epA}/stream/no-such-job`)).headers.get('ratelimit'), /^"status";r=1999;/);
  t.match((await a.req('GET', `/v2/${epA}/health`)).headers.get('ratelimit'), /^"status";r=1998;/, '/health takes from the status group');
  const sync = await a.req('POST', `/v2/${epA}/runsync`, { body: {} });
  t.equal(sync.status, 400, 'a /runsync without input');
  t.same(limits(sync), { policy: '"runsync";q=2000;w=10', state: '"runsync";r=1999;t=10' });

  // The state of a deleted endpoint goes with it.
  const before = a.agent.jobRateLimiter.size;
  t.equal(before, 2);
  t.equal((await a.req('DELETE', `/v2/serverless/${epA}`)).status, 204);
  t.equal(a.agent.jobRateLimiter.size, 1, 'deleting an endpoint drops its counters');
  t.equal((await a.req('GET', `/v2/${epA}/status/x`)).status, 404);
  t.equal(a.agent.jobRateLimiter.size, 1, 'requests for an endpoint that does not exist add no state');
});

t.test('a key refused the operation (403) uses none of the endpoint quota every key of the account shares', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, {}, { clock });
  const ep = await endpoint(t, a);
  const ro = await a.req('POST', '/v2/api-keys', { body: { name: 'dashboard', scopes: ['jobs:read'] } });
  t.equal(ro.status, 201);
  // A worker key sits in every worker's environment, next to the handler's code.
  const worker = await TestWorker.create(a, ep);
  for (const [who, key] of [['a jobs:read key', ro.json.key as string], ['a worker key', worker.key]] as const) {
    for (let i = 0; i < 3; i++) {
      const r = await a.req('POST', `/v2/${ep}/purge-queue`, { key });
      assertProblem(t, r, 403, `${who}: purge ${i + 1} refused for its scope, not for the quota (2)`);
      t.same(limits(r), { policy: '"purge-queue";q=2;w=10', state: '"purge-queue";r=2;t=10' }, 'the quota is reported, not spent');
    }
    const run = await a.req('POST', `/v2/${ep}/run`, { key, body: { input: {} } });
    assertProblem(t, run, 403, `${who}: /run refused`);
    t.same(limits(run), { policy: '"run";q=1000;w=10', state: '"run";r=1000;t=10' });
  }
  const p1 = await a.req('POST', `/v2/${ep}/purge-queue`);
  t.equal(p1.status, 200, 'the owner can still purge');
  t.same(limits(p1), { policy: '"purge-queue";q=2;w=10', state: '"purge-queue";r=1;t=10' });
  t.equal((await a.req('POST', `/v2/${ep}/purge-queue`)).status, 200, 'twice');
  assertJob429(t, await a.req('POST', `/v2/${ep}/purge-queue`), ep, 'purge-queue', 2, 10);
  const spent = await a.req('POST', `/v2/${ep}/purge-queue`, { key: ro.json.key as string });
  assertProblem(t, spent, 403, 'a refused key gets its 403 even with the quota spent');
  t.same(limits(spent), { policy: '"purge-queue";q=2;w=10', state: '"purge-queue";r=0;t=10' });
});

t.test('exempt keys are never limited on job routes and use no quota', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, {}, { clock });
  const ep = await endpoint(t, a);
  const exempt = await a.req('POST', '/v2/api-keys', { body: { name: 'automation', scopes: ['jobs:run', 'jobs:read'], exempt: true } });
  t.equal(exempt.status, 201);
  const key = exempt.json.key as string;
  for (let i = 0; i < 5; i++) {
    const r = await a.req('POST', `/v2/${ep}/purge-queue`, { key });
    t.equal(r.status, 200, `exempt purge ${i + 1} (quota 2)`);
    t.same(limits(r), { policy: null, state: null }, 'no RateLimit headers');
  }
  let notFound = 0;
  for (let i = 0; i < 150; i++) if ((await a.req('POST', `/v2/${ep}/cancel/job-${i}`, { key })).status === 404) notFound++;
  t.equal(notFound, 150, '150 exempt cancels (quota 100) all reach the handler');
  t.equal(a.agent.jobRateLimiter.size, 0, 'exempt traffic keeps no state');
  const limited = await a.req('POST', `/v2/${ep}/purge-queue`);
  t.equal(limited.status, 200, 'a limited key still has the whole quota');
  t.same(limits(limited), { policy: '"purge-queue";q=2;w=10', state: '"purge-queue";r=1;t=10' });
});

t.test('management routes keep the per-user limiter; job routes for endpoints not the caller’s count per user', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, { rateLimitMinute: 8, rateLimitHour: 1000, rateLimitDay: 10000 }, { clock });
  const ep = await endpoint(t, a); // admin: 1 of 8
  const other = await makeUser(t, a, 'other'); // admin: 3 of 8
  for (let i = 0; i < 30; i++) {
    const run = await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } });
    const st = await a.req('GET', `/v2/${ep}/status/${run.json.id}`);
    if (run.status !== 200 || st.status !== 200) t.fail(`job round ${i}: ${run.status} ${st.status}`);
  }
  const foreign = await a.req('GET', `/v2/${ep}/status/x`, { key: other.key });
  t.equal(foreign.status, 404, "another user's endpoint is a 404");
  t.match(foreign.headers.get('ratelimit'), /^"minute";r=7;t=60, /, "and counts against the caller's per-user quota");
  t.match((await a.req('GET', `/v2/${ep}/health`)).headers.get('ratelimit'), /^"status";r=1969;/, "the owner's status quota: 30 polls, the foreign request not among them");
  for (let i = 0; i < 5; i++) {
    const r = await a.req('GET', '/v2/serverless');
    t.equal(r.status, 200, `management request ${i + 4} of 8`);
    t.match(r.headers.get('ratelimit'), new RegExp(`^"minute";r=${4 - i};t=60, "hour"`), 'the per-user windows');
  }
  const refused = await a.req('GET', '/v2/serverless');
  assertProblem(t, refused, 429);
  t.equal(refused.json.window, 'minute');
  t.equal(refused.headers.get('retry-after'), '60');
  t.match(refused.json.detail, /"minute" window \(8 requests per 60 s\)/);
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).status, 200, 'job routes go on when the per-user quota is spent');
  const unknown = await a.req('GET', '/v2/abcdefghijklmn/status/x');
  assertProblem(t, unknown, 429, 'a job route for an endpoint that does not exist falls back to the spent per-user quota');
  t.equal(unknown.json.window, 'minute');
});

t.test('--job-rate-limit-percent 0: job routes are not limited and carry no headers; management routes still are', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, { jobRateLimitPercent: 0, rateLimitMinute: 5 }, { clock });
  const ep = await endpoint(t, a);
  for (let i = 0; i < 10; i++) {
    const r = await a.req('POST', `/v2/${ep}/purge-queue`);
    t.equal(r.status, 200, `purge ${i + 1}`);
    t.same(limits(r), { policy: null, state: null });
  }
  let last: Reply | undefined;
  for (let i = 0; i < 6; i++) last = await a.req('GET', '/v2/serverless');
  t.equal(last?.status, 429, 'the per-user limit still applies to the management API');
});
