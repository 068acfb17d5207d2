/**
 * A stream chunk posted while its endpoint is being deleted leaves no chunk row and no memory
 * behind.
 */
import t from 'tap';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

t.test('chunks posted as the endpoint is deleted do not outlive its jobs', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  const q = a.agent.queue;
  const posted = q.stream(ep, w.workerId, id, { output: 'late chunk' });
  // The endpoint goes in the same turn (any turn before that commit would do).
  q.dropEndpoint(ep);
  t.equal(await posted, 'accepted', 'the post is acknowledged');
  await q.durable();
  const db = a.agent.db;
  t.equal(db.prepare('SELECT count(*) FROM jobs WHERE id = ?').pluck().get(id), 0, 'the job row is gone');
  t.equal(db.prepare('SELECT count(*) FROM job_chunks WHERE job_id = ?').pluck().get(id), 0, 'and so are its chunks');
});
