/**
 * Error replies of the queue job API and the worker routes, as a new user meets them: the
 * status, a detail that says what was wrong and what to send, errors[] pointing at the place.
 */
import t from 'tap';
import { assertProblem, queueBody, startAgent } from '../helpers/agent.js';

t.test('job routes on a LOAD_BALANCER endpoint say it takes no jobs, not where to send them', async (t) => {
  const a = await startAgent(t);
  const lb = await a.req('POST', '/v2/serverless', { body: queueBody({ name: 'lb', type: 'LOAD_BALANCER', scaling: { type: 'REQUEST_COUNT', requestCount: 4 } }) });
  t.equal(lb.status, 201, lb.text);
  for (const [method, path] of [['POST', 'run'], ['POST', 'runsync'], ['GET', 'status/abc'], ['POST', 'cancel/abc'], ['GET', 'health']] as const) {
    const r = await a.req(method, `/v2/${lb.json.id}/${path}`, method === 'POST' ? { body: { input: {} } } : {});
    assertProblem(t, r, 400, `${method} /${path}`);
    t.match(r.json.detail, new RegExp(`^Endpoint ${lb.json.id} is a LOAD_BALANCER endpoint: only QUEUE endpoints take jobs`), `${path}: says why`);
    t.notMatch(r.json.detail, /requestUrls\.base instead/, `${path}: does not send the client to a URL flashd does not route`);
    t.match(r.json.detail, /does not route load-balancing traffic yet/, `${path}: says that base is not served either`);
  }
});

t.test('a body with more after its JSON value says so and where, not "Syntax error"', async (t) => {
  const a = await startAgent(t);
  const ep = await a.req('POST', '/v2/serverless', { body: queueBody() });
  const headers = { 'content-type': 'application/json' };
  for (const [raw, at] of [['{"input":{}} x', 13], ['{"input":{}}{"input":{"n":2}}', 12]] as const) {
    const r = await a.req('POST', `/v2/${ep.json.id}/run`, { raw, headers });
    assertProblem(t, r, 400, raw);
    t.equal(r.json.code, 'INVALID_JSON');
    // Newer V8 adds " (line 1 column N)".
    t.match(r.json.detail, new RegExp(`^The body is not valid JSON: Unexpected non-whitespace character after JSON at position ${at}(?: \\(line 1 column ${at + 1}\\))?\\.$`), `${raw}: what and where`);
  }
  const health = await a.req('GET', `/v2/${ep.json.id}/health`);
  t.equal(health.json.jobs.inQueue, 0, 'no job was queued');
});

t.test('a worker post that is not a JSON object says what is wrong and what to send; the job goes on', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json.id as string;
  const env = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json;
  const key = env.env.RUNPOD_AI_API_KEY as string;
  const wid = env.workerId as string;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  const taken = await a.req('GET', `/v2/${ep}/job-take/${wid}?gpu=gpu`, { key });
  t.equal(taken.json?.id, job, 'the worker holds the job');
  const form = { 'content-type': 'application/x-www-form-urlencoded' };
  const cases: [string, string, RegExp][] = [
    ['job-done', '{"output": 1', /^The result body is not valid JSON: (?:Unexpected end of JSON input|Expected ',' or '}' after property value in JSON at position 12)\. Send a JSON object: \{"output": …\}, \{"error": "…"\} or a progress update \{"status": "IN_PROGRESS", "output": …\}\.$/],
    ['job-done', 'done', /^The result body is not valid JSON: Unexpected token\. Send a JSON object: \{"output": …\}/],
    ['job-done', '[1, 2]', /^The result body must be a JSON object, not an array\. Send \{"output": …\}, \{"error": "…"\}/],
    ['job-done', '"ok"', /^The result body must be a JSON object, not a string\./],
    ['job-done', 'null', /^The result body must be a JSON object, not null\./],
    ['job-stream', '{"output": "a"', /^The stream chunk body is not valid JSON: .*\. Send a JSON object: \{"output": …\}\.$/],
    ['job-stream', '7', /^The stream chunk body must be a JSON object, not a number\. Send \{"output": …\}\.$/],
  ];
  for (const [route, raw, detail] of cases) {
    const r = await a.req('POST', `/v2/${ep}/${route}/${wid}/${job}?gpu=gpu&isStream=false`, { raw, key, headers: form });
    assertProblem(t, r, 400, `${route} ${raw}`);
    t.equal(r.json.code, 'INVALID_JSON', `${route} ${raw}: code`);
    t.match(r.json.detail, detail, `${route} ${raw}: detail`);
    const s = await a.req('GET', `/v2/${ep}/status/${job}`);
    t.equal(s.json.status, 'IN_PROGRESS', `${route} ${raw}: the job is still held by the worker`);
  }
  const ok = await a.req('POST', `/v2/${ep}/job-done/${wid}/${job}?gpu=gpu&isStream=false`, { raw: '{"output": 1}', key, headers: form });
  t.same(ok.json, { ok: true }, 'its valid result is then taken');
  const s = await a.req('GET', `/v2/${ep}/status/${job}`);
  t.same([s.json.status, s.json.output], ['COMPLETED', 1]);
});

t.test('a stream chunk with no output member (an error posted to job-stream, an empty body) is refused with a 400 saying what to send; {"output": null} is a chunk', async (t) => {
  // runpod-python and the Python SDK post every yield as {"output": v} ({"output": null} for None)
  // and an error that ends the job to job-done: a job-stream body without `output` is a worker bug.
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json.id as string;
  const env = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json;
  const key = env.env.RUNPOD_AI_API_KEY as string;
  const wid = env.workerId as string;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await a.req('GET', `/v2/${ep}/job-take/${wid}?gpu=gpu`, { key })).json?.id, job, 'the worker holds the job');
  const form = { 'content-type': 'application/x-www-form-urlencoded' };
  const cases: [string, string][] = [
    ['{"error": "x"}', 'The stream chunk body has no "output" member (it has "error"). Send {"output": …} ({"output": null} for a null chunk); an error that ends the job goes to job-done as {"error": "…"}.'],
    ['{"notoutput": 1, "metrics": {}}', 'The stream chunk body has no "output" member (it has "notoutput", "metrics"). Send {"output": …} ({"output": null} for a null chunk); an error that ends the job goes to job-done as {"error": "…"}.'],
    ['{}', 'The stream chunk body has no "output" member (it has none). Send {"output": …} ({"output": null} for a null chunk); an error that ends the job goes to job-done as {"error": "…"}.'],
    ['', 'The stream chunk body is empty. Send {"output": …} ({"output": null} for a null chunk); an error that ends the job goes to job-done as {"error": "…"}.'],
  ];
  for (const [raw, detail] of cases) {
    const r = await a.req('POST', `/v2/${ep}/job-stream/${wid}/${job}?gpu=gpu&isStream=false`, { raw, key, headers: form });
    assertProblem(t, r, 400, `job-stream ${raw || '(empty)'}`);
    t.equal(r.json.detail, detail, `${raw || '(empty)'}: detail`);
  }
  const ok = await a.req('POST', `/v2/${ep}/job-stream/${wid}/${job}?gpu=gpu&isStream=false`, { raw: '{"output": null}', key, headers: form });
  t.same(ok.json, { ok: true }, '{"output": null} is taken');
  const s = await a.req('GET', `/v2/${ep}/stream/${job}`);
  t.same([s.json.status, s.json.stream], ['IN_PROGRESS', [{ output: null }]], 'only the null chunk was stored; the job goes on');
});

t.test('?wait and ?ttl given twice are refused, whichever of the two is wrong; nothing is queued', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json.id as string;
  for (const query of ['wait=1000&wait=abc', 'wait=abc&wait=2000', 'wait=1000&wait=2000']) {
    const r = await a.req('POST', `/v2/${ep}/runsync?${query}`, { body: { input: {} } });
    assertProblem(t, r, 400, query);
    t.equal(r.json.detail, '?wait was given 2 times; give it once, an integer from 1000 to 300000 (milliseconds).', `${query}: detail`);
    t.same(r.json.errors, ['?wait: was given 2 times; give it once'], `${query}: errors`);
  }
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 0, 'no job was queued');
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  const r = await a.req('GET', `/v2/${ep}/status/${job}?ttl=5000&ttl=x`);
  assertProblem(t, r, 400, 'ttl twice');
  t.equal(r.json.detail, '?ttl was given 2 times; give it once, an integer from 1000 to 604800000 (milliseconds).');
  const sync = await a.req('GET', `/v2/${ep}/status-sync/${job}?wait=1000&wait=1000`);
  assertProblem(t, sync, 400, 'status-sync wait twice');
  t.equal((await a.req('GET', `/v2/${ep}/status/${job}?ttl=5000`)).status, 200, 'once is fine');
});

t.test('a body on /cancel, /retry, /purge-queue and the POSTed reads is ignored, as they read none (curl -X POST -d x)', async (t) => {
  // No quotas: /purge-queue takes 2 per 10 s.
  const a = await startAgent(t, { jobRateLimitPercent: 0 });
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json.id as string;
  const bodies: [string, Record<string, string>][] = [
    ['x', { 'content-type': 'application/x-www-form-urlencoded' }], // curl -d x
    ['x', { 'content-type': 'text/plain' }],
    ['{', { 'content-type': 'application/json' }],
    ['\xff', {}],
    ['{"input":{}}', { 'content-type': 'application/json', 'content-encoding': 'gzip' }],
  ];
  for (const [raw, headers] of bodies) {
    const what = `${JSON.stringify(raw)} ${JSON.stringify(headers)}`;
    const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
    const status = await a.req('POST', `/v2/${ep}/status/${job}`, { raw, headers });
    t.equal(status.status, 200, `POST /status with ${what}: ${status.text}`);
    t.equal(status.json.status, 'IN_QUEUE', `POST /status with ${what}: the job's status`);
    t.equal((await a.req('POST', `/v2/${ep}/stream/${job}`, { raw, headers })).status, 200, `POST /stream with ${what}`);
    t.equal((await a.req('POST', `/v2/${ep}/status-sync/${job}?wait=1000`, { raw, headers })).status, 200, `POST /status-sync with ${what}`);
    const cancel = await a.req('POST', `/v2/${ep}/cancel/${job}`, { raw, headers });
    t.equal(cancel.status, 200, `cancel with ${what}: ${cancel.text}`);
    t.same(cancel.json, { id: job, status: 'CANCELLED' }, `cancel with ${what}: cancelled`);
    const retry = await a.req('POST', `/v2/${ep}/retry/${job}`, { raw, headers });
    t.equal(retry.status, 409, `retry with ${what}: the 409 of a CANCELLED job, not a complaint about the body: ${retry.text}`);
    const purge = await a.req('POST', `/v2/${ep}/purge-queue`, { raw, headers });
    t.equal(purge.status, 200, `purge-queue with ${what}: ${purge.text}`);
  }
});

t.test('a near miss of a job route\'s query parameter (?wiat, ?wait_ms, ?tll) is served as before, with a Flashd-Hint header naming it', async (t) => {
  const a = await startAgent(t, { jobRateLimitPercent: 0 });
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json.id as string;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${job}`)).status, 200, 'the job has ended: the waits below answer at once');
  const cases: [string, string, string][] = [
    ['GET', `status/${job}?tll=5000`, '?tll is no parameter of this route and was ignored; did you mean ?ttl?'],
    ['GET', `status/${job}?ttl_ms=5000`, '?ttl_ms is no parameter of this route and was ignored; did you mean ?ttl?'],
    ['GET', `status-sync/${job}?wiat=5000`, '?wiat is no parameter of this route and was ignored; did you mean ?wait?'],
    ['POST', `status-sync/${job}?Wait=5000`, '?Wait is no parameter of this route and was ignored; did you mean ?wait?'],
    ['GET', `stream/${job}?wait_ms=5000&foo=1`, '?wait_ms is no parameter of this route and was ignored; did you mean ?wait?'],
  ];
  for (const [method, path, hint] of cases) {
    const r = await a.req(method, `/v2/${ep}/${path}`);
    t.equal(r.status, 200, `${method} ${path}: served, not refused`);
    t.equal(r.headers.get('flashd-hint'), hint, `${method} ${path}: the hint`);
  }
  // Nothing said for a parameter that is no near miss, nor for the right one, nor on a route with none.
  for (const path of [`status/${job}?foo=1&gpu=x`, `status/${job}?ttl=5000`, `status/${job}`, `stream/${job}?%0d%0await=1`, 'health?wiat=1']) {
    const r = await a.req('GET', `/v2/${ep}/${path}`);
    t.equal(r.status, 200, `${path}: served`);
    t.equal(r.headers.get('flashd-hint'), null, `${path}: no hint`);
  }
});
