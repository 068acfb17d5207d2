/**
 * The first start of this flashd on a database the previous release left (user_version 14,
 * auto_vacuum NONE, free pages of expired results, long inputs inline in their rows): migration
 * 15 and the conversion (a VACUUM) run before recovery, and afterwards every queued and running
 * job comes back and runs with its whole input, a kept result is served, an old FAILED job's
 * /retry runs with its input, and the file is cut to its live pages. Recovery reads the jobs
 * table from the recovery floor (a rowid) up, so the conversion must keep every row's rowid:
 * jobs has no INTEGER PRIMARY KEY, and a copy that renumbered rows would put active ones under
 * the floor, where recovery never looks.
 *
 * The conversion's VACUUM writes a temporary copy of the live pages: in the data directory,
 * where its room was checked, not in SQLite's temporary directory (SQLITE_TMPDIR, TMPDIR or
 * /var/tmp), often another filesystem. So does the VACUUM of the sealing pass a database from
 * before migration 14 gets (JobsRepo.sealPlainExtras).
 *
 * The old database is made here from a current one: endpoint created through the API, then
 * migration 15 undone (its table and trigger dropped, user_version 14) and the file rewritten
 * with auto_vacuum NONE; the jobs are written by SQL as the previous release wrote them.
 */
import t, { type Test } from 'tap';
import Database from 'better-sqlite3';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';
import { databaseAtVersion } from '../helpers/old-db.js';
import { REPO_ROOT, cleanEnv } from '../helpers/spawn-flashd.js';

const MB = 1024 * 1024;
const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');

t.test('an old database: migration 15, conversion and recovery of its active jobs, with their long inline inputs', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 200, sqliteSynchronous: 'normal' }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  await a.agent.close();

  const old = new Database(join(dir, 'flashd.db'));
  old.exec('DROP TRIGGER jobs_delete_input; DROP TABLE job_inputs');
  old.pragma('user_version = 14');
  old.pragma('auto_vacuum = NONE');
  old.exec('VACUUM');
  t.equal(old.pragma('auto_vacuum', { simple: true }), 0, 'the fixture is in the old format');
  const now = Date.now();
  const insert = old.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, attempt, worker_id,
    output, error, created_at, queued_at, started_at, completed_at, expires_at) VALUES (?, ?, ?, ?, 600000, 86400000, 1800000, ?, ?, ?, ?, ?, ?, ?, ?, ?)`);
  // Finished results the old flashd expired: their pages are on the freelist, their rowids below the live rows'.
  const blob = JSON.stringify({ blob: 'x'.repeat(MB) });
  for (let i = 0; i < 24; i++) insert.run(`gone-${i}`, ep, 'COMPLETED', blob, 1, 'w0', '{"ok":1}', null, now, now, now, now, now + 1);
  const input = (tag: string, chars: number) => JSON.stringify({ tag, image: 'QUJD'.repeat(chars / 4) });
  const jobs = {
    kept: input('kept', 40_000), failed: input('failed', 300_000), running: input('running', 200_000),
    queued: input('queued', 1_000_000), small: input('small', 100),
  };
  insert.run('kept', ep, 'COMPLETED', jobs.kept, 1, 'w0', '{"answer":42}', null, now, now, now, now, now + 3_600_000);
  insert.run('failed', ep, 'FAILED', jobs.failed, 1, 'w0', null, '"out of memory"', now, now, now, now, now + 3_600_000);
  insert.run('running', ep, 'IN_PROGRESS', jobs.running, 1, 'w-killed', null, null, now, now, now, null, null);
  insert.run('queued', ep, 'IN_QUEUE', jobs.queued, 0, null, null, null, now, now, null, null, null);
  insert.run('small', ep, 'IN_QUEUE', jobs.small, 0, null, null, null, now, now, null, null, null);
  old.prepare("DELETE FROM jobs WHERE id GLOB 'gone-*'").run();
  const firstLive = old.prepare("SELECT min(rowid) FROM jobs WHERE endpoint_id = ?").pluck().get(ep) as number;
  // As the old flashd kept it: no active row below the floor, which is above the deleted rows.
  old.prepare("INSERT OR REPLACE INTO settings (key, value) VALUES ('jobs.recovery_floor', ?)").run(String(firstLive));
  const rows = old.prepare('SELECT rowid, id FROM jobs ORDER BY rowid').all();
  old.pragma('wal_checkpoint(TRUNCATE)');
  old.close();
  const peak = statSync(join(dir, 'flashd.db')).size;
  t.ok(peak > 24 * MB, `the old file is ${peak} bytes`);

  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 1000, sqliteSynchronous: 'normal' }, { dir });
  const logs = b.logs.join('');
  t.match(logs, /store migrated version=15/, 'migration 15 ran');
  t.match(logs, /converting to give space back.*converted to auto_vacuum=INCREMENTAL/s, 'the file was converted');
  t.match(logs, /jobs recovered queued=2 running=1/, 'the queued and the running jobs were recovered');
  t.equal(b.agent.db.pragma('auto_vacuum', { simple: true }), 2);
  t.same(b.agent.db.prepare('SELECT rowid, id FROM jobs ORDER BY rowid').all(), rows, 'every row kept its rowid');
  const after = statSync(join(dir, 'flashd.db')).size;
  t.ok(after < peak / 4, `the file went from ${peak} to ${after} bytes`);

  t.same((await b.req('GET', `/v2/${ep}/status/kept`)).json.output, { answer: 42 }, 'a kept result is served');
  t.equal((await b.req('POST', `/v2/${ep}/retry/failed`)).status, 200, '/retry of an old FAILED job');
  const w = await TestWorker.create(b, ep);
  const got = new Map<string, number>();
  for (let i = 0; i < 50 && got.size < 4; i++) {
    const job = await w.take();
    if (!job) continue;
    got.set(job.id, (got.get(job.id) ?? 0) + 1);
    t.equal(JSON.stringify(job.input), jobs[job.id as keyof typeof jobs], `${job.id}: its whole input`);
    t.equal((await w.done(job.id, { output: { tag: job.id } })).status, 200);
  }
  t.same([...got.keys()].sort(), ['failed', 'queued', 'running', 'small'], 'the queued, the running (at its lease) and the retried job ran');
  t.ok([...got.values()].every((n) => n === 1), 'each once');
  for (const id of ['failed', 'queued', 'running', 'small']) {
    t.match((await b.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', output: { tag: id } });
  }
  t.equal(b.agent.db.prepare('SELECT count(*) FROM job_inputs').pluck().get(), 0, 'old inputs stay in their rows');
  t.equal(b.agent.db.pragma('integrity_check', { simple: true }), 'ok');
});

t.test('the conversion writes its temporary copy in the data directory, where its room was checked, not in SQLite\'s temporary directory', async (t) => {
  // `npm test` builds dist/flashd.mjs once before tap; rebuilding here would race other files.
  if (!existsSync(BUNDLE)) throw new Error('dist/flashd.mjs is missing: run `npm run build` (npm test does) first');
  const dir = testDataDir(t);
  const tmp = join(dir, 'sqlite-tmp');
  mkdirSync(tmp);
  const data = join(dir, 'data');
  mkdirSync(data);
  const old = databaseAtVersion(data, 14);
  const insert = old.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, created_at, expires_at)
    VALUES (?, 'gone0000000001', 'COMPLETED', ?, 1, 1, 1, 1, ?)`);
  const blob = JSON.stringify({ blob: 'x'.repeat(MB) });
  old.transaction(() => {
    for (let i = 0; i < 48; i++) insert.run(`kept-${i}`, blob, Date.now() + 3_600_000);
  })();
  old.pragma('wal_checkpoint(TRUNCATE)');
  old.close();

  const { err, temps } = await tempFilesOfStart(t, data, tmp);
  t.match(err, /converted to auto_vacuum=INCREMENTAL/, 'converted');
  t.ok(temps.length > 0, `the temporary copy was seen: ${temps.join(', ')}`);
  t.same(temps.filter((f) => !f.startsWith(data + '/')), [], 'in the data directory only');
});

t.test('the sealing pass at the start of a database with plain s3Config rows (before migration 14) writes its VACUUM\'s temporary copy in the data directory too', async (t) => {
  const dir = testDataDir(t);
  const tmp = join(dir, 'sqlite-tmp');
  mkdirSync(tmp);
  const data = join(dir, 'data');
  mkdirSync(data);
  // A current database (auto_vacuum=INCREMENTAL already: no conversion), with the mark
  // migration 14 leaves when rows hold an older flashd's plain extra keys.
  const a = await startAgent(t, { takeHoldMs: 200 }, { dir: data });
  await a.agent.close();
  const db = new Database(join(data, 'flashd.db'));
  const insert = db.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, extra, execution_timeout_ms, ttl_ms, retention_ms, created_at, expires_at)
    VALUES (?, 'gone0000000001', 'FAILED', '{}', ?, 1, 1, 1, 1, ?)`);
  const extra = JSON.stringify({ s3Config: { accessId: 'id', accessSecret: 'secret-'.padEnd(MB, 'x'), bucketName: 'b', endpointUrl: 'https://s3.example' } });
  db.transaction(() => {
    for (let i = 0; i < 48; i++) insert.run(`plain-${i}`, extra, Date.now() + 3_600_000);
  })();
  db.prepare("INSERT OR REPLACE INTO settings (key, value) VALUES ('jobs.unsealed_extra', '1')").run();
  db.pragma('wal_checkpoint(TRUNCATE)');
  db.close();

  const { err, temps } = await tempFilesOfStart(t, data, tmp);
  t.match(err, /jobs s3Config sealed at rest/, 'the rows were sealed');
  t.notMatch(err, /converted to auto_vacuum=INCREMENTAL/, 'no conversion VACUUM: the copy seen is the sealing pass\'s');
  t.ok(temps.length > 0, `the temporary copy was seen: ${temps.join(', ')}`);
  t.same(temps.filter((f) => !f.startsWith(data + '/')), [], 'in the data directory only');
});

/**
 * Starts the bundle on `data` with SQLITE_TMPDIR=`tmp` and, until it listens, notes the files it
 * holds open: SQLite puts a VACUUM's temporary database in SQLITE_TMPDIR (else TMPDIR, else
 * /var/tmp) as `etilqs_…`, so they show where it went.
 */
async function tempFilesOfStart(t: Test, data: string, tmp: string): Promise<{ err: string; temps: string[] }> {
  const child = spawn(process.execPath, [BUNDLE, '--port', '0', '--data-dir', data, '--runtime', 'none'],
    { cwd: REPO_ROOT, env: cleanEnv({ SQLITE_TMPDIR: tmp }), stdio: ['ignore', 'ignore', 'pipe'] });
  t.teardown(() => void child.kill('SIGKILL'));
  let err = '';
  child.stderr.setEncoding('utf8').on('data', (c: string) => (err += c));
  const opened = new Set<string>();
  while (!/flashd listening/.test(err) && child.exitCode === null) {
    try {
      for (const fd of readdirSync(`/proc/${child.pid}/fd`)) opened.add(readlinkSync(`/proc/${child.pid}/fd/${fd}`));
    } catch {
      // an fd closed between the listing and its read
    }
    await new Promise((resolve) => setImmediate(resolve));
  }
  return { err, temps: [...opened].filter((f) => /etilqs_/.test(f)) };
}
