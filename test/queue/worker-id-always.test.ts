/**
 * runpod/flash's client reads every /runsync reply and every final /status into
 * `JobOutput(**response)`, whose `workerId: str` is required (pydantic fails on a missing or null
 * one). /status, /status-sync, /runsync and the webhook body always carry `workerId`: `""` while
 * no worker has run the job (still queued, cancelled, purged or expired in the queue), the
 * worker's id once one has.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { webhookReceiver } from '../helpers/webhook-receiver.js';

t.test('a job no worker ran shows workerId ""', async (t) => {
  const clock = new ManualClock();
  const hook = await webhookReceiver(t);
  const a = await startAgent(t, { takeHoldMs: 100, webhookAllowPrivate: true }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;

  // /runsync whose wait ends with the job still queued (the manual clock does not move the wait's
  // timer, which is real).
  const sync = await a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { n: 1 } } });
  t.equal(sync.status, 200);
  t.same(Object.keys(sync.json).sort(), ['delayTime', 'executionTime', 'id', 'status', 'workerId'], sync.text);
  t.match(sync.json, { status: 'IN_QUEUE', workerId: '' });
  t.match((await a.req('GET', `/v2/${ep}/status/${sync.json.id}`)).json, { status: 'IN_QUEUE', workerId: '' }, '/status of a queued job');

  // Cancelled before a worker took it, with a webhook.
  const c = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 }, webhook: hook.url } })).json.id as string;
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${c}`)).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${c}`)).json, { status: 'CANCELLED', workerId: '' }, '/status of a cancelled job');
  t.match((await a.req('GET', `/v2/${ep}/status-sync/${c}`)).json, { status: 'CANCELLED', workerId: '' }, '/status-sync');
  for (let i = 0; i < 100 && !hook.state.bodies.has(c); i++) await new Promise((r) => setTimeout(r, 20));
  t.match(hook.state.bodies.get(c), { id: c, status: 'CANCELLED', workerId: '', input: { n: 2 } }, 'the webhook body');

  // Purged.
  const p = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 3 } } })).json.id as string;
  t.equal((await a.req('POST', `/v2/${ep}/purge-queue`)).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${p}`)).json, { status: 'CANCELLED', workerId: '' }, '/status of a purged job');

  // TIMED_OUT in the queue (policy.ttl).
  const x = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 4 }, policy: { ttl: 10_000 } } })).json.id as string;
  clock.advance(11_000);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.match((await a.req('GET', `/v2/${ep}/status/${x}`)).json, { status: 'TIMED_OUT', workerId: '' }, '/status of a job expired in the queue');

  // A job a worker ran keeps its id, also after a /retry ran it again.
  const w = await TestWorker.create(a, ep);
  const r = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 5 } } })).json.id as string;
  t.equal((await w.take())?.id, r);
  t.match((await a.req('GET', `/v2/${ep}/status/${r}`)).json, { status: 'IN_PROGRESS', workerId: w.workerId });
  t.equal((await w.done(r, { output: 5 })).status, 200);
  t.match((await a.req('GET', `/v2/${ep}/status/${r}`)).json, { status: 'COMPLETED', workerId: w.workerId, output: 5 });
});
