/**
 * README "Running jobs": `{"ok":true,"duplicate":true}` answers only a re-post of the worker's
 * own result that was already recorded. A progress update or a stream chunk the same worker
 * posts after its result ended the job is no re-post of it: it is discarded with a 200 (runpod-
 * python logs every 4xx on these posts as an ERROR) saying the job already ended, and changes
 * nothing. In memory and read back from the row after a restart alike.
 */
import t, { type Test } from 'tap';
import { cpuBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

async function chunk(w: TestWorker, id: string, output: unknown): Promise<{ status: number; json: unknown }> {
  const res = await fetch(w.postUrl('stream', id), {
    method: 'POST', headers: { authorization: w.key, 'content-type': 'application/x-www-form-urlencoded' }, body: JSON.stringify({ output }),
  });
  return { status: res.status, json: await res.json() };
}

const LATE = { ok: true, discarded: true, reason: /already ended.*result/ };

async function checkLatePosts(t: Test, a: TestAgent, ep: string, w: TestWorker, id: string, result: { output?: unknown; error?: string }, where: string): Promise<void> {
  const before = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  const progress = await w.done(id, { status: 'IN_PROGRESS', output: { pct: 99 } });
  t.equal(progress.status, 200, `${where}: a late progress update gets a 200`);
  t.match(progress.json, LATE, `${where}: a late progress update is discarded, the job already ended`);
  t.notOk(progress.json.duplicate, `${where}: a late progress update is not a duplicate`);
  const late = await chunk(w, id, 'late');
  t.equal(late.status, 200, `${where}: a late stream chunk gets a 200`);
  t.match(late.json, LATE, `${where}: a late stream chunk is discarded, the job already ended`);
  t.notOk((late.json as { duplicate?: boolean }).duplicate, `${where}: a late stream chunk is not a duplicate`);
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream, [], `${where}: the late chunk is not served`);
  t.same(await w.done(id, result), { status: 200, json: { ok: true, duplicate: true } }, `${where}: a re-post of the result itself is still a duplicate`);
  t.same((await a.req('GET', `/v2/${ep}/status/${id}`)).json, before, `${where}: the job is unchanged`);
}

t.test('a progress update or stream chunk after the worker\'s own result is discarded, not a duplicate', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const ok = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, ok);
  t.same((await w.done(ok, { output: { text: 'done' } })).json, { ok: true });
  const failed = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  t.equal((await w.take())?.id, failed);
  t.same((await w.done(failed, { error: 'boom' })).json, { ok: true });
  await checkLatePosts(t, a, ep, w, ok, { output: { text: 'done' } }, 'COMPLETED, in memory');
  await checkLatePosts(t, a, ep, w, failed, { error: 'boom' }, 'FAILED by the worker, in memory');
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const wb = w.rebase(a.url, b.url);
  await checkLatePosts(t, b, ep, wb, ok, { output: { text: 'done' } }, 'COMPLETED, read from the row');
  await checkLatePosts(t, b, ep, wb, failed, { error: 'boom' }, 'FAILED by the worker, read from the row');
});
