/**
 * Migration 3 rebuilds the jobs table without the per-endpoint index and foreign key, and
 * fills job_counts from the finished rows: a database written by the previous version keeps
 * every row (same rowids, same values) and its /health counts. Migration 4 drops the index of
 * active jobs and sets the recovery floor from it.
 */
import t from 'tap';
import { createLogger } from '../../src/core/logger.js';
import { MIGRATIONS } from '../../src/store/migrations.js';
import { openDb } from '../../src/store/index.js';
import { databaseAtVersion } from '../helpers/old-db.js';

const quiet = createLogger({ level: 'error', sink: { write: () => undefined } });

t.test('a version-2 database keeps its jobs and gets job_counts', (t) => {
  const dir = t.testdir();
  const old = databaseAtVersion(dir, 2);
  old.pragma('foreign_keys = ON');
  for (const ep of ['epa', 'epb']) old.prepare("INSERT INTO endpoints (id, owner_id, data, created_at, updated_at) VALUES (?, 'usr', '{}', 0, 0)").run(ep);
  const insert = old.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, retries, created_at, expires_at)
    VALUES (?, ?, ?, '{"n":1}', 600000, 86400000, 1800000, ?, ?, ?)`);
  const rows: [string, string, string, number][] = [
    ['j1', 'epa', 'COMPLETED', 1], ['j2', 'epa', 'COMPLETED', 0], ['j3', 'epa', 'FAILED', 2], ['j4', 'epa', 'IN_QUEUE', 1],
    ['j5', 'epb', 'TIMED_OUT', 0], ['j6', 'epb', 'IN_PROGRESS', 0],
  ];
  rows.forEach(([id, ep, status, retries], i) => insert.run(id, ep, status, retries, 1000 + i, status.startsWith('IN_') ? null : 5000));
  const before = old.prepare('SELECT rowid, * FROM jobs ORDER BY rowid').all();
  old.close();

  const db = openDb({ dataDir: dir, synchronous: 'full', log: quiet });
  t.teardown(() => db.close());
  t.equal(db.pragma('user_version', { simple: true }), MIGRATIONS.length);
  t.same(db.prepare('SELECT rowid, * FROM jobs ORDER BY rowid').all(), before.map((r) => ({ ...(r as object), queued_at: null, ended_by_flashd: 0, lost_ms: 0, fenced_from: null })),
    'every row, rowid and value kept (migration 5 adds queued_at, null: queued when created; migration 8 ended_by_flashd, 0; migration 9 lost_ms, 0; migration 10 fenced_from, null)');
  t.same(db.prepare('SELECT endpoint_id AS ep, status, jobs, retries FROM job_counts ORDER BY ep, status').all(), [
    { ep: 'epa', status: 'COMPLETED', jobs: 2, retries: 1 },
    { ep: 'epa', status: 'FAILED', jobs: 1, retries: 2 },
    { ep: 'epb', status: 'TIMED_OUT', jobs: 1, retries: 0 },
  ], 'finished rows counted per endpoint and status');
  const indexes = (db.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' AND sql IS NOT NULL").all() as { name: string }[]).map((r) => r.name).sort();
  t.same(indexes, ['jobs_expiry'], 'no per-endpoint index, no index of active jobs');
  t.same(db.prepare('PRAGMA foreign_key_list(jobs)').all(), [], 'no foreign key');
  t.equal(db.prepare("SELECT value FROM settings WHERE key = 'jobs.recovery_floor'").pluck().get(), '4', 'migration 4: the recovery floor is the oldest active row (j4)');
  t.end();
});

t.test('a new database starts with the recovery floor past its (no) rows', (t) => {
  const db = openDb({ dataDir: t.testdir(), synchronous: 'normal', log: quiet });
  t.teardown(() => db.close());
  t.equal(db.prepare("SELECT value FROM settings WHERE key = 'jobs.recovery_floor'").pluck().get(), '1');
  t.end();
});

t.test('a new database logs one line with its schema version; an older one, a line per migration it ran', (t) => {
  const lines: string[] = [];
  const log = createLogger({ level: 'info', sink: { write: (line: string) => void lines.push(line) } });
  const dir = t.testdir();
  openDb({ dataDir: dir, synchronous: 'normal', log }).close();
  const fresh = lines.filter((l) => /store (created|migrated)/.test(l));
  t.equal(fresh.length, 1, `one line: ${fresh.join(' | ')}`);
  t.match(fresh[0], new RegExp(`store created version=${MIGRATIONS.length}\\b`));

  lines.length = 0;
  const old = t.testdir();
  databaseAtVersion(old, MIGRATIONS.length - 2).close();
  openDb({ dataDir: old, synchronous: 'normal', log }).close();
  const upgraded = lines.filter((l) => /store (created|migrated)/.test(l));
  t.same(upgraded.map((l) => /store migrated version=(\d+)/.exec(l)?.[1]), [String(MIGRATIONS.length - 1), String(MIGRATIONS.length)], upgraded.join(' | '));
  t.end();
});

t.test('migration 16: the webhooks a version-15 database owes stay owed, with no tries counted', (t) => {
  const dir = t.testdir();
  const old = databaseAtVersion(dir, 15);
  old.prepare('INSERT INTO webhook_outbox (job_id) VALUES (?), (?)').run('ja', 'jb');
  old.close();
  const db = openDb({ dataDir: dir, synchronous: 'normal', log: quiet });
  t.teardown(() => db.close());
  t.ok(MIGRATIONS.length >= 16);
  t.same(db.prepare('SELECT job_id, tries FROM webhook_outbox ORDER BY job_id').all(), [{ job_id: 'ja', tries: 0 }, { job_id: 'jb', tries: 0 }]);
  t.equal(db.prepare("SELECT sql FROM sqlite_master WHERE name = 'webhook_outbox'").pluck().get(),
    'CREATE TABLE "webhook_outbox" (job_id TEXT PRIMARY KEY, tries INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID', 'same name, still WITHOUT ROWID');
  t.end();
});
