/**
 * Worker protocol edges: a ping speaks for its own endpoint only, a job-take brings a worker
 * marked unhealthy back, `error` is judged by Python's truth test (as runpod-python does), and
 * /retry answers IN_QUEUE like /run.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, ADMIN_KEY } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

async function setup(t: Test) {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000 }, { clock });
  const ep = async () => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const step = (ms: number) => {
    clock.advance(ms);
    a.agent.queue.reap();
  };
  return { a, ep, step };
}

t.test("a ping on one endpoint does not renew another endpoint's job", async (t) => {
  const { a, ep, step } = await setup(t);
  const ep1 = await ep();
  const ep2 = await ep();
  const w2 = await TestWorker.create(a, ep2);
  const j2 = (await a.req('POST', `/v2/${ep2}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w2.take())?.id, j2);
  // The same worker id on ep1's URL, listing ep2's job: through the admin key, which may act as
  // any worker (a worker key of ep1 acts only as its own worker id, test/api/worker-keys.test.ts).
  const url = `/v2/${ep1}/ping/${w2.workerId}?gpu=cpu&job_id=${j2}&runpod_version=1.12.0`;
  for (let i = 0; i < 3; i++) {
    t.equal((await a.req('GET', url)).status, 200);
    step(1100);
  }
  t.equal((await a.req('GET', `/v2/${ep2}/status/${j2}`)).json.status, 'IN_QUEUE', 'the lease ran out: no other endpoint can keep it alive');
});

t.test('a worker that reported itself unhealthy is up again once it asks for work', async (t) => {
  const { a, ep } = await setup(t);
  const e = await ep();
  const w = await TestWorker.create(a, e);
  const r = await fetch(`${a.url}/v2/${e}/ping/${w.workerId}?gpu=cpu&status=unhealthy&check=memory&reason=low&runpod_version=1.12.0`, { headers: { authorization: w.key } });
  t.equal(r.status, 200);
  t.match((await a.req('GET', `/v2/${e}/health`)).json.workers, { unhealthy: 1, ready: 0 });
  const id = (await a.req('POST', `/v2/${e}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal(await w.ping([id]), 200);
  t.match((await a.req('GET', `/v2/${e}/health`)).json.workers, { unhealthy: 0, running: 1 }, 'counted as what it does');
});

t.test("an unhealthy ping's check and reason reach flashd's log and the endpoint log, capped and on one line", async (t) => {
  const { a, ep } = await setup(t);
  const e = await ep();
  const w = await TestWorker.create(a, e);
  // runpod-python's fitness-check report (worker-protocol.md §1.12): once, then os._exit(1)
  const report = (query: string) => fetch(`${a.url}/v2/${e}/ping/${w.workerId}?gpu=cpu&status=unhealthy&${query}&runpod_version=1.12.0`, { headers: { authorization: w.key } });
  t.equal((await report('check=gpu_memory&reason=CUDA+out+of+memory')).status, 200);
  t.equal((await report(`check=disk%0A%1B[31mfake&reason=${encodeURIComponent('line one\r\nline two\u0085 ' + 'x'.repeat(400))}`)).status, 200);
  t.equal((await report('reason=no+check+named')).status, 200);
  t.equal((await report('x=1')).status, 200);
  await new Promise((r) => setImmediate(r));
  const lines = ((await a.req('GET', `/v2/serverless/${e}/logs`)).json as { line: string; stream: string; workerId: string }[])
    .filter((l) => l.line.includes('reported unhealthy'));
  t.same(lines.map((l) => [l.stream, l.workerId]), Array(4).fill(['system', w.workerId]));
  t.equal(lines[0]!.line, `worker ${w.workerId} reported unhealthy: check gpu_memory failed: CUDA out of memory`);
  const long = lines[1]!.line;
  t.match(long, `worker ${w.workerId} reported unhealthy: check disk [31mfake failed: line one line two `, 'control characters become spaces');
  t.notMatch(long, /[\u0000-\u001f\u007f-\u009f]/, 'no control character is left');
  t.equal(long.length, `worker ${w.workerId} reported unhealthy: check disk [31mfake failed: `.length + 256, 'the reason is capped at 256 characters');
  t.equal(lines[2]!.line, `worker ${w.workerId} reported unhealthy: no check named`);
  t.equal(lines[3]!.line, `worker ${w.workerId} reported unhealthy`);
  const warn = a.logs.find((l) => l.includes('worker reported unhealthy') && l.includes('gpu_memory'));
  t.ok(warn, "flashd's own log names the check");
  t.match(warn, 'CUDA out of memory', "and the reason");
});

t.test("error is judged by Python's truth test: empty lists and objects are not errors, NaN is", async (t) => {
  const { a, ep } = await setup(t);
  const e = await ep();
  const w = await TestWorker.create(a, e);
  const cases: [string, string][] = [
    ['{"error":{},"output":1}', 'COMPLETED'], ['{"error":[],"output":1}', 'COMPLETED'], ['{"error":0.0,"output":1}', 'COMPLETED'],
    ['{"error":{"a":1}}', 'FAILED'], ['{"error":[0]}', 'FAILED'], ['{"error":NaN}', 'FAILED'], ['{"output":NaN,"error":-Infinity}', 'FAILED'],
    ['{"output":NaN}', 'COMPLETED'],
  ];
  for (const [body, status] of cases) {
    const id = (await a.req('POST', `/v2/${e}/run`, { body: { input: {} } })).json.id as string;
    t.equal((await w.take())?.id, id);
    const r = await fetch(w.postUrl('done', id), { method: 'POST', headers: { authorization: w.key, 'content-type': 'application/x-www-form-urlencoded' }, body });
    t.equal(r.status, 200, body);
    const s = (await a.req('GET', `/v2/${e}/status/${id}`)).json;
    t.equal(s.status, status, `${body} -> ${JSON.stringify(s)}`);
    if (body === '{"error":NaN}') t.equal(s.error, 'NaN', 'the error is kept as text');
  }
});

t.test('/retry answers IN_QUEUE even when a parked worker takes the job before the reply', async (t) => {
  const { a, ep } = await setup(t);
  const e = await ep();
  const w = await TestWorker.create(a, e);
  const id = (await a.req('POST', `/v2/${e}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal((await w.done(id, { error: 'boom' })).status, 200);
  const parked = w.take();
  await new Promise((r) => setTimeout(r, 50));
  const r = await fetch(`${a.url}/v2/${e}/retry/${id}`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.same(await r.json(), { id, status: 'IN_QUEUE' });
  t.equal((await parked)?.id, id, 'and the parked worker has it');
});

t.test('a stream chunk posted again under the same ?chunk= number (its answer was lost) is stored once', async (t) => {
  const { a, ep } = await setup(t);
  const e = await ep();
  const w = await TestWorker.create(a, e);
  const id = (await a.req('POST', `/v2/${e}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  const post = async (chunk: number | null, output: unknown) => {
    const res = await fetch(`${w.postUrl('stream', id)}${chunk === null ? '' : `&chunk=${chunk}`}`, {
      method: 'POST', headers: { authorization: w.key, 'content-type': 'application/json' }, body: JSON.stringify({ output }),
    });
    return { status: res.status, json: await res.json() };
  };
  t.same(await post(1, 'a'), { status: 200, json: { ok: true } });
  t.same(await post(1, 'a'), { status: 200, json: { ok: true, duplicate: true } }, 'the retry is acknowledged, not stored');
  t.same(await post(2, 'b'), { status: 200, json: { ok: true } });
  t.same(await post(2, 'b'), { status: 200, json: { ok: true, duplicate: true } });
  t.same(await post(null, 'c'), { status: 200, json: { ok: true } }, 'without a number (runpod-python) every post is stored');
  t.same(await post(null, 'c'), { status: 200, json: { ok: true } });
  t.same(await post(0, 'd'), { status: 200, json: { ok: true } }, 'a number that is not 1 or more is ignored');
  const stream = (await a.req('GET', `/v2/${e}/stream/${id}`)).json;
  t.same(stream.stream, [{ output: 'a' }, { output: 'b' }, { output: 'c' }, { output: 'c' }, { output: 'd' }]);
  t.equal((await w.done(id, { output: [] }, true)).status, 200);

  // the same worker takes the job's next run: its numbers start again at 1
  const id2 = (await a.req('POST', `/v2/${e}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id2);
  const res = await fetch(`${w.postUrl('stream', id2)}&chunk=1`, { method: 'POST', headers: { authorization: w.key }, body: '{"output":"x"}' });
  t.same(await res.json(), { ok: true });
});
