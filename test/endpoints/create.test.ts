/**
 * POST /v2/serverless: every field, default, bound and rule of the spec's "Create a serverless
 * endpoint" and "Resources and their fields" (mounts, templates and command encoding have their
 * own files).
 */
import t, { type Test } from 'tap';
import { assertSchema } from '../../src/core/schemas.js';
import { GPU_POOLS } from '../../src/catalog/index.js';
import { assertProblem, cpuBody, queueBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { assertErrorAt, createEndpoint, makeRegistry, makeTemplate, mustCreate } from '../helpers/expect.js';

type Case = [label: string, body: Record<string, unknown>, status: number, pointer: string];

async function expectCases(t: Test, a: TestAgent, cases: Case[]): Promise<void> {
  for (const [label, body, status, pointer] of cases) {
    const r = await createEndpoint(a, body);
    assertErrorAt(t, r, status, pointer, `${label} → ${status} at ${pointer}: ${r.text.slice(0, 300)}`);
  }
}

const LB = (extra: Record<string, unknown> = {}) =>
  queueBody({ type: 'LOAD_BALANCER', scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, ...extra });
const gpu = (g: Record<string, unknown>) => queueBody({ gpu: { pools: ['AMPERE_24'], ...g } });
const omit = (body: Record<string, unknown>, key: string) => {
  const { [key]: _drop, ...rest } = body;
  return rest;
};

t.test('a minimal create gets every default and the full Endpoint shape', async (t) => {
  const a = await startAgent(t);
  const r = await createEndpoint(a, queueBody({ name: 'defaults' }));
  t.equal(r.status, 201);
  t.match(r.headers.get('content-type'), /^application\/json/);
  const e = r.json;
  t.match(e.id, /^[a-z0-9]{14}$/, 'id: 14 lowercase base36 characters');
  t.equal(e.name, 'defaults');
  t.equal(e.type, 'QUEUE');
  t.same(e.workers, { min: 0, max: 3, idleTimeout: 10 }, 'workers default {0, 3, 10}');
  t.equal(e.timeout, 300000, 'timeout default 300000 ms');
  t.equal(e.flashboot, 'OFF', 'flashboot default OFF');
  t.same(e.gpu, { pools: ['ADA_24'], excludedTypes: [], count: 1, allowedCudaVersions: [], minCudaVersion: null }, 'gpu.count default 1, CUDA fields present');
  t.notOk('cpu' in e, 'no cpu on a GPU endpoint');
  t.same(e.scaling, { type: 'QUEUE_DELAY', queueDelay: 4 });
  t.equal(e.image, 'registry.local/worker:1');
  t.equal(e.args, '', 'args always present');
  t.same(e.entrypoint, [], 'entrypoint always present');
  t.same(e.cmd, [], 'cmd always present');
  t.same(e.ports, []);
  t.same(e.env, {});
  t.equal(e.registry, null);
  t.same(e.dataCenterIds, [], 'dataCenterIds required, empty');
  t.same(e.networkVolumes, [], 'networkVolumes required, empty');
  t.same(e.mounts, { network: [], global: [] }, 'mounts.network and mounts.global both present');
  t.notOk('disk' in e, 'disk omitted when not set');
  t.ok(Number.isFinite(Date.parse(e.createdAt)) && /T.*Z$/.test(e.createdAt), 'createdAt is a date-time');
  for (const f of ['id', 'name', 'workers', 'scaling', 'dataCenterIds', 'networkVolumes', 'mounts', 'timeout', 'flashboot', 'createdAt']) {
    t.ok(f in e, `required field ${f}`);
  }
  t.doesNotThrow(() => assertSchema('Endpoint', e), 'matches the Endpoint schema of the OpenAPI document');

  const got = await a.req('GET', `/v2/serverless/${e.id}`);
  t.equal(got.status, 200);
  t.same(got.json, e, 'GET returns the same object');

  const c = await mustCreate(t, a, cpuBody({ name: 'cpu-defaults' }));
  t.notOk('gpu' in c, 'no gpu on a CPU endpoint');
  t.same(c.cpu, [{ id: 'cpu3c', vcpuCount: 2, memory: 4 }]);
  t.same(c.workers, { min: 0, max: 3, idleTimeout: 10 });
  t.doesNotThrow(() => assertSchema('Endpoint', c));
});

t.test('every explicit field is kept', async (t) => {
  const a = await startAgent(t);
  const reg = await makeRegistry(t, a);
  const body = queueBody({
    name: 'explicit',
    image: 'ghcr.io/acme/worker:2',
    disk: 20,
    ports: ['8000/http', '22/tcp'],
    env: { A: '1', MODEL: 'x' },
    registry: reg.id,
    gpu: { pools: ['AMPERE_24', 'ADA_24'], excludedTypes: ['NVIDIA L4'], count: 2, allowedCudaVersions: ['12.4', '12.1'] },
    workers: { min: 1, max: 5, idleTimeout: 60 },
    scaling: { type: 'QUEUE_DELAY', queueDelay: 0.5 },
    dataCenterIds: ['LOCAL-1'],
    flashboot: 'PRIORITY_FLASHBOOT',
    timeout: 5000,
  });
  const e = await mustCreate(t, a, body);
  t.equal(e.image, 'ghcr.io/acme/worker:2');
  t.equal(e.disk, 20);
  t.same(e.ports, ['8000/http', '22/tcp']);
  t.same(e.env, { A: '1', MODEL: 'x' });
  t.equal(e.registry, reg.id);
  t.same(e.gpu, { pools: ['AMPERE_24', 'ADA_24'], excludedTypes: ['NVIDIA L4'], count: 2, allowedCudaVersions: ['12.4', '12.1'], minCudaVersion: null }, 'pool order kept');
  t.same(e.workers, { min: 1, max: 5, idleTimeout: 60 });
  t.same(e.scaling, { type: 'QUEUE_DELAY', queueDelay: 0.5 });
  t.same(e.dataCenterIds, ['LOCAL-1']);
  t.equal(e.flashboot, 'PRIORITY_FLASHBOOT');
  t.equal(e.timeout, 5000);
  t.equal((await mustCreate(t, a, queueBody({ flashboot: 'FLASHBOOT' }))).flashboot, 'FLASHBOOT');
});

t.test('timeout is at least 5 s, as policy.executionTimeout; a value meant in seconds is told so', async (t) => {
  const a = await startAgent(t);
  const seconds = await createEndpoint(a, queueBody({ timeout: 600 }));
  assertErrorAt(t, seconds, 400, '/timeout', `600 (10 minutes in seconds) is refused: ${seconds.text.slice(0, 300)}`);
  t.equal(seconds.json?.detail, '/timeout: must be >= 5000 (5 s): it is in milliseconds, so 600 is 0.6 s; did you mean 600000?');
  const tiny = await createEndpoint(a, queueBody({ timeout: 1 }));
  assertErrorAt(t, tiny, 400, '/timeout', 'every job would time out at once');
  t.same(tiny.json?.errors, ['/timeout: must be >= 5000 (5 s): it is in milliseconds, so 1 is 0.001 s'], 'no suggestion where 1000 times the value is still under the floor');
  assertErrorAt(t, await createEndpoint(a, queueBody({ timeout: 4999 })), 400, '/timeout');
  t.equal((await mustCreate(t, a, queueBody({ timeout: 5000 }))).timeout, 5000, '5000 accepted');
  t.same((await createEndpoint(a, queueBody({ timeout: 0 }))).json?.errors, ['/timeout: must be >= 5000'], 'no unit hint for 0');
});

t.test('required fields and basic bounds', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['no name', omit(queueBody(), 'name'), 400, '/name'],
    ['empty name', queueBody({ name: '' }), 400, '/name'],
    ['name not a string', queueBody({ name: 7 }), 400, '/name'],
    ['no type', omit(queueBody(), 'type'), 400, '/type'],
    ['lower-case type', queueBody({ type: 'queue' }), 400, '/type'],
    ['unknown type', queueBody({ type: 'SERVERLESS' }), 400, '/type'],
    ['no scaling', omit(queueBody(), 'scaling'), 400, '/scaling'],
    ['no image and no templateId', omit(queueBody(), 'image'), 400, '/image'],
    ['empty image', queueBody({ image: '' }), 400, '/image'],
    ['empty templateId', queueBody({ templateId: '' }), 400, '/templateId'],
    ['disk 0', queueBody({ disk: 0 }), 400, '/disk'],
    ['disk fractional', queueBody({ disk: 1.5 }), 400, '/disk'],
    ['disk as string', queueBody({ disk: '10' }), 400, '/disk'],
    ['timeout 0', queueBody({ timeout: 0 }), 400, '/timeout'],
    ['timeout fractional', queueBody({ timeout: 10.5 }), 400, '/timeout'],
    ['flashboot unknown', queueBody({ flashboot: 'ON' }), 400, '/flashboot'],
    ['flashboot boolean', queueBody({ flashboot: true }), 400, '/flashboot'],
    ['port without protocol', queueBody({ ports: ['8000'] }), 400, '/ports/0'],
    ['port 0', queueBody({ ports: ['0/tcp'] }), 400, '/ports/0'],
    ['port above 65535', queueBody({ ports: ['65536/http'] }), 400, '/ports/0'],
    ['port unknown protocol', queueBody({ ports: ['8000/ftp'] }), 400, '/ports/0'],
    ['duplicate ports', queueBody({ ports: ['8000/http', '8000/http'] }), 400, '/ports'],
    ['env value not a string', queueBody({ env: { A: 1 } }), 400, '/env/A'],
    ['env not an object', queueBody({ env: ['A=1'] }), 400, '/env'],
    ['env bad name', queueBody({ env: { '1A': 'x' } }), 400, '/env'],
    ['registry empty', queueBody({ registry: '' }), 400, '/registry'],
    ['dataCenterIds unknown', queueBody({ dataCenterIds: ['EU-RO-1'] }), 400, '/dataCenterIds/0'],
    ['dataCenterIds duplicate', queueBody({ dataCenterIds: ['LOCAL-1', 'LOCAL-1'] }), 400, '/dataCenterIds'],
    ['HEALTH_CHECK_PATH without slash', LB({ env: { HEALTH_CHECK_PATH: 'ping' } }), 400, '/env/HEALTH_CHECK_PATH'],
    ['PORT not a number', LB({ env: { PORT: 'eighty' } }), 400, '/env/PORT'],
    ['PORT 0', LB({ env: { PORT: '0' } }), 400, '/env/PORT'],
    ['PORT_HEALTH above 65535', LB({ env: { PORT_HEALTH: '65536' } }), 400, '/env/PORT_HEALTH'],
  ]);
  t.equal((await createEndpoint(a, queueBody({ disk: 1, timeout: 5000, ports: ['1/udp', '65535/tcp'] }))).status, 201, 'lower bounds accepted');
  const reg = await createEndpoint(a, queueBody({ registry: 'reg_doesnotexist0000000' }));
  assertErrorAt(t, reg, 404, '/registry', 'an unknown registry credential is a 404');
  t.equal((await createEndpoint(a, queueBody({ registry: null }))).status, 201, 'registry null is allowed');
  const body = await a.req('POST', '/v2/serverless', { raw: '[]', headers: { 'content-type': 'application/json' } });
  assertProblem(t, body, 400, 'a JSON array body is a 400');
});

t.test('an env name that is not a valid variable name is named in the error', async (t) => {
  const a = await startAgent(t);
  const r = await createEndpoint(a, queueBody({ env: { GOOD: 'x', 'MY-VAR!': 'secret-value', OTHER: 'y' } }));
  assertErrorAt(t, r, 400, '/env');
  t.same(r.json.errors, ['/env: the name "MY-VAR!" must match pattern "^[A-Za-z_][A-Za-z0-9_.-]{0,254}$"'], 'one error, naming the key and the rule');
  t.notMatch(r.text, /secret-value/, 'the value is not echoed');
  const ok = await mustCreate(t, a, queueBody({ env: { GOOD: 'x' } }));
  const patch = await a.req('PATCH', `/v2/serverless/${ok.id}`, { body: { env: { '1A': 'x' } } });
  t.match(patch.json.detail, /^\/env: the name "1A" must match pattern/, 'an update says the same');
});

t.test('a NUL character in an env value or the command is refused (no worker could ever start)', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['env value with NUL', queueBody({ env: { TOKEN: 'secret-\u0000-value' } }), 400, '/env/TOKEN'],
    ['args with NUL', queueBody({ args: 'python\u0000 app.py' }), 400, '/args'],
    ['args JSON cmd with NUL', queueBody({ args: '{"cmd": ["python", "a\\u0000.py"]}' }), 400, '/args'],
    ['cmd item with NUL', queueBody({ cmd: ['python', 'a\u0000.py'] }), 400, '/cmd/1'],
    ['entrypoint item with NUL', queueBody({ entrypoint: ['sh\u0000'] }), 400, '/entrypoint/0'],
  ]);
  const r = await createEndpoint(a, queueBody({ env: { TOKEN: 'secret-\u0000-value' } }));
  t.match(r.json.detail, /must not contain a NUL character/, 'the reason is said plainly');
  t.notMatch(r.text, /secret-/, 'the value is not echoed');
  const ok = await mustCreate(t, a, queueBody({ env: { TOKEN: 'line one\nline two' } }));
  const patch = await a.req('PATCH', `/v2/serverless/${ok.id}`, { body: { env: { TOKEN: 'x\u0000' } } });
  assertErrorAt(t, patch, 400, '/env/TOKEN', 'an update is checked the same way');
  const tpl = await a.req('POST', '/v2/templates', { body: { name: 'nul', image: 'busybox', isServerless: true, env: { A: 'x\u0000' } } });
  assertErrorAt(t, tpl, 400, '/env/A', 'and a template');
});

t.test('image must be a Docker image reference: every real one is taken, anything else is a 400 that does not echo it', async (t) => {
  const a = await startAgent(t);
  const digest = 'sha256:' + '0123456789abcdef'.repeat(4);
  const valid = [
    'i', 'busybox', 'python:3.11', 'docker.io/library/python:3.11-slim', 'docker.io/library/python:3.12-slim',
    'localhost/flashd-test-worker:41f209d620b7254a', 'localhost:5000/a/b:c', `ghcr.io/o/r@${digest}`,
    `ghcr.io/example/worker:1.0@${digest}`, 'runpod/worker-v1-vllm:v2.1.0stable-cuda12.1.0',
    'registry.example.com:443/team/img_x:1.0', 'registry.local/worker:1', 'a__b/c-d.e---f:TAG_1.x-y',
    '[::1]:5000/x/y:1', 'Registry.Example.com/x', `x:${'t'.repeat(128)}`,
  ];
  const tpl = await makeTemplate(t, a, { image: 'busybox' });
  for (const [i, image] of valid.entries()) {
    const ep = await mustCreate(t, a, queueBody({ image }));
    t.equal(ep.image, image, `${image} kept as given`);
    t.equal((await a.req('PATCH', `/v2/serverless/${ep.id}`, { body: { image } })).status, 200, `${image} on PATCH`);
    t.equal((await a.req('POST', '/v2/templates', { body: { name: `t${i}`, image, isServerless: true } })).status, 201, `${image} on a template`);
    t.equal((await a.req('PATCH', `/v2/templates/${tpl.id}`, { body: { image } })).status, 200, `${image} on a template update`);
  }
  const ep = await mustCreate(t, a, queueBody());
  const invalid = [
    '../../containers/json', '--privileged', '-x', '/busybox', 'busybox/', 'a//b', './x', 'x/../y', 'x/./y', '..',
    'Python:3.11', 'library/Python', 'busybox:', 'busybox:-1', 'busybox:.1', `busybox:${'t'.repeat(129)}`, 'busybox@sha256:abc',
    'busybox@', 'a b', 'busybox?x=1', 'busybox#1', 'busybox%2F..', 'x/y\\z', 'x_/y', 'x-/y', 'x./y', 'a___b', 'host:port/x',
    'host:/x', 'ä/x', 'busybox:1\u0000',
  ];
  for (const image of invalid) {
    for (const [what, r] of [
      ['create', await createEndpoint(a, queueBody({ image }))],
      ['PATCH', await a.req('PATCH', `/v2/serverless/${ep.id}`, { body: { image } })],
      ['template', await a.req('POST', '/v2/templates', { body: { name: 't', image, isServerless: true } })],
      ['template update', await a.req('PATCH', `/v2/templates/${tpl.id}`, { body: { image } })],
    ] as const) {
      assertErrorAt(t, r, 400, '/image', `${JSON.stringify(image)} refused on ${what}`);
      t.match(r.json.errors, [/^\/image: must be an image reference/], 'the reason is said plainly');
      if (image.length > 3) t.notOk(r.text.includes(JSON.stringify(image).slice(1, -1)), 'and the value is not echoed');
    }
  }
  t.equal((await a.req('GET', `/v2/serverless/${ep.id}`)).json.image, 'registry.local/worker:1', 'nothing refused was stored');
});

t.test('a control character in the image or a registry user name is refused, as the engine would get it', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['image with NUL', queueBody({ image: 'busybox\u0000:1' }), 400, '/image'],
    ['image with a newline', queueBody({ image: 'busybox\n' }), 400, '/image'],
    ['image with an escape', queueBody({ image: 'busy\u001bbox' }), 400, '/image'],
    ['image with DEL', queueBody({ image: 'busybox\u007f' }), 400, '/image'],
  ]);
  const r = await createEndpoint(a, queueBody({ image: 'busybox\u0000:1' }));
  t.match(r.json.detail, /\/image: must be an image reference/, 'the reason is said plainly');
  const ok = await mustCreate(t, a, queueBody({ image: 'ghcr.io/example/worker:1.0@sha256:' + 'a'.repeat(64) }));
  assertErrorAt(t, await a.req('PATCH', `/v2/serverless/${ok.id}`, { body: { image: 'busybox\u0000' } }), 400, '/image', 'an update is checked the same way');
  assertErrorAt(t, await a.req('POST', '/v2/templates', { body: { name: 'nul', image: 'busybox\u0000', isServerless: true } }), 400, '/image', 'a template');
  const tpl = (await a.req('POST', '/v2/templates', { body: { name: 'ok', image: 'busybox', isServerless: true } })).json;
  assertErrorAt(t, await a.req('PATCH', `/v2/templates/${tpl.id}`, { body: { image: 'busybox\r' } }), 400, '/image', 'a template update');
  assertErrorAt(t, await a.req('POST', '/v2/registry-credentials', { body: { name: 'r', username: 'robot\n', password: 'pw' } }), 400, '/username', 'a registry user name');
  assertErrorAt(t, await a.req('POST', '/v2/registry-credentials', { body: { name: 'r', username: 'robot', password: 'pw\u0000' } }), 400, '/password', 'a NUL in a registry password');
  const reg = await makeRegistry(t, a, { username: '_json_key', password: '{\n  "type": "service_account"\n}\n' });
  t.ok(reg.id, 'a password may span lines (a _json_key password is a whole JSON key file)');
  assertErrorAt(t, await a.req('PATCH', `/v2/registry-credentials/${reg.id}`, { body: { username: 'a\tb' } }), 400, '/username', 'a registry update');
});

t.test('unknown properties are rejected at every level', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['top level', queueBody({ extra: 1 }), 400, '/extra'],
    ['top level, RunPod-style name', queueBody({ gpuIds: 'ADA_24' }), 400, '/gpuIds'],
    ['__proto__ key', { ...queueBody(), ...JSON.parse('{"__proto__": {"admin": true}}') }, 400, '/__proto__'],
    ['gpu', gpu({ extra: 1 }), 400, '/gpu/extra'],
    ['gpu, pod field', gpu({ gpuTypeIds: ['NVIDIA L4'] }), 400, '/gpu/gpuTypeIds'],
    ['cpu item', cpuBody({ cpu: [{ id: 'cpu3c', vcpuCount: 2, memory: 4 }] }), 400, '/cpu/0/memory'],
    ['workers', queueBody({ workers: { min: 0, max: 1, standby: 1 } }), 400, '/workers/standby'],
    ['scaling QUEUE_DELAY', queueBody({ scaling: { type: 'QUEUE_DELAY', queueDelay: 1, extra: 1 } }), 400, '/scaling/extra'],
    ['scaling REQUEST_COUNT', queueBody({ scaling: { type: 'REQUEST_COUNT', requestCount: 1, extra: 1 } }), 400, '/scaling/extra'],
    ['mounts', queueBody({ mounts: { network: [], shared: [] } }), 400, '/mounts/shared'],
    ['network mount item', queueBody({ mounts: { network: [{ volumeId: 'nv_x', path: '/data' }] } }), 400, '/mounts/network/0/path'],
    ['global mount item', queueBody({ mounts: { global: [{ volumeId: 'gv_x', mountPath: '/data' }] } }), 400, '/mounts/global/0/mountPath'],
  ]);
});

t.test('scaling is a discriminated union', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['LOAD_BALANCER with QUEUE_DELAY', LB({ scaling: { type: 'QUEUE_DELAY', queueDelay: 2 } }), 400, '/scaling/type'],
    ['queueDelay below 0.5', queueBody({ scaling: { type: 'QUEUE_DELAY', queueDelay: 0.49 } }), 400, '/scaling/queueDelay'],
    ['queueDelay 0', queueBody({ scaling: { type: 'QUEUE_DELAY', queueDelay: 0 } }), 400, '/scaling/queueDelay'],
    ['queueDelay negative', queueBody({ scaling: { type: 'QUEUE_DELAY', queueDelay: -1 } }), 400, '/scaling/queueDelay'],
    ['queueDelay missing', queueBody({ scaling: { type: 'QUEUE_DELAY' } }), 400, '/scaling/queueDelay'],
    ['queueDelay as string', queueBody({ scaling: { type: 'QUEUE_DELAY', queueDelay: '4' } }), 400, '/scaling/queueDelay'],
    ['requestCount with QUEUE_DELAY', queueBody({ scaling: { type: 'QUEUE_DELAY', requestCount: 4 } }), 400, '/scaling'],
    ['requestCount 0', queueBody({ scaling: { type: 'REQUEST_COUNT', requestCount: 0 } }), 400, '/scaling/requestCount'],
    ['requestCount fractional', queueBody({ scaling: { type: 'REQUEST_COUNT', requestCount: 1.5 } }), 400, '/scaling/requestCount'],
    ['requestCount missing', LB({ scaling: { type: 'REQUEST_COUNT' } }), 400, '/scaling/requestCount'],
    ['queueDelay with REQUEST_COUNT', queueBody({ scaling: { type: 'REQUEST_COUNT', queueDelay: 4 } }), 400, '/scaling'],
    ['unknown scaler', queueBody({ scaling: { type: 'CPU_UTILIZATION', value: 50 } }), 400, '/scaling/type'],
    ['no scaler type', queueBody({ scaling: { queueDelay: 4 } }), 400, '/scaling'],
    ['scaling not an object', queueBody({ scaling: 'QUEUE_DELAY' }), 400, '/scaling'],
  ]);
  const lb = await mustCreate(t, a, LB());
  t.same(lb.scaling, { type: 'REQUEST_COUNT', requestCount: 2 }, 'LOAD_BALANCER with REQUEST_COUNT');
  const q = await mustCreate(t, a, queueBody({ scaling: { type: 'REQUEST_COUNT', requestCount: 1 } }));
  t.same(q.scaling, { type: 'REQUEST_COUNT', requestCount: 1 }, 'QUEUE may select REQUEST_COUNT; requestCount 1 is the floor');
  const d = await mustCreate(t, a, queueBody({ scaling: { type: 'QUEUE_DELAY', queueDelay: 0.5 } }));
  t.same(d.scaling, { type: 'QUEUE_DELAY', queueDelay: 0.5 }, 'queueDelay 0.5 is the floor');
  t.equal((await mustCreate(t, a, queueBody({ scaling: { type: 'QUEUE_DELAY', queueDelay: 7.25 } }))).scaling.queueDelay, 7.25, 'queueDelay is a number');
});

t.test('workers: bounds, min ≤ max and idleTimeout', async (t) => {
  const a = await startAgent(t);
  const rc = { type: 'REQUEST_COUNT', requestCount: 3 };
  await expectCases(t, a, [
    ['min negative', queueBody({ workers: { min: -1 } }), 400, '/workers/min'],
    ['max negative', queueBody({ workers: { max: -1 } }), 400, '/workers/max'],
    ['min fractional', queueBody({ workers: { min: 0.5 } }), 400, '/workers/min'],
    ['min > max', queueBody({ workers: { min: 4, max: 2 } }), 400, '/workers'],
    ['min above the default max', queueBody({ workers: { min: 5 } }), 400, '/workers'],
    ['idleTimeout 0', queueBody({ workers: { idleTimeout: 0 } }), 400, '/workers/idleTimeout'],
    ['idleTimeout 3601', queueBody({ workers: { idleTimeout: 3601 } }), 400, '/workers/idleTimeout'],
    ['idleTimeout fractional', queueBody({ workers: { idleTimeout: 1.5 } }), 400, '/workers/idleTimeout'],
    ['idleTimeout as string', queueBody({ workers: { idleTimeout: '10' } }), 400, '/workers/idleTimeout'],
    ['idleTimeout on QUEUE + REQUEST_COUNT', queueBody({ scaling: rc, workers: { idleTimeout: 30 } }), 400, '/workers/idleTimeout'],
    ['idleTimeout 10 on QUEUE + REQUEST_COUNT', queueBody({ scaling: rc, workers: { min: 0, max: 2, idleTimeout: 10 } }), 400, '/workers/idleTimeout'],
    ['workers not an object', queueBody({ workers: 3 }), 400, '/workers'],
  ]);
  t.same((await mustCreate(t, a, queueBody({ workers: { idleTimeout: 1 } }))).workers, { min: 0, max: 3, idleTimeout: 1 }, 'idleTimeout 1');
  t.same((await mustCreate(t, a, queueBody({ workers: { idleTimeout: 3600 } }))).workers, { min: 0, max: 3, idleTimeout: 3600 }, 'idleTimeout 3600');
  t.same((await mustCreate(t, a, queueBody({ workers: { min: 2, max: 2 } }))).workers, { min: 2, max: 2, idleTimeout: 10 }, 'min = max, partial object merged with defaults');
  t.same((await mustCreate(t, a, queueBody({ workers: { min: 0, max: 0 } }))).workers, { min: 0, max: 0, idleTimeout: 10 }, 'max 0 is allowed');
  t.same((await mustCreate(t, a, queueBody({ workers: {} }))).workers, { min: 0, max: 3, idleTimeout: 10 }, 'empty workers object gets the defaults');

  const hidden = await mustCreate(t, a, queueBody({ name: 'rc-hidden', scaling: rc, workers: { min: 1, max: 4 } }));
  t.same(hidden.workers, { min: 1, max: 4 }, 'idleTimeout omitted for QUEUE + REQUEST_COUNT');
  t.same((await a.req('GET', `/v2/serverless/${hidden.id}`)).json.workers, { min: 1, max: 4 }, 'omitted on GET too');
  const listed = (await a.req('GET', '/v2/serverless')).json.find((e: { id: string }) => e.id === hidden.id);
  t.same(listed.workers, { min: 1, max: 4 }, 'and in the list');
  const lb = await mustCreate(t, a, LB({ workers: { idleTimeout: 120 } }));
  t.same(lb.workers, { min: 0, max: 3, idleTimeout: 120 }, 'idleTimeout applies to LOAD_BALANCER + REQUEST_COUNT');
});

t.test('exactly one of gpu and cpu', async (t) => {
  const a = await startAgent(t);
  const neither = omit(queueBody(), 'gpu');
  for (const [label, body] of [
    ['neither', neither],
    ['both', { ...queueBody(), cpu: [{ id: 'cpu3c', vcpuCount: 2 }] }],
    ['both null', { ...neither, gpu: null, cpu: null }],
    ['gpu null and no cpu', { ...neither, gpu: null }],
  ] as const) {
    const r = await createEndpoint(a, body);
    assertProblem(t, r, 400, `${label}: 400`);
    t.ok(r.json.errors?.some((e: string) => /^\/(gpu|cpu):/.test(e)), `${label}: error points at gpu or cpu`);
  }
  t.equal((await createEndpoint(a, cpuBody({ gpu: null }))).status, 201, 'gpu: null with cpu');
  t.equal((await createEndpoint(a, queueBody({ cpu: null }))).status, 201, 'cpu: null with gpu');
  await expectCases(t, a, [
    ['gpu not an object', queueBody({ gpu: 'ADA_24' }), 400, '/gpu'],
    ['cpu not an array', cpuBody({ cpu: { id: 'cpu3c', vcpuCount: 2 } }), 400, '/cpu'],
  ]);
});

t.test('gpu.pools are pool ids', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['GPU type id as pool', queueBody({ gpu: { pools: ['NVIDIA GeForce RTX 4090'] } }), 400, '/gpu/pools/0'],
    ['GPU type id as second pool', queueBody({ gpu: { pools: ['ADA_24', 'NVIDIA L4'] } }), 400, '/gpu/pools/1'],
    ['GPU type in no pool', queueBody({ gpu: { pools: ['Tesla T4'] } }), 400, '/gpu/pools/0'],
    ['unknown pool', queueBody({ gpu: { pools: ['ADA_4090'] } }), 400, '/gpu/pools/0'],
    ['lower-case pool', queueBody({ gpu: { pools: ['ada_24'] } }), 400, '/gpu/pools/0'],
    ['no pools', queueBody({ gpu: {} }), 400, '/gpu/pools'],
    ['empty pools', queueBody({ gpu: { pools: [] } }), 400, '/gpu/pools'],
    ['duplicate pools', queueBody({ gpu: { pools: ['ADA_24', 'ADA_24'] } }), 400, '/gpu/pools'],
    ['empty pool id', queueBody({ gpu: { pools: [''] } }), 400, '/gpu/pools/0'],
    ['pools a string', queueBody({ gpu: { pools: 'ADA_24' } }), 400, '/gpu/pools'],
  ]);
  const all = [...GPU_POOLS.keys()];
  const e = await mustCreate(t, a, queueBody({ gpu: { pools: all } }));
  t.same(e.gpu.pools, all, 'every serverless pool is accepted, in the order sent');
});

t.test('gpu.excludedTypes', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['leading dash (pool-string negation)', gpu({ excludedTypes: ['-NVIDIA L4'] }), 400, '/gpu/excludedTypes/0'],
    ['dash after white space', gpu({ excludedTypes: [' \t-NVIDIA L4'] }), 400, '/gpu/excludedTypes/0'],
    ['empty string', gpu({ excludedTypes: [''] }), 400, '/gpu/excludedTypes/0'],
    ['only white space', gpu({ excludedTypes: ['   '] }), 400, '/gpu/excludedTypes/0'],
    ['exact duplicate', gpu({ excludedTypes: ['NVIDIA L4', 'NVIDIA L4'] }), 400, '/gpu/excludedTypes'],
    ['duplicate after trimming', gpu({ excludedTypes: ['NVIDIA L4', '  NVIDIA L4 '] }), 400, '/gpu/excludedTypes/1'],
    ['type of another pool', gpu({ excludedTypes: ['NVIDIA GeForce RTX 4090'] }), 400, '/gpu/excludedTypes/0'],
    ['type in no pool', gpu({ excludedTypes: ['Tesla T4'] }), 400, '/gpu/excludedTypes/0'],
    ['unknown type', gpu({ excludedTypes: ['NVIDIA GeForce RTX 9999'] }), 400, '/gpu/excludedTypes/0'],
    ['pool id as exclusion', gpu({ excludedTypes: ['AMPERE_24'] }), 400, '/gpu/excludedTypes/0'],
    ['second item outside the pools', gpu({ excludedTypes: ['NVIDIA L4', 'NVIDIA A40'] }), 400, '/gpu/excludedTypes/1'],
    ['every type of the only pool', queueBody({ gpu: { pools: ['ADA_24'], excludedTypes: ['NVIDIA GeForce RTX 4090'] } }), 400, '/gpu/excludedTypes'],
    ['every type of every pool', queueBody({ gpu: { pools: ['ADA_24', 'AMPERE_80'], excludedTypes: ['NVIDIA GeForce RTX 4090', 'NVIDIA A100 80GB PCIe', 'NVIDIA A100-SXM4-80GB'] } }), 400, '/gpu/excludedTypes'],
    ['not an array', gpu({ excludedTypes: 'NVIDIA L4' }), 400, '/gpu/excludedTypes'],
  ]);
  const trimmed = await mustCreate(t, a, gpu({ excludedTypes: ['  NVIDIA L4\t', 'NVIDIA RTX A5000 '] }));
  t.same(trimmed.gpu.excludedTypes, ['NVIDIA L4', 'NVIDIA RTX A5000'], 'surrounding white space is trimmed, order kept');
  t.same(trimmed.gpu.pools, ['AMPERE_24']);
  const twoPools = await mustCreate(t, a, queueBody({ gpu: { pools: ['ADA_24', 'AMPERE_24'], excludedTypes: ['NVIDIA GeForce RTX 4090'] } }));
  t.same(twoPools.gpu.excludedTypes, ['NVIDIA GeForce RTX 4090'], 'a whole pool may be excluded while another pool still has types');
  const empty = await mustCreate(t, a, gpu({ excludedTypes: [] }));
  t.same(empty.gpu.excludedTypes, []);
});

t.test('gpu.count', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['count 0', gpu({ count: 0 }), 400, '/gpu/count'],
    ['count fractional', gpu({ count: 1.5 }), 400, '/gpu/count'],
    ['count as string', gpu({ count: '2' }), 400, '/gpu/count'],
  ]);
  t.equal((await mustCreate(t, a, gpu({ count: 4 }))).gpu.count, 4);
});

t.test('CUDA versions on a GPU create', async (t) => {
  const a = await startAgent(t);
  const bad = ['12', '12.1.1', 'v12.1', '12.x', '', ' 12.1', '12.1 ', '１２.１', '12.1\n'];
  await expectCases(t, a, [
    ...bad.map((v): Case => [`allowedCudaVersions ${JSON.stringify(v)}`, gpu({ allowedCudaVersions: [v] }), 400, '/gpu/allowedCudaVersions/0']),
    ...bad.map((v): Case => [`minCudaVersion ${JSON.stringify(v)}`, gpu({ minCudaVersion: v }), 400, '/gpu/minCudaVersion']),
    ['allowedCudaVersions duplicate', gpu({ allowedCudaVersions: ['12.1', '12.1'] }), 400, '/gpu/allowedCudaVersions'],
    ['allowedCudaVersions number', gpu({ allowedCudaVersions: [12.1] }), 400, '/gpu/allowedCudaVersions/0'],
    ['minCudaVersion number', gpu({ minCudaVersion: 12.1 }), 400, '/gpu/minCudaVersion'],
    ['non-empty allowedCudaVersions with minCudaVersion', gpu({ allowedCudaVersions: ['12.4'], minCudaVersion: '12.1' }), 400, '/gpu'],
    ['top-level allowedCudaVersions on a GPU create', queueBody({ allowedCudaVersions: ['12.4'] }), 400, '/allowedCudaVersions'],
    ['top-level minCudaVersion on a GPU create', queueBody({ minCudaVersion: '12.4' }), 400, '/minCudaVersion'],
  ]);
  const exact = await mustCreate(t, a, gpu({ allowedCudaVersions: ['12.10', '11.8', '12.2'] }));
  t.same(exact.gpu.allowedCudaVersions, ['12.10', '11.8', '12.2'], 'versions kept exactly as sent (12.10 is not 12.1), in order');
  t.equal(exact.gpu.minCudaVersion, null);
  const floor = await mustCreate(t, a, gpu({ allowedCudaVersions: [], minCudaVersion: '12.11' }));
  t.same(floor.gpu.allowedCudaVersions, [], 'an explicit empty list may accompany a floor');
  t.equal(floor.gpu.minCudaVersion, '12.11', 'the floor is kept exactly');
  const floorOnly = await mustCreate(t, a, gpu({ minCudaVersion: '12.2' }));
  t.same([floorOnly.gpu.allowedCudaVersions, floorOnly.gpu.minCudaVersion], [[], '12.2']);
  const nullFloor = await mustCreate(t, a, gpu({ allowedCudaVersions: ['12.4'], minCudaVersion: null }));
  t.same([nullFloor.gpu.allowedCudaVersions, nullFloor.gpu.minCudaVersion], [['12.4'], null], 'a null floor is no floor');
});

t.test('CUDA constraints on a CPU create are a 422', async (t) => {
  const a = await startAgent(t);
  await expectCases(t, a, [
    ['gpu object with only allowedCudaVersions', cpuBody({ gpu: { allowedCudaVersions: ['12.4'] } }), 422, '/gpu/allowedCudaVersions'],
    ['gpu object with only minCudaVersion', cpuBody({ gpu: { minCudaVersion: '12.4' } }), 422, '/gpu/minCudaVersion'],
    ['gpu object with both CUDA fields', cpuBody({ gpu: { allowedCudaVersions: [], minCudaVersion: '12.4' } }), 422, '/gpu'],
    ['top-level allowedCudaVersions', cpuBody({ allowedCudaVersions: ['12.4'] }), 422, '/allowedCudaVersions'],
    ['top-level minCudaVersion', cpuBody({ minCudaVersion: '12.4' }), 422, '/minCudaVersion'],
    ['top-level CUDA with gpu: null', cpuBody({ gpu: null, allowedCudaVersions: ['12.4'] }), 422, '/allowedCudaVersions'],
  ]);
  const r = await createEndpoint(a, cpuBody({ minCudaVersion: '12.4' }));
  t.equal(r.json.code, 'UNPROCESSABLE');
  t.match(r.json.detail, /CUDA/);
  const both = await createEndpoint(a, cpuBody({ gpu: { pools: ['ADA_24'], allowedCudaVersions: ['12.4'] } }));
  assertProblem(t, both, 400, 'a real gpu object next to cpu is "both", a 400');
});

t.test('schema errors of a CPU body with CUDA constraints are a 400 listing all of them, not a 422 hiding them', async (t) => {
  const a = await startAgent(t);
  const r = await createEndpoint(a, cpuBody({ minCudaVersion: '12.4', foo: 1, disk: 0 }));
  assertProblem(t, r, 400, 'the schema runs first');
  t.same(r.json.errors, ['/foo: unknown property', '/disk: must be >= 1'], 'every schema error, and not the CUDA one');
  const gpuOnly = await createEndpoint(a, cpuBody({ gpu: { minCudaVersion: '12.4' }, foo: 1 }));
  assertProblem(t, gpuOnly, 400);
  t.same(gpuOnly.json.errors, ['/foo: unknown property'], 'a CUDA-only gpu object adds no "/gpu/pools: is required"');
  for (const [label, body, pointer] of [
    ['a malformed top-level floor', cpuBody({ minCudaVersion: 'abc' }), '/minCudaVersion'],
    ['a null top-level floor', cpuBody({ minCudaVersion: null }), '/minCudaVersion'],
    ['top-level versions that are not an array', cpuBody({ allowedCudaVersions: '12.4' }), '/allowedCudaVersions'],
    ['a malformed floor in a CUDA-only gpu object', cpuBody({ gpu: { minCudaVersion: 'abc' } }), '/gpu/minCudaVersion'],
  ] as const) {
    const only = await createEndpoint(a, body);
    assertErrorAt(t, only, 422, pointer, `${label} on an otherwise valid CPU body is still the 422: ${only.text.slice(0, 300)}`);
  }
});

t.test('cpu items', async (t) => {
  const a = await startAgent(t);
  const cpu = (...items: unknown[]) => cpuBody({ cpu: items });
  await expectCases(t, a, [
    ['vcpuCount 1', cpu({ id: 'cpu3c', vcpuCount: 1 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount 0', cpu({ id: 'cpu3c', vcpuCount: 0 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount 3', cpu({ id: 'cpu3c', vcpuCount: 3 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount 6', cpu({ id: 'cpu3g', vcpuCount: 6 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount 12 on the second item', cpu({ id: 'cpu3g', vcpuCount: 2 }, { id: 'cpu3g', vcpuCount: 12 }), 400, '/cpu/1/vcpuCount'],
    ['vcpuCount 64, not offered for cpu3c', cpu({ id: 'cpu3c', vcpuCount: 64 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount 32, not offered for cpu5g', cpu({ id: 'cpu5g', vcpuCount: 32 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount 2^40', cpu({ id: 'cpu3c', vcpuCount: 2 ** 40 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount 2^32 + 2', cpu({ id: 'cpu3c', vcpuCount: 2 ** 32 + 2 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount fractional', cpu({ id: 'cpu3c', vcpuCount: 2.5 }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount as string', cpu({ id: 'cpu3c', vcpuCount: '2' }), 400, '/cpu/0/vcpuCount'],
    ['vcpuCount missing', cpu({ id: 'cpu3c' }), 400, '/cpu/0/vcpuCount'],
    ['id missing', cpu({ vcpuCount: 2 }), 400, '/cpu/0/id'],
    ['id empty', cpu({ id: '', vcpuCount: 2 }), 400, '/cpu/0/id'],
    ['unknown flavor', cpu({ id: 'cpu9x', vcpuCount: 2 }), 400, '/cpu/0/id'],
    ['instance id instead of flavor', cpu({ id: 'cpu3c-2-4', vcpuCount: 2 }), 400, '/cpu/0/id'],
    ['empty list', cpuBody({ cpu: [] }), 400, '/cpu'],
    ['exact duplicate', cpu({ id: 'cpu3c', vcpuCount: 4 }, { id: 'cpu3g', vcpuCount: 2 }, { id: 'cpu3c', vcpuCount: 4 }), 400, '/cpu/2'],
    ['exact duplicate, keys in another order', cpu({ id: 'cpu5c', vcpuCount: 8 }, { vcpuCount: 8, id: 'cpu5c' }), 400, '/cpu/1'],
  ]);
  const e = await mustCreate(t, a, cpu(
    { id: 'cpu5g', vcpuCount: 16 }, { id: 'cpu3c', vcpuCount: 2 }, { id: 'cpu3c', vcpuCount: 32 },
    { id: 'cpu3g', vcpuCount: 8 }, { id: 'cpu5c', vcpuCount: 4 },
  ));
  t.same(e.cpu, [
    { id: 'cpu5g', vcpuCount: 16, memory: 64 },
    { id: 'cpu3c', vcpuCount: 2, memory: 4 },
    { id: 'cpu3c', vcpuCount: 32, memory: 64 },
    { id: 'cpu3g', vcpuCount: 8, memory: 32 },
    { id: 'cpu5c', vcpuCount: 4, memory: 8 },
  ], 'submitted order kept; the same flavor repeats with another vcpuCount; memory = vcpuCount × RAM multiplier');
  const got = await a.req('GET', `/v2/serverless/${e.id}`);
  t.same(got.json.cpu, e.cpu, 'GET keeps order and memory');
  const catalog = (await a.req('GET', '/v2/catalog/cpus')).json as { id: string; ramMultiplier: number }[];
  for (const item of e.cpu) {
    const flavor = catalog.find((f) => f.id === item.id);
    t.equal(item.memory, item.vcpuCount * (flavor?.ramMultiplier ?? NaN), `${item.id} memory follows the catalog multiplier`);
  }
});

t.test('requestUrls', async (t) => {
  const a = await startAgent(t);
  const q = await mustCreate(t, a, queueBody());
  const base = `${a.url}/v2/${q.id}`;
  t.same(q.requestUrls, {
    run: `${base}/run`,
    runSync: `${base}/runsync`,
    status: `${base}/status/{job_id}`,
    stream: `${base}/stream/{job_id}`,
    cancel: `${base}/cancel/{job_id}`,
    retry: `${base}/retry/{job_id}`,
    purgeQueue: `${base}/purge-queue`,
    health: `${base}/health`,
  }, 'QUEUE: all eight URLs in the spec shapes, under queue_base_url');
  for (const v of Object.values(q.requestUrls as Record<string, string>)) t.doesNotThrow(() => new URL(v.replace('{job_id}', 'x')), `${v} is a URI`);

  const port = new URL(a.url).port;
  const lb = await mustCreate(t, a, LB());
  t.same(lb.requestUrls, { base: `http://${lb.id}.lb.localhost:${port}`, health: `http://${lb.id}.lb.localhost:${port}/ping` }, 'LOAD_BALANCER: base and /ping');
  const custom = await mustCreate(t, a, LB({ env: { HEALTH_CHECK_PATH: '/healthz', PORT: '8080', PORT_HEALTH: '8081' } }));
  t.equal(custom.requestUrls.health, `http://${custom.id}.lb.localhost:${port}/healthz`, 'health follows HEALTH_CHECK_PATH');
});

t.test('requestUrls follow the configured queue_base_url, endpoint_host and scheme', async (t) => {
  const a = await startAgent(t, { publicUrl: 'https://api.example.test', endpointHost: 'ep.example.test', endpointScheme: 'https' });
  const q = await mustCreate(t, a, queueBody());
  t.equal(q.requestUrls.run, `https://api.example.test/v2/${q.id}/run`);
  const lb = await mustCreate(t, a, LB());
  t.same(lb.requestUrls, { base: `https://${lb.id}.ep.example.test`, health: `https://${lb.id}.ep.example.test/ping` });
});

t.test('HEALTH_CHECK_PATH must be a URI path, so requestUrls.health is a URI', async (t) => {
  const a = await startAgent(t);
  for (const bad of ['/a b', '/a?x=1', '/a#f', '/a b?x=1#f', '/a%2', '/a%zz', '/caf\u00e9', '/a\\b', '/a"b', '/<x>', '/a|b', '/a\tb']) {
    const r = await createEndpoint(a, LB({ env: { HEALTH_CHECK_PATH: bad } }));
    assertErrorAt(t, r, 400, '/env/HEALTH_CHECK_PATH', `${JSON.stringify(bad)} is refused: ${r.text.slice(0, 300)}`);
    t.notOk(r.text.includes(JSON.stringify(bad).slice(1, -1)), 'the reply does not echo the value');
  }
  for (const good of ['/', '/ping', '/a/b/', '/v1/health-check_x.json', "/a~b!$&'()*+,;=:@", '/a%20b', '/%E2%9C%93', '//x']) {
    const e = await mustCreate(t, a, LB({ env: { HEALTH_CHECK_PATH: good } }));
    t.equal(e.requestUrls.health, `${e.requestUrls.base}${good}`, `${good} is accepted as sent`);
    t.equal(new URL(e.requestUrls.health).pathname, good, `${good}: the health URL parses with that path`);
  }
  const lb = await mustCreate(t, a, LB());
  const patched = await a.req('PATCH', `/v2/serverless/${lb.id}`, { body: { env: { HEALTH_CHECK_PATH: '/a b?x=1#f' } } });
  assertErrorAt(t, patched, 400, '/env/HEALTH_CHECK_PATH', 'and on PATCH');
});

t.test('validation failures are listed together', async (t) => {
  const a = await startAgent(t);
  const schema = await createEndpoint(a, queueBody({ name: '', disk: 0, extra: true, workers: { idleTimeout: 0 } }));
  assertProblem(t, schema, 400);
  for (const p of ['/name', '/disk', '/extra', '/workers/idleTimeout']) {
    t.ok(schema.json.errors.some((e: string) => e.startsWith(`${p}:`)), `schema errors include ${p}`);
  }
  const rules = await createEndpoint(a, { ...gpu({ excludedTypes: ['NVIDIA A40'], allowedCudaVersions: ['12.4'], minCudaVersion: '12.1' }), workers: { min: 3, max: 1 } });
  assertProblem(t, rules, 400);
  for (const p of ['/gpu/excludedTypes/0:', '/gpu:', '/workers:']) {
    t.ok(rules.json.errors.some((e: string) => e.startsWith(p)), `rule errors include ${p}`);
  }
  t.match(rules.json.detail, /3 validation errors/, 'the detail counts them');
});

t.test('get, list and delete', async (t) => {
  const a = await startAgent(t);
  const one = await mustCreate(t, a, queueBody({ name: 'one' }));
  const two = await mustCreate(t, a, cpuBody({ name: 'two' }));
  const list = await a.req('GET', '/v2/serverless');
  t.equal(list.status, 200);
  t.ok(Array.isArray(list.json), 'list is a bare JSON array');
  t.same(list.json.map((e: { id: string }) => e.id), [one.id, two.id], 'in creation order');
  t.same(list.json[0], one, 'list items are full Endpoint objects');
  assertProblem(t, await a.req('GET', '/v2/serverless/aaaaaaaaaaaaaa'), 404);
  const del = await a.req('DELETE', `/v2/serverless/${one.id}`);
  t.equal(del.status, 204);
  t.equal(del.text, '', 'no body on 204');
  assertProblem(t, await a.req('GET', `/v2/serverless/${one.id}`), 404, 'gone after delete');
  assertProblem(t, await a.req('DELETE', `/v2/serverless/${one.id}`), 404, 'a second delete is a 404');
  assertProblem(t, await a.req('PATCH', `/v2/serverless/${one.id}`, { body: { name: 'x' } }), 404, 'PATCH after delete is a 404');
  t.same((await a.req('GET', '/v2/serverless')).json.map((e: { id: string }) => e.id), [two.id]);
  t.equal((a.agent.db.prepare('SELECT count(*) AS n FROM endpoints WHERE id = ?').get(one.id) as { n: number }).n, 0, 'the row is gone');
});

t.test('delete removes the endpoint logs and job history for good', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody({ name: 'with-logs' }));
  const keep = await mustCreate(t, a, queueBody({ name: 'keeps-logs' }));
  const job = await a.req('POST', `/v2/${e.id}/run`, { body: { input: { prompt: 'hi' } } });
  t.equal(job.status, 200, `a job is queued: ${job.text.slice(0, 200)}`);
  const otherJob = await a.req('POST', `/v2/${keep.id}/run`, { body: { input: {} } });
  t.equal((await a.req('GET', `/v2/${e.id}/status/${job.json.id}`)).status, 200);
  const jobs = (id: string) => (a.agent.db.prepare('SELECT count(*) AS n FROM jobs WHERE endpoint_id = ?').get(id) as { n: number }).n;
  const insert = a.agent.db.prepare('INSERT INTO endpoint_logs (endpoint_id, worker_id, stream, line, at) VALUES (?, ?, ?, ?, ?)');
  for (let i = 0; i < 3; i++) insert.run(e.id, 'w1', 'stdout', `line ${i}`, Date.now());
  insert.run(keep.id, 'w2', 'stdout', 'other endpoint', Date.now());
  const count = (id: string) => (a.agent.db.prepare('SELECT count(*) AS n FROM endpoint_logs WHERE endpoint_id = ?').get(id) as { n: number }).n;
  t.equal(count(e.id), 3);
  t.equal((await a.req('DELETE', `/v2/serverless/${e.id}`)).status, 204);
  t.equal(count(e.id), 0, 'its logs are removed');
  t.equal(count(keep.id), 1, 'other endpoints keep theirs');
  t.equal(jobs(e.id), 0, 'its jobs are removed');
  assertProblem(t, await a.req('GET', `/v2/${e.id}/status/${job.json.id}`), 404, 'the job is gone');
  t.equal(jobs(keep.id), 1, 'other endpoints keep their jobs');
  t.equal((await a.req('GET', `/v2/${keep.id}/status/${otherJob.json.id}`)).status, 200);
});

t.test('a /v2 body with the older /v1/endpoints field names (workersMax, gpuTypeIds, …) says where each one goes here', async (t) => {
  const a = await startAgent(t);
  // What a RunPod user who knows the REST /v1/endpoints body sends to /v2/serverless: each was a
  // bare "unknown property", which does not say that the field exists under another name.
  const r = await createEndpoint(a, cpuBody({ workersMax: 2, idleTimeout: 5, executionTimeoutMs: 600000, foo: 1 }));
  assertProblem(t, r, 400);
  t.same(r.json.errors, [
    '/workersMax: unknown property (a POST /v1/endpoints field); here it is workers.max',
    '/idleTimeout: unknown property (a POST /v1/endpoints field); here it is workers.idleTimeout',
    '/executionTimeoutMs: unknown property (a POST /v1/endpoints field); here it is timeout',
    '/foo: unknown property',
  ], 'each /v1 name gets the /v2 place; any other unknown property stays as it was');
  const g = await createEndpoint(a, queueBody({ gpuTypeIds: ['NVIDIA L4'] }));
  t.same(g.json.errors, ['/gpuTypeIds: unknown property (a POST /v1/endpoints field); here it is gpu.pools with gpu.excludedTypes, or send it as it is to POST /v1/endpoints']);
  const p = await a.req('PATCH', `/v2/serverless/${(await mustCreate(t, a, cpuBody())).id}`, { body: { workersMin: 1 } });
  t.same(p.json.errors, ['/workersMin: unknown property (a POST /v1/endpoints field); here it is workers.min'], 'a PATCH alike');
});

t.test("snake_case names (runpod-flash's Endpoint arguments, Python habits) say where each one goes here", async (t) => {
  const a = await startAgent(t);
  const FLASH = "(an argument of runpod-flash's Endpoint)";
  // Each was a bare "unknown property": a flash user writing the body by hand keeps flash's
  // Python names, which are RunPod's or flashd's own in snake_case, or flash-only.
  const r = await createEndpoint(a, cpuBody({
    idle_timeout: 5, workers_max: 2, execution_timeout_ms: 600000, min_cuda_version: '12.8', data_center_ids: ['LOCAL-1'],
    max_concurrency: 4, dependencies: ['torch'], datacenter: 'EU-RO-1', some_thing: 1,
  }));
  assertProblem(t, r, 400);
  t.same([...r.json.errors].sort(), [
    '/idle_timeout: unknown property (idleTimeout in snake_case, as a POST /v1/endpoints field); here it is workers.idleTimeout',
    '/workers_max: unknown property (workersMax in snake_case, as a POST /v1/endpoints field); here it is workers.max',
    '/execution_timeout_ms: unknown property (executionTimeoutMs in snake_case, as a POST /v1/endpoints field); here it is timeout',
    "/min_cuda_version: unknown property; here it is minCudaVersion (flashd's names are camelCase)",
    "/data_center_ids: unknown property; here it is dataCenterIds (flashd's names are camelCase)",
    `/max_concurrency: unknown property ${FLASH}; a worker takes as many jobs at once as its SDK asks for (concurrency_modifier in serverless.start): leave it out`,
    `/dependencies: unknown property ${FLASH}; flashd installs nothing into a worker: put the packages in the image`,
    `/datacenter: unknown property ${FLASH}; here it is dataCenterIds, an array of data center ids`,
    '/some_thing: unknown property',
  ].sort(), 'each gets its place; an unknown snake_case name stays as it was');
  const tpl = await a.req('POST', '/v2/templates', { body: { name: 't', image_name: 'x/y:1' } });
  t.same([...tpl.json.errors].sort(), ['/image: is required', "/image_name: unknown property (imageName in snake_case, as a field of RunPod's REST template body); here it is image"].sort(), 'a template body alike');
  const ep = (await mustCreate(t, a, cpuBody())).id;
  const p = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { scaler_value: 3 } });
  t.same(p.json.errors, ['/scaler_value: unknown property (scalerValue in snake_case, as a POST /v1/endpoints field); here it is scaling.queueDelay or scaling.requestCount'], 'a PATCH alike');
});

t.test('a /v2 body with RunPod GraphQL, template or console names (scaler, gpuIds, locations, imageName, flashboot: true, …) says where each one goes here', async (t) => {
  const a = await startAgent(t);
  const GQL = "(a field of RunPod GraphQL's saveEndpoint)";
  const TPL = "(a field of RunPod's REST template body)";
  // Each was a bare "unknown property" (or the enum alone for a boolean flashboot): a RunPod user
  // types the names of RunPod's console, GraphQL and REST bodies, too far from flashd's for a guess.
  const { scaling, image: _image, ...rest } = cpuBody();
  const r = await createEndpoint(a, {
    ...rest, scaler: scaling, locations: 'EU-RO-1', flashBootType: 'FLASHBOOT', instanceIds: ['cpu3c-2-4'], networkVolumeIds: ['v1'],
    imageName: 'a/b:1', containerDiskInGb: 20, dockerArgs: 'python h.py', dockerStartCmd: ['python', 'h.py'], dockerEntrypoint: ['bash'], foo: 1,
  });
  assertProblem(t, r, 400);
  t.same([...r.json.errors].sort(), [
    '/scaling: is required',
    '/scaler: unknown property; here it is scaling: {"type": "QUEUE_DELAY", "queueDelay": N} or {"type": "REQUEST_COUNT", "requestCount": N}',
    `/locations: unknown property ${GQL}; here it is dataCenterIds, an array of data center ids (not a comma-separated string)`,
    `/flashBootType: unknown property ${GQL}; here it is flashboot: "OFF", "FLASHBOOT" or "PRIORITY_FLASHBOOT"`,
    `/instanceIds: unknown property ${GQL}; here it is cpu, a list of {"id": CPU flavor id, "vcpuCount": N}`,
    `/networkVolumeIds: unknown property ${GQL}; here it is mounts.network, a list of {"volumeId": ID}`,
    `/imageName: unknown property ${TPL}; here it is image`,
    `/containerDiskInGb: unknown property ${TPL}; here it is disk`,
    `/dockerArgs: unknown property ${TPL}; here it is args`,
    `/dockerStartCmd: unknown property ${TPL}; here it is cmd`,
    `/dockerEntrypoint: unknown property ${TPL}; here it is entrypoint`,
    '/foo: unknown property',
  ].sort(), 'each RunPod name gets its place here; any other unknown property stays as it was');
  const g = await createEndpoint(a, omit(queueBody({ gpuIds: 'AMPERE_24,-NVIDIA L4', flashboot: true }), 'gpu'));
  t.same([...g.json.errors].sort(), [
    '/flashboot: must be one of "OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT" (POST /v1/endpoints takes a boolean; here true is "FLASHBOOT" and false "OFF")',
    `/gpuIds: unknown property ${GQL}; here it is gpu.pools, an array of pool ids (not a comma-separated string), with each "-TYPE" of it in gpu.excludedTypes`,
  ].sort(), 'gpuIds and a boolean flashboot');
  t.same((await createEndpoint(a, queueBody({ flashboot: 'ON' }))).json.errors, ['/flashboot: must be one of "OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT"'], 'a string flashboot: as before');
  const ep = (await mustCreate(t, a, cpuBody())).id as string;
  const p = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { scaler: scaling, templateId: 'tpl1', flashboot: false } });
  t.same([...p.json.errors].sort(), [
    '/flashboot: must be one of "OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT" (POST /v1/endpoints takes a boolean; here true is "FLASHBOOT" and false "OFF")',
    '/scaler: unknown property; here it is scaling: {"type": "QUEUE_DELAY", "queueDelay": N} or {"type": "REQUEST_COUNT", "requestCount": N}',
    "/templateId: unknown property (RunPod's REST PATCH takes it); here a template is read only at create: send the fields to change (image, args, env, …) themselves",
  ].sort(), 'a PATCH alike, templateId included');
});

t.test('RunPod console habits in a create or PATCH body (numbers as strings, comma-separated lists, idleTimeout in ms, "QB", lower case) get errors[] entries that say what the field takes', async (t) => {
  const a = await startAgent(t);
  // Each entry was the schema's words alone ("/workers/max: must be integer" for "3"), which do
  // not say why a value that reads right is refused. Nothing more is accepted than before.
  const r = await createEndpoint(a, queueBody({
    type: 'QB', gpu: { pools: 'AMPERE_24,ADA_24', count: '2' }, workers: { max: '3', idleTimeout: 60000 }, dataCenterIds: 'EU-RO-1',
    cmd: 'python handler.py', env: { PORT: 8000, DEBUG: true }, scaling: { type: 'QUEUE_DELAY', value: 4 }, flashboot: 'flashboot', disk: '20',
  }));
  assertProblem(t, r, 400);
  t.same([...r.json.errors].sort(), [
    '/type: must be one of "QUEUE", "LOAD_BALANCER" (RunPod\'s "QB" is "QUEUE" here)',
    '/gpu/pools: must be array (a JSON array of strings, not one comma-separated string)',
    '/gpu/count: must be integer (a JSON number: 2, not the string "2")',
    '/workers/max: must be integer (a JSON number: 3, not the string "3")',
    '/workers/idleTimeout: must be <= 3600 (it is in seconds, not milliseconds: did you mean 60?)',
    '/dataCenterIds: must be array (a JSON array of strings, not one comma-separated string)',
    '/cmd: must be array (a JSON array of arguments such as ["python", "handler.py"]; a whole command line as one string goes in args)',
    '/env/PORT: must be string (every env value is a string: put numbers and booleans in quotes)',
    '/env/DEBUG: must be string (every env value is a string: put numbers and booleans in quotes)',
    '/scaling/queueDelay: is required',
    '/scaling/value: unknown property; here it is scaling.queueDelay (seconds, for QUEUE_DELAY) or scaling.requestCount (for REQUEST_COUNT)',
    '/flashboot: must be one of "OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT" (did you mean "FLASHBOOT"?)',
    '/disk: must be integer (a JSON number: 20, not the string "20")',
  ].sort(), 'each entry says what the field takes');
  const c = await createEndpoint(a, omit(queueBody({ type: 'LB', cpu: { id: 'cpu3c', vcpuCount: 2 }, mounts: { network: ['nv1'] }, workers: { idleTimeout: 4500 }, scaling: { type: 'request_count', requestCount: 1 } }), 'gpu'));
  t.same([...c.json.errors].sort(), [
    '/type: must be one of "QUEUE", "LOAD_BALANCER" (RunPod\'s "LB" is "LOAD_BALANCER" here)',
    '/cpu: must be array or null (a list, even of one: [{"id": "cpu3c", "vcpuCount": 2}])',
    '/mounts/network/0: must be object ({"volumeId": ID}, not the id alone)',
    '/workers/idleTimeout: must be <= 3600 (it is in seconds, not milliseconds)',
    '/scaling/type: must be one of "QUEUE_DELAY", "REQUEST_COUNT" (did you mean "REQUEST_COUNT"?)',
  ].sort(), 'a single cpu object, a bare volume id, an idleTimeout in ms not a whole number of seconds, a scaling type in lower case');
  t.same((await createEndpoint(a, queueBody({ workers: { max: 'three', min: 1.5 }, type: 'SERVERLESS', gpu: { pools: 7 }, disk: '1.5' }))).json.errors.sort(), [
    '/type: must be one of "QUEUE", "LOAD_BALANCER"', '/workers/min: must be integer', '/workers/max: must be integer', '/gpu/pools: must be array', '/disk: must be integer',
  ].sort(), 'anything else keeps the schema\'s words ("1.5" for an integer too)');
  const ep = (await mustCreate(t, a, cpuBody())).id as string;
  const p = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { min: '1' }, timeout: '600000' } });
  t.same([...p.json.errors].sort(), [
    '/timeout: must be integer (a JSON number: 600000, not the string "600000")',
    '/workers/min: must be integer (a JSON number: 1, not the string "1")',
  ].sort(), 'a PATCH alike');
});

t.test('RunPod names one level down (workers.workersMax, gpu.gpuCount, gpu.gpuTypeIds) say where each one goes here', async (t) => {
  const a = await startAgent(t);
  const r = await createEndpoint(a, queueBody({ workers: { workersMin: 0, workersMax: 2, foo: 1 }, gpu: { pools: ['ADA_24'], gpuCount: 2, gpuTypeIds: ['NVIDIA L4'], gpuIds: 'ADA_24' } }));
  assertProblem(t, r, 400);
  t.same([...r.json.errors].sort(), [
    '/workers/workersMin: unknown property; here it is workers.min',
    '/workers/workersMax: unknown property; here it is workers.max',
    '/workers/foo: unknown property',
    '/gpu/gpuCount: unknown property; here it is gpu.count',
    '/gpu/gpuTypeIds: unknown property; here it is gpu.pools with gpu.excludedTypes (GPU type ids go in gpuTypeIds of POST /v1/endpoints)',
    '/gpu/gpuIds: unknown property; here it is gpu.pools with gpu.excludedTypes',
  ].sort(), 'each gets its place; any other unknown property stays as it was');
});

t.test('env sent as a list of {key, value} pairs (RunPod GraphQL\'s shape) says which shape is taken, on endpoints and templates', async (t) => {
  const a = await startAgent(t);
  const expected = '/env: must be an object of variable names to string values ({"NAME": "value"}), not an array (RunPod GraphQL\'s list of {key, value} pairs)';
  const pairs = [{ key: 'A', value: 'b' }];
  const create = await createEndpoint(a, { ...queueBody(), env: pairs });
  assertErrorAt(t, create, 400, '/env', 'endpoint create');
  t.same(create.json.errors, [expected], 'endpoint create: errors');
  t.equal(create.json.detail, expected, 'endpoint create: detail');
  const ep = (await createEndpoint(a, queueBody())).json.id as string;
  const patch = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: pairs, workers: { min: '1' } } });
  t.same([...patch.json.errors].sort(), ['/workers/min: must be integer (a JSON number: 1, not the string "1")', expected].sort(), 'endpoint PATCH: each error, env\'s said');
  const template = await a.req('POST', '/v2/templates', { body: { name: 't', image: 'x/y:1', env: pairs } });
  t.same(template.json.errors, [expected], 'template create: errors');
  // Other wrong shapes keep the schema's words.
  t.same((await createEndpoint(a, { ...queueBody(), env: 'A=b' })).json.errors, ['/env: must be object'], 'a string: as before');
});
