/**
 * A job that ended before its endpoint was deleted is owed its webhook like any other: a
 * delivery in flight, one waiting its turn (64 in flight, 32 per destination) and one waiting
 * for its next try are all still sent, and so are those a stop left owed. The job's row is kept
 * for the body until its delivery settles, then deleted; nothing else of the endpoint is left.
 */
import t from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { until } from '../helpers/wait.js';
import { webhookReceiver } from '../helpers/webhook-receiver.js';
import { testDataDir } from '../helpers/data-dir.js';

const submit = (a: TestAgent, ep: string, webhook: string, i: number) =>
  a.agent.queue.submit({
    endpointId: ep, input: `{"i":${i}}`, extra: null, webhook, executionTimeoutMs: 600_000, ttlMs: 86_400_000, lowPriority: false, retentionMs: 600_000,
  });

const rows = (dir: string) => {
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  try {
    return {
      owed: db.prepare('SELECT count(*) FROM webhook_outbox').pluck().get() as number,
      jobs: db.prepare('SELECT count(*) FROM jobs').pluck().get() as number,
    };
  } finally {
    db.close();
  }
};

const endpoint = async (a: TestAgent) => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;

t.test('deliveries waiting their turn when the endpoint is deleted are still sent, then the rows go', async (t) => {
  const hook = await webhookReceiver(t);
  hook.state.held = true;
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true });
  const ep = await endpoint(a);
  const ids: string[] = [];
  for (let i = 0; i < 40; i++) ids.push((await submit(a, ep, hook.url, i)).id);
  t.equal((await a.req('POST', `/v2/${ep}/purge-queue`)).json.removed, 40);
  await until('32 deliveries held by the receiver', async () => hook.state.waiting.length === 32);
  const deleted = await a.req('DELETE', `/v2/serverless/${ep}`);
  t.equal(deleted.status, 204, deleted.text);
  await a.agent.queue.durable();
  t.same(rows(a.dir), { owed: 40, jobs: 40 }, 'the rows of the jobs owed a webhook are kept for their bodies');
  hook.release();
  await until('every webhook', async () => hook.state.ids.length === 40);
  t.same([...hook.state.ids].sort(), [...ids].sort(), 'each job that ended before the deletion, once');
  const last = ids[39] as string;
  t.match(hook.state.bodies.get(last), { id: last, status: 'CANCELLED', input: { i: 39 }, webhook: hook.url }, 'a full body, built after the deletion');
  await until('settled', async () => (await a.agent.queue.durable(), rows(a.dir).owed === 0));
  t.same(rows(a.dir), { owed: 0, jobs: 0 }, 'delivered, the deleted endpoint\'s rows go');
  await new Promise((resolve) => setTimeout(resolve, 200));
  t.equal(hook.state.ids.length, 40, 'nothing sent twice');
  t.equal((await a.req('GET', `/v2/${ep}/status/${last}`)).status, 404, 'the endpoint is gone for /status');
});

t.test('webhooks owed when the endpoint is deleted are still sent by the next start', async (t) => {
  const hook = await webhookReceiver(t);
  hook.state.status = 503; // every first try fails; the next is a minute away
  const dir = testDataDir(t);
  const options = { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 };
  const first = await startAgent(t, options, { dir });
  const ep = await endpoint(first);
  const keep = await endpoint(first);
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) ids.push((await submit(first, ep, hook.url, i)).id);
  await submit(first, keep, 'http://127.0.0.1:1/other', 99); // another endpoint's queued job stays
  t.equal((await first.req('POST', `/v2/${ep}/purge-queue`)).json.removed, 3);
  // Each first try answered 503 before the stop: one still in flight at the stop could be
  // answered 200 after it (the receiver switches below) and then be sent again by the next
  // start, as a delivery cut off by a stop is (at least once).
  await until('the first tries, refused', async () => hook.state.arrived.size === 3);
  await first.agent.queue.durable();
  t.equal((await first.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  await first.agent.close();
  t.same(rows(dir), { owed: 3, jobs: 4 }, 'owed across the stop, with their rows');
  hook.state.status = 200;
  const second = await startAgent(t, options, { dir });
  await until('the owed webhooks', async () => hook.state.ids.length === 3);
  t.same([...hook.state.ids].sort(), [...ids].sort());
  t.match(hook.state.bodies.get(ids[0] as string), { id: ids[0], status: 'CANCELLED', input: { i: 0 } });
  await until('settled', async () => (await second.agent.queue.durable(), rows(dir).owed === 0));
  t.same(rows(dir), { owed: 0, jobs: 1 }, 'delivered, the deleted endpoint\'s rows go; the other endpoint\'s job stays');
});
