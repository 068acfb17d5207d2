/**
 * Finished jobs stay in memory for /status, up to a count (2,000). Results may be 64 MiB each,
 * so a count alone let flashd hold every large output of the last 2,000 jobs (40 jobs of 8 MB
 * kept 440 MB resident). They are also bounded by bytes now (`finishedBytesInMemory`): older
 * large results leave memory and are read from SQLite. Checked on the queue's own in-memory
 * jobs, not on RSS, which the allocator and the collector make too noisy to assert on.
 */
import t from 'tap';
import { DEFAULT_QUEUE_SETTINGS } from '../../src/queue/index.js';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const JOBS = 20;
const OUTPUT_CHARS = 6 * 1024 * 1024;

t.test('finished jobs hold at most finishedBytesInMemory of results; older ones are read from SQLite', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const ids: string[] = [];
  for (let i = 0; i < JOBS; i++) {
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).json.id as string;
    t.equal((await w.take())?.id, id);
    // A different output per job, so no two can share memory.
    t.equal((await w.done(id, { output: String(i % 10).repeat(OUTPUT_CHARS) })).status, 200);
    ids.push(id);
  }
  await a.agent.queue.durable();
  const live = ids.filter((id) => a.agent.queue.live(id) !== undefined);
  const chars = live.reduce((n, id) => n + (a.agent.queue.live(id)?.output?.length ?? 0), 0);
  const budget = DEFAULT_QUEUE_SETTINGS.finishedBytesInMemory;
  t.ok(chars <= budget, `${live.length} of ${JOBS} finished jobs in memory, ${(chars / 1048576).toFixed(0)} MB of results (budget ${budget / 1048576} MB)`);
  t.ok(live.includes(ids[JOBS - 1] as string), 'the newest result stays in memory');
  t.notOk(live.includes(ids[0] as string), 'the oldest left it');

  const last = (await a.req('GET', `/v2/${ep}/status/${ids[JOBS - 1]}`)).json;
  t.equal(last.output, String((JOBS - 1) % 10).repeat(OUTPUT_CHARS), 'the newest result is served');
  const first = (await a.req('GET', `/v2/${ep}/status/${ids[0]}`)).json;
  t.equal(first.status, 'COMPLETED', 'an old result is still there');
  t.equal(first.output, '0'.repeat(OUTPUT_CHARS), 'read back whole from SQLite');
});
