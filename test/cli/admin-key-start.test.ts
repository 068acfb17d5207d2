/**
 * The admin key at start, as a user meets it (`node dist/flashd.mjs`, real processes, real
 * files). A FLASHD_ADMIN_API_KEY that starts with `fd_` but is no key flashd generated is a
 * configuration error: exit 2 before the data directory is touched (it used to exit 1 after
 * flashd.db and secret.key were made). A first start that then fails (its port in use) does not
 * say "It is shown once here" for a start that did not happen: the banner comes once flashd
 * listens, and a failed start says where the key it made was saved.
 */
import t from 'tap';
import { existsSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { cleanEnv, REPO_ROOT, run, startFlashd } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');
const node = process.execPath;

t.before(() => {
  if (!existsSync(BUNDLE)) throw new Error('dist/flashd.mjs is missing: run `npm run build` (npm test does) first');
});

t.test('a malformed fd_ FLASHD_ADMIN_API_KEY exits 2 and leaves the data directory alone', async (t) => {
  const dir = join(testDataDir(t), 'not-yet');
  // The second has a generated key's shape with a wrong checksum.
  for (const value of ['fd_my-own-admin-passphrase-2026', `fd_usr_${'A'.repeat(36)}`]) {
    const r = run(node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv({ FLASHD_ADMIN_API_KEY: value }));
    t.equal(r.status, 2, `${value}: exit 2, a configuration error`);
    t.match(r.stderr, /FLASHD_ADMIN_API_KEY starts with fd_ but is not a key flashd generated/);
    t.notOk(r.stderr.includes(value), 'the value is not echoed');
    t.notOk(existsSync(dir), 'no data directory made');
  }
});

t.test('a FLASHD_ADMIN_API_KEY with whitespace (a trailing newline from a file or a secret) exits 2 and revokes nothing', async (t) => {
  // No request can present it (Authorization carries one token), so registered it locked the
  // admin out: the earlier value was revoked for a key that never authenticates.
  const dir = testDataDir(t);
  const good = 'goodkeyabcdefghij123';
  const f = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv({ FLASHD_ADMIN_API_KEY: good }));
  t.equal(await f.stop(), 0);
  for (const value of ['newkeyabcdefghij1234\n', '  spacedkeyabcdefghij  ', 'inner space key 0123456789']) {
    const r = run(node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv({ FLASHD_ADMIN_API_KEY: value }));
    t.equal(r.status, 2, `${JSON.stringify(value)}: exit 2, a configuration error`);
    t.match(r.stderr, /FLASHD_ADMIN_API_KEY: adminApiKey must be visible ASCII with no space, tab or newline/);
    t.notOk(r.stderr.includes(value.trim()), 'the value is not echoed');
  }
  const again = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv({ FLASHD_ADMIN_API_KEY: good }));
  t.equal((await fetch(`${again.url}/v2/serverless`, { headers: { authorization: `Bearer ${good}` } })).status, 200, 'the earlier key still works');
  t.notMatch(again.stderr(), /revoked/, 'nothing was revoked');
  t.equal(await again.stop(), 0);
});

t.test('a first start that fails to listen does not announce the key as shown once; it says where it was saved', async (t) => {
  const dir = testDataDir(t);
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const port = (server.address() as { port: number }).port;
  const file = join(dir, 'admin-api-key');

  const failed = run(node, [BUNDLE, '--port', String(port), '--data-dir', dir, '--runtime', 'none'], cleanEnv());
  t.equal(failed.status, 1, 'the start fails');
  t.match(failed.stderr, /cannot listen on 127\.0\.0\.1/);
  const key = readFileSync(file, 'utf8').trim();
  t.match(key, /^fd_usr_/, 'a key was made and saved');
  t.notMatch(failed.stdout, /First start|shown once/, 'not announced as shown once');
  t.notOk(failed.stdout.includes(key) || failed.stderr.includes(key), 'nor printed');
  t.ok(failed.stdout.includes(`the start failed`) && failed.stdout.includes(file), `says the start failed and where the key is: ${failed.stdout}`);

  const f = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv());
  t.notOk(f.stdout().includes('fd_usr_'), 'the next start makes no other key');
  t.equal((await fetch(`${f.url}/v2/serverless`, { headers: { authorization: `Bearer ${key}` } })).status, 200, 'the saved key works');
  t.equal(await f.stop(), 0);
});
