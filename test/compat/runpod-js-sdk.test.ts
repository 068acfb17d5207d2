/**
 * RunPod's own JavaScript client, the `runpod-sdk` npm package (1.1.2, unchanged, a
 * devDependency), against a real flashd over loopback with real worker processes running the
 * vendor_flash SDK: every method of its endpoint object, `runpodSdk(key, { baseUrl })`.
 *
 * What the SDK sends (its src/index.ts): `Authorization: Bearer <key>` and
 * `content-type: application/json` on every request; run `POST /run`, runSync
 * `POST /runsync?wait=<clamp(1000, 90000, timeout)>` then, while the status is not final,
 * `GET /status-sync/{id}?wait=<remaining, at least 1000>` until `timeout` more ms have passed;
 * status `GET /status/{id}`; statusSync `GET /status-sync/{id}?wait=`; stream `GET /stream/{id}`
 * (no wait) in a loop until the status is final, yielding each element of `stream`; cancel
 * `POST /cancel/{id}` and purgeQueue `POST /purge-queue` with the body `{}`; health `GET /health`.
 * It reads the body only of a 200: any other 2xx comes back as `{status, statusText}` (from
 * status, runSync and statusSync with `started: false`), so every success must be exactly 200.
 * Its HTTP library (xior 0.1.4) throws a `XiorError` for a non-2xx, with the parsed body at
 * `error.response.data`.
 */
import t from 'tap';
import runpodSdk from 'runpod-sdk';
import { startAgent, cpuBody, ADMIN_KEY, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

type Endpoint = NonNullable<ReturnType<ReturnType<typeof runpodSdk>['endpoint']>>;

async function endpoint(a: TestAgent, worker: string): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', {
    body: cpuBody({ name: worker, args: `python3 -u test/fixtures/workers/${worker}.py`, workers: { min: 1, max: 1, idleTimeout: 60 } }),
  });
  if (r.status !== 201) throw new Error(r.text);
  return r.json.id as string;
}

/** The SDK's client for endpoint `ep`, pointed at flashd with `baseUrl`. */
function client(a: TestAgent, ep: string, key = ADMIN_KEY): Endpoint {
  const e = runpodSdk(key, { baseUrl: `${a.url}/v2` }).endpoint(ep);
  if (!e) throw new Error('no endpoint object');
  return e;
}

/**
 * The requests the SDK makes during `fn`, as `METHOD path?query` with the body sent (xior calls
 * the global fetch on each request; it is wrapped, not replaced: each call goes through).
 * runSync's own `<id>: <status>` lines go to the console as the SDK prints them.
 */
async function recording<T>(fn: () => Promise<T>): Promise<{ value: T; sent: { call: string; body: unknown }[] }> {
  const sent: { call: string; body: unknown }[] = [];
  const real = globalThis.fetch;
  globalThis.fetch = (input: string | URL | Request, init?: RequestInit) => {
    const u = new URL(String(input));
    sent.push({ call: `${init?.method ?? 'GET'} ${u.pathname}${u.search}`, body: init?.body });
    return real(input, init);
  };
  try {
    return { value: await fn(), sent };
  } finally {
    globalThis.fetch = real;
  }
}

async function waitReady(a: TestAgent, ep: string): Promise<void> {
  await until(`a worker of ${ep} ready`, async () => (await a.req('GET', `/v2/${ep}/health`)).json?.workers?.idle === 1, 20_000);
}

t.test('runpod-sdk 1.1.2 against flashd', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 2000 });
  const echoEp = await endpoint(a, 'echo');
  const genEp = await endpoint(a, 'generator');
  await Promise.all([waitReady(a, echoEp), waitReady(a, genEp)]);
  const echo = client(a, echoEp);
  const gen = client(a, genEp);
  t.equal(echo.endpointId, echoEp);
  t.equal(echo.baseUrl, `${a.url}/v2`);

  t.test('run, then status and statusSync until COMPLETED', async (t) => {
    const run = await echo.run({ input: { n: 1 }, policy: { executionTimeout: 60_000, ttl: 600_000, lowPriority: false } });
    t.match(run, { id: String, status: /^(IN_QUEUE|IN_PROGRESS|COMPLETED)$/ }, `run answers 200 with id and status: ${JSON.stringify(run)}`);
    const id = (run as { id: string }).id;
    const done = await echo.statusSync(id, 20_000);
    t.match(done, { id, status: 'COMPLETED', started: true, completed: true, succeeded: true, output: { echo: { n: 1 } } }, JSON.stringify(done));
    t.type((done as { delayTime?: number }).delayTime, 'number');
    t.type((done as { executionTime?: number }).executionTime, 'number');
    const s = await echo.status(id);
    t.match(s, { id, status: 'COMPLETED', started: true, completed: true, succeeded: true, output: { echo: { n: 1 } } }, JSON.stringify(s));
  });

  t.test('runSync finishing within its timeout', async (t) => {
    const { value: r, sent } = await recording(() => echo.runSync({ input: { n: 2 } }, 20_000));
    t.match(r, { status: 'COMPLETED', started: true, completed: true, succeeded: true, output: { echo: { n: 2 } } }, JSON.stringify(r));
    t.type((r as { id?: string }).id, 'string');
    t.type(r.executionTime, 'number');
    t.type(r.delayTime, 'number');
    t.same(sent, [{ call: `POST /v2/${echoEp}/runsync?wait=20000`, body: '{"input":{"n":2}}' }], 'answered by /runsync alone');
  });

  t.test('runSync past /runsync?wait, finished by a /status-sync poll', async (t) => {
    // timeout 2000: /runsync?wait=2000 answers IN_PROGRESS, then /status-sync?wait=1000 (the floor) sees the end at ~2.5 s.
    const { value: r, sent } = await recording(() => echo.runSync({ input: { sleep: 2.5 } }, 2000));
    t.match(r, { status: 'COMPLETED', started: true, completed: true, succeeded: true, output: { echo: { sleep: 2.5 } } }, JSON.stringify(r));
    const id = (r as { id: string }).id;
    t.equal(sent[0]?.call, `POST /v2/${echoEp}/runsync?wait=2000`);
    t.ok(sent.length >= 2, `it polled /status-sync: ${JSON.stringify(sent)}`);
    for (const s of sent.slice(1)) t.equal(s.call, `GET /v2/${echoEp}/status-sync/${id}?wait=1000`);
  });

  t.test('runSync NOT finishing within its timeout', async (t) => {
    const { value: r, sent } = await recording(() => echo.runSync({ input: { sleep: 4 } }, 1200));
    t.match(r, { status: 'IN_PROGRESS', started: true, completed: false }, `gave up before the job ended: ${JSON.stringify(r)}`);
    const id = (r as { id: string }).id;
    t.ok(sent.length >= 2, `it polled /status-sync: ${JSON.stringify(sent)}`);
    for (const s of sent.slice(1)) t.equal(s.call, `GET /v2/${echoEp}/status-sync/${id}?wait=1000`);
    // The job went on: the worker still finishes it.
    const done = await echo.statusSync(id, 10_000);
    t.match(done, { status: 'COMPLETED', output: { echo: { sleep: 4 } } }, JSON.stringify(done));
  });

  t.test('stream: a generator worker, chunks in order, the iteration ends', async (t) => {
    const run = (await gen.run({ input: { n: 5, delay: 0.2 } })) as { id: string };
    t.type(run.id, 'string');
    const chunks: unknown[] = [];
    const { sent } = await recording(async () => {
      for await (const c of gen.stream(run.id)) chunks.push(c);
    });
    t.ok(sent.length > 0 && sent.every((s) => s.call === `GET /v2/${genEp}/stream/${run.id}`), 'GET /stream/{id}, no query');
    t.same(chunks, [0, 1, 2, 3, 4].map((i) => ({ output: { i } })), 'every chunk once, in order');
    const s = await gen.status(run.id);
    t.match(s, { status: 'COMPLETED', output: [{ i: 0 }, { i: 1 }, { i: 2 }, { i: 3 }, { i: 4 }] }, 'return_aggregate_stream: the chunks as the output');
    const again: unknown[] = [];
    for await (const c of gen.stream(run.id)) again.push(c);
    t.same(again, [], 'a finished, read stream yields nothing and ends');
  });

  t.test('stream with its own timeout ends', async (t) => {
    const run = (await gen.run({ input: { n: 3, delay: 0.1 } })) as { id: string };
    const chunks: unknown[] = [];
    for await (const c of gen.stream(run.id, 20_000)) chunks.push(c);
    t.same(chunks, [0, 1, 2].map((i) => ({ output: { i } })));
  });

  t.test('stream of a job running for seconds, with a jobs key (not exempt from the quotas)', async (t) => {
    // stream() polls /stream with no pause of its own: flashd paces it (at most one poll per
    // 100 ms of a job, an empty one held until the next chunk), so it neither spins nor runs
    // into the endpoint's 2000-per-10 s "status" quota (a 429 that ended the stream).
    const made = await a.req('POST', '/v2/api-keys', { body: { name: 'app', scopes: ['jobs:run', 'jobs:read'] } });
    t.equal(made.status, 201, made.text);
    const app = client(a, genEp, made.json.key as string);
    const run = (await app.run({ input: { n: 6, delay: 0.5 } })) as { id: string };
    const chunks: unknown[] = [];
    const { sent } = await recording(async () => {
      for await (const c of app.stream(run.id)) chunks.push(c);
    });
    t.same(chunks, Array.from({ length: 6 }, (_, i) => ({ output: { i } })), 'every chunk, in order');
    t.ok(sent.length <= 40, `${sent.length} polls over ~2.5 s`);
  });

  t.test('cancel (running and queued), purgeQueue, health', async (t) => {
    const running = (await echo.run({ input: { sleep: 30 } })) as { id: string };
    await until('the sleeping job to start', async () => (await echo.status(running.id)).status === 'IN_PROGRESS');
    const queued = await Promise.all([1, 2, 3].map((n) => echo.run({ input: { n } }) as Promise<{ id: string; status: string }>));
    for (const q of queued) t.equal(q.status, 'IN_QUEUE', 'the only worker is busy');

    const h = await echo.health();
    t.match(h, { jobs: { inProgress: 1, inQueue: 3, completed: Number, failed: Number, retried: Number }, workers: { idle: 0, running: 1, ready: 1, initializing: 0, throttled: 0 } }, JSON.stringify(h));

    const { value: c, sent } = await recording(() => echo.cancel(queued[0]!.id));
    t.same(sent, [{ call: `POST /v2/${echoEp}/cancel/${queued[0]!.id}`, body: '{}' }], 'the SDK posts {} to /cancel');
    t.match(c, { id: queued[0]!.id, status: 'CANCELLED' }, `cancel of a queued job: ${JSON.stringify(c)}`);
    const { value: purged, sent: purgeSent } = await recording(() => echo.purgeQueue());
    t.same(purgeSent, [{ call: `POST /v2/${echoEp}/purge-queue`, body: '{}' }], 'and to /purge-queue');
    t.same(purged, { removed: 2, status: 'completed' }, 'purgeQueue removes the two still queued');
    for (const q of queued.slice(1)) t.match(await echo.status(q.id), { status: 'CANCELLED', completed: true, succeeded: false });

    const cr = await echo.cancel(running.id);
    t.match(cr, { id: running.id, status: 'CANCELLED' }, `cancel of a running job: ${JSON.stringify(cr)}`);
    t.match(await echo.status(running.id), { status: 'CANCELLED', started: true, completed: true, succeeded: false });
    const h2 = await echo.health();
    t.match(h2, { jobs: { inProgress: 0, inQueue: 0 } }, JSON.stringify(h2));
  });

  t.test('errors: the SDK throws XiorError with our problem+json at error.response.data', async (t) => {
    const bad = client(a, echoEp, 'not-a-valid-key-0123456789');
    const err = (await bad.run({ input: {} }).then(() => undefined, (e: unknown) => e)) as {
      message: string; response?: { status: number; data: any; headers: Headers };
    };
    t.ok(err, 'a bad key rejects');
    t.equal(err.message, 'Request failed with status code 401');
    t.equal(err.response?.status, 401);
    t.match(err.response?.headers.get('content-type'), /^application\/problem\+json/);
    t.match(err.response?.data, { status: 401, title: String, detail: String, errors: Array });
    for (const call of [() => bad.health(), () => bad.status('x'), () => bad.purgeQueue(), () => bad.cancel('x'), () => bad.runSync({ input: {} }, 1000)]) {
      const e = (await call().then(() => undefined, (x: unknown) => x)) as { response?: { status: number } };
      t.equal(e?.response?.status, 401, 'every method rejects a bad key');
    }
    const streamErr = await (async () => {
      for await (const _ of bad.stream('x')) return undefined;
      return undefined;
    })().then(() => undefined, (e: { response?: { status: number } }) => e);
    t.equal(streamErr?.response?.status, 401, 'stream too');

    const unknown = (await echo.status('no-such-job').then(() => undefined, (e: unknown) => e)) as { response?: { status: number; data: any } };
    t.equal(unknown?.response?.status, 404);
    t.match(unknown?.response?.data, { status: 404, detail: String });
    const noInput = (await echo.run({} as never).then(() => undefined, (e: unknown) => e)) as { response?: { status: number; data: any } };
    t.equal(noInput?.response?.status, 400, 'a run without input');
    t.match(noInput?.response?.data, { status: 400, detail: /input/ });
    const otherEp = (await client(a, 'no-such-endpoint').health().then(() => undefined, (e: unknown) => e)) as { response?: { status: number; data: any } };
    t.equal(otherEp?.response?.status, 404, 'an unknown endpoint');
    t.match(otherEp?.response?.data, { status: 404, detail: String });
  });
});
