/**
 * A clean shutdown answers every request it holds: a /runsync still waiting gets its job's id
 * and current status (the job is stored, and goes on after the restart), and a parked
 * job-take gets its empty answer, instead of a connection closed with no reply.
 */
import t from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

t.test('a clean stop answers a waiting /runsync with the id and a parked job-take with 204', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 60_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const busy = await TestWorker.create(a, ep);
  const idle = await TestWorker.create(a, ep);
  const waiting = a.req('POST', `/v2/${ep}/runsync?wait=60000`, { body: { input: { n: 1 } } });
  const job = await busy.take();
  t.ok(job, 'the job runs');
  const parked = idle.take();
  await new Promise((resolve) => setTimeout(resolve, 100));
  await a.agent.close();
  const r = await waiting;
  t.equal(r.status, 200);
  t.match(r.json, { id: job!.id, status: 'IN_PROGRESS' });
  t.equal(await parked, null, 'the parked poll got 204');
  const db = new Database(join(a.dir, 'flashd.db'), { readonly: true });
  t.teardown(() => db.close());
  t.match(db.prepare('SELECT status, worker_id AS workerId FROM jobs WHERE id = ?').get(job!.id), { status: 'IN_PROGRESS', workerId: busy.workerId },
    'the job the caller was told of is stored, with its worker');
});
