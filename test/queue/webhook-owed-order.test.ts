/**
 * Webhooks owed across a restart go out in the order their jobs ended, as they would have
 * without the restart: the outbox is read by the jobs' end time (then rowid), not by job id
 * (ids sort by creation, so a job that ran long came first).
 */
import t from 'tap';
import { createServer } from 'node:http';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';
import { randomBytes } from 'node:crypto';
import { JobsRepo } from '../../src/store/jobs.js';
import { createSecretBox } from '../../src/core/secret-box.js';
import { testDataDir } from '../helpers/data-dir.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

t.test('webhooks owed at a stop are sent by the next start in the order their jobs ended', async (t) => {
  const state = { status: 503, arrived: [] as string[], refused: 0 };
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      if (state.status === 200) state.arrived.push(JSON.parse(body).id);
      else state.refused++;
      res.statusCode = state.status;
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  const hook = `http://127.0.0.1:${(server.address() as { port: number }).port}/hook`;
  const dir = testDataDir(t);
  const options = { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 };
  const first = await startAgent(t, options, { dir });
  const ep = (await first.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(first, ep);
  const ids: string[] = [];
  for (let i = 0; i < 6; i++) {
    ids.push((await first.req('POST', `/v2/${ep}/run`, { body: { input: { i }, webhook: hook } })).json.id as string);
    await sleep(3); // distinct creation times: ids sort by them
  }
  for (let i = 0; i < ids.length; i++) t.ok(await w.take());
  // They end last submitted first, each in its own millisecond; every first try fails (503).
  const ended = [...ids].reverse();
  for (const id of ended) {
    t.equal((await w.done(id, { output: id })).status, 200);
    await sleep(3);
  }
  // Every first try answered before the stop: one in flight at the stop could be answered 200
  // after it and be sent again by the next start (at least once), out of this order.
  await until('the first tries, refused', async () => state.refused === ids.length);
  await first.agent.queue.durable();
  await first.agent.close();

  const db = new Database(join(dir, 'flashd.db'));
  try {
    t.same(new JobsRepo(db, createSecretBox(randomBytes(32))).webhooksOwed(), ended, 'the outbox is read in the order the jobs ended');
  } finally {
    db.close();
  }

  state.status = 200;
  const second = await startAgent(t, options, { dir });
  await until('every owed webhook delivered', async () => state.arrived.length === ids.length);
  t.same(state.arrived, ended, 'delivered in the order the jobs ended');
  await second.agent.close();
});
