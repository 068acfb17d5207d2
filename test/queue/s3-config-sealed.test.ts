/**
 * A job's `s3Config` (its `accessSecret` is a credential) stays in its row while the job is
 * queued or running, and for FAILED and TIMED_OUT jobs until their result expires (a /retry
 * needs it). It was stored there in plain text, so a copy of flashd.db alone (a backup, a disk
 * image without secret.key) revealed it. The row now holds it sealed with `<data-dir>/secret.key`
 * (as registry passwords are); the worker still gets the plain value with the job, after a
 * restart and after a /retry too. Rows an older flashd wrote are sealed by the next start.
 */
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { databaseAtVersion } from '../helpers/old-db.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

const SECRET = 'wJalrXUtnFEMI-K7MDENG-bPxRfiCYzz9sealed';
const ACCESS_ID = 'AKIAFLASHDSEALTEST';
const s3Config = { accessId: ACCESS_ID, accessSecret: SECRET, bucketName: 'b', endpointUrl: 'https://s3.example' };

/** Whether the secret's bytes are anywhere in the database files (the database and its WAL). */
const atRest = (dir: string): string[] => ['flashd.db', 'flashd.db-wal']
  .filter((f) => existsSync(join(dir, f)) && readFileSync(join(dir, f)).includes(Buffer.from(SECRET)));

/** The job's `extra` column as stored. */
const extraOf = (dir: string, id: string): string | null => {
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  try {
    return (db.prepare('SELECT extra FROM jobs WHERE id = ?').pluck().get(id) as string | null | undefined) ?? null;
  } finally {
    db.close();
  }
};

type T = Parameters<typeof startAgent>[0];

/**
 * Puts another secret.key beside the database, as one from before the database kept a check of
 * its key allowed (a start now refuses a key that does not match the check): the check goes too.
 */
const replaceKey = (dir: string): void => {
  writeFileSync(join(dir, 'secret.key'), randomBytes(32).toString('base64'));
  const db = new Database(join(dir, 'flashd.db'));
  db.prepare("DELETE FROM settings WHERE key = 'secret_key.check'").run();
  db.close();
};

const sealed = (t: T, dir: string, id: string, when: string) => {
  t.same(atRest(dir), [], `${when}: the secret is not in flashd.db or its WAL`);
  const extra = extraOf(dir, id);
  t.match(extra, /^v1\./, `${when}: the row holds the s3Config sealed`);
  t.notMatch(extra, ACCESS_ID, `${when}: nothing of it in clear`);
};

async function setup(t: T, dir = testDataDir(t)) {
  const a = await startAgent(t, { takeHoldMs: 100 }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  return { a, ep, dir, w: await TestWorker.create(a, ep) };
}

t.test('queued, running and FAILED rows hold the s3Config sealed; the worker gets it plain, also after a restart and a /retry', async (t) => {
  const { a, ep, dir, w } = await setup(t);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 }, s3Config } })).json.id as string;
  await a.agent.queue.durable();
  sealed(t, dir, id, 'queued');
  const job = await w.take();
  t.equal(job?.id, id);
  t.same(job?.['s3Config'], s3Config, 'the worker gets the plain s3Config in the job-take body');
  await a.agent.queue.durable();
  sealed(t, dir, id, 'running');
  t.equal((await w.done(id, { error: 'boom' })).status, 200);
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'FAILED');
  sealed(t, dir, id, 'FAILED');
  const from = a.url;
  await a.agent.close();
  sealed(t, dir, id, 'FAILED, flashd stopped');

  const b = await startAgent(t, { takeHoldMs: 100 }, { dir });
  const w2 = w.rebase(from, b.url);
  t.equal((await b.req('POST', `/v2/${ep}/retry/${id}`)).status, 200);
  const again = await w2.take();
  t.equal(again?.id, id);
  t.same(again?.['s3Config'], s3Config, '/retry after a restart hands the plain s3Config to the worker again');
  await b.agent.queue.durable();
  sealed(t, dir, id, 'retried');
});

t.test('a job queued before a restart is handed to the worker with its s3Config', async (t) => {
  const { a, ep, dir, w } = await setup(t);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, s3Config } })).json.id as string;
  const plain = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  const from = a.url;
  await a.agent.close();
  sealed(t, dir, id, 'queued, flashd stopped');
  t.equal(extraOf(dir, plain), null, 'a job without s3Config has no extra at all');
  const b = await startAgent(t, { takeHoldMs: 100 }, { dir });
  const w2 = w.rebase(from, b.url);
  const job = await w2.take();
  t.equal(job?.id, id);
  t.same(job?.['s3Config'], s3Config, 'recovered with it');
  const next = await w2.take();
  t.equal(next?.id, plain);
  t.notOk(next && 's3Config' in next, 'and the other without');
});

t.test('plain s3Config rows an older flashd wrote are sealed by the next start (migration 14), and still reach the worker', async (t) => {
  const { a, ep, dir, w } = await setup(t);
  const failed = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, s3Config } })).json.id as string;
  t.equal((await w.take())?.id, failed);
  t.equal((await w.done(failed, { error: 'boom' })).status, 200);
  const pending = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, s3Config } })).json.id as string;
  const from = a.url;
  await a.agent.close();
  // What a flashd before this fix left: the extra keys in plain text, schema version 13.
  const old = new Database(join(dir, 'flashd.db'));
  old.prepare('UPDATE jobs SET extra = ? WHERE id IN (?, ?)').run(JSON.stringify({ s3Config }), failed, pending);
  old.pragma('user_version = 13');
  old.close();
  t.same(atRest(dir), ['flashd.db'], 'the older rows hold it in plain text');

  const b = await startAgent(t, { takeHoldMs: 100 }, { dir });
  t.ok(b.logs.some((l) => l.includes('jobs s3Config sealed at rest') && /jobs[=":]+2\b/.test(l)), 'the start says it sealed 2 rows');
  sealed(t, dir, failed, 'FAILED row of an older flashd');
  sealed(t, dir, pending, 'queued row of an older flashd');
  const w2 = w.rebase(from, b.url);
  const job = await w2.take();
  t.equal(job?.id, pending);
  t.same(job?.['s3Config'], s3Config, 'the queued job reaches the worker with it');
  t.equal((await b.req('POST', `/v2/${ep}/retry/${failed}`)).status, 200);
  const retried = await w2.take();
  t.equal(retried?.id, failed);
  t.same(retried?.['s3Config'], s3Config, 'the FAILED one after a /retry too');
  await b.agent.close();
  t.same(atRest(dir), [], 'nothing left in clear after the restart');
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  t.equal(db.prepare("SELECT value FROM settings WHERE key = 'jobs.unsealed_extra'").pluck().get(), undefined, 'the mark is gone: the pass runs once');
  db.close();
});

t.test('an older database with many s3Config rows keeps no copy of them in clear after the upgrade: none in the free space of its pages, also of rows migration 11 cleared', async (t) => {
  const dir = testDataDir(t);
  // Enough rows that the jobs table spans several pages (splits leave copies of old cells behind).
  const old = databaseAtVersion(dir, 10);
  const insert = old.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, extra, execution_timeout_ms, ttl_ms, retention_ms, retries, created_at)
    VALUES (?, 'ep', ?, '{}', ?, 600000, 86400000, 1800000, 0, 1000)`);
  const statuses = ['COMPLETED', 'CANCELLED', 'FAILED', 'TIMED_OUT'];
  for (let i = 0; i < 200; i++) insert.run(`job-${i}`, statuses[i % statuses.length], JSON.stringify({ s3Config }));
  old.pragma('wal_checkpoint(TRUNCATE)');
  old.close();
  t.same(atRest(dir), ['flashd.db'], 'the older database holds it in plain text');
  const a = await startAgent(t, { takeHoldMs: 100 }, { dir });
  t.same(atRest(dir), [], 'after the start: nowhere in flashd.db or its WAL');
  await a.agent.close();
  t.same(atRest(dir), [], 'nor after the stop');
  const db = new Database(join(dir, 'flashd.db'), { readonly: true });
  t.equal(db.prepare("SELECT count(*) FROM jobs WHERE extra GLOB 'v1.*'").pluck().get(), 100, 'the FAILED and TIMED_OUT rows keep it, sealed');
  t.equal(db.prepare("SELECT value FROM settings WHERE key = 'jobs.unsealed_extra'").pluck().get(), undefined, 'the mark is gone: the pass runs once');
  db.close();
});

t.test('a sealed s3Config that no longer opens (secret.key replaced) is logged, and the job goes on without it', async (t) => {
  const { a, ep, dir, w } = await setup(t);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, s3Config } })).json.id as string;
  const from = a.url;
  await a.agent.close();
  replaceKey(dir);
  const b = await startAgent(t, { takeHoldMs: 100 }, { dir });
  t.ok(b.logs.some((l) => l.includes('job s3Config could not be opened') && l.includes(id)), 'logged with the job id');
  const job = await w.rebase(from, b.url).take();
  t.equal(job?.id, id, 'the job still runs');
  t.notOk(job && 's3Config' in job, 'without s3Config');
});

t.test('an owed webhook sent by a start whose secret.key changed opens no s3Config (it never carries one) and logs nothing about it', async (t) => {
  const received: string[] = [];
  let status = 503;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c)).on('end', () => {
      received.push(body);
      res.statusCode = status;
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  const webhook = `http://127.0.0.1:${(server.address() as { port: number }).port}/hook`;
  const dir = testDataDir(t);
  const options = { takeHoldMs: 100, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 };
  const a = await startAgent(t, options, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, s3Config, webhook } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { error: 'boom' })).status, 200, 'FAILED: the row keeps its sealed s3Config for a /retry');
  await until('the first try', async () => received.length === 1);
  await a.agent.close();
  replaceKey(dir);
  status = 200;
  const b = await startAgent(t, options, { dir });
  await until('the owed webhook', async () => received.length === 2);
  t.match(JSON.parse(received[1] as string), { id, status: 'FAILED', error: 'boom' });
  t.notOk(b.logs.some((l) => l.includes('s3Config could not be opened')), 'no warning about an s3Config the webhook does not use');
});
