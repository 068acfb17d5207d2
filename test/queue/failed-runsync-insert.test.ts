/**
 * A /runsync job's insert is deferred (written 100 ms after the submit, or when its wait ends
 * first). When that insert lands in a commit that fails (a full disk, an I/O error; SQLite
 * rolls it back), the caller is answered 500 and flashd forgets the job, as it does a /run
 * whose insert failed: it leaves its queue (or its worker, which is told to stop it), /health
 * does not count it, its result is not taken and no webhook goes out. Before, it stayed in
 * memory: a worker took it with its input, /health counted it, and its result updated a row
 * that was not there yet got 200, a webhook and, within the wait, a 200 COMPLETED to the caller.
 * A commit that succeeded and whose sync then failed is no rollback: SQLite has the row, and
 * the job goes on. A purge whose end of the job shared the failed commit does not bring it back
 * when that end is undone. The commit fails with a temporary SQLite trigger, as in
 * failed-commit.test.ts; the sync with a replaced fdatasync, as in failed-sync.test.ts.
 */
import t, { type Test } from 'tap';
import fs from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { webhookReceiver } from '../helpers/webhook-receiver.js';

const failInserts = (a: TestAgent) =>
  a.agent.db.exec(`CREATE TEMP TRIGGER insert_fails BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
const allowInserts = (a: TestAgent) => a.agent.db.exec('DROP TRIGGER insert_fails');
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const rowOf = (a: TestAgent, id: string) => a.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').pluck().get(id);

/** The next fdatasync fails with EIO (after the commit it follows succeeded). */
function failNextSync(): void {
  const real = fs.fdatasync;
  (fs as { fdatasync: typeof fs.fdatasync }).fdatasync = ((fd: number, cb: (err: NodeJS.ErrnoException | null) => void) => {
    (fs as { fdatasync: typeof fs.fdatasync }).fdatasync = real;
    syncBuiltinESMExports();
    setImmediate(() => cb(Object.assign(new Error('EIO: i/o error, fdatasync'), { code: 'EIO', errno: -5, syscall: 'fdatasync' })));
  }) as typeof fs.fdatasync;
  syncBuiltinESMExports();
}

/** The next fdatasync waits until the returned release is called: writes meanwhile gather into one commit. */
function holdNextSync(): () => void {
  const real = fs.fdatasync;
  let release = () => undefined as void;
  (fs as { fdatasync: typeof fs.fdatasync }).fdatasync = ((fd: number, cb: (err: NodeJS.ErrnoException | null) => void) => {
    (fs as { fdatasync: typeof fs.fdatasync }).fdatasync = real;
    syncBuiltinESMExports();
    release = () => real(fd, cb);
  }) as typeof fs.fdatasync;
  syncBuiltinESMExports();
  return () => release();
}

async function scene(t: Test) {
  const a = await startAgent(t, { takeHoldMs: 300, webhookAllowPrivate: true });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json.jobs;
  return { a, ep, w, health };
}

t.test('a queued /runsync job whose deferred insert was rolled back is forgotten: no worker gets it', async (t) => {
  const { a, ep, w, health } = await scene(t);
  failInserts(a);
  const r = await a.req('POST', `/v2/${ep}/runsync?wait=2000`, { body: { input: { secret: 1 } } });
  allowInserts(a);
  t.equal(r.status, 500, 'not stored: no 200');
  t.match(r.json, { status: 500, detail: /could not be stored/ });
  t.match(await health(), { inQueue: 0, inProgress: 0 }, '/health does not count it');
  t.equal(await w.take(), null, 'no worker is handed a job SQLite does not have');
  // A later /runsync is stored and runs as usual.
  const next = a.req('POST', `/v2/${ep}/runsync?wait=2000`, { body: { input: { n: 2 } } });
  const job = await w.take();
  t.same(job?.input, { n: 2 });
  t.equal((await w.done(job!.id, { output: 'ok' })).status, 200);
  t.match((await next).json, { status: 'COMPLETED', output: 'ok' });
});

t.test('a /runsync job a worker took before its insert was rolled back is taken off it: no result, count or webhook', async (t) => {
  const { a, ep, w, health } = await scene(t);
  const hook = await webhookReceiver(t);
  failInserts(a);
  const reply = a.req('POST', `/v2/${ep}/runsync?wait=2000`, { body: { input: { n: 1 }, webhook: hook.url } });
  const job = await w.take();
  t.ok(job, 'a parked worker took it at once, before its insert was due');
  const r = await reply;
  allowInserts(a);
  t.equal(r.status, 500, `not stored: no 200 (got ${r.status} ${JSON.stringify(r.json)})`);
  t.equal(rowOf(a, job!.id), undefined);
  t.match(await health(), { inQueue: 0, inProgress: 0 }, 'no longer running on its worker');
  t.equal(await w.ping([job!.id]), 200);
  t.same(await w.stops(), [job!.id], 'the worker is told to stop it');
  const done = await w.done(job!.id, { output: 'lost' });
  t.not(done.status, 200, `its result is not taken for a job SQLite does not have (got ${done.status})`);
  await sleep(200);
  t.match(await health(), { completed: 0, inQueue: 0, inProgress: 0 }, 'not counted');
  t.same([...hook.state.arrived], [], 'no webhook');
  t.equal(rowOf(a, job!.id), undefined);
});

t.test('a result posted within the wait, after the insert was rolled back, is no 200 COMPLETED for an id with no row', async (t) => {
  const { a, ep, w } = await scene(t);
  failInserts(a);
  const reply = a.req('POST', `/v2/${ep}/runsync?wait=3000`, { body: { input: { n: 1 } } });
  const job = await w.take();
  await sleep(300); // the insert (100 ms) failed
  allowInserts(a);
  const done = await w.done(job!.id, { output: 'r' });
  const r = await reply;
  t.equal(r.status, 500, `not a 200 for a job SQLite does not have (got ${r.status} ${JSON.stringify(r.json)})`);
  t.not(done.status, 200, 'the result is not taken');
  t.equal(rowOf(a, job!.id), undefined);
  t.equal((await a.req('GET', `/v2/${ep}/status/${job!.id}`)).status, 404, '/status agrees');
});

t.test('a deferred insert whose commit succeeded and whose sync failed is no rollback: the job runs', async (t) => {
  const { a, ep, w, health } = await scene(t);
  const reply = a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { n: 1 } } });
  await sleep(300); // the insert is committed (100 ms), not yet synced: nothing waits for it
  const id = a.agent.db.prepare("SELECT id FROM jobs WHERE status = 'IN_QUEUE'").pluck().get() as string;
  t.ok(id, 'its row is committed');
  failNextSync();
  const r = await reply;
  t.equal(r.status, 500, 'its durability is unknown: no 200 for its id');
  t.equal(await a.agent.queue.durable().then(() => rowOf(a, id)), 'IN_QUEUE', 'SQLite has it');
  t.match(await health(), { inQueue: 1 }, 'still queued');
  const job = await w.take();
  t.equal(job?.id, id, 'a worker runs it');
  t.equal((await w.done(id, { output: 'kept' })).status, 200);
  t.equal(rowOf(a, id), 'COMPLETED');
});

t.test('a purge in the same commit as a rolled-back deferred insert does not bring the job back', async (t) => {
  const { a, ep, w, health } = await scene(t);
  const release = holdNextSync();
  // A /run starts the sync that is held; what comes after it gathers into the next commit.
  const run = a.req('POST', `/v2/${ep}/run`, { body: { input: { run: 1 } } });
  const reply = a.req('POST', `/v2/${ep}/runsync?wait=5000`, { body: { input: { sync: 1 } } });
  await sleep(300); // its deferred insert is queued (100 ms), behind the held sync
  const purge = a.req('POST', `/v2/${ep}/purge-queue`);
  await sleep(100);
  failInserts(a);
  release();
  t.equal((await run).status, 200, 'the /run was in the commit before');
  t.equal((await purge).status, 500, 'the purge shared the failed commit');
  t.equal((await reply).status, 500, 'the /runsync job was not stored');
  allowInserts(a);
  t.match(await health(), { inQueue: 1 }, 'only the /run job is queued (the purge\'s end of it was undone)');
  t.same((await w.take())?.input, { run: 1 });
  t.equal(await w.take(), null, 'the /runsync job is not brought back by the purge\'s undo');
});
