/**
 * flashd.db gives the space of deleted rows back to the filesystem. A new database is in
 * auto_vacuum=INCREMENTAL mode and SpaceReclaimer cuts its free pages off a slice per commit;
 * a database an older flashd made (auto_vacuum NONE) is converted once when openDb opens it.
 * Before this the file stayed at its peak size for ever.
 */
import t from 'tap';
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createLogger } from '../../src/core/logger.js';
import { MIGRATIONS } from '../../src/store/migrations.js';
import { SpaceReclaimer, WriteBatch, openDb, walPathOf, type Db } from '../../src/store/index.js';
import { VACUUM_SLICE_PAGES } from '../../src/store/vacuum.js';
import { WAL_SIZE_LIMIT } from '../../src/store/db.js';
import { databaseAtVersion } from '../helpers/old-db.js';
import { testDataDir } from '../helpers/data-dir.js';

const MB = 1024 * 1024;
const quiet = createLogger({ level: 'error', sink: { write: () => undefined } });

function logTo(lines: string[]) {
  return createLogger({ level: 'info', format: 'json', sink: { write: (line) => void lines.push(line) } });
}

const insertSql = `INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, created_at)
  VALUES (?, 'ep', 'IN_QUEUE', ?, 600000, 86400000, 1800000, 0)`;

/** `count` jobs rows of `size` bytes of input each, a few per transaction, as bursts of /run write them. */
function fill(db: Db, count: number, size: number, prefix = 'big', perCommit = 4): void {
  const insert = db.prepare(insertSql);
  const input = JSON.stringify({ blob: 'x'.repeat(size - 12) });
  for (let i = 0; i < count; i += perCommit) {
    db.transaction(() => {
      for (let j = i; j < Math.min(count, i + perCommit); j++) insert.run(`${prefix}${j}`, input);
    })();
  }
}

const fileSize = (dir: string): number => statSync(join(dir, 'flashd.db')).size;
const walSize = (dir: string): number => (existsSync(walPathOf(dir)) ? statSync(walPathOf(dir)).size : 0);

async function reclaimed(r: SpaceReclaimer): Promise<void> {
  for (let i = 0; i < 3000 && r.running; i++) await new Promise((resolve) => setTimeout(resolve, 5));
}

t.test('a new database gives the pages of deleted rows back, a slice per commit', async (t) => {
  const dir = testDataDir(t);
  const db = openDb({ dataDir: dir, synchronous: 'full', log: quiet });
  const batch = new WriteBatch(db, { durability: 'fsync', walPath: walPathOf(dir), onError: () => undefined });
  const lines: string[] = [];
  const reclaimer = new SpaceReclaimer(db, batch, logTo(lines));
  t.teardown(() => {
    reclaimer.close();
    batch.close();
    db.close();
  });
  t.equal(db.pragma('auto_vacuum', { simple: true }), 2, 'auto_vacuum=INCREMENTAL');

  fill(db, 60, MB, 'big', 30);
  t.ok(walSize(dir) > WAL_SIZE_LIMIT, `the burst grew the WAL to ${walSize(dir)} bytes (30 MB commits)`);
  fill(db, 3, 1000, 'small');
  db.pragma('wal_checkpoint(PASSIVE)');
  const peak = fileSize(dir);
  t.ok(peak > 60 * MB, `and the file to ${peak} bytes`);
  db.prepare("DELETE FROM jobs WHERE id GLOB 'big*'").run();
  const free = db.pragma('freelist_count', { simple: true }) as number;
  const pages = db.pragma('page_count', { simple: true }) as number;

  reclaimer.check();
  t.ok(reclaimer.running, 'a freelist this large starts a reclaim');
  t.equal(db.pragma('page_count', { simple: true }), pages, 'nothing is cut on the caller\'s turn: the slices are commits of the batch');
  await reclaimed(reclaimer);
  t.notOk(reclaimer.running, 'the reclaim ends');
  t.equal(db.pragma('freelist_count', { simple: true }), 0, 'no free page left');
  t.ok(reclaimer.slices >= Math.ceil(free / VACUUM_SLICE_PAGES), `in slices of at most ${VACUUM_SLICE_PAGES} pages (${reclaimer.slices} for ${free} free pages)`);
  const after = fileSize(dir);
  t.ok(after < peak / 20, `the file went from ${peak} to ${after} bytes`);
  t.ok(walSize(dir) <= WAL_SIZE_LIMIT, `and the WAL is ${walSize(dir)} bytes, not the burst's size`);
  t.equal(db.prepare('SELECT count(*) FROM jobs').pluck().get(), 3, 'the live rows are all there');
  t.equal(db.pragma('integrity_check', { simple: true }), 'ok');
  t.match(lines.join(''), /giving free space back.*gave free space back/s, 'logged when it starts and ends');

  reclaimer.check();
  t.notOk(reclaimer.running, 'nothing to do afterwards');
});

t.test('a small freelist is left for the next writes to reuse', (t) => {
  const dir = testDataDir(t);
  const db = openDb({ dataDir: dir, synchronous: 'normal', log: quiet });
  const batch = new WriteBatch(db, { durability: 'none', onError: () => undefined });
  const reclaimer = new SpaceReclaimer(db, batch, quiet);
  t.teardown(() => {
    reclaimer.close();
    batch.close();
    db.close();
  });
  fill(db, 8, MB);
  db.prepare('DELETE FROM jobs').run();
  const pages = db.pragma('page_count', { simple: true });
  reclaimer.check();
  t.notOk(reclaimer.running, '8 MB free is under the threshold');
  t.equal(db.pragma('page_count', { simple: true }), pages);
  t.end();
});

t.test('a database an older flashd made (auto_vacuum NONE) is converted once at start', (t) => {
  const dir = testDataDir(t);
  const old = databaseAtVersion(dir, MIGRATIONS.length);
  t.equal(old.pragma('auto_vacuum', { simple: true }), 0, 'the old file does not shrink');
  fill(old, 40, MB);
  fill(old, 5, 1000, 'small');
  old.prepare("DELETE FROM jobs WHERE id GLOB 'big*'").run();
  const before = old.prepare('SELECT rowid, id, input FROM jobs ORDER BY rowid').all();
  old.pragma('wal_checkpoint(TRUNCATE)');
  old.close();
  const peak = fileSize(dir);
  t.ok(peak > 40 * MB, `the old file is ${peak} bytes`);

  const lines: string[] = [];
  let db = openDb({ dataDir: dir, synchronous: 'full', log: logTo(lines) });
  t.equal(db.pragma('auto_vacuum', { simple: true }), 2, 'now INCREMENTAL');
  t.same(db.prepare('SELECT rowid, id, input FROM jobs ORDER BY rowid').all(), before, 'every row kept, with its rowid (the recovery floor relies on them)');
  const after = fileSize(dir);
  t.ok(after < peak / 20, `the file went from ${peak} to ${after} bytes`);
  t.ok(walSize(dir) <= WAL_SIZE_LIMIT, 'and the WAL did not keep it');
  t.match(lines.join(''), /converting to give space back.*"liveMb".*converted to auto_vacuum=INCREMENTAL/s, 'logged with its sizes');
  db.close();

  lines.length = 0;
  db = openDb({ dataDir: dir, synchronous: 'full', log: logTo(lines) });
  t.teardown(() => db.close());
  t.notMatch(lines.join(''), /convert/, 'the next start has nothing to convert');
  t.end();
});
