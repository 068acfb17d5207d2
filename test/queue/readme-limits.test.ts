/**
 * The job API's limits as README "Running jobs" states them, pinned at both edges: bodies up
 * to 10 MiB on /run and 20 MiB on /runsync, input nested at most 512 deep, ?wait 1000–300000,
 * ?ttl 1000–604800000 (an empty value a 400 like any other non-integer), and results kept
 * 30 min after /run, 1 min after /runsync, up to 5 min with ?wait; a webhook URL with
 * credentials in it refused.
 */
import t from 'tap';
import { readFileSync } from 'node:fs';
import { ManualClock } from '../../src/core/clock.js';
import { assertProblem, cpuBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { webhookUrlForLog } from '../../src/queue/webhook.js';

const MiB = 1024 * 1024;

/** A submit body of exactly `bytes` bytes. */
function bodyOf(bytes: number): string {
  const empty = '{"input":{"pad":""}}';
  return `{"input":{"pad":"${'x'.repeat(bytes - empty.length)}"}}`;
}

const submit = (a: TestAgent, path: string, raw: string) => a.req('POST', path, { raw, headers: { 'content-type': 'application/json' } });

t.test('bodies: /run takes 10 MiB, /runsync 20 MiB; a byte more is a 413', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  t.equal((await submit(a, `/v2/${ep}/run`, bodyOf(10 * MiB))).status, 200, '/run: 10 MiB accepted');
  assertProblem(t, await submit(a, `/v2/${ep}/run`, bodyOf(10 * MiB + 1)), 413, '/run: 10 MiB + 1 refused');
  t.equal((await submit(a, `/v2/${ep}/runsync?wait=1000`, bodyOf(20 * MiB))).status, 200, '/runsync: 20 MiB accepted');
  assertProblem(t, await submit(a, `/v2/${ep}/runsync?wait=1000`, bodyOf(20 * MiB + 1)), 413, '/runsync: 20 MiB + 1 refused');
});

t.test('?wait is 1000–300000 and ?ttl 1000–604800000, both ends included', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const serve = async () => {
    const job = await w.take();
    if (job) await w.done(job.id, { output: 'ok' });
  };
  for (const wait of [1000, 300_000]) {
    const [r] = await Promise.all([a.req('POST', `/v2/${ep}/runsync?wait=${wait}`, { body: { input: {} } }), serve()]);
    t.equal(r.json.status, 'COMPLETED', `wait=${wait} accepted`);
  }
  for (const wait of [999, 300_001]) assertProblem(t, await a.req('POST', `/v2/${ep}/runsync?wait=${wait}`, { body: { input: {} } }), 400, `wait=${wait} refused`);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await serve();
  for (const ttl of [1000, 604_800_000]) t.equal((await a.req('GET', `/v2/${ep}/status/${id}?ttl=${ttl}`)).status, 200, `ttl=${ttl} accepted`);
  for (const ttl of [999, 604_800_001]) assertProblem(t, await a.req('GET', `/v2/${ep}/status/${id}?ttl=${ttl}`), 400, `ttl=${ttl} refused`);
});

t.test('an empty ?wait= or ?ttl= is not an integer: the same 400 as ?wait=abc, and nothing is queued', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  const requests: [string, string][] = [['POST', `/v2/${ep}/runsync?wait=`], ['GET', `/v2/${ep}/status-sync/${id}?wait=`], ['GET', `/v2/${ep}/status/${id}?ttl=`]];
  for (const [method, path] of requests) {
    const name = path.slice(path.indexOf('?') + 1, -1);
    const abc = await a.req(method, `${path}abc`, method === 'POST' ? { body: { input: {} } } : {});
    assertProblem(t, abc, 400, `${path}abc refused`);
    const empty = await a.req(method, path, method === 'POST' ? { body: { input: {} } } : {});
    assertProblem(t, empty, 400, `${path} refused, not taken as absent`);
    t.same(empty.json.errors, abc.json.errors, `${path}: the same errors as ?${name}=abc`);
    t.equal(empty.json.detail, abc.json.detail, `${path}: the same detail as ?${name}=abc`);
  }
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 1, 'the refused /runsync queued nothing');
});

t.test('retention: /run 30 min, /runsync 1 min, /runsync?wait=300000 5 min', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 2000 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const serve = async () => {
    const job = await w.take();
    if (job) await w.done(job.id, { output: 'ok' });
  };
  const step = (ms: number) => {
    clock.advance(ms);
    a.agent.queue.reap();
  };
  const kept = async (id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).status === 200;
  const run = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await serve();
  const [sync] = await Promise.all([a.req('POST', `/v2/${ep}/runsync`, { body: { input: {} } }), serve()]);
  const [short] = await Promise.all([a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: {} } }), serve()]);
  const [long] = await Promise.all([a.req('POST', `/v2/${ep}/runsync?wait=300000`, { body: { input: {} } }), serve()]);
  step(59_000);
  t.ok(await kept(sync.json.id) && await kept(short.json.id), '/runsync results kept just under 1 min');
  step(2_000);
  t.notOk(await kept(sync.json.id), '/runsync: gone after 1 min');
  t.notOk(await kept(short.json.id), '/runsync?wait=1000: 1 min too (a shorter wait keeps the minute)');
  step(5 * 60_000 - 61_000 - 1000);
  t.ok(await kept(long.json.id), '/runsync?wait=300000 kept just under 5 min');
  step(2_000);
  t.notOk(await kept(long.json.id), 'and gone after 5 min');
  step(30 * 60_000 - 5 * 60_000 - 2_000);
  t.ok(await kept(run), '/run kept just under 30 min');
  step(2_000);
  t.notOk(await kept(run), 'and gone after 30 min');
});

t.test('a webhook URL with credentials in it is refused at submit, as docs/jobs.md says, and a token in its query is not logged', async (t) => {
  const doc = readFileSync(new URL('../../docs/jobs.md', import.meta.url), 'utf8');
  t.match(doc, /a URL with credentials in it \(`https:\/\/user:password@host\/…`\) refused at submit \(400 `webhook must not carry credentials in the URL`\)/i, 'docs/jobs.md states the rule');
  t.match(doc, /put a token in the query or the path instead/, 'and what to do instead');
  const a = await startAgent(t, { webhookAllowPrivate: true });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  for (const name of ['webhook', 'webhookV2']) {
    const r = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, [name]: 'https://user:secret@hooks.example.com/hook' } });
    assertProblem(t, r, 400, `${name} with credentials refused`);
    t.match(r.json.detail, `${name} must not carry credentials in the URL`);
    t.match(r.json.errors, [new RegExp(`^/${name}: `)], 'the errors name the member');
  }
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: 'https://hooks.example.com/hook?token=s3cret' } })).status, 200, 'a token in the query is taken');
  t.match(webhookUrlForLog('https://hooks.example.com/hook?token=s3cret'), /^https:\/\/hooks\.example\.com\/\(hidden:[0-9a-f]{8}\)$/, 'and logged hidden');
});

t.test('input nests at most 512 levels deep on /run and /runsync; 513 is a 400 naming /input', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  // `input` itself is level 1: {"a":[…]} with n-1 arrays nests n deep.
  const nested = (n: number) => `{"input":{"a":${'['.repeat(n - 1)}1${']'.repeat(n - 1)}},"policy":{"ttl":10000}}`;
  for (const path of [`/v2/${ep}/run`, `/v2/${ep}/runsync?wait=1000`]) {
    t.equal((await submit(a, path, nested(512))).status, 200, `${path}: 512 levels accepted`);
    const r = await submit(a, path, nested(513));
    assertProblem(t, r, 400, `${path}: 513 levels refused`);
    t.match(r.json.detail, /nests 513 levels .*more than the 512 allowed/);
    t.same(r.json.errors.length, 1);
    t.match(r.json.errors[0], /^\/input: nests 513 levels/);
    const deep = await submit(a, path, `{"input":{"a":${'['.repeat(1199)}${']'.repeat(1199)}}}`);
    assertProblem(t, deep, 400, `${path}: 1200 levels refused`);
    t.match(deep.json.errors, [/^\/input: nests 1200 levels/]);
  }
  // Whitespace and strings full of brackets do not count.
  const br = await submit(a, `/v2/${ep}/run`, `{ "input" : { "s" : "${'['.repeat(2000)}" , "b" : [ { "c" : "}}}" } ] } }`);
  t.equal(br.status, 200, `brackets in strings are text: ${br.text}`);
});

t.test('/stream ?wait takes 0 to 300000 as RunPod\'s Go SDK sends it; a malformed one is the 400 /status-sync gives', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  const job = await w.take();
  await w.done(job!.id, { output: 'ok' });
  // The Go SDK's Stream() sends its timeout in ms, 90000 at most (0 when told 0), by POST.
  for (const wait of ['0', '1000', '90000', '300000']) {
    for (const method of ['GET', 'POST']) {
      const r = await a.req(method, `/v2/${ep}/stream/${id}?wait=${wait}`);
      t.equal(r.status, 200, `${method} wait=${wait} accepted`);
      t.equal(r.json.status, 'COMPLETED', `${method} wait=${wait}: a finished job, at once`);
    }
  }
  for (const wait of ['abc', '-5', '1e9', '', '1.5', '300001', '1000000000']) {
    for (const method of ['GET', 'POST']) {
      const r = await a.req(method, `/v2/${ep}/stream/${id}?wait=${wait}`);
      assertProblem(t, r, 400, `${method} wait=${wait} refused`);
      t.equal(r.json.detail, '?wait must be an integer from 0 to 300000 (milliseconds).', `${method} wait=${wait}: names the parameter and its range`);
      t.same(r.json.errors, ['?wait: must be an integer from 0 to 300000'], `${method} wait=${wait}: errors`);
    }
  }
  const twice = await a.req('GET', `/v2/${ep}/stream/${id}?wait=0&wait=1000`);
  assertProblem(t, twice, 400, 'wait twice refused');
  t.match(twice.json.detail, /^\?wait was given 2 times; give it once/, 'wait twice: says so');
  // The same shape of reply as /status-sync's.
  const sync = await a.req('GET', `/v2/${ep}/status-sync/${id}?wait=abc`);
  assertProblem(t, sync, 400, 'status-sync wait=abc');
  t.same(sync.json.errors, ['?wait: must be an integer from 1000 to 300000'], '/status-sync names its own range');
});
