/**
 * Error bodies (spec, "Errors"): every non-2xx is application/problem+json with type, title,
 * status, detail, instance (the request id) and code; validation failures add errors[] of
 * JSON-pointer strings. (Transport cases — 404/405/415/413/500 — are also in server.test.ts.)
 */
import t from 'tap';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { ERROR_CODES } from '../../src/core/errors.js';
import { ManualClock } from '../../src/core/clock.js';
import { ADMIN_KEY, assertProblem, cpuBody, queueBody, startAgent, type Reply } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { makeRegistry, makeTemplate, makeUser, mustCreate, mustPost } from '../helpers/expect.js';

t.test('problem members on every kind of failure', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { rateLimitMinute: 40 }, { clock });
  const cases: [string, Promise<Reply>, number, string][] = [
    ['unknown route', a.req('GET', '/v2/nothing/here/at/all'), 404, 'ROUTE_NOT_FOUND'],
    ['wrong method', a.req('PUT', '/v2/serverless/abcdefghijklmn', { body: {} }), 405, 'METHOD_NOT_ALLOWED'],
    ['bad JSON', a.req('POST', '/v2/serverless', { raw: '{', headers: { 'content-type': 'application/json' } }), 400, 'INVALID_JSON'],
    ['wrong content type', a.req('POST', '/v2/serverless', { raw: '{}', headers: { 'content-type': 'application/x-www-form-urlencoded' } }), 415, 'UNSUPPORTED_MEDIA_TYPE'],
    ['validation', a.req('POST', '/v2/serverless', { body: queueBody({ name: '' }) }), 400, 'VALIDATION_FAILED'],
    ['CUDA on CPU', a.req('POST', '/v2/serverless', { body: cpuBody({ minCudaVersion: '12.1' }) }), 422, 'UNPROCESSABLE'],
    ['not found', a.req('GET', '/v2/serverless/abcdefghijklmn'), 404, 'NOT_FOUND'],
    ['unauthenticated', a.req('GET', '/v2/serverless', { key: null }), 401, 'UNAUTHENTICATED'],
  ];
  for (const [label, pending, status, code] of cases) {
    const r = await pending;
    assertProblem(t, r, status, `${label}: ${status}`);
    t.equal(r.json.code, code, `${label}: code ${code}`);
    t.equal(r.json.title, ERROR_CODES[code as keyof typeof ERROR_CODES].title, `${label}: the title of its code`);
    t.match(r.json.type, /^https:\/\//, `${label}: type is a URI`);
    t.ok(r.json.detail.length > 0, `${label}: a detail`);
    t.equal(r.json.instance, r.headers.get('x-request-id'), `${label}: instance is the request id`);
  }
  const types = new Set((await Promise.all(cases.map(([, p]) => p))).map((r) => `${r.json.code} ${r.json.type}`));
  t.equal(new Set([...types].map((x) => x.split(' ')[1])).size, new Set([...types].map((x) => x.split(' ')[0])).size, 'one stable type URI per code');

  const mine = await a.req('POST', '/v2/serverless', { body: { name: 1 }, headers: { 'x-request-id': 'trace-123.abc' } });
  t.equal(mine.headers.get('x-request-id'), 'trace-123.abc', 'a client request id is kept');
  t.equal(mine.json.instance, 'trace-123.abc', 'and is the instance');
  const weird = await a.req('GET', '/v2/serverless/abcdefghijklmn', { headers: { 'x-request-id': 'has spaces and <tags>' } });
  t.not(weird.json.instance, 'has spaces and <tags>', 'an unsafe request id is replaced');
  const ok = await a.req('GET', '/v2/serverless');
  t.equal(ok.status, 200);
  t.equal(ok.headers.get('x-request-id'), null, 'a success carries no request id the client did not send');
  const okMine = await a.req('GET', '/v2/serverless', { headers: { 'x-request-id': 'trace-ok' } });
  t.equal(okMine.headers.get('x-request-id'), 'trace-ok', 'a client request id is echoed on success too');

  const v = await a.req('POST', '/v2/serverless', { body: { type: 'QUEUE', gpu: { pools: ['ADA_24'], extra: 1 } } });
  t.ok(Array.isArray(v.json.errors) && v.json.errors.length >= 3, 'validation failures come as errors[]');
  t.ok(v.json.errors.every((e: string) => typeof e === 'string' && /^\/[^:]*: ./.test(e)), `each starts with a JSON pointer: ${JSON.stringify(v.json.errors)}`);
  t.same((await a.req('GET', '/v2/serverless/abcdefghijklmn')).json.errors, [], 'errors[] is empty where nothing was validated');

  for (let i = 0; i < 40; i++) await a.req('GET', '/v2/serverless');
  const limited = await a.req('GET', '/v2/serverless');
  assertProblem(t, limited, 429);
  t.equal(limited.json.type, 'https://iana.org/assignments/http-problem-types#quota-exceeded', '429 uses the IANA quota-exceeded type');
  t.same(limited.json['violated-policies'], ['minute']);
});

t.test('a malformed JSON body is not quoted back in the problem', async (t) => {
  const a = await startAgent(t);
  const bodies = [
    '{"name":"reg","username":"bob","password":SECRET-PASSWORD-1}',
    'password=SECRET-PASSWORD-2',
    '{"input":{"apiKey":"SECRET-KEY-3"},]',
  ];
  for (const raw of bodies) {
    const r = await a.req('POST', '/v2/registry-credentials', { raw, headers: { 'content-type': 'application/json' } });
    assertProblem(t, r, 400);
    t.equal(r.json.code, 'INVALID_JSON');
    t.notMatch(r.text, /SECRET|password|apiKey/, `nothing of the body in the reply: ${r.json.detail}`);
  }
  const r = await a.req('POST', '/v2/registry-credentials', { raw: '{"name":"x",', headers: { 'content-type': 'application/json' } });
  t.match(r.json.detail, /Unexpected end of JSON input|at position \d+/, 'a position or the end of input is still named');
  t.notOk(a.logs.some((l) => /SECRET/.test(l)), 'nor in the log');
});

t.test('a body that is not UTF-8 is refused, not stored with replacement characters', async (t) => {
  const a = await startAgent(t, { jobRateLimitPercent: 0 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const bytes = Buffer.concat([Buffer.from('{"input":{"s":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}}')]);
  for (const path of [`/v2/${ep}/run`, `/v2/${ep}/runsync?wait=1000`, '/v2/templates']) {
    const res = await fetch(a.url + path, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, body: bytes });
    const text = await res.text();
    const r: Reply = { status: res.status, headers: res.headers, text, json: JSON.parse(text) };
    assertProblem(t, r, 400, `${path}: 400`);
    t.equal(r.json.code, 'INVALID_JSON');
    t.match(r.json.detail, /UTF-8/);
  }
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.jobs, { completed: 0, failed: 0, inProgress: 0, inQueue: 0, retried: 0 }, 'no job was queued');
  const ok = await a.req('POST', `/v2/${ep}/run`, { body: { input: { s: 'é ✓ 😀' } } });
  t.equal(ok.status, 200, 'UTF-8 text beyond ASCII is taken');
});

t.test('a body that starts with a UTF-8 byte order mark is read without it', async (t) => {
  const a = await startAgent(t, { jobRateLimitPercent: 0, takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const bom = '\ufeff';
  const run = await a.req('POST', `/v2/${ep}/run`, { raw: `${bom}{"input":{"n":1}}`, headers: { 'content-type': 'application/json' } });
  t.equal(run.status, 200, `/run: ${run.text}`);
  const w = await TestWorker.create(a, ep);
  const job = await w.take();
  t.equal(job?.id, run.json.id);
  t.same(job?.input, { n: 1 }, 'the worker gets the input');
  const tpl = await a.req('POST', '/v2/templates', { raw: `${bom}{"name":"bom","image":"x/y:1"}`, headers: { 'content-type': 'application/json' } });
  t.equal(tpl.status, 201, `a management create: ${tpl.text}`);
  const twice = await a.req('POST', `/v2/${ep}/run`, { raw: `${bom}${bom}{"input":{}}`, headers: { 'content-type': 'application/json' } });
  assertProblem(t, twice, 400, 'only one mark is ignored');
});

t.test('a compressed body (Content-Encoding) is refused with 415 saying to send it uncompressed; nothing is queued', async (t) => {
  const a = await startAgent(t, { jobRateLimitPercent: 0 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const plain = '{"input":{"n":1}}';
  const z = (b: Buffer): Uint8Array<ArrayBuffer> => new Uint8Array(b);
  const cases: [string, string, Uint8Array<ArrayBuffer> | string][] = [
    [`/v2/${ep}/run`, 'gzip', z(gzipSync(plain))],
    [`/v2/${ep}/runsync?wait=1000`, 'gzip', z(gzipSync(plain))],
    [`/v2/${ep}/run`, 'deflate', z(deflateSync(plain))],
    [`/v2/${ep}/run`, 'br', z(brotliCompressSync(plain))],
    // Labelled compressed but sent plain: was queued as if uncompressed.
    [`/v2/${ep}/run`, 'gzip', plain],
    ['/v2/templates', 'gzip', z(gzipSync('{"name":"t","image":"x/y:1"}'))],
  ];
  for (const [path, coding, body] of cases) {
    const res = await fetch(a.url + path, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', 'content-encoding': coding }, body });
    const text = await res.text();
    const r: Reply = { status: res.status, headers: res.headers, text, json: JSON.parse(text) };
    assertProblem(t, r, 415, `${path} ${coding}: 415`);
    t.equal(r.json.code, 'UNSUPPORTED_MEDIA_TYPE');
    t.equal(r.json.detail, `Content-Encoding "${coding}" is not supported: send the body uncompressed, without a Content-Encoding header.`);
    t.equal(r.headers.get('accept-encoding'), 'identity', 'Accept-Encoding names what is taken');
  }
  t.same((await a.req('GET', `/v2/${ep}/health`)).json.jobs, { completed: 0, failed: 0, inProgress: 0, inQueue: 0, retried: 0 }, 'no job was queued');
  t.equal((await a.req('POST', `/v2/${ep}/run`, { raw: plain, headers: { 'content-type': 'application/json', 'content-encoding': 'identity' } })).status, 200, 'identity is no coding');
  t.equal((await a.req('POST', `/v2/${ep}/cancel/nope`, { raw: '', headers: { 'content-encoding': 'gzip' } })).status, 404, 'a coding on an empty body changes nothing');
});

t.test('a member that may also be null is not reported as "must be null" when its value is wrong', async (t) => {
  const a = await startAgent(t);
  const ep = await a.req('POST', '/v2/serverless', { body: queueBody() });
  t.equal(ep.status, 201);
  const id = ep.json.id as string;
  const cases: [string, Record<string, unknown>, string[]][] = [
    ['policy member out of range', { input: {}, policy: { executionTimeout: 1000 } }, ['/policy/executionTimeout: must be >= 5000 (5 s): it is in milliseconds, so 1000 is 1 s; did you mean 1000000?']],
    ['policy member of the wrong type', { input: {}, policy: { ttl: 'x', foo: 1 } }, ['/policy/ttl: must be integer or null']],
    ['policy of the wrong type', { input: {}, policy: 5 }, ['/policy: must be object or null']],
  ];
  for (const [label, body, errors] of cases) {
    const r = await a.req('POST', `/v2/${id}/run`, { body });
    assertProblem(t, r, 400, label);
    t.same(r.json.errors, errors, `${label}: ${JSON.stringify(r.json.errors)}`);
    t.equal(r.json.detail, errors[0], `${label}: the detail is that one error`);
  }
  const cuda = await a.req('POST', '/v2/serverless', { body: queueBody({ gpu: { pools: ['ADA_24'], minCudaVersion: 'abc' } }) });
  assertProblem(t, cuda, 400);
  t.same(cuda.json.errors, ['/gpu/minCudaVersion: must match pattern "^\\d+\\.\\d+$"'], `minCudaVersion: ${JSON.stringify(cuda.json.errors)}`);
  const nul = await a.req('POST', `/v2/${id}/run`, { body: { input: {}, policy: null } });
  t.equal(nul.status, 200, 'policy null is still accepted');
});

t.test('length and count limits read as sentences, not as Ajv\'s "must NOT have fewer than 1 characters"', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json.id as string;
  const empty = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: '' } });
  assertProblem(t, empty, 400);
  t.same(empty.json.errors, ['/webhook: must not be empty']);
  const long = await a.req('POST', '/v2/serverless', { body: cpuBody({ name: 'a'.repeat(300), cpu: [] }) });
  assertProblem(t, long, 400);
  t.same(long.json.errors, ['/name: must be at most 191 characters long', '/cpu: must not be empty']);
});

t.test('a 404 says "not found" once, in its detail and in each errors[] entry', async (t) => {
  const a = await startAgent(t);
  const owner = await makeUser(t, a, 'nf-owner');
  const caller = await makeUser(t, a, 'nf-caller');
  const ep = await mustCreate(t, a, queueBody());
  const team = await mustPost(t, a, '/v2/teams', { name: 'nf-team' });
  const ownerReg = await makeRegistry(t, a, { name: 'owner-reg' }, owner.key);
  const pubWithReg = await makeTemplate(t, a, { name: 'public-private-image', isPublic: true, registry: ownerReg.id }, owner.key);
  const unknown = 'zz_unknown0000000000000';
  const job = 'job_unknown000000000000';
  const cases: [string, Promise<Reply>][] = [];
  for (const path of ['/v2/serverless', '/v2/templates', '/v2/network-volumes', '/v2/global-volumes', '/v2/registry-credentials', '/v2/api-keys']) {
    cases.push([`GET ${path}/{unknown}`, a.req('GET', `${path}/${unknown}`)]);
    cases.push([`PATCH ${path}/{unknown}`, a.req('PATCH', `${path}/${unknown}`, { body: { name: 'x' } })]);
    cases.push([`DELETE ${path}/{unknown}`, a.req('DELETE', `${path}/${unknown}`)]);
  }
  cases.push(
    ['GET /v1/endpoints/{unknown}', a.req('GET', `/v1/endpoints/${unknown}`)],
    ['GET /v2/teams/{unknown}', a.req('GET', `/v2/teams/${unknown}`)],
    ['POST /v2/teams/{id}/members, unknown user', a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: 'usr_unknown000000000000' } })],
    ['DELETE /v2/teams/{id}/members/{unknown}', a.req('DELETE', `/v2/teams/${team.id}/members/usr_unknown000000000000`)],
    ['POST /v2/api-keys, unknown user', a.req('POST', '/v2/api-keys', { body: { name: 'k', scopes: ['jobs:run'], userId: 'usr_unknown000000000000' } })],
    ['GET /v2/serverless/{unknown}/logs', a.req('GET', `/v2/serverless/${unknown}/logs`)],
    ['POST /v2/{unknown}/run', a.req('POST', `/v2/${unknown}/run`, { body: { input: {} } })],
    ['GET /v2/{unknown}/health', a.req('GET', `/v2/${unknown}/health`)],
    ['an unknown template', a.req('POST', '/v2/serverless', { body: queueBody({ templateId: 'tpl_unknown000000000000' }) })],
    ['an unknown registry credential', a.req('POST', '/v2/serverless', { body: queueBody({ registry: 'reg_unknown000000000000' }) })],
    ['unknown volumes', a.req('POST', '/v2/serverless', { body: queueBody({ mounts: { network: [{ volumeId: 'nv_unknown000000000000' }] } }) })],
    ["a public template's credential another account cannot use", a.req('POST', '/v2/serverless', { body: queueBody({ templateId: pubWithReg.id, image: undefined }), key: caller.key })],
    ["the same, with an unknown volume too", a.req('POST', '/v2/serverless', { body: queueBody({ templateId: pubWithReg.id, image: undefined, mounts: { network: [{ volumeId: 'nv_unknown000000000000' }] } }), key: caller.key })],
  );
  for (const op of ['status', 'status-sync', 'stream']) {
    cases.push([`GET /v2/{id}/${op}/{unknown job}`, a.req('GET', `/v2/${ep.id}/${op}/${job}`)]);
    cases.push([`GET /v2/{unknown}/${op}/{job}`, a.req('GET', `/v2/${unknown}/${op}/${job}`)]);
  }
  for (const op of ['cancel', 'retry']) {
    cases.push([`POST /v2/{id}/${op}/{unknown job}`, a.req('POST', `/v2/${ep.id}/${op}/${job}`)]);
    cases.push([`POST /v2/{unknown}/${op}/{job}`, a.req('POST', `/v2/${unknown}/${op}/${job}`)]);
  }
  const twice = /not found[\s\S]*not found/i;
  for (const [label, pending] of cases) {
    const r = await pending;
    assertProblem(t, r, 404, `${label}: 404 ${r.text.slice(0, 300)}`);
    t.notMatch(r.json.detail, twice, `${label}: the detail says it once: ${r.json.detail}`);
    for (const e of r.json.errors as string[]) t.notMatch(e, twice, `${label}: errors[] says it once: ${e}`);
  }
  const viaTemplate = await cases.find(([label]) => label.startsWith("a public template's"))![1];
  t.equal(viaTemplate.json.detail, `Not found or not accessible: the template's registry credential ${ownerReg.id} (set registry, or null, in the body).`);
  t.same(viaTemplate.json.errors, [`/templateId: the template's registry credential ${ownerReg.id} not found or not accessible; set registry, or null, in the body`]);
  const both = await cases.find(([label]) => label.startsWith('the same, with'))![1];
  t.equal(both.json.detail, `Not found or not accessible: network volume nv_unknown000000000000, the template's registry credential ${ownerReg.id} (set registry, or null, in the body).`, 'several missing references in one detail');
});

t.test('an id from the URL is repeated in a problem detail cut to 64 characters, not whole', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const long = 'a'.repeat(100_000);
  const cut = `${'a'.repeat(64)}…`;
  const done = await a.req('POST', w.postUrl('done', long).replace(a.url, ''), { key: w.key, body: { output: 1 } });
  assertProblem(t, done, 404);
  t.equal(done.json.detail, `Job ${cut} not found.`);
  t.ok(done.text.length < 2000, `the reply is small (${done.text.length} characters)`);
  const status = await a.req('GET', `/v2/${ep}/status/${long}`);
  assertProblem(t, status, 404);
  t.notOk(status.json.detail.includes('a'.repeat(65)), status.json.detail.slice(0, 200));
  const endpoint = await a.req('POST', `/v2/${long}/run`, { body: { input: {} } });
  assertProblem(t, endpoint, 404);
  t.ok(endpoint.text.length < 2000, `an endpoint id too (${endpoint.text.length} characters)`);
  const route = await a.req('GET', `/v2/nothing/${long}/x`);
  assertProblem(t, route, 404);
  t.ok(route.text.length < 2000, `an unknown route's path too (${route.text.length} characters)`);
  const short = await a.req('GET', `/v2/${ep}/status/${'b'.repeat(64)}`);
  t.match(short.json.detail, 'b'.repeat(64), 'an id of 64 characters is repeated whole');
});

t.test('a 405 repeats the request path cut to 256 characters, as the 404 of an unknown route does', async (t) => {
  const a = await startAgent(t);
  const long = 'a'.repeat(100_000);
  const cut = `/v2/serverless/${'a'.repeat(256 - '/v2/serverless/'.length)}…`;
  const put = await a.req('PUT', `/v2/serverless/${long}`, { body: {} });
  assertProblem(t, put, 405);
  t.equal(put.json.detail, `PUT is not allowed on ${cut}; allowed: GET, PATCH, DELETE, HEAD.`);
  t.ok(put.text.length < 2000, `the reply is small (${put.text.length} characters)`);
  t.equal(put.headers.get('allow'), 'GET, PATCH, DELETE, HEAD', 'the Allow header is unchanged');
  // A HEAD the route refuses (its GET hands out chunks that a reply without a body would lose):
  // the body is not sent, but its Content-Length says how long the detail is.
  const head = await fetch(`${a.url}/v2/x/stream/${long}`, { method: 'HEAD', headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(head.status, 405, 'HEAD on a route that refuses it: 405');
  t.ok(Number(head.headers.get('content-length')) < 2000, `the HEAD's problem is small too (Content-Length ${head.headers.get('content-length')})`);
  const short = await a.req('PUT', '/v2/serverless/abcdefghijklmn', { body: {} });
  t.match(short.json.detail, 'PUT is not allowed on /v2/serverless/abcdefghijklmn;', 'a short path is repeated whole');
});

t.test('an empty id in the path (an unset shell variable) is a 404 that says so, not another route\'s', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  // Collapsed, `/v2/serverless//worker-env` was GET /v2/serverless/{endpointId} with the id
  // "worker-env": `Endpoint worker-env not found.`, which points at the wrong cause.
  const cases: [string, string, string][] = [
    ['GET', '/v2/serverless//worker-env', 'endpoint id'],
    ['GET', '/v2/serverless//logs', 'endpoint id'],
    ['HEAD', '/v2/serverless//logs', 'endpoint id'],
    ['PATCH', '/v2/serverless//', 'endpoint id'],
    ['POST', '/v2//run', 'endpoint id'],
    ['GET', '/v2//status/abc', 'endpoint id'],
    ['GET', '/v2//health', 'endpoint id'],
    ['GET', `/v2/${ep}/status//`, 'job id'],
    ['POST', `/v2/${ep}/job-done//abc`, 'worker id'],
    // A trailing slash where the last id should be: README's `curl $FLASHD/v2/$EP/status/$JOB`
    // with JOB unset was `No route for GET /v2/…/status/.`, and `DELETE /v2/serverless/$EP` with
    // EP unset a 405 of the endpoint list.
    ['GET', `/v2/${ep}/status/`, 'job id'],
    ['GET', `/v2/${ep}/stream/`, 'job id'],
    ['POST', `/v2/${ep}/cancel/`, 'job id'],
    ['POST', `/v2/${ep}/retry/`, 'job id'],
    ['DELETE', '/v2/serverless/', 'endpoint id'],
    ['PATCH', '/v2/serverless/', 'endpoint id'],
  ];
  for (const [method, path, what] of cases) {
    const r = await a.req(method, path, method === 'POST' || method === 'PATCH' ? { body: {} } : {});
    t.equal(r.status, 404, `${method} ${path}: 404`);
    if (method === 'HEAD') continue;
    assertProblem(t, r, 404, `${method} ${path}`);
    t.equal(r.json.detail, `The ${what} in the path is empty (${method} ${path}): was the variable that should hold it unset?`, `${method} ${path}: names the empty ${what}`);
  }
  t.equal((await a.req('GET', '/v2//serverless')).status, 200, 'a doubled slash elsewhere still collapses');
  t.equal((await a.req('GET', `/v2/serverless//${ep}`)).status, 200, 'and so does one before a non-empty id');
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs/`)).status, 200, 'a trailing slash is still ignored');
  t.equal((await a.req('GET', '/v2/serverless/')).status, 200, 'the endpoint list answers with a trailing slash too');
  t.equal((await a.req('POST', `/v2/${ep}/run/`, { body: { input: {} } })).status, 200, 'as does /run');
});

t.test('an unknown route that is a near miss of a real one names it: /runSync, /purgeQueue, /v2/serverless/{id}/run', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  // requestUrls names them runSync and purgeQueue; RunPod's paths are /runsync and /purge-queue.
  const cases: [string, string, string][] = [
    ['POST', `/v2/${ep}/runSync`, `POST /v2/${ep}/runsync`],
    ['POST', `/v2/${ep}/purgeQueue`, `POST /v2/${ep}/purge-queue`],
    ['GET', `/v2/${ep}/statusSync/abc`, `GET /v2/${ep}/status-sync/abc`],
    ['POST', `/v2/${ep}/RUN`, `POST /v2/${ep}/run`],
    // The job routes are not under /v2/serverless, and not under /v1 or without /v2.
    ['POST', `/v2/serverless/${ep}/run`, `POST /v2/${ep}/run`],
    ['GET', `/v2/serverless/${ep}/status/abc`, `GET /v2/${ep}/status/abc`],
    ['POST', `/v1/${ep}/runsync`, `POST /v2/${ep}/runsync`],
    ['GET', `/${ep}/health`, `GET /v2/${ep}/health`],
    ['GET', '/v2/Serverless', 'GET /v2/serverless'],
    ['GET', '/v2/api_keys', 'GET /v2/api-keys'],
  ];
  for (const [method, path, meant] of cases) {
    const r = await a.req(method, path, method === 'POST' ? { body: { input: {} } } : {});
    assertProblem(t, r, 404, `${method} ${path}`);
    t.equal(r.json.detail, `No route for ${method} ${path}; did you mean ${meant}?`, `${method} ${path}: names ${meant}`);
  }
  const far = await a.req('GET', '/v2/nothing/here/at/all');
  t.equal(far.json.detail, 'No route for GET /v2/nothing/here/at/all.', 'nothing near: no suggestion');
});

t.test('a body sent as curl -d sends it (form-urlencoded) gets a 415 that names the header to add', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  for (const path of ['/v2/serverless', `/v2/${ep}/run`]) {
    const r = await a.req('POST', path, { raw: '{"input":{}}', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    assertProblem(t, r, 415, path);
    t.equal(r.json.detail, 'Send the body as application/json (got "application/x-www-form-urlencoded", what curl -d sends unless given -H \'Content-Type: application/json\').', `${path}: says which header curl needs`);
  }
  const plain = await a.req('POST', `/v2/${ep}/run`, { raw: '{"input":{}}', headers: { 'content-type': 'text/plain' } });
  t.equal(plain.json.detail, 'Send the body as application/json (got "text/plain").', 'another type: as before');
});
