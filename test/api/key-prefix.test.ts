/**
 * A listed key's `prefix` tells keys apart without giving away their secret. A generated key
 * shows its first 11 characters (`fd_usr_` and 4 of its 36 random ones). A key whose value
 * was chosen (FLASHD_ADMIN_API_KEY) used to show its first 4 characters, a meaningful part of a
 * chosen secret, to every key of the admin user (a `jobs:read` dashboard key included); it now
 * shows `chosen_` and 4 random characters that are not taken from it, kept across restarts.
 */
import t from 'tap';
import { createLogger } from '../../src/core/logger.js';
import { openDb } from '../../src/store/index.js';
import { startAgent } from '../helpers/agent.js';
import { databaseAtVersion } from '../helpers/old-db.js';
import { testDataDir } from '../helpers/data-dir.js';

const CHOSEN = 'homelab-admin-passphrase-2026';
const NEXT = 'my-own-admin-passphrase-2026';

t.test('a chosen admin key is listed by a prefix that shows none of it, and kept across a restart', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { adminApiKey: CHOSEN }, { dir });
  const dashboard = (await a.req('POST', '/v2/api-keys', { key: CHOSEN, body: { name: 'dashboard', scopes: ['jobs:read'] } })).json;
  t.equal(dashboard.prefix, dashboard.key.slice(0, 11), 'a generated key still shows fd_usr_ and 4 of its random characters');
  const listed = (await a.req('GET', '/v2/api-keys', { key: dashboard.key })).json as { id: string; name: string; prefix: string }[];
  const admin = listed.find((k) => k.name === 'admin (FLASHD_ADMIN_API_KEY)');
  t.ok(admin, 'a jobs:read key of the admin user lists the chosen admin key');
  t.match(admin?.prefix, /^chosen_[A-Za-z0-9]{4}$/, 'chosen_ and 4 characters');
  t.notOk(admin?.prefix.includes(CHOSEN.slice(0, 4)), `not its first characters: ${admin?.prefix}`);
  t.ok(a.logs.some((l) => l.includes('admin key from environment registered') && l.includes(admin?.id ?? '?') && l.includes(admin?.prefix ?? '?')),
    'the start log names the key id and prefix it registered, so the operator can find it in the list');
  await a.agent.close();

  // The value changes: the old key is revoked but still listed, and the new one is told apart from it.
  const b = await startAgent(t, { adminApiKey: NEXT }, { dir });
  const after = (await b.req('GET', '/v2/api-keys', { key: NEXT })).json as { id: string; prefix: string; createdAt: string }[];
  t.equal(after.find((k) => k.id === admin?.id)?.prefix, admin?.prefix, 'the same prefix after a restart');
  const next = after.find((k) => k.id !== admin?.id && k.id !== dashboard.id);
  t.match(next?.prefix, /^chosen_[A-Za-z0-9]{4}$/);
  t.notOk(next?.prefix.includes(NEXT.slice(0, 4)), `not its first characters: ${next?.prefix}`);
  t.not(next?.prefix, admin?.prefix, 'two chosen keys are told apart');
});

t.test('chosen keys listed by an older flashd lose the characters they showed when the database is opened (migration 12)', (t) => {
  const dir = testDataDir(t);
  const old = databaseAtVersion(dir, 11);
  old.prepare("INSERT INTO users (id, name, is_admin, created_at) VALUES ('usr_admin', 'admin', 1, 0)").run();
  const insert = old.prepare(`INSERT INTO api_keys (id, name, kind, user_id, scopes, hash, prefix, created_at)
    VALUES (?, 'k', ?, 'usr_admin', '["admin"]', ?, ?, 0)`);
  insert.run('key_chosen', 'user', 'h1', 'home…');
  insert.run('key_chosenfd', 'user', 'h2', 'fd_my-own-a');
  insert.run('key_generated', 'user', 'h3', 'fd_usr_AbCd');
  insert.run('key_worker', 'worker', 'h4', 'fd_wkr_XyZ0');
  old.close();
  const db = openDb({ dataDir: dir, synchronous: 'full', log: createLogger({ level: 'error', sink: { write: () => undefined } }) });
  t.teardown(() => db.close());
  const prefix = Object.fromEntries((db.prepare('SELECT id, prefix FROM api_keys').all() as { id: string; prefix: string }[]).map((r) => [r.id, r.prefix]));
  t.match(prefix['key_chosen'], /^chosen_[0-9a-f]{4}$/);
  t.match(prefix['key_chosenfd'], /^chosen_[0-9a-f]{4}$/);
  t.same([prefix['key_generated'], prefix['key_worker']], ['fd_usr_AbCd', 'fd_wkr_XyZ0'], 'generated keys keep theirs');
  t.end();
});
