/**
 * Worker keys handed out by worker-env can be found and revoked like API keys, act only as the
 * worker they were made for, and replies that carry a credential are never cached.
 */
import { connect } from 'node:net';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { assertProblem, cpuBody, startAgent } from '../helpers/agent.js';
import { TestWorker, postOversized } from '../helpers/worker.js';

t.test('a worker-env key is listed, read and revoked through /v2/api-keys', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const r = await a.req('GET', `/v2/serverless/${ep}/worker-env`);
  t.equal(r.status, 200);
  t.match(r.json.keyId, /^key_/, 'worker-env names the key it made');
  const keyId = r.json.keyId as string;
  const worker = new TestWorker(r.json);
  t.equal(await worker.ping(), 200, 'the key works');

  const users = await a.req('GET', '/v2/api-keys');
  t.notOk((users.json as { id: string }[]).some((k) => k.id === keyId), 'the default list holds API keys only');
  t.ok((users.json as { kind: string }[]).every((k) => k.kind === 'user'));
  const workers = await a.req('GET', '/v2/api-keys?kind=worker');
  t.equal(workers.status, 200);
  t.match((workers.json as { id: string }[]).find((k) => k.id === keyId), { kind: 'worker', endpointId: ep, scopes: ['worker'], revokedAt: null });
  t.notOk(workers.text.includes(worker.key), 'never the secret');
  const one = await a.req('GET', `/v2/api-keys/${keyId}`);
  t.match(one.json, { id: keyId, kind: 'worker', endpointId: ep });

  assertProblem(t, await a.req('PATCH', `/v2/api-keys/${keyId}`, { body: { name: 'x' } }), 409);
  assertProblem(t, await a.req('GET', '/v2/api-keys?kind=robot'), 400);

  t.equal((await a.req('DELETE', `/v2/api-keys/${keyId}`)).status, 204);
  t.equal(await worker.ping(), 401, 'a revoked worker key is refused');
  t.notOk(((await a.req('GET', '/v2/api-keys?kind=worker')).json as { id: string }[]).some((k) => k.id === keyId), 'revoked worker keys leave the list');
  t.match((await a.req('GET', `/v2/api-keys/${keyId}`)).json, { revokedAt: /^\d{4}-/ }, 'and can still be read');
});

t.test('replies carrying a credential say Cache-Control: no-store', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = await a.req('GET', `/v2/serverless/${ep}/worker-env`);
  t.equal(env.headers.get('cache-control'), 'no-store', 'worker-env');
  const key = await a.req('POST', '/v2/api-keys', { body: { name: 'k', scopes: ['endpoints:read'] } });
  t.equal(key.status, 201);
  t.equal(key.headers.get('cache-control'), 'no-store', 'a new API key');
  const session = await a.req('POST', '/v2/sessions');
  t.equal(session.status, 201);
  t.equal(session.headers.get('cache-control'), 'no-store', 'a session token');
  t.equal((await a.req('GET', '/v2/api-keys')).headers.get('cache-control'), null, 'lists of key metadata need not say it');
});

t.test('revoked worker keys are deleted a day after their revocation, so a key per launch does not pile up', async (t) => {
  const clock = new ManualClock(Date.now());
  const a = await startAgent(t, {}, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const envKey = async () => (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json.keyId as string;
  const first = await envKey();
  t.equal((await a.req('DELETE', `/v2/api-keys/${first}`)).status, 204);
  const user = (await a.req('POST', '/v2/api-keys', { body: { name: 'u', scopes: ['endpoints:read'] } })).json.id as string;
  t.equal((await a.req('DELETE', `/v2/api-keys/${user}`)).status, 204);
  const live = await envKey();
  t.equal((await a.req('GET', `/v2/api-keys/${first}`)).status, 200, 'within a day a revoked worker key can still be read');

  clock.advance(86_400_000 + 1000);
  await envKey();
  assertProblem(t, await a.req('GET', `/v2/api-keys/${first}`), 404);
  t.equal((await a.req('GET', `/v2/api-keys/${live}`)).status, 200, 'an unrevoked worker key stays');
  t.match((await a.req('GET', `/v2/api-keys/${user}`)).json, { revokedAt: /^\d{4}-/ }, 'a revoked API key stays (its owner lists it)');
  const db = new Database(join(a.dir, 'flashd.db'), { readonly: true });
  t.teardown(() => db.close());
  t.equal(db.prepare("SELECT count(*) FROM api_keys WHERE kind = 'worker' AND revoked_at IS NOT NULL").pluck().get(), 0, 'no revoked worker key row is left');
});

t.test('a job-take parked before its key was revoked is handed no job; the job waits for a worker with a good key', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const r = await a.req('GET', `/v2/serverless/${ep}/worker-env`);
  const revoked = new TestWorker(r.json);
  const takeUrl = (r.json.env.RUNPOD_WEBHOOK_GET_JOB as string).replace('$ID', revoked.workerId);
  const parked = fetch(`${takeUrl}&job_in_progress=0`, { headers: { authorization: revoked.key } });
  await new Promise((resolve) => setTimeout(resolve, 200));
  t.equal((await a.req('DELETE', `/v2/api-keys/${r.json.keyId}`)).status, 204);
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { secret: 'for good keys only' } } })).json.id as string;
  const answer = await parked;
  const text = await answer.text();
  t.equal(answer.status, 401, 'the parked poll of the revoked key is refused');
  t.notOk(text.includes('for good keys only'), 'without the job input');
  t.match(JSON.parse(text), { detail: /revoked/ });
  t.match((await a.req('GET', `/v2/${ep}/status/${job}`)).json, { status: 'IN_QUEUE' }, 'the job stays queued');
  const good = await TestWorker.create(a, ep);
  t.match(await good.take(), { id: job }, 'and goes to a worker whose key is valid');
});


t.test('deleting an endpoint answers the parked polls of its workers at once with the 401 a new poll gets', async (t) => {
  // A take or job-stop hold far longer than the test: only the deletion can end them.
  const a = await startAgent(t, { takeHoldMs: 30_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json as { workerId: string; env: Record<string, string> };
  const worker = new TestWorker(env);
  const takeUrl = `${(env.env.RUNPOD_WEBHOOK_GET_JOB as string).replace('$ID', worker.workerId)}&job_in_progress=0`;
  const since = Date.now();
  const timed = (p: Promise<Response>) => p.then(async (r) => ({ status: r.status, ms: Date.now() - since, text: await r.text() }));
  const take = timed(fetch(takeUrl, { headers: { authorization: worker.key } }));
  const stop = timed(fetch(takeUrl.replace('/job-take/', '/job-stop/'), { headers: { authorization: worker.key } }));
  await new Promise((resolve) => setTimeout(resolve, 300));

  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  const [took, stopped] = await Promise.all([take, stop]);
  t.equal(took.status, 401, 'the parked job-take is refused');
  t.equal(stopped.status, 401, 'so is the parked job-stop');
  t.match(JSON.parse(stopped.text), { status: 401 });
  t.match(JSON.parse(took.text), { detail: `The API key has been revoked: it is a worker key of endpoint ${ep}, which was deleted.` }, 'saying why');
  t.ok(took.ms < 5000 && stopped.ms < 5000, `both at once, not after the 30 s hold (${took.ms} ms, ${stopped.ms} ms)`);
});

t.test('a worker of a deleted endpoint is told so: its 401 says the endpoint was deleted, not only that its key was revoked', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const worker = await TestWorker.create(a, ep);
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.match(await worker.take(), { id: job }, 'the worker holds a job');
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  const detail = `The API key has been revoked: it is a worker key of endpoint ${ep}, which was deleted.`;
  for (const [what, method, path, body] of [
    ['job-take', 'GET', `/v2/${ep}/job-take/${worker.workerId}?gpu=cpu&job_in_progress=1`, undefined],
    ['ping', 'GET', `/v2/${ep}/ping/${worker.workerId}?job_id=${job}&runpod_version=1.12.0`, undefined],
    ['job-done', 'POST', `/v2/${ep}/job-done/${worker.workerId}/${job}?gpu=cpu&isStream=false`, { output: 'late' }],
  ] as const) {
    const r = await a.req(method, path, { key: worker.key, ...(body ? { body } : {}) });
    assertProblem(t, r, 401, `${what}: 401`);
    t.equal(r.json.detail, detail, `${what}: the detail names the deleted endpoint`);
    t.match(r.headers.get('www-authenticate') ?? '', /^Bearer/, `${what}: still a 401 challenge`);
  }
  // Any other revoked worker key keeps the plain detail.
  const ep2 = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = (await a.req('GET', `/v2/serverless/${ep2}/worker-env`)).json as { workerId: string; keyId: string; env: Record<string, string> };
  t.equal((await a.req('DELETE', `/v2/api-keys/${env.keyId}`)).status, 204);
  const other = await a.req('GET', `/v2/${ep2}/ping/${env.workerId}`, { key: env.env['RUNPOD_AI_API_KEY'] as string });
  assertProblem(t, other, 401);
  t.equal(other.json.detail, 'The API key has been revoked.', 'a key revoked with its endpoint still there');
});

t.test('each key worker-env hands out is logged with who asked for it, as keys made through the API are, and never the key itself', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json as { workerId: string; keyId: string; env: Record<string, string> };
  const line = a.logs.find((l) => l.includes('worker key issued'));
  t.ok(line, 'a "worker key issued" line');
  t.match(line ?? '', new RegExp(`keyId=${env.keyId}\\b.*endpointId=${ep}\\b.*workerId=${env.workerId}\\b`), 'naming the key id, the endpoint and the worker');
  t.match(line ?? '', /by=key_\w+/, 'and the key that asked for it');
  t.notOk(a.logs.some((l) => l.includes(env.env['RUNPOD_AI_API_KEY'] as string)), 'the key itself is never logged');
});

t.test("a worker key acts only as its own worker: another worker's id in the path is a 403", async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const wa = await TestWorker.create(a, ep);
  const wb = await TestWorker.create(a, ep);
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.match(await wb.take(), { id: job }, 'worker B holds the job');

  // Worker A's key with worker B's URLs, as a compromised worker A would send them.
  const asB = (method: string, path: string, raw?: string) =>
    a.req(method, `/v2/${ep}/${path}`, { key: wa.key, headers: { 'content-type': 'application/x-www-form-urlencoded' }, ...(raw === undefined ? {} : { raw }) });
  const forged = [
    await asB('GET', `job-take/${wb.workerId}?gpu=cpu&job_in_progress=0`),
    await asB('GET', `job-take-batch/${wb.workerId}?gpu=cpu&batch_size=2&job_in_progress=0`),
    await asB('GET', `ping/${wb.workerId}?gpu=cpu&job_id=${job}`),
    await asB('GET', `job-stop/${wb.workerId}?gpu=cpu`),
    await asB('POST', `job-stream/${wb.workerId}/${job}?gpu=cpu&isStream=false`, JSON.stringify({ output: 'forged chunk' })),
    await asB('POST', `job-done/${wb.workerId}/${job}?gpu=cpu&isStream=false`, JSON.stringify({ output: 'forged by A' })),
  ];
  for (const r of forged) {
    assertProblem(t, r, 403);
    t.equal(r.json.detail, `This worker key belongs to worker ${wa.workerId}, not to worker ${wb.workerId} named in the path.`);
  }
  t.match(await postOversized(wb.postUrl('done', job), wa.key), /^HTTP\/1\.1 413/, 'an oversized post as B gets its 413');
  t.match((await a.req('GET', `/v2/${ep}/status/${job}`)).json, { status: 'IN_PROGRESS', workerId: wb.workerId }, 'and fails nothing: B still holds the job');

  t.equal(await wa.ping(), 200, "A's key still works as A");
  const admin = await a.req('GET', `/v2/${ep}/ping/${wb.workerId}?gpu=cpu&job_id=${job}`);
  t.equal(admin.status, 200, 'an admin key acts as any worker');
  t.equal((await wb.done(job, { output: 'by B' })).status, 200, "B's own result is taken");
  t.match((await a.req('GET', `/v2/${ep}/status/${job}`)).json, { status: 'COMPLETED', output: 'by B' });
});

t.test('revoking a worker key answers its parked polls at once and takes its worker out of /health', async (t) => {
  // A take or job-stop hold far longer than the test: only the revocation can end them.
  const a = await startAgent(t, { takeHoldMs: 30_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const envOf = async () => (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json as { workerId: string; keyId: string; env: Record<string, string> };
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json.workers as Record<string, number>;

  const busyEnv = await envOf();
  const busy = new TestWorker(busyEnv);
  const running = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.match(await busy.take(), { id: running }, 'one worker holds a job');
  const idleEnv = await envOf();
  const idle = new TestWorker(idleEnv);
  const takeUrl = `${(idleEnv.env.RUNPOD_WEBHOOK_GET_JOB as string).replace('$ID', idle.workerId)}&job_in_progress=0`;
  const since = Date.now();
  const timed = (p: Promise<Response>) => p.then(async (r) => ({ status: r.status, ms: Date.now() - since, text: await r.text() }));
  const take = timed(fetch(takeUrl, { headers: { authorization: idle.key } }));
  const stop = timed(fetch(takeUrl.replace('/job-take/', '/job-stop/'), { headers: { authorization: idle.key } }));
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.match(await health(), { idle: 1, running: 1, ready: 2 }, 'both count before');

  t.equal((await a.req('DELETE', `/v2/api-keys/${idleEnv.keyId}`)).status, 204);
  t.equal((await a.req('DELETE', `/v2/api-keys/${busyEnv.keyId}`)).status, 204);
  t.match(await health(), { idle: 0, running: 0, ready: 0 }, 'neither counts once its key is revoked');
  const [took, stopped] = await Promise.all([take, stop]);
  t.equal(took.status, 401, 'the parked job-take is answered with the 401 a new poll gets');
  t.match(JSON.parse(took.text), { detail: /revoked/ });
  t.equal(stopped.status, 401, 'so is the parked job-stop');
  t.ok(took.ms < 5000 && stopped.ms < 5000, `both at once, not after the 30 s hold (${took.ms} ms, ${stopped.ms} ms)`);

  const queued = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  t.match(await health(), { idle: 0, ready: 0 }, 'a queued job is not taken to have an idle worker waiting for it');
  t.match((await a.req('GET', `/v2/${ep}/status/${running}`)).json, { status: 'IN_PROGRESS' }, 'the revoked worker\'s job keeps its lease rules: requeued when the lease lapses');

  t.equal((await a.req('GET', `/v2/${ep}/ping/${idle.workerId}?gpu=cpu`)).status, 200, 'the same worker id calling with a good key (an admin key)');
  t.match(await health(), { idle: 1, running: 0 }, 'counts again');
  const good = await TestWorker.create(a, ep);
  t.match(await good.take(), { id: queued }, 'a worker with a good key takes the queued job');
});

t.test('a worker route refused for a key that is no flashd key says once a minute in the endpoint log that a RunPod key baked into the image may replace the one flashd gives', async (t) => {
  const clock = new ManualClock(Date.now());
  const a = await startAgent(t, {}, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const runpodKey = 'rpa_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefgh';
  const lines = async () => ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line).filter((l) => /no flashd key/.test(l));
  // runpod-python sends the raw key, without "Bearer ".
  const call = (path: string, key: string) => a.req('GET', `/v2/${ep}/${path}`, { key: null, headers: { authorization: key } });

  assertProblem(t, await call('ping/w1?gpu=x', runpodKey), 401);
  assertProblem(t, await call('job-stop/w1?gpu=x', runpodKey), 401);
  const first = await lines();
  t.equal(first.length, 1, `one line for both refusals: ${JSON.stringify(first)}`);
  t.match(first[0], /~\/\.runpod\/config\.toml/, 'it names the config file that replaces the key');
  t.match(first[0], /RUNPOD_AI_API_KEY/, 'and the variable it replaces');
  t.notOk(first[0]?.includes(runpodKey) || first[0]?.includes(runpodKey.slice(4, 12)), 'never the key itself');
  t.notOk(a.logs.some((l) => l.includes(runpodKey.slice(4, 12))), 'nor in flashd\'s own log');

  clock.advance(61_000);
  assertProblem(t, await call('ping/w1?gpu=x', runpodKey), 401);
  t.equal((await lines()).length, 2, 'again after a minute');

  clock.advance(61_000);
  assertProblem(t, await call('ping/w1?gpu=x', 'fd_wkr_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA000000'), 401);
  assertProblem(t, await call('ping/w1?gpu=x', ''), 401);
  const envKey = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json;
  t.equal((await a.req('DELETE', `/v2/api-keys/${envKey.keyId}`)).status, 204);
  assertProblem(t, await call('ping/w1?gpu=x', envKey.env?.RUNPOD_AI_API_KEY ?? envKey.RUNPOD_AI_API_KEY), 401);
  t.equal((await lines()).length, 2, 'a malformed, missing or revoked flashd key is no such case');
  assertProblem(t, await a.req('GET', '/v2/nosuchendpoint1/ping/w1?gpu=x', { key: null, headers: { authorization: runpodKey } }), 401);
  assertProblem(t, await a.req('GET', `/v2/serverless/${ep}`, { key: runpodKey }), 401);
  t.equal((await lines()).length, 2, 'nor an unknown endpoint, nor a route that is not a worker route');
});

t.test('a worker route refused for an EMPTY Authorization header, as runpod-python sends when the image\'s ~/.runpod/config.toml has [default] without api_key, says so once a minute in the endpoint log', async (t) => {
  const clock = new ManualClock(Date.now());
  const a = await startAgent(t, {}, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const lines = async (re: RegExp) => ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line).filter((l) => re.test(l));
  // runpod-python's aiohttp session, its headers from http_client.get_auth_header(): with a
  // config.toml whose [default] has no api_key, credentials.get("api_key", "") is "", sent as is.
  // (A refused job-take is answered after a hold; the other worker routes at once.)
  const sdkRequest = (path: string, authorization: string | null) => new Promise<number>((resolve, reject) => {
    const { port } = new URL(a.url);
    const socket = connect(Number(port), '127.0.0.1', () => {
      socket.write(`GET /v2/${ep}/${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n`
        + (authorization === null ? '' : `Authorization: ${authorization}\r\n`)
        + 'User-Agent: RunPod-Python-SDK/1.12.0 (Linux 6.8; x86_64) Language/Python 3.11.9\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\nConnection: close\r\n\r\n');
    });
    let head = '';
    socket.on('data', (d) => { head += d.toString('latin1'); });
    socket.on('end', () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1])));
    socket.on('error', reject);
  });

  t.equal(await sdkRequest('job-take/w1?gpu=x&job_in_progress=0', ''), 401, 'an empty Authorization is refused');
  t.equal(await sdkRequest('job-stop/w1?gpu=x', ''), 401);
  const first = await lines(/empty Authorization/);
  t.equal(first.length, 1, `one line for both refusals: ${JSON.stringify(first)}`);
  t.match(first[0], /worker "w1"/, 'it names the worker');
  t.match(first[0], /~\/\.runpod\/config\.toml/, 'it names the config file');
  t.match(first[0], /api_key/, 'and the line it lacks');
  t.match(first[0], /RUNPOD_AI_API_KEY/, 'and the variable it replaces');
  t.equal((await lines(/no flashd key/)).length, 0, 'not the line of a foreign key');

  t.equal(await sdkRequest('job-stop/w1?gpu=x', '   '), 401);
  t.equal(await sdkRequest('job-stop/w1?gpu=x', 'rpa_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefgh'), 401);
  t.equal((await lines(/empty Authorization/)).length, 1, 'at most once a minute');
  t.equal((await lines(/no flashd key/)).length, 1, 'a foreign key still gets its own line');

  clock.advance(61_000);
  t.equal(await sdkRequest('job-stop/w1?gpu=x', null), 401);
  t.equal(await sdkRequest('job-stop/w1?gpu=x', 'Bearer'), 401);
  t.equal((await lines(/empty Authorization/)).length, 1, 'no header at all, or "Bearer" alone, is no such case');
  t.equal(await sdkRequest('job-take/w1?gpu=x&job_in_progress=0', ''), 401);
  t.equal((await lines(/empty Authorization/)).length, 2, 'again after a minute');
  const other = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  t.equal((await a.req('GET', `/v2/serverless/${other}`, { key: null, headers: { authorization: '' } })).status, 401);
  t.equal(((await a.req('GET', `/v2/serverless/${other}/logs`)).json as unknown[]).length, 0, 'nor a route that is not a worker route');
});
