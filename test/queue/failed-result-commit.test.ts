/**
 * A worker's final result whose commit fails (a full disk, an I/O error) is answered 500, and
 * nothing of it may stay in memory as if stored: the job stays the worker's, IN_PROGRESS, so
 * /status does not show a result SQLite does not have and the worker's retry of the post (the
 * SDKs retry a 5xx) is written, not answered 200 `duplicate` for a result that is nowhere.
 * Before, memory kept the job COMPLETED: the retry got a 200 and the worker stopped retrying,
 * while the row stayed IN_PROGRESS, so a restart ran the job again and the result was lost.
 * The failure is made with a temporary SQLite trigger, as in failed-commit.test.ts.
 */
import t, { type Test } from 'tap';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const failFinish = (a: TestAgent) =>
  a.agent.db.exec(`CREATE TEMP TRIGGER finish_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status IN ('COMPLETED', 'FAILED')
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
const allowFinish = (a: TestAgent) => a.agent.db.exec('DROP TRIGGER finish_fails');
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function scene(t: Test) {
  const dir = testDataDir(t);
  const config = { takeHoldMs: 100 };
  let a = await startAgent(t, config, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  let w = await TestWorker.create(a, ep);
  return {
    ep,
    get a() { return a; },
    get w() { return w; },
    status: async (id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json,
    restart: async () => {
      const from = a.url;
      await a.agent.close();
      a = await startAgent(t, config, { dir });
      w = w.rebase(from, a.url);
    },
  };
}

for (const [name, body, final] of [
  ['a result', { output: { answer: 42 } }, 'COMPLETED'],
  ['an error', { error: 'handler raised' }, 'FAILED'],
] as const) {
  t.test(`${name} whose commit failed stays unposted: the retry is stored, and kept across a restart`, async (t) => {
    const s = await scene(t);
    const id = (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
    t.equal((await s.w.take())?.id, id);
    await sleep(200); // its claim is written (CLAIM_SAVE_DELAY_MS)

    failFinish(s.a);
    t.equal((await s.w.done(id, body)).status, 500, 'not stored: no 200');
    allowFinish(s.a);
    const between = await s.status(id);
    t.equal(between.status, 'IN_PROGRESS', `/status does not show a result SQLite does not have (got ${JSON.stringify(between)})`);
    t.equal((await s.a.req('GET', `/v2/${s.ep}/health`)).json.jobs.inProgress, 1, 'still running on its worker');
    t.equal(await s.w.ping([id]), 200);
    t.same(await s.w.stops(), [], 'the worker is not told to stop it');

    const retry = await s.w.done(id, body);
    t.equal(retry.status, 200);
    t.notOk(retry.json?.duplicate, `the retry is written, not taken for a repeat of a stored post (got ${JSON.stringify(retry.json)})`);
    t.equal((await s.status(id)).status, final);

    await s.restart();
    const after = await s.status(id);
    t.equal(after.status, final, 'the stored result is what a restart finds');
    if (final === 'COMPLETED') t.same(after.output, { answer: 42 });
    else t.equal(after.error, 'handler raised');
    t.equal(await s.w.take(), null, 'and the job is not run again');
    const jobs = (await s.a.req('GET', `/v2/${s.ep}/health`)).json.jobs;
    t.match(jobs, final === 'COMPLETED' ? { completed: 1, failed: 0, inProgress: 0 } : { completed: 0, failed: 1, inProgress: 0 }, 'counted once');
  });
}

t.test('a /runsync result whose commit failed (its row not inserted yet) is stored by the retry', async (t) => {
  const s = await scene(t);
  const reply = s.a.req('POST', `/v2/${s.ep}/runsync?wait=3000`, { body: { input: { n: 2 } } });
  const job = await s.w.take();
  t.ok(job);
  const id = job?.id as string;
  s.a.agent.db.exec(`CREATE TEMP TRIGGER insert_fails BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  t.equal((await s.w.done(id, { output: 'sync' })).status, 500, 'not stored: no 200');
  s.a.agent.db.exec('DROP TRIGGER insert_fails');
  const retry = await s.w.done(id, { output: 'sync' });
  t.equal(retry.status, 200);
  t.notOk(retry.json?.duplicate, `written by the retry (got ${JSON.stringify(retry.json)})`);
  const r = await reply;
  t.equal(r.status, 200);
  t.match(r.json, { id, status: 'COMPLETED', output: 'sync' }, 'the waiting /runsync gets the stored result');
  await s.restart();
  t.match(await s.status(id), { status: 'COMPLETED', output: 'sync' }, 'kept across a restart');
});
