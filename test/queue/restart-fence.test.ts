/**
 * A job whose lease lapsed is fenced from the worker that lost it (it may still run the old
 * attempt). The fence lives in memory: after a restart the job came back queued and unfenced,
 * so that worker could take it again and its old run's late result completed the new attempt.
 * A ping that lists a queued job its worker does not hold now fences it again.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

t.test("after a restart, a worker still running a requeued job's old attempt is not handed it again", async (t) => {
  const clock = new ManualClock();
  const dir = t.testdir();
  const config = { takeHoldMs: 100, leaseMs: 3000 };
  let a = await startAgent(t, config, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  let w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, id);
  clock.advance(3001);
  a.agent.queue.reap();
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the lease lapsed: requeued');
  t.equal(await w.ping([id]), 200);
  t.equal(await w.take(), null, 'fenced from the worker that still runs it');

  const from = a.url;
  await a.agent.close();
  a = await startAgent(t, config, { clock, dir });
  w = w.rebase(from, a.url);
  t.equal(await w.ping([id]), 200, 'its heartbeat still lists the job');
  t.equal(await w.take(), null, 'not handed back to it after the restart either');
  t.same(await w.stops(), [id], 'and it is told to stop the old run');
  const late = await w.done(id, { output: 'old run' });
  t.equal(late.status, 409, "the old run's late result is refused");
  const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'IN_QUEUE', 'the job waits for its next attempt');
  t.notOk('output' in s, 'no output recorded from the old run');

  // Once it let go (its result came back refused), the job may go to it again.
  t.equal(await w.ping([]), 200);
  t.equal((await w.take())?.id, id, 'it may take the next attempt once it dropped the old one');
});
