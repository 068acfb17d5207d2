/**
 * Deleting an endpoint looks up its jobs still owed a webhook (JobsRepo.webhooksOwedOf) from
 * the outbox, each job by its key: never a walk of the whole jobs table, which has no index by
 * endpoint, inside the DELETE request (1M rows of other endpoints: ~330 ms of the event loop).
 * Nor is the rowid range the deletion works in found by a walk (min and max of rowid in one
 * SELECT are; 500k rows: ~55 ms). Checked on the statements the running server prepared, by
 * SQLite's own query plan.
 */
import t from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody } from '../helpers/agent.js';

// Every statement the server prepares, as text (better-sqlite3 itself; nothing of flashd is replaced).
const prepared = new Set<string>();
const prepare = Database.prototype.prepare;
Database.prototype.prepare = function (this: Database.Database, source: string) {
  prepared.add(source);
  return prepare.call(this, source);
} as typeof prepare;
t.teardown(() => void (Database.prototype.prepare = prepare));

t.test('deleting an endpoint reads no row of the jobs table but those owed a webhook', async (t) => {
  const a = await startAgent(t, { webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 });
  const gone = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const job = await a.req('POST', `/v2/${gone}/run`, { body: { input: { n: 1 }, webhook: 'http://127.0.0.1:1/hook' } });
  t.equal(job.status, 200, job.text);
  // Ended, its webhook's first try refused and the next a minute away: owed when the endpoint goes.
  t.equal((await a.req('POST', `/v2/${gone}/purge-queue`)).json.removed, 1);
  await a.agent.queue.durable();
  const deleted = await a.req('DELETE', `/v2/serverless/${gone}`);
  t.equal(deleted.status, 204, deleted.text);
  await a.agent.queue.durable();

  const db = new Database(join(a.dir, 'flashd.db'), { readonly: true });
  t.teardown(() => db.close());
  t.equal(db.prepare('SELECT status FROM jobs WHERE id = ?').pluck().get(job.json.id), 'CANCELLED', 'the deleted endpoint\'s job owed a webhook keeps its row for it');
  const joins = [...prepared].filter((sql) => /webhook_outbox/.test(sql) && /JOIN jobs/.test(sql));
  t.ok(joins.length >= 2, 'the outbox reads joined to jobs were prepared');
  for (const sql of joins) {
    const params = (sql.match(/\?/g) ?? []).map(() => 'x');
    const plan = (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...params) as { detail: string }[]).map((p) => p.detail);
    t.notOk(plan.some((d) => /^SCAN (j|jobs)\b/.test(d)), `no walk of jobs: ${sql.replace(/\s+/g, ' ')} -> ${plan.join('; ')}`);
  }
});

t.test('deleting an endpoint finds the rowid range of jobs at both ends of the table, not by a walk of it', async (t) => {
  const a = await startAgent(t);
  const gone = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  t.equal((await a.req('POST', `/v2/${gone}/run`, { body: { input: { n: 1 } } })).status, 200);
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  await a.agent.queue.durable();

  const db = new Database(join(a.dir, 'flashd.db'), { readonly: true });
  t.teardown(() => db.close());
  // min(rowid) and max(rowid) in one SELECT: SQLite walks every row (500k rows: ~55 ms in the DELETE request).
  const ranges = [...prepared].filter((sql) => /min\(rowid\)/i.test(sql) && /max\(rowid\)/i.test(sql) && /FROM jobs/.test(sql));
  t.equal(ranges.length, 1, 'the rowid range read was prepared');
  for (const sql of ranges) {
    const plan = (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all() as { detail: string }[]).map((p) => p.detail);
    t.notOk(plan.some((d) => /^SCAN (jobs)\b/.test(d)), `no walk of jobs: ${sql} -> ${plan.join('; ')}`);
  }
});
