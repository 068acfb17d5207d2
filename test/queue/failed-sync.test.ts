/**
 * A batch whose commit succeeded but whose fdatasync of the WAL then failed (an I/O error, a
 * full thin-provisioned or network disk). With `--sqlite-synchronous full` SQLite commits at
 * NORMAL and flashd syncs the WAL itself (store/write-batch.ts), so SQLite never reports this:
 * the commit returned OK and SQLite holds and reads its writes. Its callers still get a 500
 * (not known to be durable), but memory must keep what SQLite holds. Before, the undo paths took
 * it for a rolled-back commit: an execution timeout went back to running in memory while its row
 * said TIMED_OUT, so the worker's result then got 200 and /status showed it COMPLETED, but the
 * result's conditional write matched no row and a restart said TIMED_OUT (the result was lost);
 * a running job's result went back to running, so a /cancel then got 200 CANCELLED while the
 * row (and a restart) said COMPLETED; a /run's job left memory while its row stayed queued,
 * run by no worker until a restart.
 *
 * The failure is made by replacing node:fs's fdatasync for one call (the operating system's
 * answer, not flashd's code); syncBuiltinESMExports carries it to the write batch's import.
 */
import t, { type Test } from 'tap';
import fs from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

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

async function scene(t: Test, config: Record<string, unknown> = {}) {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const settings = { takeHoldMs: 100, leaseMs: 600_000, ...config };
  let a = await startAgent(t, settings, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  return {
    clock, ep, w,
    get a() { return a; },
    status: async (id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json,
    restart: async () => {
      await a.agent.close();
      a = await startAgent(t, settings, { clock, dir });
    },
  };
}

t.test('an execution timeout whose sync failed stands: the late result is not taken, and a restart agrees', async (t) => {
  const s = await scene(t);
  const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {}, policy: { executionTimeout: 5000 } } })).json.id as string;
  t.equal((await s.w.take())?.id, id);
  s.clock.advance(200);
  await sleep(250); // its claim is written (CLAIM_SAVE_DELAY_MS)
  s.clock.advance(5000);
  failNextSync();
  s.a.agent.queue.reap();
  await t.rejects(s.a.agent.queue.durable(), /fdatasync of the WAL failed/);
  t.equal(rowOf(s.a, id), 'TIMED_OUT', 'SQLite has the timeout');
  t.equal(s.a.agent.queue.find(s.ep, id)?.status, 'TIMED_OUT', 'and so does memory');
  t.equal((await s.status(id)).status, 'TIMED_OUT');
  const late = await s.w.done(id, { output: 'late' });
  t.equal(late.status, 200);
  t.notSame(late.json, { ok: true }, `not accepted as its result (got ${JSON.stringify(late.json)})`);
  t.equal((await s.status(id)).status, 'TIMED_OUT', '/status does not show a result SQLite does not have');
  await s.restart();
  t.equal((await s.status(id)).status, 'TIMED_OUT', 'a restart finds what /status said');
});

t.test("a worker's result whose sync failed stands: a /cancel after it does not answer CANCELLED", async (t) => {
  const s = await scene(t);
  const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await s.w.take())?.id, id);
  s.clock.advance(200);
  await sleep(250);
  failNextSync();
  t.equal((await s.w.done(id, { output: { answer: 42 } })).status, 500, 'not known to be durable: no 200');
  t.equal(rowOf(s.a, id), 'COMPLETED', 'SQLite has the result');
  t.match(await s.status(id), { status: 'COMPLETED', output: { answer: 42 } }, 'and /status shows it');
  const cancel = await s.a.req('POST', `/v2/${s.ep}/cancel/${id}`);
  t.equal(cancel.status, 200);
  t.equal(cancel.json.status, 'COMPLETED', 'a cancel after it finds the job completed');
  const retry = await s.w.done(id, { output: { answer: 42 } });
  t.equal(retry.status, 200, "the worker's retry of its post");
  await s.restart();
  t.match(await s.status(id), { status: 'COMPLETED', output: { answer: 42 } }, 'a restart finds the same');
});

t.test('a /run whose sync failed: the job SQLite holds is run, not left for a restart', async (t) => {
  const s = await scene(t);
  failNextSync();
  const run = await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: { n: 1 } } });
  t.equal(run.status, 500, 'not known to be durable: no id given out');
  const rows = s.a.agent.db.prepare("SELECT id FROM jobs WHERE status = 'IN_QUEUE'").pluck().all() as string[];
  t.equal(rows.length, 1, 'SQLite has the job');
  t.equal((await s.w.take())?.id, rows[0], 'and a worker gets it now');
});

t.test('a /cancel of a running job whose sync failed stands: its worker is told to stop it', async (t) => {
  const s = await scene(t);
  const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await s.w.take())?.id, id);
  failNextSync();
  t.equal((await s.a.req('POST', `/v2/${s.ep}/cancel/${id}`)).status, 500, 'not known to be durable: no 200');
  t.equal(rowOf(s.a, id), 'CANCELLED', 'SQLite has the cancel');
  t.equal((await s.status(id)).status, 'CANCELLED');
  t.equal(await s.w.ping([id]), 200);
  t.same(await s.w.stops(), [id], 'its worker is told to stop it');
  const again = await s.a.req('POST', `/v2/${s.ep}/cancel/${id}`);
  t.match(again, { status: 200, json: { status: 'CANCELLED' } }, "the client's retry");
});
