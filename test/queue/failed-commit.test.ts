/**
 * A group commit that fails (a full disk, an I/O error) rolls back every write in it. Nothing
 * that was in it may be reported as stored afterwards, even once later commits succeed, and the
 * queue's memory must not depend on a floor walk that stops after a failure. The failure is
 * made with a temporary SQLite trigger, as in purge.test.ts.
 */
import t, { type Test } from 'tap';
import v8 from 'node:v8';
import vm from 'node:vm';
import { ManualClock } from '../../src/core/clock.js';
import { openDb, WriteBatch } from '../../src/store/index.js';
import { createLogger } from '../../src/core/logger.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const failInserts = (a: TestAgent) =>
  a.agent.db.exec(`CREATE TEMP TRIGGER insert_fails BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const rowOf = (a: TestAgent, id: string) => a.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').get(id);

/** A /runsync (wait 1 s) whose deferred insert, due 100 ms after the submit, lands in a commit that fails. */
async function runsyncWithFailedInsert(t: Parameters<typeof startAgent>[0]) {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  failInserts(a);
  const reply = a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { n: 1 } } });
  await sleep(400);
  a.agent.db.exec('DROP TRIGGER insert_fails');
  return { a, ep, reply };
}

t.test('a batch whose commit failed is never durable, whatever later commits cover', async (t) => {
  const dir = testDataDir(t);
  const log = createLogger({ level: 'error', sink: { write: () => undefined } });
  const db = openDb({ dataDir: dir, synchronous: 'normal', log });
  t.teardown(() => db.close());
  db.exec('CREATE TABLE t (v INTEGER CHECK (v > 0))');
  const errors: Error[] = [];
  const batch = new WriteBatch(db, { durability: 'none', onError: (e) => errors.push(e) });
  const ok1 = batch.write(() => db.prepare('INSERT INTO t VALUES (1)').run());
  await batch.committed();
  const bad = [0, 0, 0].map(() => {
    const seq = batch.write(() => db.prepare('INSERT INTO t VALUES (0)').run());
    batch.flush();
    return seq;
  });
  const ok2 = batch.write(() => db.prepare('INSERT INTO t VALUES (2)').run());
  await batch.committed();
  const bad2 = batch.write(() => db.prepare('INSERT INTO t VALUES (-1)').run());
  batch.flush();
  const ok3 = batch.write(() => db.prepare('INSERT INTO t VALUES (3)').run());
  await batch.committed();
  t.equal(errors.length, 4, 'four commits failed');
  t.same([ok1, ok2, ok3].map((s) => [batch.isDurable(s), batch.hasFailed(s)]), [[true, false], [true, false], [true, false]]);
  t.same([...bad, bad2].map((s) => [batch.isDurable(s), batch.hasFailed(s)]), [[false, true], [false, true], [false, true], [false, true]]);
  t.same(db.prepare('SELECT v FROM t ORDER BY v').pluck().all(), [1, 2, 3]);
  batch.close();
});

t.test('a /runsync whose deferred insert failed answers 500 and the server goes on serving', async (t) => {
  const { a, reply } = await runsyncWithFailedInsert(t);
  // When the wait ends nothing else is pending: the old loop spun in microtasks for ever here.
  const r = await reply;
  t.equal(r.status, 500, 'the id is not given out as stored');
  t.match(r.json, { status: 500, title: 'Internal server error', detail: /could not be stored/ });
  t.equal((await a.req('GET', '/healthz')).status, 200, 'the event loop turns');
});

t.test('a /runsync whose deferred insert failed is not given out once another commit succeeds', async (t) => {
  const { a, ep, reply } = await runsyncWithFailedInsert(t);
  const other = await a.req('POST', `/v2/${ep}/run`, { body: { input: { other: 1 } } });
  t.equal(other.status, 200, 'an unrelated /run commits');
  t.ok(rowOf(a, other.json.id as string));
  const r = await reply;
  t.equal(r.status, 500, `not a 200 for an id with no row (got ${r.status} ${JSON.stringify(r.json)})`);
});

t.test('finished jobs are let go after a failed commit (the floor walk no longer runs)', async (t) => {
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as () => void;
  const clock = new ManualClock();
  const a = await startAgent(t, { sqliteSynchronous: 'normal', takeHoldMs: 1000 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  failInserts(a);
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).status, 500, 'one /run fails to store');
  a.agent.db.exec('DROP TRIGGER insert_fails');
  // Retried jobs are out of rowid order: the floor walk's set holds them while they are active.
  const refs: WeakRef<object>[] = [];
  for (let i = 0; i < 10; i++) {
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).json.id as string;
    t.equal((await w.take())?.id, id);
    await w.done(id, { error: 'boom' });
    t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).json.status, 'IN_QUEUE');
    t.equal((await w.take())?.id, id);
    t.equal((await w.done(id, { output: 'x'.repeat(100_000) })).status, 200);
    refs.push(new WeakRef(a.agent.queue.live(id) as object));
  }
  clock.advance(31 * 60_000); // /run results are kept 30 minutes
  a.agent.queue.reap();
  await a.agent.queue.durable();
  for (let i = 0; i < 5; i++) {
    gc();
    await sleep(20);
  }
  t.equal(refs.filter((r) => r.deref() !== undefined).length, 0, 'no finished, expired job is still referenced');
});

/** A flashd with one job running on a test worker. */
async function withRunningJob(t: Test) {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const running = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, running);
  return { a, ep, w, running };
}

t.test('a /status?ttl= is answered once the ttl is stored: a write that fails is no 200', async (t) => {
  const { a, ep, w, running } = await withRunningJob(t);
  const finished = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  t.equal((await w.take())?.id, finished);
  t.equal((await w.done(finished, { output: 'r' })).status, 200);
  // Only a ttl writes these columns now: the running job's retention, the finished job's expiry.
  a.agent.db.exec(`CREATE TEMP TRIGGER ttl_fails BEFORE UPDATE OF retention_ms, expires_at ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  const r1 = await a.req('GET', `/v2/${ep}/status/${finished}?ttl=600000`);
  t.equal(r1.status, 500, `a finished job's ttl that was not stored is not acknowledged (got ${r1.status})`);
  const r2 = await a.req('GET', `/v2/${ep}/status/${running}?ttl=600000`);
  t.equal(r2.status, 500, `a running job's ttl that was not stored is not acknowledged (got ${r2.status})`);
  a.agent.db.exec('DROP TRIGGER ttl_fails');
  const r3 = await a.req('GET', `/v2/${ep}/status/${finished}?ttl=600000`);
  t.equal(r3.status, 200);
  const row = a.agent.db.prepare('SELECT expires_at - completed_at AS kept FROM jobs WHERE id = ?').get(finished) as { kept: number };
  t.ok(row.kept >= 600_000, 'the ttl is in the row when the 200 comes');
});

t.test('a /status?ttl= asked again after its write failed is stored before the 200, not taken as already set', async (t) => {
  const { a, ep, w, running } = await withRunningJob(t);
  a.agent.db.exec(`CREATE TEMP TRIGGER ttl_fails BEFORE UPDATE OF retention_ms ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  t.equal((await a.req('GET', `/v2/${ep}/status/${running}?ttl=600000`)).status, 500, 'the ttl that was not stored is no 200');
  a.agent.db.exec('DROP TRIGGER ttl_fails');
  // The client asks again, with the same ttl: a 200 now says it is stored.
  t.equal((await a.req('GET', `/v2/${ep}/status/${running}?ttl=600000`)).status, 200);
  const row = a.agent.db.prepare('SELECT retention_ms FROM jobs WHERE id = ?').get(running) as { retention_ms: number };
  t.equal(row.retention_ms, 600_000, 'the ttl is in the row when the 200 comes');
});
