/**
 * The data directory's permissions at start (core/data-dir.ts through createAgent): one made
 * beforehand that group or others may write is tightened to 0700 with one warning when flashd
 * owns it, and refused when another user does; secret.key and admin-api-key are never written
 * through a link, tightened to 0600 when open to others, refused when another user's.
 * Real directories, a real flashd.
 */
import t from 'tap';
import { chmodSync, chownSync, existsSync, readFileSync, statSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { startAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { createAgent } from '../../src/app.js';
import { loadConfig } from '../../src/config/index.js';

const asRoot = process.getuid?.() === 0;
// `nobody` on Debian and most Linux systems; any uid other than ours does.
const OTHER_UID = 65534;

async function startFails(dir: string, logs: string[], adminApiKey: string | null = 'test-admin-key-0123456789abcdef'): Promise<Error> {
  const config = loadConfig({ overrides: { host: '127.0.0.1', port: 0, dataDir: dir, adminApiKey, runtime: 'none' } });
  try {
    const agent = await createAgent({ config, logSink: { write: (l) => void logs.push(l) }, announce: () => {} });
    await agent.close();
  } catch (err) {
    return err as Error;
  }
  throw new Error('flashd started');
}

t.test('a world- or group-writable data directory of flashd\'s user is made 0700, with one warning', async (t) => {
  for (const loose of [0o777, 0o770, 0o2775]) {
    const dir = testDataDir(t);
    chmodSync(dir, loose);
    const a = await startAgent(t, {}, { dir });
    t.equal(statSync(dir).mode & 0o7777, 0o700, `${loose.toString(8)}: now 0700`);
    const warnings = a.logs.filter((l) => l.includes('data directory was writable by group or others'));
    t.equal(warnings.length, 1, 'one warning line');
    t.match(warnings[0], `oldMode=0${loose.toString(8)}`);
    t.match(warnings[0], 'newMode=0700');
    t.equal((await a.req('GET', '/v2/serverless')).status, 200, 'and flashd serves');
    await a.agent.close();
  }
});

t.test('a data directory closed to writers other than its owner keeps its mode, silently', async (t) => {
  const dir = testDataDir(t);
  chmodSync(dir, 0o755);
  const a = await startAgent(t, {}, { dir });
  t.equal(statSync(dir).mode & 0o7777, 0o755);
  t.notOk(a.logs.some((l) => l.includes('data directory was writable')));
});

t.test('a new data directory is made 0700', async (t) => {
  const dir = join(testDataDir(t), 'new', 'data');
  await startAgent(t, {}, { dir });
  t.equal(statSync(dir).mode & 0o777, 0o700);
});

t.test('a writable data directory of another user is refused, untouched', { skip: asRoot ? false : 'needs root to give a directory to another user' }, async (t) => {
  const dir = testDataDir(t);
  chownSync(dir, OTHER_UID, OTHER_UID);
  chmodSync(dir, 0o777);
  const logs: string[] = [];
  const err = await startFails(dir, logs);
  t.match(err.message, `data directory ${dir} is writable by group or others (mode 0777) and owned by uid ${OTHER_UID}`);
  t.match(err.message, /chmod 700/);
  t.equal(statSync(dir).mode & 0o7777, 0o777, 'its mode is left alone');
  t.notOk(existsSync(join(dir, 'flashd.db')), 'no file made in it');
  t.notOk(existsSync(join(dir, 'secret.key')));
  // Not writable by others: another user's directory is the owner's business (root runs on volumes of other uids).
  chmodSync(dir, 0o755);
  const a = await startAgent(t, {}, { dir });
  t.equal((await a.req('GET', '/healthz')).status, 200, 'then flashd starts');
});

t.test('secret.key: created 0600, never through a link planted in its place', async (t) => {
  const dir = testDataDir(t);
  const elsewhere = join(testDataDir(t), 'stolen.key');
  symlinkSync(elsewhere, join(dir, 'secret.key'));
  const err = await startFails(dir, []);
  t.match(err.message, `${join(dir, 'secret.key')} is a symbolic link`);
  t.notOk(existsSync(elsewhere), 'no key written where the link points');

  const fresh = testDataDir(t);
  const a = await startAgent(t, {}, { dir: fresh });
  t.equal(statSync(join(fresh, 'secret.key')).mode & 0o7777, 0o600);
  t.equal(Buffer.from(readFileSync(join(fresh, 'secret.key'), 'utf8'), 'base64').length, 32);
  await a.agent.close();
});

t.test('an existing secret.key or admin-api-key open to group or others is made 0600, with one warning each', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, { adminApiKey: null }, { dir });
  await first.agent.close();
  const key = readFileSync(join(dir, 'secret.key'), 'utf8');
  const adminKey = readFileSync(join(dir, 'admin-api-key'), 'utf8').trim();
  chmodSync(join(dir, 'secret.key'), 0o644);
  chmodSync(join(dir, 'admin-api-key'), 0o666);
  const a = await startAgent(t, { adminApiKey: null }, { dir });
  t.equal(statSync(join(dir, 'secret.key')).mode & 0o7777, 0o600, 'secret.key 0600');
  t.equal(statSync(join(dir, 'admin-api-key')).mode & 0o7777, 0o600, 'admin-api-key 0600');
  t.equal(readFileSync(join(dir, 'secret.key'), 'utf8'), key, 'the same key');
  const warnings = a.logs.filter((l) => l.includes('secret file was readable or writable by group or others'));
  t.equal(warnings.length, 2, 'one warning per file');
  t.match(warnings.find((l) => l.includes('/secret.key ')), 'oldMode=0644 newMode=0600');
  t.match(warnings.find((l) => l.includes('/admin-api-key ')), 'oldMode=0666 newMode=0600');
  t.equal((await a.req('GET', '/v2/serverless', { key: adminKey })).status, 200, 'the saved admin key still works');
});

t.test('a generated admin key is not written through a link planted as admin-api-key', async (t) => {
  const dir = testDataDir(t);
  const elsewhere = join(testDataDir(t), 'stolen-admin-key');
  symlinkSync(elsewhere, join(dir, 'admin-api-key'));
  const err = await startFails(dir, [], null);
  t.match(err.message, `${join(dir, 'admin-api-key')} is a symbolic link`);
  t.notOk(existsSync(elsewhere), 'no key written where the link points');
});

t.test('a secret.key or admin-api-key of another user is refused', { skip: asRoot ? false : 'needs root to give a file to another user' }, async (t) => {
  for (const name of ['secret.key', 'admin-api-key']) {
    const dir = testDataDir(t);
    const first = await startAgent(t, { adminApiKey: null }, { dir });
    await first.agent.close();
    chownSync(join(dir, name), OTHER_UID, OTHER_UID);
    const err = await startFails(dir, []);
    t.match(err.message, `${join(dir, name)} is owned by uid ${OTHER_UID}, not by flashd's user (uid 0)`, name);
    t.equal(statSync(join(dir, name)).mode & 0o7777, 0o600, `${name}: left as it was`);
  }
});
