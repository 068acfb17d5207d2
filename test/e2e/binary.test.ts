/**
 * The single executable `dist/flashd` (build/sea.mjs). Building it copies the ~100 MB node
 * binary, so it runs only with FLASHD_TEST_BINARY=1 (.ci/run sets it).
 */
import t from 'tap';
import { createHash } from 'node:crypto';
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
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

const asOtherUser = process.getuid?.() === 0 && run('sh', ['-c', 'command -v setpriv']).status === 0 ? skip : 'needs root and setpriv(1) to run as uid 65534';

t.test('single binary as a user without a writable home (nobody, useradd -r, systemd DynamicUser): --help/--version load no addons, serve falls back to a per-uid temp dir, else one line', { skip: asOtherUser }, async (t) => {
  if (!existsSync(BINARY)) t.equal(run(process.execPath, ['build/sea.mjs']).status, 0, 'npm run build:binary succeeds');
  const NOBODY = 65534;
  // Under the temp dir, not the checkout: nobody must reach the binary, and a checkout under a
  // 0700 directory (/root, a mktemp -d) would refuse it ("Permission denied", exit 126).
  const base = mkdtempSync(join(tmpdir(), 'flashd-nobody-'));
  t.teardown(() => rmSync(base, { recursive: true, force: true }));
  chmodSync(base, 0o755);
  const bin = join(base, 'flashd');
  copyFileSync(BINARY, bin);
  chmodSync(bin, 0o755);
  if (run('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'test', '-x', bin]).status !== 0) {
    t.skip(`uid 65534 cannot reach ${bin} (a temp dir under a 0700 directory)`, () => undefined);
    return;
  }
  const owned = (name: string, mode = 0o700) => {
    const dir = join(base, name);
    mkdirSync(dir);
    chownSync(dir, NOBODY, NOBODY);
    chmodSync(dir, mode);
    return dir;
  };
  const data = owned('data');
  const tmp = owned('tmp');
  // As nobody, with nobody's home (/nonexistent) and nothing else: no XDG_CACHE_HOME, no FLASHD_NATIVE_DIR.
  const asNobody = (tmpdir: string) => ['--reuid=65534', '--regid=65534', '--clear-groups', 'env', '-i', `PATH=${process.env.PATH ?? ''}`, 'HOME=/nonexistent', `TMPDIR=${tmpdir}`, bin];

  for (const args of [['--version'], ['--help'], ['worker-env', '--help']]) {
    const r = run('setpriv', [...asNobody('/nonexistent'), ...args]);
    t.equal(r.status, 0, `${args.join(' ')} exits 0 with no writable cache or temp dir: it needs no native addon\n${r.stderr}`);
    t.equal(r.stderr, '', `${args.join(' ')}: nothing on stderr`);
  }
  t.equal(run('setpriv', [...asNobody('/nonexistent'), '--version']).stdout, `flashd ${pkg.version}\n`);

  // Neither ~/.cache nor the temp dir can be written: exit 1 with one line naming where and what to set.
  const refused = run('setpriv', [...asNobody('/nonexistent'), '--port', '0', '--data-dir', data, '--runtime', 'none']);
  t.equal(refused.status, 1, 'no writable place for the addons: exit 1');
  t.equal(refused.stderr.trimEnd().split('\n').length, 1, `one line, no stack trace:\n${refused.stderr}`);
  t.match(refused.stderr, /^flashd: cannot start: cannot unpack native addons to \/nonexistent\/\.cache\/flashd\/native-[0-9a-f]{16} \(EACCES\)/);
  t.match(refused.stderr, /set XDG_CACHE_HOME or FLASHD_NATIVE_DIR to a writable directory/);

  // ~/.cache cannot be written: the addons go to <tmpdir>/flashd-<uid>/, made 0700 for that uid.
  const env = cleanEnv();
  const f = await startFlashd(t, 'setpriv', [...asNobody(tmp), '--port', '0', '--data-dir', data, '--runtime', 'none'], env);
  t.equal((await fetch(`${f.url}/healthz`)).status, 200, 'serves /healthz');
  t.equal(await f.stop('SIGTERM'), 0, 'SIGTERM exits 0');
  const perUid = join(tmp, `flashd-${NOBODY}`);
  t.equal(statSync(perUid).uid, NOBODY, 'the fallback dir is owned by the uid');
  t.equal(statSync(perUid).mode & 0o777, 0o700, 'and is 0700');
  const manifest = JSON.parse(readFileSync(join(REPO_ROOT, 'dist/sea/native-manifest.json'), 'utf8')) as { hash: string; files: { name: string; sha256: string; bytes: number }[] };
  const nativeDir = join(perUid, `native-${manifest.hash.slice(0, 16)}`);
  for (const file of manifest.files) t.equal(statSync(join(nativeDir, file.name)).size, file.bytes, `${file.name} extracted there`);

  // A same-size file that is not the addon (planted or damaged) is not loaded: it is extracted again.
  const sqlite = join(nativeDir, 'better_sqlite3.node');
  const size = statSync(sqlite).size;
  writeFileSync(sqlite, Buffer.alloc(size, 0x41));
  const again = await startFlashd(t, 'setpriv', [...asNobody(tmp), '--port', '0', '--data-dir', data, '--runtime', 'none'], env);
  t.equal((await fetch(`${again.url}/healthz`)).status, 200, 'serves after a same-size file replaced an addon');
  t.equal(await again.stop('SIGTERM'), 0);
  const sha = createHash('sha256').update(readFileSync(sqlite)).digest('hex');
  t.equal(sha, manifest.files.find((x) => x.name === 'better_sqlite3.node')?.sha256, 'the addon was extracted again (sha256 checked, not just the size)');

  // A flashd-<uid> dir that the uid does not own (made by another user first) is not used.
  const shared = owned('shared', 0o1777);
  const planted = join(shared, `flashd-${NOBODY}`);
  mkdirSync(planted, { mode: 0o777 });
  chmodSync(planted, 0o777);
  const notOwned = run('setpriv', [...asNobody(shared), '--port', '0', '--data-dir', data, '--runtime', 'none']);
  t.equal(notOwned.status, 1, 'a per-uid temp dir owned by another user is refused: exit 1');
  t.equal(notOwned.stderr.trimEnd().split('\n').length, 1, `one line:\n${notOwned.stderr}`);
  t.match(notOwned.stderr, new RegExp(`${planted.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}.*owned by uid 0`), 'naming the dir and its owner');
  t.same(readdirSync(planted), [], 'nothing was written into it');
});
