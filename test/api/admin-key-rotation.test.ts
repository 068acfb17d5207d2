/**
 * FLASHD_ADMIN_API_KEY names the admin key chosen through the environment. An operator who
 * changes it (the old value leaked) must be able to rely on the old value no longer working:
 * a start with a new value used to register it beside the old one, which stayed valid. Now the
 * key an earlier start registered from the variable is revoked by the start that registers the
 * new one (logged with its id and prefix, never its value). The key flashd generated on its
 * first start and keys made through the API are not touched; an unset variable changes nothing.
 */
import t from 'tap';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { hashKey } from '../../src/auth/tokens.js';
import { startAgent, type TestAgent } from '../helpers/agent.js';
import { databaseAtVersion } from '../helpers/old-db.js';
import { testDataDir } from '../helpers/data-dir.js';

const A = 'admin-passphrase-leaked-0001';
const B = 'admin-passphrase-rotated-0002';

const works = async (t: Parameters<typeof startAgent>[0], a: TestAgent, key: string, what: string) =>
  t.equal((await a.req('GET', '/v2/serverless', { key })).status, 200, `${what} works`);
const refused = async (t: Parameters<typeof startAgent>[0], a: TestAgent, key: string, what: string) => {
  const r = await a.req('GET', '/v2/serverless', { key });
  t.equal(r.status, 401, `${what} gets 401`);
  t.match(r.text, /revoked/);
};

t.test('a changed FLASHD_ADMIN_API_KEY revokes the key the old value registered; generated and API-made keys stay', async (t) => {
  const dir = testDataDir(t);
  // First start without the variable: flashd generates a key and saves it.
  const first = await startAgent(t, { adminApiKey: null }, { dir });
  const generated = first.agent.generatedAdminKey as string;
  t.ok(generated, 'a key was generated');
  await first.agent.close();

  const a = await startAgent(t, { adminApiKey: A }, { dir });
  await works(t, a, A, 'A');
  const made = (await a.req('POST', '/v2/api-keys', { key: A, body: { name: 'ci', scopes: ['admin'] } })).json as { id: string; key: string };
  const envKeyA = ((await a.req('GET', '/v2/api-keys', { key: A })).json as { id: string; name: string; prefix: string }[])
    .find((k) => k.name === 'admin (FLASHD_ADMIN_API_KEY)');
  t.ok(envKeyA);
  await a.agent.close();

  const b = await startAgent(t, { adminApiKey: B }, { dir });
  await refused(t, b, A, 'the old value A');
  await works(t, b, B, 'the new value B');
  await works(t, b, generated, 'the generated first key');
  await works(t, b, made.key, 'the key made through the API');
  const revokedLog = b.logs.filter((l) => l.includes('admin key from environment revoked'));
  t.equal(revokedLog.length, 1, 'one revocation logged');
  t.match(revokedLog[0], envKeyA?.id ?? '?', 'with the key id');
  t.match(revokedLog[0], envKeyA?.prefix ?? '?', 'and its prefix');
  t.notOk(b.logs.some((l) => l.includes(A) || l.includes(B)), 'no key value in the log');
  t.not((await b.req('GET', `/v2/api-keys/${envKeyA?.id}`, { key: B })).json.revokedAt, null, 'listed as revoked');
  // At rest: one valid key registered from the variable, the new one.
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  const live = db.prepare('SELECT hash FROM api_keys WHERE from_env = 1 AND revoked_at IS NULL').pluck().all();
  db.close();
  t.same(live, [hashKey(B)], 'only B is a live key from the environment');
  await b.agent.close();

  // The same value again: nothing changes.
  const again = await startAgent(t, { adminApiKey: B }, { dir });
  t.notOk(again.logs.some((l) => l.includes('admin key from environment')), 'nothing registered or revoked');
  await works(t, again, B, 'B');
  await works(t, again, generated, 'the generated first key');
  await works(t, again, made.key, 'the API-made key');
  await refused(t, again, A, 'A');
  await again.agent.close();

  // Unset: nothing is revoked, nothing generated (valid keys exist).
  const unset = await startAgent(t, { adminApiKey: null }, { dir });
  t.equal(unset.agent.generatedAdminKey, null);
  await works(t, unset, B, 'B, with the variable unset');
  await works(t, unset, generated, 'the generated first key');
});

t.test('the variable set to a key made through the API revokes the old environment key but never that key later', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { adminApiKey: A }, { dir });
  const made = (await a.req('POST', '/v2/api-keys', { key: A, body: { name: 'ci', scopes: ['admin'] } })).json as { key: string };
  await a.agent.close();
  const b = await startAgent(t, { adminApiKey: made.key }, { dir });
  await refused(t, b, A, 'A');
  await works(t, b, made.key, 'the API-made key now named by the variable');
  await b.agent.close();
  const c = await startAgent(t, { adminApiKey: B }, { dir });
  await works(t, c, made.key, 'the API-made key, after the variable moved on');
  await works(t, c, B, 'B');
});

t.test('the variable set to a key that is not an admin key (read-only, worker, expired) refuses the start and revokes nothing', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { adminApiKey: A }, { dir });
  const readOnly = (await a.req('POST', '/v2/api-keys', { key: A, body: { name: 'ro', scopes: ['endpoints:read'] } })).json as { key: string };
  const soon = (await a.req('POST', '/v2/api-keys', { key: A, body: { name: 'soon', scopes: ['admin'], expiresAt: new Date(Date.now() + 1500).toISOString() } })).json as { key: string };
  await a.agent.close();
  await new Promise((r) => setTimeout(r, 1600));
  for (const [what, value] of [['a read-only key', readOnly.key], ['an expired admin key', soon.key]] as const) {
    await t.rejects(startAgent(t, { adminApiKey: value }, { dir }), /FLASHD_ADMIN_API_KEY names an existing key that is not a valid admin key/, `${what}: refused`);
  }
  const b = await startAgent(t, { adminApiKey: A }, { dir });
  await works(t, b, A, 'A, still');
  t.notOk(b.logs.some((l) => /admin key from environment revoked/.test(l)), 'nothing was revoked');
});

t.test('a repeated DELETE of a key answers 204 again and logs the revocation once', async (t) => {
  const a = await startAgent(t, { adminApiKey: A }, { dir: testDataDir(t) });
  const made = (await a.req('POST', '/v2/api-keys', { key: A, body: { name: 'ci', scopes: ['jobs:read'] } })).json as { id: string };
  t.equal((await a.req('DELETE', `/v2/api-keys/${made.id}`, { key: A })).status, 204);
  t.equal((await a.req('DELETE', `/v2/api-keys/${made.id}`, { key: A })).status, 204, 'again: nothing to do, same answer');
  t.equal(a.logs.filter((l) => l.includes('api key revoked') && l.includes(made.id)).length, 1, 'one line: the second changed nothing');
});

t.test('keys an older flashd registered from the variable (rotated before this fix) are revoked by the next start with it (migration 13)', async (t) => {
  const dir = testDataDir(t);
  const old = databaseAtVersion(dir, 12);
  old.prepare("INSERT INTO users (id, name, is_admin, created_at) VALUES ('usr_admin', 'admin', 1, 0)").run();
  const insert = old.prepare(`INSERT INTO api_keys (id, name, kind, user_id, scopes, hash, prefix, created_at)
    VALUES (?, ?, 'user', 'usr_admin', '["admin"]', ?, ?, ?)`);
  const generated = 'fd_usr_FirstGeneratedKeyXXXXXXXXXXXXXXX';
  const apiMade = 'fd_usr_ApiMadeKeyXXXXXXXXXXXXXXXXXXXXXXX';
  const envGenerated = 'fd_usr_GeneratedValueChosenThroughEnvXX';
  insert.run('key_first', 'first admin key', hashKey(generated), generated.slice(0, 11), 1);
  insert.run('key_a', 'admin (FLASHD_ADMIN_API_KEY)', hashKey(A), 'chosen_ab12', 2);
  insert.run('key_renamed', 'renamed by the operator', hashKey('older-passphrase-0000000'), 'chosen_cd34', 3);
  insert.run('key_envgen', 'admin (FLASHD_ADMIN_API_KEY)', hashKey(envGenerated), envGenerated.slice(0, 11), 4);
  insert.run('key_api', 'ci', hashKey(apiMade), apiMade.slice(0, 11), 5);
  old.close();
  const b = await startAgent(t, { adminApiKey: B }, { dir });
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  const rows = Object.fromEntries((db.prepare('SELECT id, from_env, revoked_at IS NOT NULL AS revoked FROM api_keys').all() as
    { id: string; from_env: number; revoked: number }[]).map((r) => [r.id, [r.from_env, r.revoked]]));
  db.close();
  t.same({ first: rows['key_first'], a: rows['key_a'], renamed: rows['key_renamed'], envgen: rows['key_envgen'], api: rows['key_api'] },
    { first: [0, 0], a: [1, 1], renamed: [1, 1], envgen: [1, 1], api: [0, 0] }, 'older environment keys revoked, others untouched');
  await refused(t, b, A, 'A');
  await works(t, b, B, 'B');
  t.equal(b.logs.filter((l) => l.includes('admin key from environment revoked')).length, 3, 'each revocation logged');
});
