/**
 * A /retry whose commit fails (a full disk, an I/O error) is answered 500, and the job must not
 * stay queued in memory while its row still says FAILED: before, a worker took and ran it (its
 * claim and its result were written conditionally on a queued or running row, so neither was
 * stored though the result got a 200), the client's retry of the /retry was refused 409 (the
 * job was queued, in memory), /status showed a result SQLite did not have, and a restart found
 * the job FAILED with its old error. The failure is made with a temporary SQLite trigger, as in
 * failed-commit.test.ts.
 */
import t from 'tap';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

t.test('a /retry whose commit failed leaves the job FAILED: the retried /retry is stored, and its run is kept across a restart', async (t) => {
  const dir = testDataDir(t);
  const config = { takeHoldMs: 100 };
  let a = await startAgent(t, config, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  let w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { error: 'first run failed' })).status, 200);

  a.agent.db.exec(`CREATE TEMP TRIGGER retry_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'IN_QUEUE'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 500, 'not stored: no 200');
  a.agent.db.exec('DROP TRIGGER retry_fails');
  const between = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.match(between, { status: 'FAILED', error: 'first run failed' }, `/status shows what SQLite has (got ${JSON.stringify(between)})`);
  t.equal(await w.take(), null, 'no worker runs a retry that was not stored');
  const health = (await a.req('GET', `/v2/${ep}/health`)).json.jobs;
  t.match(health, { inQueue: 0, failed: 1 }, `counted as it is stored (got ${JSON.stringify(health)})`);

  const again = await a.req('POST', `/v2/${ep}/retry/${id}`);
  t.equal(again.status, 200, `the client's retry of the /retry is accepted (got ${again.status} ${JSON.stringify(again.json)})`);
  t.equal(again.json.status, 'IN_QUEUE');
  t.equal((await w.take())?.id, id, 'the stored retry runs');
  await sleep(200); // its claim is written (CLAIM_SAVE_DELAY_MS)
  const done = await w.done(id, { output: 'second run' });
  t.equal(done.status, 200);
  t.notOk(done.json?.duplicate);
  t.equal(a.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').pluck().get(id), 'COMPLETED', 'the result is in the row');

  const from = a.url;
  await a.agent.close();
  a = await startAgent(t, config, { dir });
  w = w.rebase(from, a.url);
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', output: 'second run' }, 'the restart finds the second run');
  t.equal(await w.take(), null, 'and runs nothing');
});

t.test('a /retry whose commit failed after a parked worker took the job: the worker is told to stop it, the job stays FAILED', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { error: 'first run failed' })).status, 200);

  const parked = w.take(); // parked: handed the job in the /retry's own turn, before its commit
  await sleep(100);
  a.agent.db.exec(`CREATE TEMP TRIGGER retry_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'IN_QUEUE'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 500, 'not stored: no 200');
  a.agent.db.exec('DROP TRIGGER retry_fails');
  t.equal((await parked)?.id, id, 'the parked worker got it before the commit');
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'FAILED');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inProgress, 0, 'not running');
  t.equal(await w.ping([id]), 200);
  t.same(await w.stops(), [id], 'its worker is told to stop it');
  t.equal((await w.done(id, { output: 'unstored run' })).status, 200, 'its late result is discarded');
  t.match((await a.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'FAILED', error: 'first run failed' });
});
