/**
 * AuthService caches the principal of a key that authenticated (by the raw key). Every test
 * warms the cache with repeated requests, changes something behind it through the API, and
 * expects the very next request to see the change: a cache that missed an invalidation fails.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { assertProblem, queueBody, startAgent, type Reply, type TestAgent } from '../helpers/agent.js';
import { makeUser, mustCreate, mustPost } from '../helpers/expect.js';
import { TestWorker } from '../helpers/worker.js';

function assert401(t: Test, r: Reply, detail: RegExp, label: string): void {
  assertProblem(t, r, 401, label);
  t.match(r.json?.detail, detail, `${label}: detail`);
}

/** `n` requests with `key`, each expected to succeed. */
async function warm(t: Test, a: TestAgent, key: string, n = 5): Promise<void> {
  for (let i = 0; i < n; i++) {
    const r = await a.req('GET', '/v2/serverless', { key });
    if (r.status !== 200) t.fail(`request ${i + 1} of ${n}: ${r.status} ${r.text}`);
  }
}

t.test('a key keeps working across many requests, in every header form; malformed headers keep their errors', async (t) => {
  const a = await startAgent(t);
  const u1 = await makeUser(t, a, 'cache-u1');
  const u2 = await makeUser(t, a, 'cache-u2');
  const ep1 = await mustCreate(t, a, queueBody({ name: 'u1-ep' }), u1.key);
  const ep2 = await mustCreate(t, a, queueBody({ name: 'u2-ep' }), u2.key);
  const ids = async (authorization: string) => {
    const r = await a.req('GET', '/v2/serverless', { key: null, headers: { authorization } });
    t.equal(r.status, 200, `200 for ${JSON.stringify(authorization.replace(/fd_usr_\w+/, 'KEY'))}`);
    return r.json?.map((e: { id: string }) => e.id);
  };
  for (let i = 0; i < 100; i++) {
    const [k, ep] = i % 2 === 0 ? [u1.key, ep1.id] : [u2.key, ep2.id];
    const r = await a.req('GET', '/v2/serverless', { key: k });
    if (r.status !== 200 || r.json.length !== 1 || r.json[0].id !== ep) t.fail(`request ${i}: ${r.status} ${r.text}`);
  }
  t.pass('100 interleaved requests of two keys, each sees only its own account');
  // fetch trims the value's ends, so the forms differ inside.
  for (const form of [`Bearer ${u1.key}`, `bearer ${u1.key}`, `BEARER \t ${u1.key}`, `Bearer\t${u1.key}`, u1.key]) {
    t.same(await ids(form), [ep1.id]);
  }
  const withAuth = (value: string) => a.req('GET', '/v2/serverless', { key: null, headers: { authorization: value } });
  assert401(t, await withAuth(`Bearer ${u1.key} extra`), /^Malformed Authorization header/, 'a cached key followed by another token');
  assert401(t, await withAuth(`Bearer ${u1.key}x`), /malformed/, 'a cached key with a trailing character');
  assert401(t, await withAuth('Bearer'), /no token/, '"Bearer" alone');
  // runpod-python sends an empty one when a config.toml's [default] has no api_key; a program
  // that reads the key from an unset variable does too: not the same slip as no header at all.
  assert401(t, await withAuth(''), /^The Authorization header is empty/, 'an empty header');
  assert401(t, await a.req('GET', '/v2/serverless', { key: null }), /^Missing Authorization header/, 'no header');
});

t.test('revoking a key makes the very next request 401', async (t) => {
  const a = await startAgent(t);
  const u = await makeUser(t, a, 'revoke-me');
  await warm(t, a, u.key);
  t.equal((await a.req('DELETE', `/v2/api-keys/${u.keyId}`)).status, 204);
  assert401(t, await a.req('GET', '/v2/serverless', { key: u.key }), /revoked/, 'the next request after revocation');
  assert401(t, await a.req('GET', '/v2/serverless', { key: u.key }), /revoked/, 'and the one after');
});

t.test('a key that revokes itself cannot use its next request', async (t) => {
  const a = await startAgent(t);
  const u = await makeUser(t, a, 'self-revoke');
  await warm(t, a, u.key);
  t.equal((await a.req('DELETE', `/v2/api-keys/${u.keyId}`, { key: u.key })).status, 204);
  assert401(t, await a.req('GET', '/v2/serverless', { key: u.key }), /revoked/, 'after revoking itself');
});

t.test('changing exempt takes effect on the next request', async (t) => {
  const a = await startAgent(t);
  const u = await makeUser(t, a, 'exempt-toggle');
  const limited = async () => {
    const r = await a.req('GET', '/v2/serverless', { key: u.key });
    t.equal(r.status, 200);
    return r.headers.get('ratelimit') !== null;
  };
  await warm(t, a, u.key);
  t.ok(await limited(), 'not exempt: RateLimit headers');
  t.equal((await a.req('PATCH', `/v2/api-keys/${u.keyId}`, { body: { exempt: true } })).status, 200);
  t.notOk(await limited(), 'exempt from the next request on: no RateLimit headers');
  t.notOk(await limited(), 'and after');
  t.equal((await a.req('PATCH', `/v2/api-keys/${u.keyId}`, { body: { exempt: false } })).status, 200);
  t.ok(await limited(), 'limited again from the next request on');
});

t.test("removing a user from a team ends its team key on the next request; adding it back restores it", async (t) => {
  const a = await startAgent(t);
  const owner = await makeUser(t, a, 'cache-team-owner');
  const member = await makeUser(t, a, 'cache-team-member');
  const team = await mustPost(t, a, '/v2/teams', { name: 'cache-team' }, owner.key);
  t.equal((await a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: member.id }, key: owner.key })).status, 204);
  const teamKey = await mustPost(t, a, '/v2/api-keys', { name: 'team', scopes: ['endpoints:read'], teamId: team.id }, member.key);
  await warm(t, a, teamKey.key);
  t.equal((await a.req('DELETE', `/v2/teams/${team.id}/members/${member.id}`, { key: owner.key })).status, 204);
  assert401(t, await a.req('GET', '/v2/serverless', { key: teamKey.key }), /no longer a member/, 'the next request after removal');
  t.equal((await a.req('GET', '/v2/serverless', { key: member.key })).status, 200, 'the personal key still works');
  t.equal((await a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: member.id }, key: owner.key })).status, 204);
  t.equal((await a.req('GET', '/v2/serverless', { key: teamKey.key })).status, 200, 'back in the team: the team key works again');
});

t.test('a key stops working once it expires, although it is cached', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, {}, { clock });
  const k = await mustPost(t, a, '/v2/api-keys', { name: 'short', scopes: ['endpoints:read'], expiresAt: new Date(clock.now() + 60_000).toISOString() });
  await warm(t, a, k.key);
  clock.advance(59_999);
  t.equal((await a.req('GET', '/v2/serverless', { key: k.key })).status, 200, '1 ms before expiry');
  clock.advance(1);
  assert401(t, await a.req('GET', '/v2/serverless', { key: k.key }), /expired/, 'at expiry');
});

t.test("deleting an endpoint ends its worker keys on the next request", async (t) => {
  const a = await startAgent(t);
  const ep = await mustCreate(t, a, queueBody({ name: 'worker-cache' }));
  const w = await TestWorker.create(a, ep.id);
  const ping = () => fetch(`${a.url}/v2/${ep.id}/ping/${w.workerId}`, { headers: { authorization: w.key } });
  for (let i = 0; i < 5; i++) t.equal((await ping()).status, 200, `ping ${i + 1} with the raw worker key`);
  t.equal((await a.req('DELETE', `/v2/serverless/${ep.id}`)).status, 204);
  const r = await ping();
  t.equal(r.status, 401, 'the next ping after the endpoint is deleted');
  t.match(((await r.json()) as { detail: string }).detail, /revoked/);
});

t.test('a suspended key (a FlashBoot worker kept stopped) is refused as revoked on the next request, cached or not, until resumed', async (t) => {
  const a = await startAgent(t);
  const u = await makeUser(t, a, 'suspend-me');
  await warm(t, a, u.key);
  a.agent.auth.suspendKey(u.keyId);
  const revoked = await a.req('GET', '/v2/serverless', { key: u.key });
  assert401(t, revoked, /^The API key has been revoked\.$/, 'the next request after suspension (a cached principal)');
  assert401(t, await a.req('GET', '/v2/serverless', { key: u.key }), /revoked/, 'and the one after');
  a.agent.auth.resumeKey(u.keyId);
  await warm(t, a, u.key);
  // Suspended again, revoked meanwhile (DELETE /v2/api-keys): resuming does not bring it back.
  a.agent.auth.suspendKey(u.keyId);
  t.equal((await a.req('DELETE', `/v2/api-keys/${u.keyId}`)).status, 204);
  a.agent.auth.resumeKey(u.keyId);
  assert401(t, await a.req('GET', '/v2/serverless', { key: u.key }), /revoked/, 'a key revoked while suspended stays revoked');
});
