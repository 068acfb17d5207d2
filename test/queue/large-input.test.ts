/**
 * A long input (over 2,048 characters: a base64 image) is written once, at the job's insert,
 * to `job_inputs` (migration 15), and not again by later changes of the job's row: in the row,
 * SQLite rewrote it with every claim, progress update and final state (a size change rewrites
 * the whole record, overflow pages included). What must hold: the WAL a job's life writes after
 * its insert stays far below its input, and every reader of the input gets it whole (job-take,
 * a /retry, a restart, a webhook), while the side rows go with their job (expiry, endpoint
 * deletion) and rows written before keep working.
 *
 * The WAL is counted, not timed: a second connection holds a read transaction open, so no
 * checkpoint can copy frames past it and the WAL is never restarted from its start; its file
 * then grows by one frame (4,096 + 24 bytes) per page each commit writes.
 */
import t, { type Test } from 'tap';
import Database from 'better-sqlite3';
import { randomBytes } from 'node:crypto';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { createLogger } from '../../src/core/logger.js';
import { createSecretBox } from '../../src/core/secret-box.js';
import { JobsRepo, openDb, walPathOf } from '../../src/store/index.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';
import { databaseAtVersion } from '../helpers/old-db.js';
import { until } from '../helpers/wait.js';

const quiet = createLogger({ level: 'error', sink: { write: () => undefined } });

async function endpoint(a: TestAgent): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) });
  if (r.status !== 201) throw new Error(r.text);
  return r.json.id as string;
}

/** A /run input of about `chars` characters, as a base64 image would be. */
const bigInput = (chars: number, tag = 'a') => ({ tag, image: 'QUJD'.repeat(Math.ceil(chars / 4)).slice(0, chars) });

const run = async (a: TestAgent, ep: string, input: unknown): Promise<string> => {
  const r = await a.req('POST', `/v2/${ep}/run`, { body: { input } });
  if (r.status !== 200) throw new Error(r.text);
  return r.json.id as string;
};

const sideRows = (db: Database.Database): number => db.prepare('SELECT count(*) FROM job_inputs').pluck().get() as number;

t.test('progress updates and the end of a job with a 1.5 MB input write a small fraction of it to the WAL', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300, sqliteSynchronous: 'normal' });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  // Pin the WAL: a read transaction on another connection, opened before the job.
  const reader = new Database(join(a.dir, 'flashd.db'));
  t.teardown(() => reader.close());
  reader.exec('BEGIN');
  reader.prepare('SELECT count(*) FROM jobs').get();
  const wal = walPathOf(a.dir);
  const walSize = (): number => statSync(wal).size;

  const input = bigInput(1_500_000);
  const before = walSize();
  const id = await run(a, ep, input);
  const inserted = walSize();
  t.ok(inserted - before >= 1_500_000, `the insert wrote the input to the WAL (${inserted - before} bytes): the count works`);

  const job = await w.take();
  t.equal(job?.id, id);
  t.same(job?.input, input, 'job-take hands out the whole input');
  const updates = 20;
  for (let i = 0; i < updates; i++) {
    // Of changing length, as "step 9 of 20" then "step 10 of 20": SQLite rewrites a record in
    // place, changed pages only, only while its size stays the same.
    t.equal((await w.done(id, { status: 'IN_PROGRESS', output: { step: `${i} of ${updates}`, pad: '.'.repeat(i % 3) } })).status, 200);
  }
  t.equal((await w.done(id, { output: { ok: true } })).status, 200);
  await a.agent.queue.durable();
  const rest = walSize() - inserted;
  // Before migration 15 each of these writes rewrote the input: about 22 × 1.5 MB.
  t.ok(rest < 1_500_000, `claim, ${updates} progress updates and the result wrote ${rest} bytes of WAL, less than the input once`);
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', output: { ok: true } });
  t.equal(sideRows(a.agent.db), 1, 'the input is in job_inputs');
  t.equal(a.agent.db.prepare('SELECT input FROM jobs WHERE id = ?').pluck().get(id), '', 'and not in the row');
});

t.test('a /retry after the row changed, and a restart, hand the worker the whole input', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300, sqliteSynchronous: 'normal' }, { dir });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const input = bigInput(300_000);
  const id = await run(a, ep, input);
  t.same((await w.take())?.input, input);
  t.equal((await w.done(id, { status: 'IN_PROGRESS', output: { pct: 50 } })).status, 200);
  t.equal((await w.done(id, { error: 'out of memory' })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'FAILED' });
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
  const again = await w.take();
  t.equal(again?.id, id);
  t.same(again?.input, input, 'the retried run gets the input back from SQLite');

  // Two more, queued when flashd stops: after the restart their inputs are read when taken.
  const queued = [bigInput(50_000, 'q1'), bigInput(3_000, 'q2'), { small: true }];
  const ids = [];
  for (const q of queued) ids.push(await run(a, ep, q));
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300, sqliteSynchronous: 'normal' }, { dir });
  const w2 = w.rebase(a.url, b.url);
  // The running job's lease starts again from the restart; the queued ones come in order.
  for (const [i, q] of queued.entries()) {
    const got = await w2.take(true);
    t.equal(got?.id, ids[i], `queued job ${i} taken after the restart`);
    t.same(got?.input, q, `with its whole input (${JSON.stringify(q).length} characters)`);
  }
  t.equal(sideRows(b.agent.db), 3, 'the three long inputs are in job_inputs, the short one in its row');
});

t.test('deleting an endpoint deletes its jobs\' long inputs; a kept job\'s stays', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const gone = await endpoint(a);
  const kept = await endpoint(a);
  for (let i = 0; i < 3; i++) await run(a, gone, bigInput(10_000, `g${i}`));
  const keptId = await run(a, kept, bigInput(10_000, 'k'));
  t.equal(sideRows(a.agent.db), 4);
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  await until('the deleted endpoint\'s inputs to go', async () => sideRows(a.agent.db) === 1);
  t.equal(a.agent.db.prepare('SELECT job_id FROM job_inputs').pluck().get(), keptId);
});

/** A repo on its own database, as the queue drives it (statements inside transactions). */
function store(t: Test) {
  const dir = testDataDir(t);
  const db = openDb({ dataDir: dir, synchronous: 'normal', log: quiet });
  t.teardown(() => db.close());
  const repo = new JobsRepo(db, createSecretBox(randomBytes(32)));
  const job = (id: string) => ({
    id, endpointId: 'bigrows0000001', extra: null, webhook: null, lowPriority: false, executionTimeoutMs: 60_000, ttlMs: 60_000, retentionMs: 60_000,
    createdAt: 1_000,
  });
  return { db, repo, job };
}

t.test('store: each insert path puts a long input in job_inputs, every read path gets it, expiry and deletion remove it', async (t) => {
  const { db, repo, job } = store(t);
  const long = (n: number) => JSON.stringify({ image: 'x'.repeat(n) });
  const atLimit = JSON.stringify({ s: 'y'.repeat(2048 - 8) });
  t.equal(atLimit.length, 2048);
  db.transaction(() => {
    repo.insert(job('one'), long(5_000));
    repo.insertMany([job('m0'), job('m1'), job('m2')], [long(1), long(70_000), atLimit]);
    repo.insertFinished({
      ...job('sync'), status: 'COMPLETED', attempt: 1, retries: 0, workerId: 'w', output: '{"ok":1}', error: null, queuedAt: 1_000, lostMs: 0,
      startedAt: 1_000, completedAt: 2_000, expiresAt: 5_000,
    }, long(20_000));
  })();
  t.same(db.prepare('SELECT job_id FROM job_inputs ORDER BY job_id').pluck().all(), ['m1', 'one', 'sync'], 'only inputs over 2,048 characters');
  t.equal(db.prepare("SELECT input FROM jobs WHERE id = 'm2'").pluck().get(), atLimit, 'one of 2,048 stays in its row');
  for (const [id, input] of [['one', long(5_000)], ['m0', long(1)], ['m1', long(70_000)], ['m2', atLimit], ['sync', long(20_000)]] as const) {
    t.equal(repo.inputOf(id), input, `inputOf ${id}`);
    t.equal(repo.get(id)?.input, input, `get ${id}`);
  }
  // Later changes of the row leave the input where it is.
  db.transaction(() => {
    repo.claim('one', 1, 'w', 1_500);
    repo.setProgress('one', '{"pct":10}');
    repo.requeue('one', 0, 1, 1_600, 100, 'w');
    repo.claim('one', 2, 'w2', 1_700);
    repo.finish('one', 'FAILED', null, '"boom"', 1_800, 3_000, 'w2', 2, 1_700, false);
    repo.requeue('one', 1, 0, 1_900, 0, null);
  })();
  t.equal(repo.inputOf('one'), long(5_000), 'after claims, progress, an end and a /retry');
  t.equal(repo.inputOf('nope'), undefined, 'no row: undefined');

  // The expiry sweep (result retention), then the deletion of one job and of a slice.
  t.same(db.transaction(() => repo.deleteExpired(6_000, 100).map((r) => r.id))(), ['sync']);
  t.same(db.prepare('SELECT job_id FROM job_inputs ORDER BY job_id').pluck().all(), ['m1', 'one'], 'the expired job\'s input went with it');
  db.transaction(() => repo.deleteJob('one'))();
  t.same(db.prepare('SELECT job_id FROM job_inputs').pluck().all(), ['m1']);
  const range = repo.rowidRange();
  db.transaction(() => repo.deleteSlice('bigrows0000001', range?.lo ?? 0, (range?.hi ?? 0) + 1))();
  t.equal(sideRows(db), 0, 'an endpoint deletion slice takes the rest');
  t.equal(db.prepare('SELECT count(*) FROM jobs').pluck().get(), 0);
});

t.test('store: rows an older flashd wrote keep their long input inline and read as before', async (t) => {
  const dir = testDataDir(t);
  const old = databaseAtVersion(dir, 14);
  const input = JSON.stringify({ image: 'z'.repeat(100_000) });
  old.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, created_at)
    VALUES ('old', 'bigrows0000001', 'IN_QUEUE', ?, 1, 1, 1, 1)`).run(input);
  old.close();
  const db = openDb({ dataDir: dir, synchronous: 'normal', log: quiet });
  t.teardown(() => db.close());
  const repo = new JobsRepo(db, createSecretBox(randomBytes(32)));
  t.equal(repo.inputOf('old'), input);
  t.equal(repo.get('old')?.input, input);
  db.transaction(() => repo.claim('old', 1, 'w', 2))();
  t.equal(repo.inputOf('old'), input, 'still read from its row after a change');
  t.equal(sideRows(db), 0, 'the upgrade moved nothing');
  db.transaction(() => repo.deleteJob('old'))();
  t.equal(db.prepare('SELECT count(*) FROM jobs').pluck().get(), 0);
});
