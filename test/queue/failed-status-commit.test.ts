/**
 * A /status or /status-sync read that waits for the commit of a job's last write (a crash could
 * still take back what it has not synced) while a commit fails (a full disk, an I/O error).
 * Before, the read answered 500 whenever the commit it waited on failed: also when that commit
 * held none of the job's writes (its own was already durable, the failure was another job's),
 * and when the job's own end was rolled back and put back in memory as SQLite has it. Now it
 * waits out the undo of the failed commit and answers the job as SQLite holds it; only a change
 * nothing put back (never shown: it is not on disk) is still a 500.
 *
 * The read has to arrive between a write and its commit: the test holds the WAL sync of an
 * earlier commit by filling libuv's thread pool with opens of a FIFO that has no writer
 * (fdatasync runs there), so later writes wait for that sync; the failure is made with a
 * temporary SQLite trigger, as in failed-commit.test.ts.
 */
import t, { type Test } from 'tap';
import { execFileSync } from 'node:child_process';
import { closeSync, open, openSync } from 'node:fs';
import { join } from 'node:path';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const rowOf = (a: TestAgent, id: string) => a.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').pluck().get(id);
const failStatus = (a: TestAgent, status: string) =>
  a.agent.db.exec(`CREATE TEMP TRIGGER end_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = '${status}'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
const allowStatus = (a: TestAgent) => a.agent.db.exec('DROP TRIGGER end_fails');

async function until(what: string, ok: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !ok(); i++) await sleep(10);
  if (!ok()) throw new Error(`timed out waiting for ${what}`);
}

/**
 * Holds every libuv thread-pool thread (and so the write batch's fdatasync of the WAL) until the
 * returned function is called: each thread blocks opening a FIFO for reading until a writer opens it.
 */
function holdThreadPool(dir: string): () => Promise<void> {
  const fifo = join(dir, 'hold.fifo');
  execFileSync('mkfifo', [fifo]);
  const threads = Number(process.env['UV_THREADPOOL_SIZE']) || 4;
  const opened = Array.from({ length: threads }, () => new Promise<number>((resolve, reject) => {
    open(fifo, 'r', (err, fd) => (err ? reject(err) : resolve(fd)));
  }));
  return async () => {
    // Read-write never blocks on Linux, and lets every blocked reader through.
    const writer = openSync(fifo, 'r+');
    for (const fd of await Promise.all(opened)) closeSync(fd);
    closeSync(writer);
  };
}

async function scene(t: Test) {
  const a = await startAgent(t, { takeHoldMs: 100 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  await sleep(250); // its claim is written (CLAIM_SAVE_DELAY_MS)
  t.equal(rowOf(a, id), 'IN_PROGRESS');
  return { a, ep, w, id, dir: testDataDir(t) };
}

t.test("a read waiting on a commit that failed with only another job's write answers the job, durable, not 500", async (t) => {
  const { a, ep, w, id, dir } = await scene(t);
  const other = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  const release = holdThreadPool(dir);
  const done = w.done(id, { output: { answer: 42 } });
  await until('the result is committed', () => rowOf(a, id) === 'COMPLETED'); // its sync is held
  failStatus(a, 'CANCELLED');
  const cancel = a.req('POST', `/v2/${ep}/cancel/${other}`); // waits for the held sync, then fails
  const status = a.req('GET', `/v2/${ep}/status/${id}`);
  const statusSync = a.req('GET', `/v2/${ep}/status-sync/${id}?wait=1000`);
  await sleep(150); // both reads wait for the next commit
  await release();
  t.equal((await done).status, 200, 'the result is stored');
  t.equal((await cancel).status, 500, "the other job's cancel is not");
  allowStatus(a);
  for (const [name, reply] of [['/status', await status], ['/status-sync', await statusSync]] as const) {
    t.equal(reply.status, 200, `${name}: the job's own write is durable (got ${reply.status} ${reply.text.slice(0, 200)})`);
    t.match(reply.json, { id, status: 'COMPLETED', output: { answer: 42 } }, name);
  }
  t.equal(rowOf(a, other), 'IN_QUEUE');
});

t.test('a read waiting on a result whose commit failed answers the job as SQLite has it (running), not 500 and not the result', async (t) => {
  const { a, ep, w, id, dir } = await scene(t);
  const release = holdThreadPool(dir);
  // A commit whose sync is held: later writes wait for it.
  const other = a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } });
  await until('the insert is committed', () => a.agent.db.prepare('SELECT count(*) FROM jobs').pluck().get() === 2);
  failStatus(a, 'COMPLETED');
  const done = w.done(id, { output: { answer: 42 } });
  await until('the result is in memory', () => a.agent.queue.find(ep, id)?.status === 'COMPLETED');
  // Registered after the result's own wait: its reply is built before the result's undo runs
  // unless it waits that out.
  const status = a.req('GET', `/v2/${ep}/status/${id}`);
  await sleep(150);
  await release();
  t.equal((await other).status, 200);
  t.equal((await done).status, 500, 'the result is not stored');
  const reply = await status;
  t.equal(reply.status, 200, `/status reads the job (got ${reply.status} ${reply.text.slice(0, 200)})`);
  t.equal(reply.json?.status, 'IN_PROGRESS', 'as SQLite has it: never the result that was rolled back');
  t.notOk(reply.json?.output, 'no output');
  t.equal(rowOf(a, id), 'IN_PROGRESS');
  allowStatus(a);
  const retry = await w.done(id, { output: { answer: 42 } });
  t.equal(retry.status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', output: { answer: 42 } });
});
