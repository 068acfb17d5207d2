/**
 * Rate limits (issue §4, spec "Limits"): per user, fixed windows `minute`, `hour` and `day` aligned
 * to the UTC wall clock, RateLimit/RateLimit-Policy on every authenticated response, 429 with
 * Retry-After naming the window, no headers for exempt keys, 401s not counted.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { ADMIN_KEY, assertProblem, queueBody, startAgent, type Reply } from '../helpers/agent.js';
import { makeUser, mustCreate } from '../helpers/expect.js';

const START = Date.UTC(2026, 0, 1); // a day boundary, so every window starts here

function limits(r: Reply): { policy: string | null; state: string | null } {
  return { policy: r.headers.get('ratelimit-policy'), state: r.headers.get('ratelimit') };
}

function assert429(t: Test, r: Reply, window: 'minute' | 'hour' | 'day', retryAfter: number): void {
  assertProblem(t, r, 429, `429 for the ${window} window`);
  t.equal(r.headers.get('retry-after'), String(retryAfter), 'Retry-After in integer seconds until the window resets');
  const members = (r.headers.get('ratelimit') ?? '').split(', ');
  t.same(members.map((m) => m.split(';')[0]), ['"minute"', '"hour"', '"day"'], 'RateLimit: one member per window, in the order of RateLimit-Policy');
  t.equal(members.find((m) => m.startsWith(`"${window}";`)), `"${window}";r=0;t=${retryAfter}`, 'the violated window has r=0 and its reset');
  t.ok(r.headers.get('ratelimit-policy'), 'the policy is still reported');
  t.match(r.json.detail, new RegExp(`"${window}"`), 'the detail names the window');
  t.equal(r.json.window, window, 'problem member window');
  t.equal(r.json.code, 'RATE_LIMITED');
}

t.test('every authenticated response carries RateLimit and RateLimit-Policy', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, { rateLimitMinute: 50, rateLimitHour: 500, rateLimitDay: 5000 }, { clock });
  const policy = '"minute";q=50;w=60, "hour";q=500;w=3600, "day";q=5000;w=86400';
  const first = await a.req('GET', '/v2/serverless');
  t.same(limits(first), { policy, state: '"minute";r=49;t=60, "hour";r=499;t=3600, "day";r=4999;t=86400' }, 'exact structured fields on a 200');
  clock.advance(15_000);
  const created = await a.req('POST', '/v2/serverless', { body: queueBody() });
  t.equal(created.status, 201);
  t.same(limits(created), { policy, state: '"minute";r=48;t=45, "hour";r=498;t=3585, "day";r=4998;t=86385' }, 'r counts down, t counts to the window end');
  const responses: [string, Reply][] = [
    ['204', await a.req('DELETE', `/v2/serverless/${created.json.id}`)],
    ['400', await a.req('POST', '/v2/serverless', { body: { name: '' } })],
    ['404', await a.req('GET', '/v2/serverless/abcdefghijklmn')],
    ['415', await a.req('POST', '/v2/serverless', { raw: '{}' })],
    ['422', await a.req('POST', '/v2/serverless', { body: { ...queueBody({ gpu: undefined }), cpu: [{ id: 'cpu3c', vcpuCount: 2 }], minCudaVersion: '12.1' } })],
    ['catalog', await a.req('GET', '/v2/catalog/gpus')],
    ['keys', await a.req('GET', '/v2/api-keys')],
  ];
  let remaining = 48;
  for (const [label, r] of responses) {
    remaining--;
    t.equal(r.headers.get('ratelimit-policy'), policy, `${label}: RateLimit-Policy`);
    t.match(r.headers.get('ratelimit'), new RegExp(`^"minute";r=${remaining};t=45, "hour";r=\\d+;t=3585, "day";r=\\d+;t=86385$`), `${label}: RateLimit`);
  }
});

t.test('the minute window: 429, Retry-After, then a fresh window at the next wall-clock minute', async (t) => {
  const clock = new ManualClock(START + 20_000);
  const a = await startAgent(t, { rateLimitMinute: 3, rateLimitHour: 1000, rateLimitDay: 10000 }, { clock });
  for (let i = 0; i < 3; i++) t.equal((await a.req('GET', '/v2/serverless')).status, 200, `request ${i + 1} of 3`);
  const refused = await a.req('GET', '/v2/serverless');
  assert429(t, refused, 'minute', 40);
  t.equal(refused.headers.get('ratelimit'), '"minute";r=0;t=40, "hour";r=997;t=3580, "day";r=9997;t=86380', 'a 429 reports every window, like a 200');
  assert429(t, await a.req('POST', '/v2/serverless', { body: queueBody() }), 'minute', 40);
  clock.advance(39_000);
  assert429(t, await a.req('GET', '/v2/serverless'), 'minute', 1);
  clock.advance(1_000);
  const next = await a.req('GET', '/v2/serverless');
  t.equal(next.status, 200, 'the window resets on the minute, not 60 s after the first request');
  t.match(next.headers.get('ratelimit'), /^"minute";r=2;t=60, "hour";r=996;/, 'refused requests used no quota');
});

t.test('the hour and day windows', async (t) => {
  const clock = new ManualClock(START + 59 * 60_000);
  const a = await startAgent(t, { rateLimitMinute: 100, rateLimitHour: 2, rateLimitDay: 3 }, { clock });
  t.equal((await a.req('GET', '/v2/serverless')).status, 200);
  t.equal((await a.req('GET', '/v2/serverless')).status, 200);
  assert429(t, await a.req('GET', '/v2/serverless'), 'hour', 60);
  clock.advance(60_000);
  const nextHour = await a.req('GET', '/v2/serverless');
  t.equal(nextHour.status, 200, 'a new hour');
  t.match(nextHour.headers.get('ratelimit'), /"hour";r=1;t=3600, "day";r=0;t=\d+$/);
  const day = await a.req('GET', '/v2/serverless');
  const secondsToDayEnd = (24 * 3600) - 3600;
  assert429(t, day, 'day', secondsToDayEnd);
  clock.advance(3_600_000);
  assert429(t, await a.req('GET', '/v2/serverless'), 'day', secondsToDayEnd - 3600);
  clock.advance((secondsToDayEnd - 3600) * 1000);
  t.equal((await a.req('GET', '/v2/serverless')).status, 200, 'a new day');
});

t.test('limits are per user; 401s do not count', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, { rateLimitMinute: 4, rateLimitHour: 1000, rateLimitDay: 10000 }, { clock });
  const u = await makeUser(t, a, 'limited'); // 2 admin requests
  const second = await a.req('POST', '/v2/api-keys', { body: { name: 'second', scopes: ['endpoints:read'] }, key: u.key });
  t.equal(second.status, 201);
  for (let i = 0; i < 5; i++) t.equal((await a.req('GET', '/v2/serverless', { key: null })).status, 401);
  for (let i = 0; i < 3; i++) t.equal((await a.req('GET', '/v2/serverless', { key: 'fd_usr_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA' })).status, 401);
  t.equal((await a.req('GET', '/v2/serverless', { key: second.json.key })).status, 200, 'another key of the same user');
  const session = await a.req('POST', '/v2/sessions', { key: u.key });
  t.equal(session.status, 201);
  const last = await a.req('GET', '/v2/serverless', { key: session.json.token });
  t.equal(last.status, 200, 'a session of the same user');
  t.match(last.headers.get('ratelimit'), /^"minute";r=0;/, 'keys and sessions of one user share the quota; the 401s used none');
  assert429(t, await a.req('GET', '/v2/serverless', { key: second.json.key }), 'minute', 60);
  assert429(t, await a.req('GET', '/v2/serverless', { key: u.key }), 'minute', 60);
  const admin = await a.req('GET', '/v2/serverless');
  t.equal(admin.status, 200, 'another user has its own quota');
  t.match(admin.headers.get('ratelimit'), /^"minute";r=1;/);
});

t.test('exempt keys get neither header and no limit; the first admin key is not exempt', async (t) => {
  const clock = new ManualClock(START);
  const a = await startAgent(t, { rateLimitMinute: 3, rateLimitHour: 1000, rateLimitDay: 10000 }, { clock });
  const admin = await a.req('GET', '/v2/api-keys');
  t.ok(admin.headers.get('ratelimit'), 'the admin key from FLASHD_ADMIN_API_KEY is limited');
  const adminKey = admin.json.find((k: { name: string }) => k.name === 'admin (FLASHD_ADMIN_API_KEY)');
  t.equal(adminKey?.exempt, false, 'and listed as not exempt');
  const exempt = await a.req('POST', '/v2/api-keys', { body: { name: 'automation', scopes: ['endpoints:read', 'endpoints:write'], exempt: true } });
  t.equal(exempt.status, 201);
  t.equal(exempt.json.exempt, true);
  for (let i = 0; i < 6; i++) {
    const r = await a.req('GET', '/v2/serverless', { key: exempt.json.key });
    t.equal(r.status, 200, `exempt request ${i + 1}`);
    t.equal(r.headers.get('ratelimit'), null, 'no RateLimit');
    t.equal(r.headers.get('ratelimit-policy'), null, 'no RateLimit-Policy');
  }
  const bad = await a.req('POST', '/v2/serverless', { body: { name: '' }, key: exempt.json.key });
  t.equal(bad.status, 400);
  t.equal(bad.headers.get('ratelimit'), null, 'not on errors either');
  t.equal((await a.req('GET', '/v2/serverless')).status, 200, "the admin's third request: exempt traffic used none of its quota");
  assert429(t, await a.req('GET', '/v2/serverless'), 'minute', 60);

  clock.advance(60_000);
  const user = await makeUser(t, a, 'to-exempt');
  const patched = await a.req('PATCH', `/v2/api-keys/${user.keyId}`, { body: { exempt: true } });
  t.equal(patched.json.exempt, true, 'an admin sets exempt: true on an existing key');
  await mustCreate(t, a, queueBody(), user.key);
  const after = await a.req('GET', '/v2/serverless', { key: user.key });
  t.equal(after.headers.get('ratelimit'), null, 'the change applies at once');
  const session = await a.req('POST', '/v2/sessions', { key: user.key });
  t.equal((await a.req('GET', '/v2/serverless', { key: session.json.token })).headers.get('ratelimit'), null, "sessions of an exempt key are exempt");
  clock.advance(60_000); // the admin made three requests in this minute
  t.equal((await a.req('PATCH', `/v2/api-keys/${user.keyId}`, { body: { exempt: false } })).json.exempt, false);
  t.ok((await a.req('GET', '/v2/serverless', { key: user.key })).headers.get('ratelimit'), 'and can be taken back');
});
