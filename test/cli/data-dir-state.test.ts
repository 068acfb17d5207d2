/**
 * A data directory put back wrong, or one flashd may not write for a reason other than its
 * owner, as `dist/flashd.mjs` meets it: a deleted flashd.db beside the rest, a flashd.db copied
 * without its secret.key or with another one, an admin-api-key a new key would have replaced, a
 * read-only mount and immutable or append-only files. Each stops the start (exit 1) with the
 * files named and what to do, and leaves the directory as it was. Real processes, real files;
 * the mount and chattr cases need root (and chattr a filesystem that has the flags).
 */
import t, { type Test } from 'tap';
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { once } from 'node:events';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { cleanEnv, REPO_ROOT, startFlashd, type RunResult } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');
const node = process.execPath;
const asRoot = process.getuid?.() === 0;
const args = (dir: string): string[] => [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'];

t.before(() => {
  if (!existsSync(BUNDLE)) throw new Error('dist/flashd.mjs is missing: run `npm run build` (npm test does) first');
});

const authed = (key: string, body?: unknown): RequestInit => ({
  method: body === undefined ? 'GET' : 'POST',
  headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
  ...(body === undefined ? {} : { body: JSON.stringify(body) }),
});

/**
 * A first start on `dir` that stores a registry credential (its password sealed with
 * secret.key), stopped by `signal` (SIGKILL leaves flashd.db-wal behind). The admin key.
 */
async function firstRun(t: Test, dir: string, signal: NodeJS.Signals = 'SIGTERM'): Promise<string> {
  const f = await startFlashd(t, node, args(dir), cleanEnv());
  const key = readFileSync(join(dir, 'admin-api-key'), 'utf8').trim();
  const reg = await fetch(`${f.url}/v2/registry-credentials`, authed(key, { name: 'reg', username: 'robot', password: 'pw-sealed' }));
  t.ok(reg.ok, `registry credential stored (${reg.status})`);
  await f.stop(signal);
  return key;
}

/**
 * Runs flashd on `dir` until it exits. One that starts instead (what these cases did before)
 * is stopped with SIGTERM once it listens, and so exits 0.
 */
async function attempt(dir: string, env = cleanEnv()): Promise<RunResult> {
  const child = spawn(node, args(dir), { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => {
    stderr += c;
    if (stderr.includes('flashd listening')) child.kill('SIGTERM');
  });
  const [status] = (await once(child, 'exit')) as [number | null];
  return { status, stdout, stderr };
}

const bytes = (file: string): string => readFileSync(file).toString('base64');

t.test('flashd.db deleted, its secret.key, admin-api-key or WAL left: exit 1 naming them, nothing made or written over', async (t) => {
  const dir = testDataDir(t);
  await firstRun(t, dir);
  rmSync(join(dir, 'flashd.db'));
  const adminKey = bytes(join(dir, 'admin-api-key'));
  const secret = bytes(join(dir, 'secret.key'));
  const r = await attempt(dir);
  t.equal(r.status, 1, 'exit 1');
  t.equal(r.stderr, `flashd: cannot start: ${join(dir, 'flashd.db')} is missing, but the data directory still holds secret.key, admin-api-key: `
    + 'a flashd ran here and its database was deleted or not restored. Starting would make a new, empty one. '
    + 'Restore flashd.db from a backup (with the secret.key saved with it), or move the directory aside to start afresh\n');
  t.notOk(r.stdout.includes('fd_usr_'), 'no new admin key printed');
  t.equal(bytes(join(dir, 'admin-api-key')), adminKey, 'admin-api-key not written over');
  t.equal(bytes(join(dir, 'secret.key')), secret, 'secret.key as it was');
  t.notOk(existsSync(join(dir, 'flashd.db')), 'no new flashd.db');

  // kill -9: the last writes are still in flashd.db-wal.
  const crashed = testDataDir(t);
  await firstRun(t, crashed, 'SIGKILL');
  t.ok(existsSync(join(crashed, 'flashd.db-wal')), 'a WAL is left by kill -9');
  rmSync(join(crashed, 'flashd.db'));
  const wal = bytes(join(crashed, 'flashd.db-wal'));
  const r2 = await attempt(crashed);
  t.equal(r2.status, 1, 'with the WAL: exit 1');
  t.match(r2.stderr, `still holds secret.key, admin-api-key, flashd.db-wal: `);
  t.match(r2.stderr, 'Starting would make a new, empty one and drop the recent writes in flashd.db-wal.');
  t.equal(bytes(join(crashed, 'flashd.db-wal')), wal, 'the WAL is kept');
  t.notOk(existsSync(join(crashed, 'flashd.db')), 'no new flashd.db');

  // The WAL alone (FLASHD_ADMIN_API_KEY, no admin-api-key; secret.key gone too) is enough.
  rmSync(join(crashed, 'secret.key'));
  rmSync(join(crashed, 'admin-api-key'));
  const r3 = await attempt(crashed, cleanEnv({ FLASHD_ADMIN_API_KEY: 'restore-test-admin-key-0123456789' }));
  t.equal(r3.status, 1, 'the WAL alone: exit 1');
  t.match(r3.stderr, 'still holds flashd.db-wal: ');
  t.notOk(existsSync(join(crashed, 'secret.key')), 'no secret.key made');
});

/**
 * What an operator does after a crash: flashd killed (flashd.db-wal and -shm left), then a
 * backup's flashd.db put in the same directory. SQLite reads that WAL as part of the restored
 * file; here its pages point at pages the backup does not have, so the start fails as
 * malformed. The database was closed the usual way on that failure: the close's checkpoint
 * wrote the WAL into the restored file and deleted it, and both were lost.
 */
t.test('a backup\'s flashd.db put beside a crash\'s flashd.db-wal: exit 1 naming the WAL, both files left byte for byte', async (t) => {
  const dir = testDataDir(t);
  const adminKey = await firstRun(t, dir);
  const dbFile = join(dir, 'flashd.db');
  const walFile = join(dir, 'flashd.db-wal');
  // The backup: no free pages, so every page added after it lies past its end.
  const vacuum = new Database(dbFile);
  vacuum.exec('VACUUM');
  vacuum.close();
  const backup = readFileSync(dbFile);
  // Writes after the backup, checkpointed into flashd.db: the settings table is split into pages the backup lacks.
  const later = new Database(dbFile);
  const put = later.prepare('INSERT INTO settings (key, value) VALUES (?, ?)');
  later.transaction(() => {
    for (let i = 0; i < 300; i++) put.run(`pad.${i}`, 'p'.repeat(200));
  })();
  later.close();
  // Then more, still in the WAL when the process is killed (a new root page for settings, and
  // enough commits that the close's checkpoint would run).
  const crash = spawnSync(node, ['-e', `
    const db = new (require('better-sqlite3'))(${JSON.stringify(dbFile)});
    db.pragma('wal_autocheckpoint = 0');
    const put = db.prepare('INSERT INTO settings (key, value) VALUES (?, ?)');
    db.transaction(() => { for (let i = 0; i < 50; i++) put.run('aaa.' + i, 'w'.repeat(200)); })();
    for (let i = 0; i < 100; i++) db.prepare("UPDATE settings SET value = ? WHERE key = 'aaa.0'").run(String(i));
    process.kill(process.pid, 'SIGKILL');`], { cwd: REPO_ROOT, env: cleanEnv() });
  t.equal(crash.signal, 'SIGKILL', `the writer was killed with its WAL left (${crash.stderr})`);
  writeFileSync(dbFile, backup);
  const wal = bytes(walFile);

  const r = await attempt(dir);
  t.equal(r.status, 1, 'exit 1');
  t.equal(r.stderr, `flashd: cannot start: database disk image is malformed: ${walFile} was beside ${dbFile} at this start (a crash or kill -9 leaves it), `
    + 'and SQLite reads it as part of the database. If flashd.db was restored from a backup, move flashd.db-wal and flashd.db-shm out of the data directory (keep them) '
    + 'and start again: they belong to the database it replaced. Otherwise never delete them: they hold the last writes. Both files were left as they were (README "Backups")\n');
  t.equal(bytes(dbFile), backup.toString('base64'), 'the restored flashd.db is as it was');
  t.equal(existsSync(walFile) ? bytes(walFile) : 'deleted', wal, 'and so is the WAL');

  // As the message says: the WAL and -shm moved aside, the backup starts.
  const aside = testDataDir(t);
  renameSync(walFile, join(aside, 'flashd.db-wal'));
  renameSync(join(dir, 'flashd.db-shm'), join(aside, 'flashd.db-shm'));
  const f = await startFlashd(t, node, args(dir), cleanEnv());
  t.equal((await fetch(`${f.url}/v2/registry-credentials`, authed(adminKey))).status, 200, 'the backup starts, its admin key works');
  t.equal(await f.stop(), 0);
});

t.test('flashd.db copied without its secret.key, or beside another one: exit 1; with its own key it starts as before', async (t) => {
  const from = testDataDir(t);
  const adminKey = await firstRun(t, from);
  const dir = testDataDir(t);
  copyFileSync(join(from, 'flashd.db'), join(dir, 'flashd.db'));

  const missing = await attempt(dir);
  t.equal(missing.status, 1, 'no secret.key: exit 1');
  t.equal(missing.stderr, `flashd: cannot start: ${join(dir, 'secret.key')} is missing, but ${join(dir, 'flashd.db')} holds data sealed with it (registry passwords, jobs' s3Config): `
    + 'a new key would leave them unreadable. Put back the secret.key saved with this flashd.db (mode 0600); if it is lost for good, README "Backups" says how to go on without it\n');
  t.notOk(existsSync(join(dir, 'secret.key')), 'no new secret.key made');

  const other = randomBytes(32).toString('base64');
  writeFileSync(join(dir, 'secret.key'), other, { mode: 0o600 });
  const wrong = await attempt(dir);
  t.equal(wrong.status, 1, 'another secret.key: exit 1');
  t.equal(wrong.stderr, `flashd: cannot start: ${join(dir, 'secret.key')} is not the key ${join(dir, 'flashd.db')} was used with: the registry passwords and jobs' s3Config sealed in it would not open. `
    + 'Put back the secret.key saved with this flashd.db (or the flashd.db saved with this secret.key); if it is lost for good, README "Backups" says how to go on without it\n');
  t.equal(readFileSync(join(dir, 'secret.key'), 'utf8'), other, 'secret.key left as it was');

  copyFileSync(join(from, 'secret.key'), join(dir, 'secret.key'));
  const f = await startFlashd(t, node, args(dir), cleanEnv());
  const list = await fetch(`${f.url}/v2/registry-credentials`, authed(adminKey));
  t.equal(list.status, 200, 'its own secret.key: flashd starts and the old admin key works');
  t.match(await list.json(), [{ name: 'reg', username: 'robot' }]);
  t.equal(await f.stop(), 0);
});

t.test('a database from before the check gets it at its next start, never the key itself, and is checked from then on', async (t) => {
  const dir = testDataDir(t);
  await firstRun(t, dir);
  const db = new Database(join(dir, 'flashd.db'));
  t.equal(db.prepare("DELETE FROM settings WHERE key = 'secret_key.check'").run().changes, 1, 'the first start wrote the check');
  db.close();
  const f = await startFlashd(t, node, args(dir), cleanEnv());
  t.equal(await f.stop(), 0, 'the older database starts');
  const after = new Database(join(dir, 'flashd.db'), { readonly: true });
  const check = after.prepare("SELECT value FROM settings WHERE key = 'secret_key.check'").pluck().get() as string | undefined;
  after.close();
  t.match(check, /^[A-Za-z0-9_-]{43}$/, 'the check is written again');
  const key = readFileSync(join(dir, 'secret.key'), 'utf8').trim();
  t.not(check, key, 'not the key');
  for (const f of ['flashd.db', 'flashd.db-wal'].filter((n) => existsSync(join(dir, n)))) {
    const content = readFileSync(join(dir, f));
    t.equal(content.indexOf(Buffer.from(key)), -1, `the key's text is not in ${f}`);
    t.equal(content.indexOf(Buffer.from(key, 'base64')), -1, `nor its bytes`);
  }
  writeFileSync(join(dir, 'secret.key'), randomBytes(32).toString('base64'), { mode: 0o600 });
  const r = await attempt(dir);
  t.equal(r.status, 1, 'then another secret.key is refused');
  t.match(r.stderr, 'is not the key');
});

t.test('a database with no data in it yet (a first start that failed before writing any) gets a new secret.key', async (t) => {
  const dir = testDataDir(t);
  const env = cleanEnv({ FLASHD_ADMIN_API_KEY: 'bare-schema-admin-key-0123456789' });
  const f = await startFlashd(t, node, args(dir), env);
  t.equal(await f.stop(), 0);
  // What such a start leaves: the schema, no row a start or a user writes, no check, no key.
  const bare = new Database(join(dir, 'flashd.db'));
  bare.exec("DELETE FROM api_keys; DELETE FROM users; DELETE FROM settings WHERE key = 'secret_key.check'");
  bare.close();
  rmSync(join(dir, 'secret.key'));
  const again = await startFlashd(t, node, args(dir), env);
  t.equal(Buffer.from(readFileSync(join(dir, 'secret.key'), 'utf8'), 'base64').length, 32, 'a new secret.key');
  t.equal(await again.stop(), 0);
});

t.test('every key revoked: the next start makes an admin key and saves it in place of the dead one in admin-api-key', async (t) => {
  const dir = testDataDir(t);
  await firstRun(t, dir);
  const file = join(dir, 'admin-api-key');
  const old = readFileSync(file, 'utf8').trim();
  // Every key revoked: the next start generates one.
  const db = new Database(join(dir, 'flashd.db'));
  db.exec('UPDATE api_keys SET revoked_at = 1');
  db.close();
  const f = await startFlashd(t, node, args(dir), cleanEnv());
  const key = /fd_usr_[A-Za-z0-9]{36}/.exec(await f.stdoutHolding(/fd_usr_[A-Za-z0-9]{36}/))?.[0];
  t.ok(key, 'a new key is printed');
  t.match(f.stdout(), `The admin user had no valid admin API key left (every one revoked or expired): created an admin API key. It is shown once here and saved to ${file} (mode 0600), in place of the old one`);
  t.equal(readFileSync(file, 'utf8'), `${key}\n`, 'admin-api-key holds the new key');
  t.equal(statSync(file).mode & 0o777, 0o600, 'still 0600');
  t.equal((await fetch(`${f.url}/v2/serverless`, authed(key ?? ''))).status, 200, 'the new key works');
  t.equal((await fetch(`${f.url}/v2/serverless`, authed(old))).status, 401, 'the old one stays revoked');
  t.equal(await f.stop(), 0);
});

const sh = (cmd: string, ...a: string[]): boolean => spawnSync(cmd, a, { stdio: 'ignore' }).status === 0;
/** Ends a test whose setting-up this machine cannot do (a container without the right), as skipped. */
const skipped = (t: Test, why: string): void => void t.pass(why, { skip: why });

t.test('a data directory on a filesystem mounted read-only: EROFS, and the advice is to remount, not chown', { skip: asRoot ? false : 'needs root to mount a tmpfs' }, async (t) => {
  const mnt = join(testDataDir(t), 'mnt');
  mkdirSync(mnt);
  if (!sh('mount', '-t', 'tmpfs', '-o', 'size=4m,mode=0700', 'tmpfs', mnt)) return skipped(t, 'cannot mount a tmpfs here');
  t.teardown(() => void sh('umount', mnt));
  const dir = join(mnt, 'data');
  mkdirSync(dir, { mode: 0o700 });
  if (!sh('mount', '-o', 'remount,ro', mnt)) return skipped(t, 'cannot remount the tmpfs read-only');
  const r = await attempt(dir);
  t.equal(r.status, 1, 'exit 1');
  t.equal(r.stderr, `flashd: cannot start: data directory ${dir} is not writable by uid 0 (EROFS); the filesystem holding it is mounted read-only. `
    + 'Remount it read-write, or choose another --data-dir\n');
});

t.test('a first start on a full disk: exit 1 naming the data directory, not SQLite\'s bare "database or disk is full"', { skip: asRoot ? false : 'needs root to mount a tmpfs' }, async (t) => {
  const mnt = join(testDataDir(t), 'mnt');
  mkdirSync(mnt);
  if (!sh('mount', '-t', 'tmpfs', '-o', 'size=1m,mode=0700', 'tmpfs', mnt)) return skipped(t, 'cannot mount a tmpfs here');
  t.teardown(() => void sh('umount', mnt));
  // A filler as large as the tmpfs: the directory entry still fits, no page of flashd.db does.
  t.notOk(sh('dd', 'if=/dev/zero', `of=${join(mnt, 'filler')}`, 'bs=64k'), 'dd stopped at a full disk');
  const dir = join(mnt, 'data');
  const r = await attempt(dir);
  t.equal(r.status, 1, 'exit 1');
  t.equal(r.stderr, `flashd: cannot start: database or disk is full (SQLITE_FULL), writing the data directory ${dir}: free space on the disk holding it, or choose another --data-dir\n`);
});

t.test('an immutable or append-only flashd.db or data directory: EPERM, and the advice is lsattr and chattr, not chown', { skip: asRoot ? false : 'needs root (CAP_LINUX_IMMUTABLE) for chattr +i' }, async (t) => {
  const dir = testDataDir(t);
  await firstRun(t, dir);
  const db = join(dir, 'flashd.db');
  // After testDataDir's teardown is registered, so it runs first: the directory can then be removed.
  t.teardown(() => void sh('chattr', '-i', '-a', db, dir));
  if (!sh('chattr', '+i', db)) return skipped(t, 'this filesystem has no immutable flag (chattr +i failed)');
  const fileAdvice = `flashd: cannot start: ${db} in the data directory is not writable by uid 0 (EPERM); it is immutable or append-only (\`lsattr ${db}\` shows i or a), `
    + `which stops writes by any user, root included. Clear it with \`chattr -i -a ${db}\`, or choose another --data-dir\n`;
  const immutable = await attempt(dir);
  t.equal(immutable.status, 1, 'immutable flashd.db: exit 1');
  t.equal(immutable.stderr, fileAdvice);

  // Append-only passes access(2): only an open for writing without O_APPEND is refused.
  t.ok(sh('chattr', '-i', '+a', db));
  const appendOnly = await attempt(dir);
  t.equal(appendOnly.status, 1, 'append-only flashd.db: exit 1');
  t.equal(appendOnly.stderr, fileAdvice);
  t.notMatch(appendOnly.stderr, /unable to open|readonly database/);

  t.ok(sh('chattr', '-a', db));
  t.ok(sh('chattr', '+i', dir));
  const dirImmutable = await attempt(dir);
  t.equal(dirImmutable.status, 1, 'immutable directory: exit 1');
  t.equal(dirImmutable.stderr, `flashd: cannot start: data directory ${dir} is not writable by uid 0 (EPERM); it is immutable or append-only (\`lsattr -d ${dir}\` shows i or a), `
    + `which stops writes by any user, root included. Clear it with \`chattr -i -a ${dir}\`, or choose another --data-dir\n`);

  t.ok(sh('chattr', '-i', dir));
  const f = await startFlashd(t, node, args(dir), cleanEnv());
  t.equal(await f.stop(), 0, 'flags cleared: flashd starts');
});

t.test('a --data-dir under /proc (mkdir answers ENOENT below a parent that exists): exit 1 with the usual line, not a silent 100 % CPU spin that ignores SIGTERM', { skip: existsSync('/proc/self') ? false : 'needs /proc' }, (t) => {
  // Node 20's mkdirSync(dir, { recursive: true }) retried such a path for ever: mkdir("/proc/x")
  // ENOENT, mkdir("/proc") EEXIST, again, on a blocked event loop. The bound only ends a spin.
  for (const dir of ['/proc/flashd-no-such-dir', '/proc/flashd-no-such-dir/data']) {
    const r = spawnSync(node, args(dir), { cwd: REPO_ROOT, env: cleanEnv(), encoding: 'utf8', timeout: 60_000, killSignal: 'SIGKILL' });
    t.equal(r.signal, null, `${dir}: flashd ended by itself (killed after 60 s otherwise)`);
    t.equal(r.status, 1, `${dir}: exit 1`);
    t.match(r.stderr, new RegExp(`^flashd: cannot start: cannot create data directory ${dir} as uid \\d+ \\(ENOENT\\)`), `${dir}: the usual one line`);
    t.equal(r.stderr.trimEnd().split('\n').length, 1, 'one line');
    t.equal(r.stderr.split('ENOENT').length - 1, 1, `${dir}: the code is said once, not again as Node's message prefix`);
  }
  t.end();
});

t.test('XDG_CACHE_HOME under /proc: the uWS copy goes to the per-uid temp dir, no spin', { skip: existsSync('/proc/self') ? false : 'needs /proc' }, async (t) => {
  const tmp = testDataDir(t);
  const env = cleanEnv({ XDG_CACHE_HOME: '/proc/flashd-no-such-dir', TMPDIR: tmp });
  const f = await startFlashd(t, node, args(join(testDataDir(t), 'data')), env, 60_000);
  t.equal((await fetch(`${f.url}/healthz`)).status, 200, 'serves');
  t.equal(await f.stop('SIGTERM'), 0, 'stops');
  if (process.platform === 'linux' && process.arch === 'x64') {
    t.ok(existsSync(join(tmp, `flashd-${process.getuid?.() ?? 'user'}`)), 'the patched uWS copy went to <tmpdir>/flashd-<uid>');
  }
});
