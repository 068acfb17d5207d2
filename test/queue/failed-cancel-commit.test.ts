/**
 * A /cancel whose commit fails (a full disk, an I/O error) is answered 500, and the job must
 * not stay CANCELLED in memory while its row is still queued: before, the client's retry of the
 * cancel got 200 CANCELLED without writing anything, and a restart ran the job it was told was
 * cancelled. The failure is made with a temporary SQLite trigger, as in failed-commit.test.ts.
 */
import t from 'tap';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

t.test('a cancel whose commit failed leaves the job as it was: the retried cancel is stored and a restart keeps it cancelled', async (t) => {
  const dir = testDataDir(t);
  const config = { takeHoldMs: 100 };
  let a = await startAgent(t, config, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  a.agent.db.exec(`CREATE TEMP TRIGGER cancel_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'CANCELLED'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).status, 500, 'not stored: no 200');
  a.agent.db.exec('DROP TRIGGER cancel_fails');
  const between = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(between.status, 'IN_QUEUE', `/status shows what SQLite has (got ${between.status})`);
  const again = await a.req('POST', `/v2/${ep}/cancel/${id}`);
  t.equal(again.status, 200);
  t.equal(again.json.status, 'CANCELLED');
  await a.agent.close();
  a = await startAgent(t, config, { dir });
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'CANCELLED', 'the restart finds it cancelled');
  const w = await TestWorker.create(a, ep);
  t.equal(await w.take(), null, 'and it is never run');
});

t.test('a cancel of a running job whose commit failed leaves it running on its worker until the retried cancel is stored', async (t) => {
  const dir = testDataDir(t);
  const config = { takeHoldMs: 100 };
  let a = await startAgent(t, config, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  a.agent.db.exec(`CREATE TEMP TRIGGER cancel_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'CANCELLED'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).status, 500, 'not stored: no 200');
  a.agent.db.exec('DROP TRIGGER cancel_fails');
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_PROGRESS', 'still running');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inProgress, 1);
  const again = await a.req('POST', `/v2/${ep}/cancel/${id}`);
  t.equal(again.status, 200);
  t.equal(again.json.status, 'CANCELLED');
  t.equal(await w.ping([id]), 200);
  t.same(await w.stops(), [id], 'its worker is told to stop it');
  t.equal((await w.done(id, { output: 'late' })).status, 200, 'a late result is discarded');
  await a.agent.close();
  a = await startAgent(t, config, { dir });
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'CANCELLED', 'the restart finds it cancelled');
});
