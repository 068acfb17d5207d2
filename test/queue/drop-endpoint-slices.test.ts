/**
 * Deleting an endpoint with a large job table deletes its rows a slice of at most 1,000 a
 * commit (JobQueue.#deleteRows), and never two slices in one commit: a slice was queued every event-loop turn
 * whatever the batch did, so while a WAL sync was in flight (the batch commits what waited for
 * it together, store/write-batch.ts) several 20,000-row slices landed in one commit, a turn of
 * 40 ms to over a second in which no other request was served. Counted on the real store: every
 * transaction flashd runs, and each run of the slice statement in it (better-sqlite3 itself is
 * wrapped; nothing of flashd is replaced), so no timing is asserted.
 */
import t, { type Test } from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

/**
 * The most rows one commit may delete: about 5 µs a row (the row, its index entries, the
 * stream-chunk trigger, its pages written to the WAL), so a few ms of the event loop. The old
 * slices were 20,000 rows, and several of them one commit.
 */
const MAX_ROWS_PER_COMMIT = 1_000;

/** Per transaction (or statement run outside one): slice statements run and rows they deleted. */
interface Commit { slices: number; rows: number }
const commits: Commit[] = [];
let open: Commit | null = null;

const prepare = Database.prototype.prepare;
const transaction = Database.prototype.transaction;
Database.prototype.prepare = function (this: Database.Database, source: string) {
  const stmt = prepare.call(this, source);
  if (/^DELETE FROM jobs WHERE rowid >= \?/.test(source)) {
    const run = stmt.run.bind(stmt) as (...args: unknown[]) => Database.RunResult;
    stmt.run = ((...args: unknown[]) => {
      const result = run(...args);
      const c = open ?? { slices: 0, rows: 0 };
      if (!open) commits.push(c);
      c.slices++;
      c.rows += result.changes;
      return result;
    }) as typeof stmt.run;
  }
  return stmt;
} as typeof prepare;
Database.prototype.transaction = function (this: Database.Database, fn: (...args: unknown[]) => unknown) {
  const tx = transaction.call(this, fn);
  return ((...args: unknown[]) => {
    const outer = open;
    const c: Commit = { slices: 0, rows: 0 };
    open = c;
    try {
      return tx(...args);
    } finally {
      open = outer;
      if (c.slices) commits.push(c);
    }
  }) as unknown as typeof tx;
} as typeof transaction;
t.teardown(() => {
  Database.prototype.prepare = prepare;
  Database.prototype.transaction = transaction;
});

const endpoint = async (a: TestAgent) => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;

/** Finished and queued rows as a busy endpoint leaves them, written directly (the HTTP path is not under test). */
function seed(db: Database.Database, rows: number, endpointOf: (i: number) => string): void {
  const insert = db.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, output, execution_timeout_ms, ttl_ms, retention_ms,
    created_at, completed_at, expires_at) VALUES (?, ?, ?, '{"prompt":"a"}', ?, 600000, 86400000, 86400000, 1, ?, ?)`);
  db.transaction(() => {
    for (let i = 0; i < rows; i++) {
      const queued = i % 4 === 0;
      insert.run(`seeded-${String(i).padStart(8, '0')}`, endpointOf(i), queued ? 'IN_QUEUE' : 'COMPLETED', queued ? null : '{"ok":1}',
        queued ? null : 2, queued ? null : 9_000_000_000_000);
    }
  })();
}

const count = (db: Database.Database, ep: string) => db.prepare('SELECT count(*) FROM jobs WHERE endpoint_id = ?').pluck().get(ep) as number;

function checkCommits(t: Test, from: number, deleted: number): void {
  const ours = commits.slice(from);
  t.equal(ours.reduce((n, c) => n + c.rows, 0), deleted, 'every deleted row was counted');
  t.same(ours.filter((c) => c.slices > 1), [], 'never two slices in one commit');
  t.same(ours.filter((c) => c.rows > MAX_ROWS_PER_COMMIT), [], `at most ${MAX_ROWS_PER_COMMIT} rows a commit (${ours.length} commits)`);
}

t.test('a large endpoint is deleted one slice a commit while other endpoints take jobs, and they keep theirs', async (t) => {
  const a = await startAgent(t);
  const gone = await endpoint(a);
  const kept = await endpoint(a);
  seed(a.agent.db, 60_000, (i) => (i % 10 === 0 ? kept : gone));
  const before = count(a.agent.db, gone);
  const from = commits.length;
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  // Jobs of another endpoint meanwhile: their commits, and the WAL syncs they wait for, are the
  // ones several queued slices used to join.
  const submitted: string[] = [];
  const deadline = Date.now() + 30_000;
  while (count(a.agent.db, gone) > 0 && Date.now() < deadline) {
    const runs = await Promise.all(Array.from({ length: 8 }, (_, i) => a.req('POST', `/v2/${kept}/run`, { body: { input: { i } } })));
    for (const r of runs) submitted.push(r.json.id as string);
  }
  await a.agent.queue.durable();
  checkCommits(t, from, before);
  t.equal(count(a.agent.db, kept), 6_000 + submitted.length, 'the other endpoint keeps every row');
  t.equal((await a.req('GET', `/v2/${kept}/status/${submitted[0]}`)).json.status, 'IN_QUEUE');
  t.equal((await a.req('GET', `/v2/${gone}/status/seeded-00000001`)).status, 404, 'the deleted endpoint answers no /status');
});

t.test('two large endpoints deleted together take turns: still one slice a commit', async (t) => {
  const a = await startAgent(t);
  const one = await endpoint(a);
  const two = await endpoint(a);
  const kept = await endpoint(a);
  seed(a.agent.db, 30_000, (i) => [one, two, kept][i % 3] as string);
  const from = commits.length;
  // In one event-loop turn, as two DELETE requests read together are: each slice chain used to
  // queue its own slice every turn, two to a commit.
  for (const ep of [one, two]) a.agent.endpoints.delete(a.agent.endpoints.byId(ep)?.ownerId ?? '', ep);
  t.equal((await a.req('GET', `/v2/serverless/${one}`)).status, 404);
  await until('both deleted', async () => count(a.agent.db, one) + count(a.agent.db, two) === 0, 20_000);
  await a.agent.queue.durable();
  checkCommits(t, from, 20_000);
  t.equal(count(a.agent.db, kept), 10_000);
});

t.test('a start after a crash mid-deletion deletes the rows left one slice a commit, and recovers the other endpoints', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, {}, { dir });
  const gone = await endpoint(first);
  const kept = await endpoint(first);
  const keptJob = (await first.req('POST', `/v2/${kept}/run`, { body: { input: { keep: 1 } } })).json.id as string;
  await first.agent.close();
  // What a crash in the middle leaves: the endpoint's row is gone, many of its job rows are not.
  const db = new Database(join(dir, 'flashd.db'));
  seed(db, 20_000, () => gone);
  db.prepare('DELETE FROM endpoints WHERE id = ?').run(gone);
  db.close();

  const from = commits.length;
  const b = await startAgent(t, {}, { dir });
  await until('the rows left', async () => count(b.agent.db, gone) === 0, 20_000);
  await b.agent.queue.durable();
  checkCommits(t, from, 20_000);
  t.equal((await b.req('GET', `/v2/${kept}/status/${keptJob}`)).json.status, 'IN_QUEUE', 'the other endpoint\'s job is recovered');
});

t.test('a commit failed by another write before its slice ran does not stop the deletion, nor later ones', async (t) => {
  const a = await startAgent(t);
  const gone = await endpoint(a);
  const later = await endpoint(a);
  const kept = await endpoint(a);
  seed(a.agent.db, 9_000, (i) => [gone, later, kept][i % 3] as string);
  // A write SQLite refuses (a full disk, a constraint): here a trigger of the test's own refuses
  // one job's insert, which fails the whole commit it is in (a TEMP trigger: it goes with the connection).
  a.agent.db.exec(`CREATE TEMP TRIGGER refuse_poison BEFORE INSERT ON main.jobs WHEN NEW.input = '{"poison":1}'
    BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`);
  a.agent.endpoints.delete(a.agent.endpoints.byId(gone)?.ownerId ?? '', gone);
  // The first slice commits in the next check phase, and queues the second for the turn after.
  // A job submitted in between (a /run read in the poll phase of that turn) is queued first:
  // the refused insert and the second slice land in one commit, the insert ahead.
  const poisoned = new Promise<unknown>((resolve) => setImmediate(() => resolve(a.agent.queue.submit({
    endpointId: kept, input: '{"poison":1}', extra: null, webhook: null, executionTimeoutMs: 600_000, ttlMs: 86_400_000, lowPriority: false, retentionMs: 86_400_000,
  }))));
  await t.rejects(poisoned, /refused by the test/, 'the refused job is not acknowledged');
  await until('the deleted endpoint\'s rows gone', async () => count(a.agent.db, gone) === 0, 20_000)
    .catch((e: Error) => t.fail(`${e.message}: ${count(a.agent.db, gone)} rows left`));
  t.equal((await a.req('DELETE', `/v2/serverless/${later}`)).status, 204);
  await until('a later deletion\'s rows gone', async () => count(a.agent.db, later) === 0, 20_000)
    .catch((e: Error) => t.fail(`${e.message}: ${count(a.agent.db, later)} rows left`));
  t.equal(count(a.agent.db, kept), 3_000, 'the other endpoint keeps every row');
  const r = await a.req('POST', `/v2/${kept}/run`, { body: { input: { after: 1 } } });
  t.equal(r.status, 200, 'jobs are taken after the failed commit');
});
