/**
 * A webhook is owed from the commit that finishes its job until the POST gets a 2xx or its
 * tries run out. One still owed at a stop (or a crash) is sent again by the next start; one
 * delivered is not.
 */
import t from 'tap';
import { createServer } from 'node:http';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';
import { ManualClock } from '../../src/core/clock.js';
import { testDataDir } from '../helpers/data-dir.js';

async function receiver(t: Parameters<typeof startAgent>[0]) {
  const state = { status: 503, received: [] as { status: number; body: any }[] };
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      state.received.push({ status: state.status, body: JSON.parse(body) });
      res.statusCode = state.status;
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  return { state, url: `http://127.0.0.1:${(server.address() as { port: number }).port}/hook` };
}

const owed = (dir: string) => {
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  try {
    return db.prepare('SELECT job_id FROM webhook_outbox').pluck().all();
  } finally {
    db.close();
  }
};

async function finishOne(a: TestAgent, hook: string, output: unknown) {
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: hook } })).json.id as string;
  await w.take();
  t.equal((await w.done(id, { output })).status, 200);
  return id;
}

t.test('a webhook still owed at a stop is delivered by the next start, once', async (t) => {
  const hook = await receiver(t);
  const dir = testDataDir(t);
  // The first try fails and the next one is a minute away when the server stops.
  const first = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir });
  const id = await finishOne(first, hook.url, { n: 1 });
  await until('the first try', async () => hook.state.received.length === 1);
  await first.agent.close();
  t.same(owed(dir), [id], 'owed across the stop');
  hook.state.status = 200;
  const second = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir });
  await until('the delivery after the restart', async () => hook.state.received.length === 2);
  t.match(hook.state.received[1], { status: 200, body: { id, status: 'COMPLETED', output: { n: 1 } } });
  t.ok(second.logs.some((l) => l.includes('webhooks owed by the previous run sent again')));
  await until('settled', async () => (await second.agent.queue.durable(), owed(dir).length === 0));
  await second.agent.close();
  await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true }, { dir });
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.equal(hook.state.received.length, 2, 'a delivered webhook is not sent again');
});

const jobRows = (dir: string, id: string) => {
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  try {
    return db.prepare('SELECT count(*) FROM jobs WHERE id = ?').pluck().get(id);
  } finally {
    db.close();
  }
};

t.test('a result that expires while its webhook is owed is kept for it: a restart still sends it', async (t) => {
  const hook = await receiver(t);
  const dir = testDataDir(t);
  const clock = new ManualClock();
  const first = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir, clock });
  const id = await finishOne(first, hook.url, { n: 2 });
  await until('the first try', async () => hook.state.received.length === 1);
  clock.advance(31 * 60_000); // past the 30 min retention of a /run result
  first.agent.queue.expire();
  await first.agent.queue.durable();
  t.equal(jobRows(dir, id), 1, 'the expired row stays while its webhook is owed');
  await first.agent.close();
  hook.state.status = 200;
  const second = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir, clock: new ManualClock(clock.now()) });
  await until('the delivery after the restart', async () => hook.state.received.length === 2);
  t.match(hook.state.received[1], { status: 200, body: { id, status: 'COMPLETED', output: { n: 2 } } });
  await until('settled', async () => (await second.agent.queue.durable(), owed(dir).length === 0));
  second.agent.queue.expire();
  await second.agent.queue.durable();
  t.equal(jobRows(dir, id), 0, 'delivered, the expired row goes');
});

t.test('a result kept past its expiry for its webhook leaves /health at its expiry, and only once', async (t) => {
  const hook = await receiver(t);
  const dir = testDataDir(t);
  const clock = new ManualClock();
  const settings = { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 };
  const first = await startAgent(t, settings, { dir, clock });
  const ep = (await first.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(first, ep);
  const health = async (a: TestAgent) => (await a.req('GET', `/v2/${ep}/health`)).json.jobs;
  const id = (await first.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: hook.url } })).json.id as string;
  await w.take();
  await w.done(id, { output: 1 });
  await until('the first try', async () => hook.state.received.length === 1);
  t.match(await health(first), { completed: 1 }, 'kept: counted');
  clock.advance(31 * 60_000); // past the 30 min retention of a /run result
  first.agent.queue.expire();
  await first.agent.queue.durable();
  t.equal((await first.req('GET', `/v2/${ep}/status/${id}`)).status, 404, 'expired: /status says 404');
  t.equal(jobRows(dir, id), 1, 'the row stays while its webhook is owed');
  t.match(await health(first), { completed: 0 }, 'expired: no longer counted, though its row stays for the webhook');
  await first.agent.close();
  hook.state.status = 200;
  const second = await startAgent(t, settings, { dir, clock: new ManualClock(clock.now()) });
  t.match(await health(second), { completed: 0 }, 'still not counted after a restart');
  await until('the delivery after the restart', async () => hook.state.received.length === 2);
  await until('settled', async () => (await second.agent.queue.durable(), owed(dir).length === 0));
  second.agent.queue.expire();
  await second.agent.queue.durable();
  t.equal(jobRows(dir, id), 0, 'delivered, the expired row goes');
  t.same(await health(second), { completed: 0, failed: 0, inProgress: 0, inQueue: 0, retried: 0 }, 'its deletion takes nothing more off the counts');
});

t.test('a webhook whose tries ran out is no longer owed', async (t) => {
  const hook = await receiver(t);
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 10 });
  await finishOne(a, hook.url, 1);
  await until('three tries', async () => hook.state.received.length === 3);
  await until('settled', async () => (await a.agent.queue.durable(), owed(a.dir).length === 0));
  t.pass('three tries, then settled');
});

t.test("a retried job's webhook stays owed when the first run's delivery ends after it started", async (t) => {
  let firstAnswered = false;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      if (JSON.parse(body).status === 'FAILED') {
        // The first run's delivery is slow; it succeeds once the retried run has finished.
        setTimeout(() => {
          res.end();
          firstAnswered = true;
        }, 800);
      } else {
        res.statusCode = 503; // the retried run's delivery waits for its next try
        res.end();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  const hook = `http://127.0.0.1:${(server.address() as { port: number }).port}/hook`;
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: hook } })).json.id as string;
  await w.take();
  await w.done(id, { error: 'first run fails' });
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { output: 'second run' })).status, 200);
  await until('the first delivery to end', async () => firstAnswered);
  await new Promise((resolve) => setTimeout(resolve, 100));
  await a.agent.queue.durable();
  t.same(owed(a.dir), [id], 'still owed: the retried run has not been delivered');
});

t.test("a /retry drops the first run's tries still to come: the receiver's last word is the new run's", async (t) => {
  const received: { code: number; status: string }[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      // The first delivery fails, so the first run's next try is due after the retried run ends.
      res.statusCode = received.length === 0 ? 503 : 200;
      received.push({ code: res.statusCode, status: JSON.parse(body).status });
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  const hook = `http://127.0.0.1:${(server.address() as { port: number }).port}/hook`;
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: hook } })).json.id as string;
  await w.take();
  await w.done(id, { error: 'first run fails' });
  await until('the first try', async () => received.length === 1);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { output: 'second run' })).status, 200);
  await until('the second run delivered', async () => received.length === 2);
  // Past the first run's next try.
  await new Promise((resolve) => setTimeout(resolve, 1500));
  t.same(received, [{ code: 503, status: 'FAILED' }, { code: 200, status: 'COMPLETED' }], 'no FAILED after the COMPLETED');
  await until('settled', async () => (await a.agent.queue.durable(), owed(a.dir).length === 0));
});

t.test('the tries made survive a restart: the next start goes on at the next try, 3 tries in all', async (t) => {
  const hook = await receiver(t);
  hook.state.status = 500;
  const dir = testDataDir(t);
  const slow = { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 };
  // Try 1 fails; the stop comes while the next one is a minute away.
  const first = await startAgent(t, slow, { dir });
  const id = await finishOne(first, hook.url, { n: 3 });
  await until('try 1 failed', async () => failedTries(first) === 1);
  await first.agent.queue.durable();
  await first.agent.close();
  // Try 2 after the restart, then another stop.
  const second = await startAgent(t, slow, { dir });
  await until('try 2 failed', async () => failedTries(second) === 1);
  await second.agent.queue.durable();
  await second.agent.close();
  t.equal(hook.state.received.length, 2, 'one POST per start so far');
  t.match(second.logs.join('\n'), /webhook try failed, trying again.*attempt[=":]+2\b/, 'the restart went on at try 2');
  // Try 3 is the last.
  const third = await startAgent(t, { ...slow, webhookRetryDelayMs: 10 }, { dir });
  await until('try 3', async () => hook.state.received.length >= 3);
  await until('settled', async () => (await third.agent.queue.durable(), owed(dir).length === 0));
  t.ok(third.logs.some((l) => l.includes('webhook gave up') && /attempts[=":]+3\b/.test(l)), 'gave up after try 3');
  await third.agent.close();
  await startAgent(t, slow, { dir });
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.equal(hook.state.received.length, 3, 'three POSTs in all, across two restarts');
  t.ok(hook.state.received.every((r) => r.body.id === id));
});

t.test('an owed webhook whose tries are all used is not sent again, and is owed no more', async (t) => {
  const hook = await receiver(t);
  hook.state.status = 500;
  const dir = testDataDir(t);
  const slow = { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 };
  const first = await startAgent(t, slow, { dir });
  const id = await finishOne(first, hook.url, { n: 4 });
  await until('try 1', async () => hook.state.received.length === 1);
  await first.agent.close();
  // As if every try had been made (a flashd configured for fewer, or a crash before the outbox row went).
  const db = new Database(join(dir, 'flashd.db'));
  db.prepare('UPDATE webhook_outbox SET tries = 3 WHERE job_id = ?').run(id);
  db.close();
  const second = await startAgent(t, slow, { dir });
  await until('settled', async () => (await second.agent.queue.durable(), owed(dir).length === 0));
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.equal(hook.state.received.length, 1, 'not sent again');
  t.ok(second.logs.some((l) => l.includes('webhook gave up') && /attempts[=":]+3\b/.test(l)), 'the start says it gave up');
});

t.test("a retried job's new delivery starts at try 1 again, whatever the first run's delivery had used", async (t) => {
  const hook = await receiver(t);
  hook.state.status = 500;
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 500, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: hook.url } })).json.id as string;
  await w.take();
  await w.done(id, { error: 'first run fails' });
  await until('try 1 of the first run', async () => hook.state.received.length === 1);
  await until('recorded', async () => (await a.agent.queue.durable(), triesOf(dir, id) === 1));
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { output: 'second run' })).status, 200);
  await a.agent.queue.durable();
  t.equal(triesOf(dir, id), 0, 'the new run owes a webhook with no tries made');
});

const failedTries = (a: TestAgent) => a.logs.filter((l) => l.includes('webhook try failed, trying again')).length;

function triesOf(dir: string, id: string): number | undefined {
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  try {
    return db.prepare('SELECT tries FROM webhook_outbox WHERE job_id = ?').pluck().get(id) as number | undefined;
  } finally {
    db.close();
  }
}
