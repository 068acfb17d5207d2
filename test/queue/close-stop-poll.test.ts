/**
 * A clean stop answers a parked job-stop poll with its 204 at once instead of sitting out the
 * HTTP server's close grace.
 */
import t from 'tap';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

t.test('a clean stop answers a parked job-stop poll and does not sit out the grace', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 60_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const stops = w.stops().then((ids) => ({ ids }), (err: Error) => ({ err: String(err.cause ?? err) }));
  await new Promise((resolve) => setTimeout(resolve, 100));
  const started = Date.now();
  await a.agent.close();
  const took = Date.now() - started;
  t.ok(took < 2500, `close took ${took} ms, not the 3 s grace`);
  t.same(await stops, { ids: [] }, 'the parked job-stop poll got its 204');
});
