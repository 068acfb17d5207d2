/**
 * A purge-queue slice whose commit fails (a full disk, an I/O error): the purge is answered 500,
 * and the jobs of that slice must not stay CANCELLED in memory while their rows are still
 * queued. Before, only the jobs the purge had not reached went back on the queue: the failed
 * slice's jobs were gone from /health and from the queue, the client's retry of the purge got
 * 200 without ending them, /status said CANCELLED, and a restart ran them all. The failure is
 * made with a temporary SQLite trigger, as in purge.test.ts.
 */
import t from 'tap';
import { PURGE_SLICE_JOBS } from '../../src/queue/job-queue.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const submitOne = (a: TestAgent, ep: string, input: string) =>
  a.agent.queue.submit({
    endpointId: ep, input, extra: null, webhook: null, executionTimeoutMs: 600_000, ttlMs: 86_400_000, lowPriority: false, retentionMs: 600_000,
  });
const queuedRows = (a: TestAgent, ep: string): number =>
  a.agent.db.prepare("SELECT count(*) FROM jobs WHERE endpoint_id = ? AND status = 'IN_QUEUE'").pluck().get(ep) as number;

t.test('a purge whose commit failed leaves its jobs queued: the retried purge ends them, and a restart runs none', async (t) => {
  const dir = testDataDir(t);
  const config = { takeHoldMs: 100 };
  let a = await startAgent(t, config, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) ids.push((await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).json.id as string);

  a.agent.db.exec(`CREATE TEMP TRIGGER purge_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'CANCELLED'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  t.equal((await a.req('POST', `/v2/${ep}/purge-queue`)).status, 500, 'not stored: no 200');
  a.agent.db.exec('DROP TRIGGER purge_fails');
  t.equal(queuedRows(a, ep), 5, 'the rows are still queued');
  const health = (await a.req('GET', `/v2/${ep}/health`)).json.jobs;
  t.match(health, { inQueue: 5 }, `/health shows what SQLite has (got ${JSON.stringify(health)})`);
  t.equal((await a.req('GET', `/v2/${ep}/status/${ids[0]}`)).json.status, 'IN_QUEUE', '/status too');

  const again = await a.req('POST', `/v2/${ep}/purge-queue`);
  t.equal(again.status, 200);
  t.equal(again.json.removed, 5, `the retried purge ends them (got ${JSON.stringify(again.json)})`);
  t.equal(queuedRows(a, ep), 0, 'in SQLite');

  await a.agent.close();
  a = await startAgent(t, config, { dir });
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 0, 'the restart finds nothing queued');
  const w = await TestWorker.create(a, ep);
  t.equal(await w.take(), null, 'and runs nothing');
});

t.test('a purge whose second slice failed: memory agrees with SQLite on every job, and the retried purge ends the rest', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const n = 3 * PURGE_SLICE_JOBS + 7;
  const jobs = await Promise.all(Array.from({ length: n }, (_, i) => submitOne(a, ep, `{"i":${i}}`)));
  const second = a.agent.db.prepare('SELECT rowid FROM jobs WHERE endpoint_id = ? ORDER BY rowid LIMIT 1 OFFSET ?').pluck().get(ep, PURGE_SLICE_JOBS) as number;
  a.agent.db.exec(`CREATE TEMP TRIGGER purge_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'CANCELLED' AND OLD.rowid >= ${second}
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  const failed = await a.agent.queue.purge(ep).then(() => 'resolved', (err: Error) => err.message);
  t.match(failed, /simulated write failure/);
  a.agent.db.exec('DROP TRIGGER purge_fails');
  t.equal(queuedRows(a, ep), n - PURGE_SLICE_JOBS, 'the first slice is stored, the rest still queued');
  t.equal(a.agent.queue.health(ep).jobs.inQueue, n - PURGE_SLICE_JOBS, 'and queued in memory, the failed slice too');
  const disagree = jobs.filter((j) => a.agent.queue.find(ep, j.id)?.status !== a.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').pluck().get(j.id));
  t.equal(disagree.length, 0, `every job's status in memory is its row's (${disagree.length} differ)`);
  t.equal(await a.agent.queue.purge(ep), n - PURGE_SLICE_JOBS, 'the retried purge ends them all');
  t.equal(queuedRows(a, ep), 0);
});
