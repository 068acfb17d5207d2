/**
 * Bytes that are not UTF-8 inside a JSON string. A client's /run body is refused (400): the
 * client is there to fix it. A worker's result is kept, each bad sequence read as U+FFFD, so
 * the result is neither lost nor refused into a retry loop (runpod-python retries a refused
 * post, then drops it and the job runs again), and /status serves valid UTF-8 that Python's
 * json.loads reads.
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
