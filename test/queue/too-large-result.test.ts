/**
 * A result or stream chunk over the 64 MiB limit of a worker post gets its 413 and fails the
 * job at once, saying why: runpod-python drops the result after a 413 and goes on, so the job
 * would otherwise run again after its lease and end with a wrong reason.
 */
import t from 'tap';
import { execFile } from 'node:child_process';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker, WORKER_POST_LIMIT as LIMIT, postOversized } from '../helpers/worker.js';

async function setup(t: Parameters<typeof startAgent>[0]) {
  const a = await startAgent(t, { takeHoldMs: 500 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  return { a, ep, w: await TestWorker.create(a, ep) };
}

const status = async (a: TestAgent, ep: string, id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json;

for (const kind of ['done', 'stream'] as const) {
  t.test(`a ${kind === 'done' ? 'result' : 'stream chunk'} over the limit fails its job at once`, async (t) => {
    const { a, ep, w } = await setup(t);
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
    await w.take();
    t.match(await postOversized(w.postUrl(kind, id), w.key), /^HTTP\/1\.1 413/);
    const s = await status(a, ep, id);
    t.equal(s.status, 'FAILED');
    const what = kind === 'done' ? 'result' : 'stream chunk';
    t.match(s.error, new RegExp(`${what} was ${LIMIT + 10} bytes, over the ${LIMIT}-byte limit`));
    // It names what was lost (the chunk, not "the job") and what to do instead.
    t.match(s.error, new RegExp(`\\(HTTP 413\\): the ${what} could not be stored, so the job failed; pass large data as a URL or a path instead\\.$`));
    t.equal(s.workerId, w.workerId);
  });
}

t.test("a generator's aggregate result over the limit says so: its chunks went to /stream", async (t) => {
  const { a, ep, w } = await setup(t);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await w.take();
  t.equal(await w.stream(id, 'streamed'), 200);
  // runpod-python's final post of a generator job: isStream=true, the list of every yield with return_aggregate_stream
  t.match(await postOversized(w.postUrl('done', id).replace('isStream=false', 'isStream=true'), w.key), /^HTTP\/1\.1 413/);
  const s = await status(a, ep, id);
  t.equal(s.status, 'FAILED');
  t.match(s.error, new RegExp(`^The worker's result \\(the list of its generator's yields, sent because return_aggregate_stream is on\\) was ${LIMIT + 10} bytes, over the ${LIMIT}-byte limit`));
  t.match(s.error, /turn return_aggregate_stream off: the yields were streamed and \/stream still has those not read yet\.$/);
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json, { status: 'FAILED', stream: [{ output: 'streamed' }] }, 'the chunks stay readable');
});

t.test('an oversized post from a worker that does not hold the job changes nothing', async (t) => {
  const { a, ep, w } = await setup(t);
  const other = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await w.take();
  t.match(await postOversized(other.postUrl('done', id), other.key), /^HTTP\/1\.1 413/);
  t.match(await postOversized(w.postUrl('done', id), 'not-a-key'), /^HTTP\/1\.1 413/, 'nor does one with a bad key');
  t.equal((await status(a, ep, id)).status, 'IN_PROGRESS');
  t.equal((await w.done(id, { output: 'fits' })).status, 200, 'its worker can still post a result that fits');
});

// runpod-python (aiohttp) and http.client send the whole body before reading the answer.
const PY_SEND_FIRST = `
import http.client, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
body = b'{"output":"' + b'a' * (int(sys.argv[3]) - 13) + b'"}'
try:
    c.request('POST', u.path + '?' + u.query, body=body, headers={'content-type': 'application/json', 'authorization': sys.argv[2]})
    print(c.getresponse().status)
except Exception as e:
    print(type(e).__name__ + ': ' + str(e))
`;

t.test('a worker that sends its whole oversized result before reading gets the 413, not a broken pipe, and the failure is logged at warn', async (t) => {
  const { a, ep, w } = await setup(t);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await w.take();
  const out = await new Promise<string>((resolve, reject) => {
    execFile('python3', ['-c', PY_SEND_FIRST, w.postUrl('done', id), w.key, String(LIMIT + 10)], (err, stdout) => (err ? reject(err) : resolve(stdout.trim())));
  });
  t.equal(out, '413');
  t.equal((await status(a, ep, id)).status, 'FAILED');
  const line = a.logs.find((l) => l.includes('job failed: worker post over the limit'));
  t.ok(line, 'logged at the default level');
  t.match(line, /warn/);
  t.match(line, new RegExp(`bytes=${LIMIT + 10}`));
  t.match(line, new RegExp(`limit=${LIMIT}`));
});
