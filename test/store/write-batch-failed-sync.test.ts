/**
 * A failed fdatasync marks every batch it was the first to cover as failed, also below an
 * earlier failed commit, so none of them is reported durable after a later good sync; and
 * ifRolledBack runs for a commit that failed, never for one whose sync failed.
 */
import t from 'tap';
import fs from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';
import { createLogger } from '../../src/core/logger.js';
import { WriteBatch, openDb, walPathOf } from '../../src/store/index.js';

const quiet = createLogger({ level: 'error', sink: { write: () => undefined } });

t.test('fdatasync failure after a commit failure: the earlier unsynced batches are never durable', async (t) => {
  const dir = t.testdir();
  const db = openDb({ dataDir: dir, synchronous: 'full', log: quiet });
  db.exec('CREATE TABLE t (n INTEGER NOT NULL CHECK (n > 0))');
  const errors: Error[] = [];
  const batch = new WriteBatch(db, { durability: 'fsync', walPath: walPathOf(dir), onError: (e) => errors.push(e) });
  const insert = db.prepare('INSERT INTO t (n) VALUES (?)');
  // A: committed, not synced (no caller waits: a claim, a progress write, a stream delete...).
  const a = batch.write(() => insert.run(1));
  batch.flush();
  // B: its commit fails (disk full).
  const b = batch.write(() => insert.run(0));
  batch.flush();
  t.ok(batch.hasFailed(b), 'B failed');
  // C: committed, and the sync that covers A..C fails (ENOSPC/EIO from fdatasync).
  const real = fs.fdatasync;
  (fs as { fdatasync: unknown }).fdatasync = (_fd: number, cb: (e: Error | null) => void) => setImmediate(() => cb(Object.assign(new Error('EIO'), { code: 'EIO' })));
  syncBuiltinESMExports();
  const c = batch.write(() => insert.run(3));
  await batch.committed().catch(() => undefined);
  (fs as { fdatasync: unknown }).fdatasync = real;
  syncBuiltinESMExports();
  t.equal(errors.length, 2, 'one commit and one sync failed');
  t.ok(batch.hasFailed(c), 'C failed (its sync failed)');
  t.ok(batch.hasFailed(a), 'A failed too: the failed sync was the first to cover it');
  t.ok(batch.wasRolledBack(b), 'B was rolled back');
  t.notOk(batch.wasRolledBack(a) || batch.wasRolledBack(c), 'A and C were not: SQLite has them');
  t.equal(db.prepare('SELECT count(*) FROM t').pluck().get(), 2, 'A and C are in the table');
  // D: a later sync succeeds and covers everything before it.
  const d = batch.write(() => insert.run(4));
  await batch.committed();
  t.ok(batch.isDurable(d), 'D durable');
  t.notOk(batch.isDurable(a), 'A is not reported durable after the later good sync');
  batch.close();
  db.close();
});

t.test('ifRolledBack runs for a commit that failed, in its turn, and never for a good commit or a failed sync', async (t) => {
  const dir = t.testdir();
  const db = openDb({ dataDir: dir, synchronous: 'full', log: quiet });
  db.exec('CREATE TABLE t (n INTEGER NOT NULL CHECK (n > 0))');
  const batch = new WriteBatch(db, { durability: 'fsync', walPath: walPathOf(dir), onError: () => undefined });
  const insert = db.prepare('INSERT INTO t (n) VALUES (?)');
  const ran: string[] = [];
  batch.write(() => insert.run(1));
  batch.ifRolledBack(() => ran.push('good'));
  await batch.committed();
  // Its commit fails: the hook runs in the flush itself, before any caller's promise settles.
  batch.write(() => insert.run(0));
  batch.ifRolledBack(() => ran.push('rolled back'));
  const waited = batch.committed().then(() => 'ok', () => ran.slice());
  batch.flush();
  t.same(ran, ['rolled back'], 'at once, in the failed commit\'s turn');
  t.same(await waited, ['rolled back'], 'before the caller hears of the failure');
  // Committed, then its sync fails: SQLite has it, so it is no rollback.
  const real = fs.fdatasync;
  (fs as { fdatasync: unknown }).fdatasync = (_fd: number, cb: (e: Error | null) => void) => setImmediate(() => cb(Object.assign(new Error('EIO'), { code: 'EIO' })));
  syncBuiltinESMExports();
  const synced = batch.write(() => insert.run(2));
  batch.ifRolledBack(() => ran.push('sync failed'));
  await batch.committed().catch(() => undefined);
  (fs as { fdatasync: unknown }).fdatasync = real;
  syncBuiltinESMExports();
  t.ok(batch.hasFailed(synced) && !batch.wasRolledBack(synced), 'its sync failed, its commit did not');
  t.same(ran, ['rolled back'], 'not run for the good commit nor the failed sync');
  batch.close();
  db.close();
});
