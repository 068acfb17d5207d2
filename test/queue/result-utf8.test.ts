/**
 * Bytes that are not UTF-8 inside a JSON string. A client's /run body is refused (400): the
 * client is there to fix it. A worker's result is kept, each bad sequence read as U+FFFD, so
 * the result is neither lost nor refused into a retry loop (runpod-python retries a refused
 * post, then drops it and the job runs again), and /status serves valid UTF-8 that Python's
 * json.loads reads. A leading byte order mark is ignored on both.
 */
import t from 'tap';
import { isUtf8 } from 'node:buffer';
import { assertProblem, cpuBody, startAgent, ADMIN_KEY } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const BAD = Buffer.from([0x78, 0xff, 0xc3, 0x79]); // "x", a lone 0xff, a truncated 2-byte sequence, "y"
const withBad = (before: string, after: string) => Buffer.concat([Buffer.from(before), BAD, Buffer.from(after)]);

t.test('a /run body that is not UTF-8 is a 400; a worker result that is not is kept with U+FFFD', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const run = await fetch(`${a.url}/v2/${ep}/run`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, body: withBad('{"input": {"t": "', '"}}') });
  const text = await run.text();
  assertProblem(t, { status: run.status, headers: run.headers, text, json: JSON.parse(text) }, 400);
  t.match(JSON.parse(text).detail, /not UTF-8/);
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 0, 'nothing was queued');

  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { t: 'ok' } } })).json.id as string;
  const env = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json;
  const worker = new TestWorker(env);
  t.equal((await worker.take())?.id, job);
  const url = (env.env['RUNPOD_WEBHOOK_POST_OUTPUT'] as string).replace('$ID', job).replace('$RUNPOD_POD_ID', worker.workerId);
  const done = await fetch(url, { method: 'POST', headers: { authorization: worker.key, 'content-type': 'application/x-www-form-urlencoded' }, body: withBad('{"output": {"t": "', '"}}') });
  t.equal(done.status, 200, `the result is taken: ${await done.text()}`);
  const status = Buffer.from(await (await fetch(`${a.url}/v2/${ep}/status/${job}`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } })).arrayBuffer());
  t.ok(isUtf8(status), '/status is valid UTF-8');
  const body = JSON.parse(status.toString('utf8'));
  t.equal(body.status, 'COMPLETED');
  t.same(body.output, { t: 'x\uFFFD\uFFFDy' }, 'each bad sequence is U+FFFD');
});

t.test("a worker's result, progress update or stream chunk that starts with a byte order mark is read without it, as a client's body is", async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const post = async (kind: 'done' | 'stream', id: string, text: string) => {
    const res = await fetch(w.postUrl(kind, id), { method: 'POST', headers: { authorization: w.key, 'content-type': 'application/x-www-form-urlencoded' }, body: `\ufeff${text}` });
    return { status: res.status, text: await res.text() };
  };
  const raw = async (path: string) => (await fetch(`${a.url}/v2/${ep}${path}`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } })).text();
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  // Spacing kept as posted: the output is sliced from the text at the right place, the BOM not counted in.
  t.same(await post('done', id, '{"status": "IN_PROGRESS", "output": {"pct":  50}}'), { status: 200, text: '{"ok":true}' }, 'a progress update with a BOM');
  t.match(await raw(`/status/${id}`), /"status":"IN_PROGRESS".*"output":\{"pct":  50\}/, 'shown as posted');
  t.same(await post('stream', id, '{"output": ["tok",  "en"], "metrics": {"n": 2}}'), { status: 200, text: '{"ok":true}' }, 'a stream chunk with a BOM');
  t.equal(await raw(`/stream/${id}`), '{"status":"IN_PROGRESS","stream":[{"output":["tok",  "en"],"metrics":{"n":2}}]}', 'served as posted');
  t.same(await post('done', id, '{"output": {"t": "bom",  "n": [1, 2]}}'), { status: 200, text: '{"ok":true}' }, 'a result with a BOM');
  t.match(await raw(`/status/${id}`), /"status":"COMPLETED".*"output":\{"t": "bom",  "n": \[1, 2\]\}/, 'the output as posted');
  // A Python worker's NaN (read as null) in a body with a BOM: the same.
  const nan = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, nan);
  t.equal((await post('done', nan, '{"output": {"loss": NaN}, "error": NaN}')).status, 200, 'NaN with a BOM');
  t.match(JSON.parse(await raw(`/status/${nan}`)), { status: 'FAILED', error: 'NaN', output: { loss: null } }, 'a NaN error fails the job, as without a BOM');
});
