/**
 * A /purge-queue in flight when its endpoint is deleted answers. The DELETE commits what is
 * queued at once (a forced flush, so the endpoint's pending writes land before its rows go);
 * coming while the write batch held its next commit for a busy group (a purge's slice of 2,000
 * jobs is one), it left the purge's commit waiting for a sync that nothing started: the row
 * deletion that followed writes a slice a turn with no caller of its own. The purge never
 * answered, and neither did any caller committed with it.
 */
import t from 'tap';
import { startAgent, cpuBody, seedQueued } from '../helpers/agent.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

const BACKLOG = 20_000;

t.test('a purge in flight when its endpoint is deleted answers', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, {}, { dir });
  const gone = (await first.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  await first.agent.close();
  // A backlog recovered at start.
  seedQueued(dir, BACKLOG, () => gone);
  const a = await startAgent(t, {}, { dir });

  const purge = a.req('POST', `/v2/${gone}/purge-queue`);
  await until('a first purged slice', async () => (await a.req('GET', `/v2/${gone}/status/seeded-00000000`)).json?.status === 'CANCELLED', 10_000);
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  let timer: NodeJS.Timeout | undefined;
  const stuck = new Promise<'stuck'>((resolve) => (timer = setTimeout(() => resolve('stuck'), 10_000)));
  const answer = await Promise.race([purge, stuck]);
  clearTimeout(timer);
  t.not(answer, 'stuck', 'the purge answered');
  if (answer !== 'stuck') {
    t.equal(answer.status, 200, answer.text);
    t.ok(answer.json.removed > 0 && answer.json.removed < BACKLOG, `it ended the slices before the deletion (${answer.json.removed})`);
  }
  t.equal((await a.req('GET', `/v2/${gone}/health`)).status, 404, 'the endpoint is gone');
});
