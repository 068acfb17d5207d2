/**
 * The data directory's permissions at start (core/data-dir.ts through createAgent): one made
 * beforehand that group or others may write is tightened to 0700 with one warning when flashd
 * owns it, and refused when another user does. Real directories, a real flashd.
 */
import t from 'tap';
import { chmodSync, chownSync, existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { startAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { createAgent } from '../../src/app.js';
import { loadConfig } from '../../src/config/index.js';

const asRoot = process.getuid?.() === 0;
// `nobody` on Debian and most Linux systems; any uid other than ours does.
const OTHER_UID = 65534;

async function startFails(dir: string, logs: string[]): Promise<Error> {
  const config = loadConfig({ overrides: { host: '127.0.0.1', port: 0, dataDir: dir, adminApiKey: 'test-admin-key-0123456789abcdef', runtime: 'none' } });
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
