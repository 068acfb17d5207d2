/**
 * `/stream` polled in a loop with no pause and no `?wait`, as RunPod's npm client `runpod-sdk`
 * does (its `stream()` generator): over loopback each poll answered in about a millisecond, so
 * the loop sent hundreds a second and ran into the endpoint's "status" quota (2000 per 10 s)
 * within seconds, its stream ending in a 429. A poll of the same job within 100 ms of the last
 * answer is now answered 100 ms after it, and held (up to 1 s, until a chunk or the job's end)
 * when there is nothing to read. A first poll, a paced client (runpod-python polls every second)
 * and an explicit `?wait=0` still get their answer at once.
 */
import t, { type Test } from 'tap';
import { startAgent, cpuBody, ADMIN_KEY, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const SDK_HEADERS = { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' };

async function setup(t: Test): Promise<{ a: TestAgent; ep: string; w: TestWorker; id: string }> {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) });
  const ep = r.json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  return { a, ep, w, id };
}

async function poll(a: TestAgent, ep: string, id: string, query = ''): Promise<{ status: number; ms: number; body: { status: string; stream: unknown[] } }> {
  const started = performance.now();
  const res = await fetch(`${a.url}/v2/${ep}/stream/${id}${query}`, { headers: SDK_HEADERS });
  const body = (await res.json()) as { status: string; stream: unknown[] };
  return { status: res.status, ms: performance.now() - started, body };
}

t.test('a loop with no pause (runpod-sdk) gets every chunk in order, in a bounded number of polls', async (t) => {
  const { a, ep, w, id } = await setup(t);
  const chunks: unknown[] = [];
  const statuses = new Set<number>();
  let polls = 0;
  const reader = (async () => {
    for (;;) {
      const r = await poll(a, ep, id);
      polls++;
      statuses.add(r.status);
      if (r.status !== 200) return;
      chunks.push(...r.body.stream);
      if (['COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT'].includes(r.body.status)) return;
    }
  })();
  for (let i = 0; i < 6; i++) {
    await new Promise((r) => setTimeout(r, 300));
    t.equal(await w.stream(id, { i }), 200);
  }
  await new Promise((r) => setTimeout(r, 300));
  t.equal((await w.done(id, { output: 'done' }, true)).status, 200);
  await reader;
  t.same([...statuses], [200], 'every poll answered 200');
  t.same(chunks, [0, 1, 2, 3, 4, 5].map((i) => ({ output: { i } })), 'every chunk once, in order');
  // ~2.1 s: at most one poll per 100 ms, and an empty one held until the next chunk.
  t.ok(polls <= 30, `polls over ~2.1 s: ${polls} (without pacing: thousands)`);
});

t.test('a first poll, a paced client and ?wait=0 are answered at once', async (t) => {
  const { a, ep, id } = await setup(t);
  const first = await poll(a, ep, id);
  t.same(first.body, { status: 'IN_PROGRESS', stream: [] });
  t.ok(first.ms < 500, `a first empty poll answers at once (${first.ms.toFixed(0)} ms)`);
  for (let i = 0; i < 3; i++) {
    await new Promise((r) => setTimeout(r, 200));
    const r = await poll(a, ep, id);
    t.ok(r.ms < 500, `a poll 200 ms after the last answer is answered at once (${r.ms.toFixed(0)} ms)`);
  }
  const started = performance.now();
  for (let i = 0; i < 20; i++) t.same((await poll(a, ep, id, '?wait=0')).body.stream, []);
  const took = performance.now() - started;
  t.ok(took < 1500, `20 polls with ?wait=0 in a row are not paced (${took.toFixed(0)} ms)`);
  // The hold ends at the job's end: a held poll answers with the final status.
  await poll(a, ep, id);
  const held = poll(a, ep, id);
  await new Promise((r) => setTimeout(r, 150));
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).status, 200);
  const r = await held;
  t.same(r.body, { status: 'CANCELLED', stream: [] }, 'a held poll answers at the job\'s end');
  t.ok(r.ms < 900, `before the hold's 1 s (${r.ms.toFixed(0)} ms)`);
});
