/**
 * The single executable `dist/flashd` (build/sea.mjs). Building it copies the ~100 MB node
 * binary, so it runs only with FLASHD_TEST_BINARY=1 (.ci/run sets it).
 */
import t from 'tap';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import configSchema from '../../schema/config.schema.json' with { type: 'json' };
import pkg from '../../package.json' with { type: 'json' };
import { cleanEnv, REPO_ROOT, run, startFlashd } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

const BINARY = join(REPO_ROOT, 'dist/flashd');
const skip = process.env['FLASHD_TEST_BINARY'] === '1'
  ? false
  : 'building the single binary copies ~100 MB and takes a while; set FLASHD_TEST_BINARY=1 to run it';

t.test('single binary: build, --help, --version, serve from extracted native addons', { skip }, async (t) => {
  const built = run(process.execPath, ['build/sea.mjs']);
  t.equal(built.status, 0, `npm run build:binary succeeds${built.status === 0 ? '' : `: ${built.stderr}`}`);
  t.ok(statSync(BINARY).mode & 0o100, 'dist/flashd is executable');
  t.ok(statSync(BINARY).size > 50e6, 'it carries the node runtime');

  const cache = testDataDir(t);
  // Outside the repo, without node_modules to fall back on.
  const env = cleanEnv({ XDG_CACHE_HOME: cache, NODE_PATH: '' });

  const help = run(BINARY, ['--help'], env);
  t.equal(help.status, 0, '--help exits 0');
  for (const o of Object.values(configSchema.properties) as { 'x-flag'?: string }[]) {
    if (o['x-flag']) t.ok(help.stdout.includes(o['x-flag']), `--help lists ${o['x-flag']}`);
  }
  t.equal(run(BINARY, ['--version'], env).stdout, `flashd ${pkg.version}\n`, '--version');
  const bad = run(BINARY, ['--bogus'], env);
  t.equal(bad.status, 2, 'unknown flag exits 2');
  t.match(bad.stderr, /unknown flag --bogus/);

  const data = join(cache, 'data');
  const adminKey = 'binary-test-admin-key-0123456789';
  const f = await startFlashd(t, BINARY, ['--port', '0', '--data-dir', data], { ...env, FLASHD_ADMIN_API_KEY: adminKey });
  t.equal((await fetch(`${f.url}/healthz`)).status, 200, '/healthz answers 200');
  // A write goes through better-sqlite3 loaded from the extracted addon.
  const created = await fetch(`${f.url}/v2/serverless`, {
    method: 'POST',
    headers: { authorization: `Bearer ${adminKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'bin', type: 'QUEUE', image: 'busybox', scaling: { type: 'QUEUE_DELAY', queueDelay: 4 }, cpu: [{ id: 'cpu3c', vcpuCount: 2 }] }),
  });
  t.equal(created.status, 201, 'an endpoint can be created');
  t.equal(await f.stop('SIGTERM'), 0, 'SIGTERM exits 0');

  const dirs = readdirSync(join(cache, 'flashd')).filter((d) => d.startsWith('native-'));
  t.equal(dirs.length, 1, 'addons extracted to one hash-named cache dir');
  const nativeDir = join(cache, 'flashd', dirs[0] as string);
  const manifest = JSON.parse(readFileSync(join(REPO_ROOT, 'dist/sea/native-manifest.json'), 'utf8')) as { hash: string; files: { name: string; bytes: number }[] };
  t.equal(dirs[0], `native-${manifest.hash.slice(0, 16)}`, 'the dir name is the assets hash');
  for (const file of manifest.files) {
    t.equal(statSync(join(nativeDir, file.name)).size, file.bytes, `${file.name} extracted whole`);
  }
  t.ok(manifest.files.some((x) => x.name === 'better_sqlite3.node') && manifest.files.some((x) => /^uws_.*\.node$/.test(x.name)), 'both addons are assets');
  if (process.platform === 'linux' && process.arch === 'x64') {
    // The extracted uWS addon is the known binary, so the binary loads its patched copy too
    // (128 KiB split header blocks, 60–64 s idle timeout: core/native.ts), as `node dist/flashd.mjs` does.
    const patched = readdirSync(join(cache, 'flashd')).filter((d) => d.startsWith('uws-p3-'));
    t.equal(patched.length, 1, 'the patched uWS copy was written beside the extracted addons');
    t.ok(existsSync(join(cache, 'flashd', patched[0] ?? '-', `uws_linux_x64_${process.versions.modules}.node`)), 'and holds the addon');
  }

  // A second start reuses the extracted files.
  const before = statSync(join(nativeDir, 'better_sqlite3.node')).mtimeMs;
  const again = await startFlashd(t, BINARY, ['--port', '0', '--data-dir', data], { ...env, FLASHD_ADMIN_API_KEY: adminKey });
  const list = await fetch(`${again.url}/v2/serverless`, { headers: { authorization: `Bearer ${adminKey}` } });
  t.equal(((await list.json()) as unknown[]).length, 1, 'data survives the restart');
  t.equal(await again.stop(), 0);
  t.equal(statSync(join(nativeDir, 'better_sqlite3.node')).mtimeMs, before, 'not extracted again');
  t.notOk(existsSync(join(data, 'admin-api-key')), 'FLASHD_ADMIN_API_KEY: no generated key file');
});
