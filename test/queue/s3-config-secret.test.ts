/**
 * A job's `s3Config` (its `accessSecret` is a credential) is handed to the worker with the job
 * and kept in the row only while a /retry may still need it: a job that ends COMPLETED or
 * CANCELLED can never be retried, so its row and its record in memory drop it in the commit
 * that ends it (and a restart cannot bring it back). FAILED and TIMED_OUT jobs keep it for
 * /retry, sealed like every row that holds it (s3-config-sealed.test.ts). It is never shown by
 * /status, /stream, a webhook or the log.
 */
import t from 'tap';
import { createServer } from 'node:http';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { createLogger } from '../../src/core/logger.js';
import { openDb } from '../../src/store/index.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';
import { databaseAtVersion } from '../helpers/old-db.js';
import { testDataDir } from '../helpers/data-dir.js';

const SECRET = 'wJalrXUtnFEMI-K7MDENG-bPxRfiCYzz9secret';
const s3Config = { accessId: 'AKIAFLASHDTEST', accessSecret: SECRET, bucketName: 'b', endpointUrl: 'https://s3.example' };

/** The job's row as stored, every column as text (null when there is no row). */
const row = (dir: string, id: string): string | null => {
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  try {
    const r = db.prepare('SELECT * FROM jobs WHERE id = ?').get(id) as Record<string, unknown> | undefined;
    return r === undefined ? null : JSON.stringify(r);
  } finally {
    db.close();
  }
};

async function setup(t: Parameters<typeof startAgent>[0], dir = testDataDir(t)) {
  const a = await startAgent(t, { takeHoldMs: 100, webhookAllowPrivate: true }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  return { a, ep, dir, w: await TestWorker.create(a, ep) };
}

async function hookReceiver(t: Parameters<typeof startAgent>[0]) {
  const bodies: string[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      bodies.push(body);
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  return { bodies, url: `http://127.0.0.1:${(server.address() as { port: number }).port}/hook` };
}

const noSecretShown = async (t: Parameters<typeof startAgent>[0], a: TestAgent, ep: string, id: string) => {
  const status = await a.req('GET', `/v2/${ep}/status/${id}`);
  t.equal(status.status, 200);
  t.notMatch(status.text, SECRET, '/status does not show it');
  t.notMatch((await a.req('GET', `/v2/${ep}/stream/${id}`)).text, SECRET, '/stream does not show it');
  t.notOk(a.logs.some((l) => l.includes(SECRET)), 'the log does not show it');
};

t.test('a COMPLETED job drops its s3Config from its row and from memory; a restart does not bring it back', async (t) => {
  const { a, ep, dir, w } = await setup(t);
  const hook = await hookReceiver(t);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 }, s3Config, webhook: hook.url } })).json.id as string;
  await a.agent.queue.durable();
  t.match(row(dir, id), /"extra":"v1\./, 'kept while the job is queued, sealed');
  const job = await w.take();
  t.same(job?.['s3Config'], s3Config, 'the worker gets it with the job');
  t.equal((await w.done(id, { output: { ok: true } })).status, 200);
  const stored = row(dir, id);
  t.ok(stored, 'the row is there');
  t.notMatch(stored, SECRET, 'gone from the row in the commit that completed the job');
  t.equal(a.agent.queue.live(id)?.extra ?? null, null, 'gone from memory');
  await until('the webhook', async () => hook.bodies.length === 1);
  t.notMatch(hook.bodies[0], SECRET, 'the webhook body does not carry it');
  await noSecretShown(t, a, ep, id);
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 100 }, { dir });
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'COMPLETED');
  await b.agent.queue.durable();
  t.notMatch(row(dir, id), SECRET, 'still gone after a restart');
});

t.test('a /runsync job written once at its end is written without its s3Config', async (t) => {
  const { a, ep, dir, w } = await setup(t);
  const sync = a.req('POST', `/v2/${ep}/runsync`, { body: { input: {}, s3Config } });
  const job = await until('the take', async () => (await w.take()) ?? undefined);
  t.same(job['s3Config'], s3Config);
  t.equal((await w.done(job.id, { output: 2 })).status, 200);
  t.equal((await sync).json.status, 'COMPLETED');
  await a.agent.queue.durable();
  t.ok(row(dir, job.id), 'the row is there');
  t.notMatch(row(dir, job.id), SECRET);
});

t.test('a CANCELLED job drops its s3Config: cancelled queued, cancelled running, purged', async (t) => {
  const { a, ep, dir, w } = await setup(t);
  const run = async () => (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, s3Config } })).json.id as string;
  const running = await run();
  t.equal((await w.take())?.id, running);
  const queued = await run();
  const purged = await run();
  await a.agent.queue.durable();
  for (const id of [running, queued, purged]) t.match(row(dir, id), /"extra":"v1\./, 'kept while active, sealed');
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${running}`)).json.status, 'CANCELLED');
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${queued}`)).json.status, 'CANCELLED');
  t.equal((await a.req('POST', `/v2/${ep}/purge-queue`)).status, 200);
  await a.agent.queue.durable();
  for (const id of [running, queued, purged]) {
    t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'CANCELLED');
    t.ok(row(dir, id), 'the row is there');
    t.notMatch(row(dir, id), SECRET, 'gone from the row');
    t.equal(a.agent.queue.live(id)?.extra ?? null, null, 'gone from memory');
    await noSecretShown(t, a, ep, id);
  }
  t.equal((await a.req('POST', `/v2/${ep}/retry/${running}`)).status, 409, 'a CANCELLED job cannot be retried, so nothing needs it');
});

for (const restart of [false, true]) {
  t.test(`a FAILED job keeps its s3Config and its /retry hands it to the worker again${restart ? ' after a restart' : ''}`, async (t) => {
    const s = await setup(t);
    let { a, w } = s;
    const { ep, dir } = s;
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, s3Config } })).json.id as string;
    t.equal((await w.take())?.id, id);
    t.equal((await w.done(id, { error: 'boom' })).status, 200);
    t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'FAILED');
    t.match(row(dir, id), /"extra":"v1\./, 'a FAILED row keeps it for /retry, sealed');
    if (restart) {
      const from = a.url;
      await a.agent.close();
      a = await startAgent(t, { takeHoldMs: 100 }, { dir });
      w = w.rebase(from, a.url);
    }
    t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
    const again = await w.take();
    t.equal(again?.id, id);
    t.same(again?.['s3Config'], s3Config, 'the retried run gets it');
    t.equal((await w.done(id, { output: 3 })).status, 200);
    t.notMatch(row(dir, id), SECRET, 'and drops it once that run completes');
  });
}

t.test('rows an older flashd ended COMPLETED or CANCELLED lose their s3Config when the database is opened (migration 11)', (t) => {
  const dir = testDataDir(t);
  const old = databaseAtVersion(dir, 10);
  const extra = JSON.stringify({ s3Config });
  const insert = old.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, extra, execution_timeout_ms, ttl_ms, retention_ms, retries, created_at)
    VALUES (?, 'ep', ?, '{}', ?, 600000, 86400000, 1800000, 0, 1000)`);
  const statuses = ['COMPLETED', 'CANCELLED', 'FAILED', 'TIMED_OUT', 'IN_QUEUE', 'IN_PROGRESS'];
  for (const st of statuses) insert.run(st, st, extra);
  old.close();
  const db = openDb({ dataDir: dir, synchronous: 'full', log: createLogger({ level: 'error', sink: { write: () => undefined } }) });
  t.teardown(() => db.close());
  const left = Object.fromEntries((db.prepare('SELECT status, extra FROM jobs').all() as { status: string; extra: string | null }[]).map((r) => [r.status, r.extra]));
  t.same(left, { COMPLETED: null, CANCELLED: null, FAILED: extra, TIMED_OUT: extra, IN_QUEUE: extra, IN_PROGRESS: extra },
    'dropped where no /retry can need it, kept elsewhere');
  t.end();
});
