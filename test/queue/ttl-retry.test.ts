/**
 * `/status?ttl=` on a finished job sets how long its result is kept; the job keeps that
 * retention, and a /retry's run uses it for its own result. Memory had it but the row did not,
 * so after a restart the retried run's result was kept for the submit's retention instead.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

for (const restart of [false, true]) {
  t.test(`a ?ttl set on a failed job holds for its retried run${restart ? ' across a restart' : ''}`, async (t) => {
    const clock = new ManualClock();
    const dir = testDataDir(t);
    const config = { takeHoldMs: 100, leaseMs: 3000 };
    let a = await startAgent(t, config, { clock, dir });
    const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
    let w = await TestWorker.create(a, ep);
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
    t.equal((await w.take())?.id, id);
    t.equal((await w.done(id, { error: 'boom' })).status, 200);
    t.equal((await a.req('GET', `/v2/${ep}/status/${id}?ttl=5000`)).json.status, 'FAILED');
    if (restart) {
      const from = a.url;
      await a.agent.close();
      a = await startAgent(t, config, { clock, dir });
      w = w.rebase(from, a.url);
    }
    t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
    t.equal((await w.take())?.id, id);
    t.equal((await w.done(id, { output: 1 })).status, 200);
    clock.advance(4000);
    t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'COMPLETED', 'kept within the ttl');
    clock.advance(2000);
    a.agent.queue.reap();
    a.agent.queue.expire();
    await a.agent.queue.durable();
    t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).status, 404, 'gone once the ttl has passed, not 30 minutes later');
  });
}
