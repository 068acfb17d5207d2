/**
 * One turn's /run inserts are written by one multi-row statement per 32 jobs
 * (JobsRepo.insertMany), gathered while nothing else is queued between them. What must hold:
 * every job gets its own row and rowid, in submit order, and a write queued between two
 * submits (here a cancel) still runs between them, so it sees the first insert and not the
 * second.
 */
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { createSecretBox } from '../../src/core/secret-box.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { JobsRepo } from '../../src/store/jobs.js';

const submitOne = (a: TestAgent, ep: string, input: string) =>
  a.agent.queue.submit({
    endpointId: ep, input, extra: null, webhook: null, executionTimeoutMs: 600_000, ttlMs: 86_400_000, lowPriority: false, retentionMs: 600_000,
  });

const rows = (a: TestAgent, ep: string) =>
  a.agent.db.prepare('SELECT rowid, id, status, input FROM jobs WHERE endpoint_id = ? ORDER BY rowid').all(ep) as
    { rowid: number; id: string; status: string; input: string }[];

t.test('a turn of submits: one row each, consecutive rowids in submit order, inputs intact', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const n = 32 * 3 + 5; // three full statements and a short one
  const jobs = await Promise.all(Array.from({ length: n }, (_, i) => submitOne(a, ep, `{"i":${i}}`)));
  const stored = rows(a, ep);
  t.equal(stored.length, n, 'every job has a row');
  t.same(stored.map((r) => r.id), jobs.map((j) => j.id), 'in submit order');
  t.same(stored.map((r) => r.input), jobs.map((_, i) => `{"i":${i}}`), 'each row holds its own input');
  t.same(jobs.map((j) => j.rowid), stored.map((r) => r.rowid), 'each job knows its own rowid');
  t.ok(stored.every((r, i) => i === 0 || r.rowid === (stored[i - 1] as { rowid: number }).rowid + 1), 'rowids are consecutive');
  t.equal(a.agent.queue.health(ep).jobs.inQueue, n);
});

t.test('a write queued between two submits runs between their inserts', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const first = await submitOne(a, ep, '{"n":1}');
  // In one turn: a submit, the purge of everything queued (it writes), and another submit.
  const second = submitOne(a, ep, '{"n":2}');
  const purged = a.agent.queue.purge(ep);
  const third = submitOne(a, ep, '{"n":3}');
  const [j2, removed, j3] = await Promise.all([second, purged, third]);
  t.equal(removed, 2, 'the purge removed the two jobs queued before it');
  const byId = new Map(rows(a, ep).map((r) => [r.id, r]));
  t.equal(byId.get(first.id)?.status, 'CANCELLED');
  t.equal(byId.get(j2.id)?.status, 'CANCELLED', 'the insert before the purge was written before it');
  t.equal(byId.get(j3.id)?.status, 'IN_QUEUE', 'the insert after the purge was written after it, and stays queued');
  t.ok((byId.get(j3.id)?.rowid ?? 0) > (byId.get(j2.id)?.rowid ?? 0));
  t.equal(a.agent.queue.health(ep).jobs.inQueue, 1);
});

t.test('JobsRepo.insertMany returns the first of consecutive rowids across statements', async (t) => {
  const a = await startAgent(t, { sqliteSynchronous: 'normal' });
  const repo = new JobsRepo(a.agent.db, createSecretBox(randomBytes(32)));
  const job = (i: number) => ({
    id: `many-${i}`, endpointId: 'insertmany0001', extra: i % 2 ? '{"s3Config":{}}' : null, webhook: i % 3 ? null : 'http://127.0.0.1:9/h',
    lowPriority: i % 4 === 0, executionTimeoutMs: 1000 + i, ttlMs: 2000 + i, retentionMs: 3000 + i, createdAt: 4000 + i,
  });
  const jobs = Array.from({ length: 70 }, (_, i) => job(i));
  const first = a.agent.db.transaction(() => repo.insertMany(jobs, jobs.map((_, i) => `{"x":${i}}`)))();
  for (const [i, j] of jobs.entries()) {
    const r = repo.get(j.id);
    if (!r) {
      t.fail(`row ${j.id} missing`);
      continue;
    }
    t.same({ ...r }, {
      ...r, rowid: first + i, id: j.id, endpointId: j.endpointId, status: 'IN_QUEUE', input: `{"x":${i}}`, extra: j.extra, webhook: j.webhook,
      lowPriority: j.lowPriority, executionTimeoutMs: j.executionTimeoutMs, ttlMs: j.ttlMs, retentionMs: j.retentionMs, createdAt: j.createdAt, attempt: 0, retries: 0,
    }, `row ${i}`);
  }
});
