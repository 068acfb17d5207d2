/**
 * flashd always keeps a way to be administered. DELETE /v2/api-keys/{id} of the last valid admin
 * key (a key of the admin user with the `admin` scope, not revoked, not expired) used to answer
 * 204 and leave nothing able to administer flashd; it is now a 409 saying to make another admin
 * key first. Keys of less (read-only, worker keys) and expired admin keys do not count. And when
 * none is left all the same (every admin key expired), the next start makes one, as its message
 * says: the count it went by used to include every unrevoked key of any kind, so a read-only key
 * or a worker-env key kept it from ever firing.
 */
import t from 'tap';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ManualClock } from '../../src/core/clock.js';
import { assertProblem, cpuBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';

const A = 'admin-passphrase-last-key-0001';
const HOUR = 3_600_000;

const listed = async (a: TestAgent, key: string, name: string): Promise<string> =>
  ((await a.req('GET', '/v2/api-keys', { key })).json as { id: string; name: string }[]).find((k) => k.name === name)?.id ?? '?';

/** Another user, `bob`, with an admin-scope key: it administers flashd, but is not the admin user's. */
async function bobsAdminKey(a: TestAgent, key: string): Promise<string> {
  const bob = (await a.req('POST', '/v2/users', { key, body: { name: 'bob' } })).json.id as string;
  return (await a.req('POST', '/v2/api-keys', { key, body: { name: 'bob admin', scopes: ['admin'], userId: bob } })).json.key as string;
}

/** Keys that must not count as admin keys: a read-only key and a worker-env key. */
async function lesserKeys(t: Parameters<typeof startAgent>[0], a: TestAgent, key: string): Promise<void> {
  t.equal((await a.req('POST', '/v2/api-keys', { key, body: { name: 'dashboard', scopes: ['jobs:read'] } })).status, 201);
  const ep = (await a.req('POST', '/v2/serverless', { key, body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  t.equal((await a.req('GET', `/v2/serverless/${ep}/worker-env`, { key })).status, 200);
}

t.test('the last valid admin key cannot be revoked: 409 with how to rotate; read-only, worker and expired keys do not count', async (t) => {
  const clock = new ManualClock(Date.now());
  const a = await startAgent(t, { adminApiKey: A }, { clock });
  await lesserKeys(t, a, A);
  // Admin-scope keys of another user and of a team: they administer flashd, but do not count.
  const bob = await bobsAdminKey(a, A);
  const team = (await a.req('POST', '/v2/teams', { key: A, body: { name: 'ops' } })).json.id as string;
  t.equal((await a.req('POST', '/v2/api-keys', { key: A, body: { name: 'team admin', scopes: ['admin'], teamId: team } })).status, 201);
  const envKey = await listed(a, A, 'admin (FLASHD_ADMIN_API_KEY)');
  const refused = await a.req('DELETE', `/v2/api-keys/${envKey}`, { key: A });
  assertProblem(t, refused, 409, 'the admin user\'s only admin key: refused');
  t.match(refused.json.detail, /is the admin user's last valid admin key/);
  t.notMatch(refused.json.detail, /leave no key able to administer/, 'not "no key able to administer flashd": bob\'s and the team\'s keys can');
  t.match(refused.json.detail, /admin-scope keys of other users or of teams do not count/, 'says which keys count');
  t.equal((await a.req('GET', '/v2/users', { key: bob })).status, 200, 'bob\'s admin key administers flashd all the same');
  t.match(refused.json.detail, /create another admin key/, 'says how to rotate');
  t.equal((await a.req('GET', '/v2/serverless', { key: A })).status, 200, 'and it still works');

  // An admin key that expires in an hour: while valid, it lets the other go.
  const soon = (await a.req('POST', '/v2/api-keys', {
    key: A, body: { name: 'soon', scopes: ['admin'], expiresAt: new Date(clock.now() + HOUR).toISOString() },
  })).json as { id: string; key: string };
  const other = (await a.req('POST', '/v2/api-keys', { key: A, body: { name: 'other', scopes: ['admin'] } })).json as { id: string; key: string };
  t.equal((await a.req('DELETE', `/v2/api-keys/${envKey}`, { key: A })).status, 204, 'another admin key exists: revoked');
  clock.advance(HOUR + 1000);
  assertProblem(t, await a.req('DELETE', `/v2/api-keys/${other.id}`, { key: other.key }), 409, 'the other admin key expired: the last one is refused');
  t.equal((await a.req('GET', '/v2/serverless', { key: other.key })).status, 200, 'and still works');
  t.equal((await a.req('DELETE', `/v2/api-keys/${soon.id}`, { key: other.key })).status, 204, 'an expired admin key can be revoked');
  t.notOk(a.logs.some((l) => l.includes('api key revoked') && l.includes(other.id)), 'no revocation logged for the refused one');
});

t.test('no valid admin key left at start (every one expired, other keys still valid): the start makes one and saves it', async (t) => {
  const dir = testDataDir(t);
  const start = Date.now();
  const first = await startAgent(t, { adminApiKey: null }, { dir, clock: new ManualClock(start) });
  const file = join(dir, 'admin-api-key');
  const generated = first.agent.generatedAdminKey as string;
  const soon = (await first.req('POST', '/v2/api-keys', {
    key: generated, body: { name: 'soon', scopes: ['admin'], expiresAt: new Date(start + HOUR).toISOString() },
  })).json as { key: string };
  await lesserKeys(t, first, generated);
  const bob = await bobsAdminKey(first, generated);
  t.equal((await first.req('DELETE', `/v2/api-keys/${await listed(first, generated, 'first admin key')}`, { key: soon.key })).status, 204);
  await first.agent.close();

  const later = await startAgent(t, { adminApiKey: null }, { dir, clock: new ManualClock(start + 2 * HOUR) });
  const key = later.agent.generatedAdminKey;
  t.match(key, /^fd_usr_/, 'a new admin key was made');
  t.equal(readFileSync(file, 'utf8'), `${key}\n`, 'saved in place of the revoked one');
  t.ok(later.logs.some((l) => l.includes("The admin user had no valid admin API key left (every one revoked or expired)") && l.includes('in place of the old one')), 'announced as such');
  t.notOk(later.logs.some((l) => /No valid admin API key was left/.test(l)), 'not "no valid admin API key": bob\'s is valid');
  t.equal((await later.req('GET', '/v2/users', { key: bob })).status, 200, 'bob\'s admin key still works');
  t.equal((await later.req('GET', '/v2/serverless', { key: key as string })).status, 200, 'the new key works');
  t.ok(later.logs.some((l) => /the admin user had no valid admin API key left: created one/.test(l) && !l.includes(key as string)), 'logged, without the key');
  await later.agent.close();
  const again = await startAgent(t, { adminApiKey: null }, { dir, clock: new ManualClock(start + 3 * HOUR) });
  t.equal(again.agent.generatedAdminKey, null, 'then the next start makes none');
});

t.test('a flashd administered through FLASHD_ADMIN_API_KEY alone (no admin-api-key file) is not told it is its first start', async (t) => {
  const dir = testDataDir(t);
  const start = Date.now();
  const a = await startAgent(t, { adminApiKey: A }, { dir, clock: new ManualClock(start) });
  const soon = (await a.req('POST', '/v2/api-keys', {
    key: A, body: { name: 'soon', scopes: ['admin'], expiresAt: new Date(start + HOUR).toISOString() },
  })).json as { key: string };
  t.equal((await a.req('DELETE', `/v2/api-keys/${await listed(a, A, 'admin (FLASHD_ADMIN_API_KEY)')}`, { key: soon.key })).status, 204);
  await a.agent.close();
  t.notOk(existsSync(join(dir, 'admin-api-key')), 'no file: the key came from the environment');

  const later = await startAgent(t, { adminApiKey: null }, { dir, clock: new ManualClock(start + 2 * HOUR) });
  const key = later.agent.generatedAdminKey as string;
  t.match(key, /^fd_usr_/);
  t.notOk(later.logs.some((l) => l.includes('First start')), 'not "First start"');
  t.ok(later.logs.some((l) => l.includes('The admin user had no valid admin API key left') && !l.includes('in place of the old one')), 'no old file to replace');
  t.equal(readFileSync(join(dir, 'admin-api-key'), 'utf8'), `${key}\n`);
});
