/**
 * Execution timeouts fire at their deadline, on the real clock: not at the periodic reap, which
 * runs once a second, so a job could run up to a second past its timeout (and a result posted
 * then completed it).
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';

const TIMEOUT_MS = 5000;
// Late by more than this is the periodic reap's doing (it runs every 1000 ms with this lease).
const SLACK_MS = 150;

t.test('jobs started a quarter second apart each time out at their own deadline', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 60_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  // Spread over one reap period: with a once-a-second reaper at most one of them is on time.
  const ids: string[] = [];
  for (let i = 0; i < 4; i++) {
    const w = await TestWorker.create(a, ep);
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { i }, policy: { executionTimeout: TIMEOUT_MS } } })).json.id as string;
    t.equal((await w.take())?.id, id);
    ids.push(id);
    await new Promise((r) => setTimeout(r, 250));
  }
  const ended: Record<string, { status: string; executionTime: number }> = {};
  await until('every job ended', async () => {
    for (const id of ids) {
      if (ended[id]) continue;
      const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
      if (s.status !== 'IN_PROGRESS') ended[id] = s;
    }
    return Object.keys(ended).length === ids.length;
  }, 15_000);
  for (const id of ids) {
    t.equal(ended[id]?.status, 'TIMED_OUT', id);
    t.ok((ended[id]?.executionTime ?? 0) >= TIMEOUT_MS, `not before its timeout (${ended[id]?.executionTime} ms)`);
    t.ok((ended[id]?.executionTime ?? Infinity) <= TIMEOUT_MS + SLACK_MS, `at its deadline: ${ended[id]?.executionTime} ms for a ${TIMEOUT_MS} ms timeout`);
  }
});

t.test('a deadline that passed while flashd was down ends the job at the deadline, not at the restart', async (t) => {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const config = { takeHoldMs: 100, leaseMs: 60_000 };
  let a = await startAgent(t, config, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const running = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { executionTimeout: 5000 } } })).json.id as string;
  t.equal((await w.take())?.id, running);
  const queued = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { ttl: 10_000 } } })).json.id as string;
  clock.advance(1000);
  await a.agent.close();
  clock.advance(60_000); // flashd is down well past both deadlines
  a = await startAgent(t, config, { clock, dir });
  a.agent.queue.reap();
  await a.agent.queue.durable();
  const r = (await a.req('GET', `/v2/${ep}/status/${running}`)).json;
  t.match(r, { status: 'TIMED_OUT', executionTime: 5000 }, `executionTime is the timeout, not the downtime (${r.executionTime} ms)`);
  const q = (await a.req('GET', `/v2/${ep}/status/${queued}`)).json;
  t.match(q, { status: 'TIMED_OUT', delayTime: 10_000 }, `delayTime is the ttl, not the downtime (${q.delayTime} ms)`);
});

t.test('a job put back after its worker was lost that then expires in the queue says so, not "before a worker took it"', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 100, leaseMs: 3000 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const never = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { ttl: 10_000 } } })).json.id as string;
  t.equal((await w.take())?.id, never, 'taken once');
  const queued = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { ttl: 10_000 } } })).json.id as string;
  clock.advance(4000); // past the lease: the first job goes back to the queue
  a.agent.queue.reap();
  t.equal((await a.req('GET', `/v2/${ep}/status/${never}`)).json.status, 'IN_QUEUE', 'requeued');
  clock.advance(7000); // past both TTLs, no worker taking
  a.agent.queue.reap();
  await a.agent.queue.durable();
  const lost = (await a.req('GET', `/v2/${ep}/status/${never}`)).json;
  t.match(lost, { status: 'TIMED_OUT', error: 'Job expired in the queue (policy.ttl) while waiting to run again, after its worker was lost.' });
  const plain = (await a.req('GET', `/v2/${ep}/status/${queued}`)).json;
  t.match(plain, { status: 'TIMED_OUT', error: 'Job expired in the queue before a worker took it (policy.ttl).' });
});
