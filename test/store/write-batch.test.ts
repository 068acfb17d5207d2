/**
 * The group commit: writes of one turn share a transaction; with durability `fsync` a caller
 * is answered only after an fdatasync of the WAL that started after its commit, and writes
 * arriving while a sync is in flight are committed together once it completes.
 */
import t, { type Test } from 'tap';
import { join } from 'node:path';
import { createLogger } from '../../src/core/logger.js';
import { WriteBatch, openDb, walPathOf } from '../../src/store/index.js';

const quiet = createLogger({ level: 'error', sink: { write: () => undefined } });

function setup(t: Test, durability: 'fsync' | 'none') {
  const dir = t.testdir();
  const db = openDb({ dataDir: dir, synchronous: durability === 'fsync' ? 'full' : 'normal', log: quiet });
  db.exec('CREATE TABLE t (n INTEGER NOT NULL)');
  const errors: Error[] = [];
  const batch = new WriteBatch(db, { durability, walPath: walPathOf(dir), onError: (e) => errors.push(e) });
  t.teardown(() => {
    batch.close();
    db.close();
  });
  const insert = db.prepare('INSERT INTO t (n) VALUES (?)');
  const count = () => (db.prepare('SELECT count(*) AS c FROM t').get() as { c: number }).c;
  return { db, batch, insert, count, errors, dir };
}

t.test('fsync: answered only after a sync that follows the commit', async (t) => {
  const { batch, insert, count, errors } = setup(t, 'fsync');
  let syncsAtAnswer = -1;
  const p = batch.commit(() => insert.run(1)).then(() => {
    syncsAtAnswer = batch.syncs;
  });
  t.equal(count(), 0, 'nothing runs before the turn ends');
  await p;
  t.equal(count(), 1, 'committed');
  t.ok(syncsAtAnswer >= 1, `a sync completed before the answer (syncs=${syncsAtAnswer})`);
  t.same(errors, []);
});

t.test('fsync: every answer follows a sync completed after its write was issued', async (t) => {
  const { batch, insert, count } = setup(t, 'fsync');
  const answers: Promise<boolean>[] = [];
  for (let i = 0; i < 20; i++) {
    const issuedAt = batch.syncs;
    answers.push(batch.commit(() => insert.run(i)).then(() => batch.syncs > issuedAt));
    if (i % 3 === 0) await new Promise((r) => setImmediate(r));
  }
  t.same(await Promise.all(answers), Array(20).fill(true));
  t.equal(count(), 20, 'every write committed');
  t.ok(batch.syncs <= 20, `no more syncs than writes (${batch.syncs})`);
});

t.test('fsync: committed() with nothing queued waits for commits not yet synced', async (t) => {
  const { batch, insert } = setup(t, 'fsync');
  batch.write(() => insert.run(1)); // no waiter of its own
  await new Promise((r) => setImmediate(r));
  const before = batch.syncs;
  await batch.committed();
  t.ok(batch.syncs > before || before > 0, 'a sync covered the unwaited write before committed() resolved');
  const idle = batch.syncs;
  await batch.committed();
  t.equal(batch.syncs, idle, 'nothing new to sync: resolves without another sync');
});

t.test('none: answered after the commit, never synced', async (t) => {
  const { batch, insert, count } = setup(t, 'none');
  await batch.commit(() => insert.run(1));
  t.equal(count(), 1);
  t.equal(batch.syncs, 0);
});

t.test('a failed statement rejects the waiters of its transaction', async (t) => {
  const { batch, db, errors } = setup(t, 'fsync');
  const bad = db.prepare('INSERT INTO t (n) VALUES (NULL)');
  await t.rejects(batch.commit(() => bad.run()), /NOT NULL/);
  t.equal(errors.length, 1, 'reported to onError');
});

t.test('close commits and syncs whatever is pending', async (t) => {
  const dir = t.testdir();
  const db = openDb({ dataDir: dir, synchronous: 'full', log: quiet });
  db.exec('CREATE TABLE t (n INTEGER NOT NULL)');
  const batch = new WriteBatch(db, { durability: 'fsync', walPath: join(dir, 'flashd.db-wal'), onError: () => undefined });
  const insert = db.prepare('INSERT INTO t (n) VALUES (?)');
  const p = batch.commit(() => insert.run(7));
  batch.close();
  await p;
  t.equal((db.prepare('SELECT n FROM t').get() as { n: number }).n, 7);
  t.throws(() => batch.write(() => insert.run(8)), /closed/);
  db.close();
});

t.test('sequence numbers: a write is durable once its batch is synced (fsync) or committed (none)', async (t) => {
  for (const durability of ['fsync', 'none'] as const) {
    const { batch, insert } = setup(t, durability);
    const seq = batch.write(() => insert.run(1));
    t.notOk(batch.isDurable(seq), `${durability}: not durable while queued`);
    await batch.committed();
    t.ok(batch.isDurable(seq), `${durability}: durable once committed() resolves`);
    const next = batch.write(() => insert.run(2));
    t.ok(next > seq, 'a later batch has a larger number');
    t.notOk(batch.isDurable(next), 'and is not durable yet');
    await batch.committed();
    t.ok(batch.isDurable(next));
  }
});

t.test('fsync: callers committed by a forced flush during a hold are synced even when only unwaited writes follow', async (t) => {
  // A busy sync (8 callers or more) makes the next commit wait for its group (the hold). A
  // forced flush then (DELETE /v2/serverless/{id} flushes before the endpoint's rows go) left
  // its callers waiting for the next sync, and the hold's end committed the writes queued
  // meanwhile without starting one: with no other caller to come (an endpoint's row deletion
  // writes a slice a turn and waits on none), those callers were never answered.
  const { batch, insert } = setup(t, 'fsync');
  await Promise.all(Array.from({ length: 16 }, (_, i) => batch.commit(() => insert.run(i))));
  // The sync that answered them set the hold: these come before it ends (1 ms).
  let answered = false;
  const waited = batch.commit(() => insert.run(100)).then(() => void (answered = true));
  batch.flush(true);
  batch.write(() => insert.run(101)); // no caller of its own
  const timeout = new Promise<'stuck'>((resolve) => setTimeout(() => resolve('stuck'), 2_000));
  t.equal(await Promise.race([waited.then(() => 'answered' as const), timeout]), 'answered', 'the forced flush\'s caller is answered');
  t.ok(answered);
});
