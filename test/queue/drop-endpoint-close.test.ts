/**
 * A server stopped while it deletes a large endpoint's rows (a slice per commit, see
 * JobQueue.#deleteRows) stops deleting: no slice is written to the closed store, which threw
 * "write batch is closed" from a setImmediate, an uncaught exception, after the stop. The rows
 * left go with the next start (active ones) or when their results expire.
 */
import t from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';

t.test('stopping during the deletion of a large endpoint throws nothing', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, {}, { dir });
  const gone = (await first.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  await first.agent.close();
  // 1,000,000 finished jobs: the deletion takes 1,000 slices of 1,000 rows.
  const seed = new Database(join(dir, 'flashd.db'));
  const insert = seed.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms,
    created_at, completed_at, expires_at) VALUES (?, ?, 'COMPLETED', '{}', 600000, 86400000, 86400000, 1, 2, 9000000000000)`);
  seed.transaction(() => {
    for (let i = 0; i < 1_000_000; i++) insert.run(`seeded-${String(i).padStart(8, '0')}`, gone);
  })();
  seed.close();

  const uncaught: Error[] = [];
  const onError = (err: Error) => void uncaught.push(err);
  process.on('uncaughtException', onError);
  t.teardown(() => void process.off('uncaughtException', onError));
  const a = await startAgent(t, {}, { dir });
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  await a.agent.close();
  await new Promise((resolve) => setTimeout(resolve, 500));
  t.same(uncaught.map((e) => e.message), [], 'no write after the store closed');

  const again = await startAgent(t, {}, { dir });
  t.equal((await again.req('GET', `/v2/serverless/${gone}`)).status, 404, 'the endpoint stays deleted');
  t.equal((await again.req('GET', '/v2/serverless')).json.length, 0);
});
