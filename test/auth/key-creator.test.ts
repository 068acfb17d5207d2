/**
 * A key made by a key without `admin` (a read-only "dashboard" key, or a session opened with
 * one) is bound to the key that made it: it lists that key as `createdBy`, it ends when that key
 * is revoked or expires (and so do the keys it made in turn), and it cannot outlive it. Keys an
 * admin makes are independent, as before. Revoking a leaked key must lock out whoever holds it,
 * also through the keys they made with it.
 */
import t, { type Test } from 'tap';
import { generateApiKey, hashKey } from '../../src/auth/index.js';
import { ManualClock } from '../../src/core/clock.js';
import { assertProblem, startAgent, type Reply, type TestAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { mustPost } from '../helpers/expect.js';
import { databaseAtVersion } from '../helpers/old-db.js';

function assert401(t: Test, r: Reply, detail: RegExp, label: string): void {
  assertProblem(t, r, 401, label);
  t.match(r.json?.detail, detail, `${label}: detail`);
}

const ok = async (t: Test, a: TestAgent, key: string, label: string) =>
  t.equal((await a.req('GET', '/v2/serverless', { key })).status, 200, label);

const dashboard = (a: TestAgent, t: Test) => mustPost(t, a, '/v2/api-keys', { name: 'dashboard', scopes: ['endpoints:read'] });

t.test('revoking a read-only key ends the keys it made, and theirs, at once', async (t) => {
  const a = await startAgent(t);
  const ro = await dashboard(a, t);
  t.equal(ro.createdBy, null, 'a key an admin made has no creator');
  const child = await mustPost(t, a, '/v2/api-keys', { name: 'child', scopes: ['endpoints:read'] }, ro.key);
  t.equal(child.createdBy, ro.id, 'the create response names its creator');
  const grandchild = await mustPost(t, a, '/v2/api-keys', { name: 'grandchild', scopes: ['endpoints:read'] }, child.key);
  t.equal(grandchild.createdBy, child.id);
  // A session opened with the child makes keys bound to the child.
  const session = (await a.req('POST', '/v2/sessions', { key: child.key })).json.token as string;
  const viaSession = await mustPost(t, a, '/v2/api-keys', { name: 'via-session', scopes: ['endpoints:read'] }, session);
  t.equal(viaSession.createdBy, child.id, 'a key made through a session is bound to the key that opened it');
  for (const [k, label] of [[ro.key, 'ro'], [child.key, 'child'], [grandchild.key, 'grandchild'], [viaSession.key, 'via-session'], [session, 'session']]) {
    for (let i = 0; i < 3; i++) await ok(t, a, k as string, `${label} works (${i + 1}, cached)`);
  }
  const listed = (await a.req('GET', '/v2/api-keys')).json as { id: string; createdBy: string | null }[];
  t.same(Object.fromEntries(listed.filter((k) => [ro.id, child.id, grandchild.id].includes(k.id)).map((k) => [k.id, k.createdBy])),
    { [ro.id]: null, [child.id]: ro.id, [grandchild.id]: child.id }, 'the listing shows createdBy');
  t.equal((await a.req('GET', `/v2/api-keys/${grandchild.id}`)).json.createdBy, child.id, 'GET shows it too');

  t.equal((await a.req('DELETE', `/v2/api-keys/${ro.id}`)).status, 204);
  assert401(t, await a.req('GET', '/v2/serverless', { key: ro.key }), /has been revoked/, 'the revoked key');
  assert401(t, await a.req('GET', '/v2/serverless', { key: child.key }), new RegExp(`creating key \\(${ro.id}\\) has been revoked`), 'its child, at once');
  assert401(t, await a.req('GET', '/v2/serverless', { key: grandchild.key }), new RegExp(`creating key \\(${ro.id}\\) has been revoked`), 'its grandchild');
  assert401(t, await a.req('GET', '/v2/serverless', { key: viaSession.key }), /creating key .* has been revoked/, 'the key made through the session');
  assert401(t, await a.req('GET', '/v2/serverless', { key: session }), /creating key .* has been revoked/, "the child's session");
  assertProblem(t, await a.req('POST', '/v2/api-keys', { key: child.key, body: { name: 'more', scopes: ['endpoints:read'] } }), 401, 'the child makes no more keys');
});

t.test('revoking a key in the middle ends the keys below it only', async (t) => {
  const a = await startAgent(t);
  const ro = await dashboard(a, t);
  const child = await mustPost(t, a, '/v2/api-keys', { name: 'child', scopes: ['endpoints:read'] }, ro.key);
  const grandchild = await mustPost(t, a, '/v2/api-keys', { name: 'grandchild', scopes: ['endpoints:read'] }, child.key);
  await ok(t, a, grandchild.key, 'grandchild works');
  t.equal((await a.req('DELETE', `/v2/api-keys/${child.id}`, { key: ro.key })).status, 204, 'the creator revokes its child');
  assert401(t, await a.req('GET', '/v2/serverless', { key: grandchild.key }), new RegExp(`creating key \\(${child.id}\\) has been revoked`), 'the grandchild ends');
  await ok(t, a, ro.key, 'the key above stays valid');
});

t.test('keys an admin made are independent of the admin key that made them', async (t) => {
  const a = await startAgent(t);
  const admin2 = await mustPost(t, a, '/v2/api-keys', { name: 'second admin', scopes: ['admin'] });
  const made = await mustPost(t, a, '/v2/api-keys', { name: 'made by admin2', scopes: ['endpoints:read'] }, admin2.key);
  t.equal(made.createdBy, null, 'a key made with an admin key records no creator');
  const byFirst = await dashboard(a, t);
  t.equal((await a.req('DELETE', `/v2/api-keys/${admin2.id}`)).status, 204);
  await ok(t, a, made.key, "a key the revoked admin key made keeps working");
  await ok(t, a, byFirst.key, 'so does one the other admin key made');
  const expiringAdmin = await mustPost(t, a, '/v2/api-keys', { name: 'admin, expiring', scopes: ['admin'], expiresAt: new Date(Date.now() + 3_600_000).toISOString() });
  const longer = await mustPost(t, a, '/v2/api-keys', { name: 'longer', scopes: ['endpoints:read'] }, expiringAdmin.key);
  t.equal(longer.expiresAt, null, "an admin key's key is not clamped to its expiry");
});

t.test("a bound key cannot outlive its creator: expiresAt is clamped to the creator's, and the creator's expiry ends it", async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, {}, { clock });
  const hour = clock.now() + 3_600_000;
  const ro = await mustPost(t, a, '/v2/api-keys', { name: 'dashboard', scopes: ['endpoints:read'], expiresAt: new Date(hour).toISOString() });
  const forever = await mustPost(t, a, '/v2/api-keys', { name: 'no expiry asked', scopes: ['endpoints:read'] }, ro.key);
  t.equal(forever.expiresAt, new Date(hour).toISOString(), 'no expiresAt: it gets its creator\'s');
  const later = await mustPost(t, a, '/v2/api-keys', { name: 'later', scopes: ['endpoints:read'], expiresAt: new Date(hour + 86_400_000).toISOString() }, ro.key);
  t.equal(later.expiresAt, new Date(hour).toISOString(), 'a later expiresAt is clamped to its creator\'s');
  const sooner = await mustPost(t, a, '/v2/api-keys', { name: 'sooner', scopes: ['endpoints:read'], expiresAt: new Date(hour - 60_000).toISOString() }, ro.key);
  t.equal(sooner.expiresAt, new Date(hour - 60_000).toISOString(), 'an earlier one is kept');
  const grand = await mustPost(t, a, '/v2/api-keys', { name: 'grand', scopes: ['endpoints:read'] }, forever.key);
  t.equal(grand.expiresAt, new Date(hour).toISOString(), 'the grandchild gets it too');
  for (const k of [ro, forever, later, grand]) await ok(t, a, k.key, `${k.name} works before the hour`);
  clock.advance(3_600_000);
  for (const k of [ro, forever, later, grand]) assert401(t, await a.req('GET', '/v2/serverless', { key: k.key }), /expired/, `${k.name} after the hour`);
});

t.test('the binding survives a restart', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, {}, { dir });
  const ro = await dashboard(first, t);
  const child = await mustPost(t, first, '/v2/api-keys', { name: 'child', scopes: ['endpoints:read'] }, ro.key);
  const grandchild = await mustPost(t, first, '/v2/api-keys', { name: 'grandchild', scopes: ['endpoints:read'] }, child.key);
  await first.agent.close();

  const second = await startAgent(t, {}, { dir });
  t.equal((await second.req('GET', `/v2/api-keys/${child.id}`)).json.createdBy, ro.id, 'createdBy is kept');
  await ok(t, second, grandchild.key, 'the grandchild works after the restart');
  t.equal((await second.req('DELETE', `/v2/api-keys/${ro.id}`)).status, 204);
  await second.agent.close();

  const third = await startAgent(t, {}, { dir });
  assert401(t, await third.req('GET', '/v2/serverless', { key: child.key }), /creating key .* has been revoked/, 'the child stays refused after another restart');
  assert401(t, await third.req('GET', '/v2/serverless', { key: grandchild.key }), /creating key .* has been revoked/, 'the grandchild too');
});

t.test('keys of an older database (migration 17) keep working, with no creator, and keep from_env', async (t) => {
  const dir = testDataDir(t);
  const old = databaseAtVersion(dir, 16);
  old.prepare("INSERT INTO users (id, name, is_admin, created_at) VALUES ('usr_admin', 'admin', 1, 0)").run();
  const insert = old.prepare(`INSERT INTO api_keys (id, name, kind, user_id, scopes, hash, prefix, created_at, revoked_at, from_env)
    VALUES (?, ?, 'user', 'usr_admin', ?, ?, ?, 0, ?, ?)`);
  insert.run('key_env', 'admin (FLASHD_ADMIN_API_KEY)', '["admin"]', hashKey('the-old-admin-value-0001'), 'chosen_abcd', null, 1);
  const ro = generateApiKey('usr');
  insert.run('key_ro', 'dashboard', '["endpoints:read"]', hashKey(ro), ro.slice(0, 11), null, 0);
  insert.run('key_gone', 'revoked', '["endpoints:read"]', hashKey(generateApiKey('usr')), 'fd_usr_Gone', 5, 0);
  old.close();

  // A new value of FLASHD_ADMIN_API_KEY revokes the key from_env marks: the mark survived the rebuild.
  const next = 'another-admin-value-0001';
  const a = await startAgent(t, { adminApiKey: next }, { dir });
  t.match(a.logs.join(''), /store migrated version=17/, 'migration 17 ran');
  t.ok(a.logs.some((l) => l.includes('admin key from environment revoked') && l.includes('key_env')), 'from_env was kept');
  await ok(t, a, ro, 'the read-only key works');
  const keys = (await a.req('GET', '/v2/api-keys', { key: next })).json as { id: string; createdBy: string | null; revokedAt: string | null }[];
  t.same(Object.fromEntries(keys.filter((k) => k.id.startsWith('key_') && k.id.length < 10).map((k) => [k.id, [k.createdBy, k.revokedAt !== null]])),
    { key_env: [null, true], key_ro: [null, false], key_gone: [null, true] }, 'no creator; revocations kept');
  const child = await mustPost(t, a, '/v2/api-keys', { name: 'child', scopes: ['endpoints:read'] }, ro);
  t.equal(child.createdBy, 'key_ro', 'a key it makes now is bound to it');
});
