/**
 * Queued jobs keep their input in memory only among the first 64 of their endpoint, and only
 * while the inputs kept by every queue stay within `queuedInputBytesInMemory`: /runsync
 * inputs may be 20 MiB, so the per-endpoint count alone let a few endpoints hold gigabytes.
 * Past the budget a job's input waits in SQLite and is read back when a worker takes it.
 * Checked on the queue's own jobs, not on RSS (see finished-memory.test.ts).
 */
import t from 'tap';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const JOBS = 12;
const INPUT_CHARS = 256 * 1024;

t.test('queued inputs past the global budget wait in SQLite, and every job still runs with its exact input', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  // A budget of 4 inputs, over two endpoints, each far below its own 64 queued jobs.
  const budget = 4 * (INPUT_CHARS + 16);
  (a.agent.queue.settings as { queuedInputBytesInMemory: number }).queuedInputBytesInMemory = budget;
  const eps = [0, 1].map(async () => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string);
  const [ep1, ep2] = await Promise.all(eps) as [string, string];
  const sent = new Map<string, { ep: string; s: string }>();
  for (let i = 0; i < JOBS; i++) {
    const ep = i % 2 === 0 ? ep1 : ep2;
    const s = String.fromCharCode(97 + i).repeat(INPUT_CHARS);
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { s } } })).json.id as string;
    sent.set(id, { ep, s });
  }
  await a.agent.queue.durable();
  const kept = [...sent.keys()].filter((id) => a.agent.queue.live(id)?.input != null);
  t.ok(kept.length > 0 && kept.length <= 4, `${kept.length} of ${JOBS} queued inputs in memory (budget of 4)`);
  t.ok(a.agent.queue.queuedInputChars <= budget, `${a.agent.queue.queuedInputChars} characters counted, within the budget`);

  for (const ep of [ep1, ep2]) {
    const w = await TestWorker.create(a, ep);
    for (let n = 0; n < JOBS / 2; n++) {
      const job = await w.take();
      t.ok(job, 'a job is handed out');
      if (!job) break;
      t.equal(sent.get(job.id)?.ep, ep);
      t.equal((job.input as { s: string }).s, sent.get(job.id)?.s, 'with its exact input');
      t.equal((await w.done(job.id, { output: 'ok' })).status, 200);
    }
  }
  t.equal(a.agent.queue.queuedInputChars, 0, 'nothing is counted once the queues are empty');
});
