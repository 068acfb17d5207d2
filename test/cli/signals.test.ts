/**
 * Signals and stdio as an operator meets them, on the bundle `dist/flashd.mjs` started as its own
 * process: a signal at any moment of the start, and a log reader that goes away.
 */
import t from 'tap';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { cleanEnv, REPO_ROOT, startFlashd } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');
const node = process.execPath;

t.before(() => {
  if (!existsSync(BUNDLE)) throw new Error('dist/flashd.mjs is missing: run `npm run build` (npm test does) first');
});

t.test('a closed stderr pipe does not end flashd: it goes on serving and stops cleanly on SIGTERM', async (t) => {
  // `flashd 2> >(head -n 4 > f)`, a killed `| tee`, a log shipper restarting: the next log line
  // met EPIPE, an uncaught 'error' that exited 1 with nothing closed.
  const dir = testDataDir(t);
  const f = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv());
  const key = readFileSync(join(dir, 'admin-api-key'), 'utf8').trim();
  f.child.stderr?.destroy();
  const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  for (let i = 0; i < 3; i++) {
    // Each logs `api key created` to the closed pipe.
    const created = await fetch(`${f.url}/v2/api-keys`, { method: 'POST', headers: auth, body: JSON.stringify({ name: `k${i}`, scopes: ['endpoints:read'] }) });
    t.equal(created.status, 201, `request ${i} after the pipe closed is served`);
  }
  t.equal((await fetch(`${f.url}/healthz`)).status, 200, '/healthz answers');
  t.equal(f.child.exitCode, null, 'still running');
  t.equal(await f.stop('SIGTERM'), 0, 'SIGTERM still exits 0 (its log lines go nowhere)');
  t.notOk(existsSync(join(dir, 'flashd.db-wal')) && statSync(join(dir, 'flashd.db-wal')).size > 0, 'the WAL was checkpointed by the clean close');
});
