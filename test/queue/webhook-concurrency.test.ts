/**
 * Webhook deliveries in flight are bounded: 64 in all and 32 per destination (host and port),
 * the rest waiting their turn in the order their jobs ended. A purge of thousands of queued jobs
 * with webhooks, or a restart owing thousands, never opens a connection per job at once. Every
 * webhook still arrives once; a stop with deliveries waiting leaves them owed, and the next
 * start sends them.
 */
import t from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { until } from '../helpers/wait.js';
import { webhookReceiver } from '../helpers/webhook-receiver.js';
import { ManualClock } from '../../src/core/clock.js';
import { testDataDir } from '../helpers/data-dir.js';

/** Open connections now, across every receiver. */
const open = { now: 0, max: 0 };

const submit = (a: TestAgent, ep: string, webhook: string, i: number, ttlMs = 86_400_000) =>
  a.agent.queue.submit({
    endpointId: ep, input: `{"i":${i}}`, extra: null, webhook, executionTimeoutMs: 600_000, ttlMs, lowPriority: false, retentionMs: 600_000,
  });

const owed = (dir: string) => {
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  try {
    return (db.prepare('SELECT job_id FROM webhook_outbox').pluck().all() as string[]).sort();
  } finally {
    db.close();
  }
};

const endpoint = async (a: TestAgent) => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;

t.test('a purge of queued jobs with webhooks: at most 32 deliveries per receiver and 64 in all at once, each arriving once', async (t) => {
  open.now = open.max = 0;
  const hooks = [await webhookReceiver(t, { holdMs: 150, counter: open }), await webhookReceiver(t, { holdMs: 150, counter: open }), await webhookReceiver(t, { holdMs: 150, counter: open })];
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true });
  const ep = await endpoint(a);
  const PER = 80;
  const ids: string[][] = [[], [], []];
  for (let i = 0; i < PER; i++) {
    for (const [h, hook] of hooks.entries()) ids[h]!.push((await submit(a, ep, hook.url, h * PER + i)).id);
  }
  const purged = await a.req('POST', `/v2/${ep}/purge-queue`);
  t.equal(purged.status, 200, purged.text);
  t.equal(purged.json.removed, 3 * PER);
  await until('every webhook', async () => hooks.every((h) => h.state.ids.length >= PER), 30_000);
  await until('settled', async () => (await a.agent.queue.durable(), owed(a.dir).length === 0));
  for (const [h, hook] of hooks.entries()) {
    t.ok(hook.state.max <= 32, `receiver ${h}: at most 32 connections at once (${hook.state.max})`);
    t.same([...hook.state.ids].sort(), [...ids[h]!].sort(), `receiver ${h}: each of its jobs once`);
    const one = hook.state.bodies.get(ids[h]![5]!);
    t.match(one, { id: ids[h]![5], status: 'CANCELLED', input: { i: h * PER + 5 }, webhook: hook.url }, 'the body is built when its turn comes');
  }
  t.ok(open.max <= 64, `at most 64 connections at once in all (${open.max})`);
  t.ok(open.max >= 60, `the bound is used: ${open.max} at once`);
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.equal(hooks.reduce((n, h) => n + h.state.ids.length, 0), 3 * PER, 'nothing sent twice');
});

t.test('a stop with deliveries waiting leaves them owed; the next start sends them, within the bound', async (t) => {
  open.now = open.max = 0;
  const hook = await webhookReceiver(t, { holdMs: 20, counter: open });
  hook.state.held = true;
  const dir = testDataDir(t);
  const first = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true }, { dir });
  const ep = await endpoint(first);
  const ids: string[] = [];
  for (let i = 0; i < 100; i++) ids.push((await submit(first, ep, hook.url, i)).id);
  t.equal((await first.req('POST', `/v2/${ep}/purge-queue`)).json.removed, 100);
  await until('32 deliveries held by the receiver', async () => hook.state.waiting.length === 32);
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.equal(hook.state.waiting.length, 32, 'the other 68 wait their turn');
  t.equal(hook.state.max, 32);
  await first.agent.close();
  t.same(owed(dir), [...ids].sort(), 'all 100 owed across the stop');
  // The tries in flight at the stop end now; their answers come after it, so they stay owed.
  hook.release();
  await until('the held answers', async () => hook.state.ids.length === 32);
  hook.state.max = 0;
  const second = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true }, { dir });
  await until('the owed webhooks after the restart', async () => hook.state.ids.length === 132, 30_000);
  await until('settled', async () => (await second.agent.queue.durable(), owed(dir).length === 0));
  const again = hook.state.ids.slice(32);
  t.same([...again].sort(), [...ids].sort(), 'each owed webhook sent once by the restart');
  t.ok(hook.state.max <= 32, `at most 32 at once after the restart (${hook.state.max})`);
  t.ok(second.logs.some((l) => l.includes('webhooks owed by the previous run sent again')));
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.equal(hook.state.ids.length, 132, 'nothing more');
});

t.test('a /retry drops a delivery still waiting its turn: the old final status is never sent', async (t) => {
  const hook = await webhookReceiver(t, { holdMs: 20, counter: open });
  hook.state.held = true;
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true }, { clock });
  const ep = await endpoint(a);
  const ids: string[] = [];
  for (let i = 0; i < 40; i++) ids.push((await submit(a, ep, hook.url, i, 10_000)).id);
  // Their TTL passes in the queue: 40 TIMED_OUT jobs, which /retry accepts.
  clock.advance(11_000);
  a.agent.queue.reap();
  await until('32 deliveries held by the receiver', async () => hook.state.waiting.length === 32);
  const last = ids.find((id) => !hook.state.arrived.has(id)) as string;
  const retried = await a.req('POST', `/v2/${ep}/retry/${last}`);
  t.equal(retried.status, 200, retried.text);
  hook.release();
  await until('the other webhooks', async () => hook.state.ids.length === 39);
  await until('settled', async () => (await a.agent.queue.durable(), owed(a.dir).length === 0));
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.same([...hook.state.ids].sort(), ids.filter((id) => id !== last).sort(), 'each once, the retried job\'s TIMED_OUT not at all');
  t.equal((await a.req('GET', `/v2/${ep}/status/${last}`)).json.status, 'IN_QUEUE', 'it runs again; its new final status will have its own webhook');
});
