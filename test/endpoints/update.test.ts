/**
 * PATCH /v2/serverless/{id}: the update semantics of the spec and the design decisions built on
 * them (fields merge, env replaces, gpu merges per field with pools+excludedTypes as one
 * selection, hardware switches, fixed type, restartRequired). Mount updates are in mounts.test.ts,
 * command updates in command.test.ts.
 */
import t, { type Test } from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { ManualClock } from '../../src/core/clock.js';
import { assertProblem, cpuBody, queueBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { assertErrorAt, makeRegistry, mustCreate } from '../helpers/expect.js';
import { TestWorker } from '../helpers/worker.js';

const patch = (a: TestAgent, id: string, body: unknown) => a.req('PATCH', `/v2/serverless/${id}`, { body });

async function mustPatch(t: Test, a: TestAgent, id: string, body: unknown): Promise<any> {
  const r = await patch(a, id, body);
  t.equal(r.status, 200, `PATCH ${JSON.stringify(body).slice(0, 120)}: ${r.text.slice(0, 300)}`);
  return r.json;
}

const strip = (e: Record<string, unknown>) => {
  const { updatedAt: _u, restartRequired: _r, restartReasons: _rr, ...rest } = e;
  return rest;
};

t.test('fields merge; env replaces the whole map; timestamps', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, {}, { clock });
  const e = await mustCreate(t, a, queueBody({ name: 'merge', env: { A: '1', B: '2' }, disk: 10, ports: ['8000/http'], timeout: 5000, flashboot: 'FLASHBOOT' }));
  clock.advance(5000);
  const renamed = await mustPatch(t, a, e.id, { name: 'merged' });
  t.same(strip(renamed), { ...strip(e), name: 'merged' }, 'only name changed');
  t.equal(renamed.createdAt, e.createdAt, 'createdAt kept');
  t.equal(Date.parse(renamed.updatedAt) - Date.parse(e.updatedAt), 5000, 'updatedAt moves');
  const stored = (await a.req('GET', `/v2/serverless/${e.id}`)).json;
  t.notOk('restartRequired' in stored || 'restartReasons' in stored, 'GET has no restart fields');
  t.same(strip(stored), strip(renamed), 'GET shows the stored result');
  t.equal(stored.updatedAt, renamed.updatedAt);

  const env = await mustPatch(t, a, e.id, { env: { C: '3' } });
  t.same(env.env, { C: '3' }, 'env replaces the whole map');
  t.same((await mustPatch(t, a, e.id, { env: {} })).env, {}, 'env {} empties it');

  const many = await mustPatch(t, a, e.id, { image: 'registry.local/worker:2', disk: 30, ports: [], timeout: 600000, flashboot: 'OFF', dataCenterIds: ['LOCAL-1'] });
  t.same([many.image, many.disk, many.ports, many.timeout, many.flashboot, many.dataCenterIds], ['registry.local/worker:2', 30, [], 600000, 'OFF', ['LOCAL-1']]);
  t.same((await mustPatch(t, a, e.id, { dataCenterIds: [] })).dataCenterIds, [], 'dataCenterIds [] resets to "scheduler chooses"');

  const empty = await mustPatch(t, a, e.id, {});
  t.equal(empty.restartRequired, false, 'an empty PATCH changes nothing');
  t.same(empty.restartReasons, []);
});

t.test('a PATCH that changes nothing writes nothing: updatedAt, the log and the change listeners stay still', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, {}, { clock });
  const changed: string[] = [];
  a.agent.endpoints.on({ changed: (id) => void changed.push(id) });
  const body = queueBody({ name: 'noop', env: { A: '1', B: '2' }, gpu: { pools: ['AMPERE_24'], excludedTypes: [] } });
  const e = await mustCreate(t, a, body);
  changed.length = 0;
  const updatedLines = () => a.logs.filter((l) => l.includes('endpoint updated')).length;
  for (const [label, same] of [
    ['{}', {}],
    ['the same name', { name: 'noop' }],
    ['the same env in another order', { env: { B: '2', A: '1' } }],
    ['the create body again', body],
  ] as const) {
    clock.advance(1000);
    const r = await mustPatch(t, a, e.id, same);
    t.same(r, { ...e, restartRequired: false, restartReasons: [] }, `${label}: the reply is the endpoint as it was, updatedAt included`);
    t.equal((await a.req('GET', `/v2/serverless/${e.id}`)).json.updatedAt, e.updatedAt, `${label}: nothing was written`);
  }
  t.equal(updatedLines(), 0, 'no "endpoint updated" log line');
  t.same(changed, [], 'no change listener ran');
  clock.advance(1000);
  const renamed = await mustPatch(t, a, e.id, { name: 'noop2' });
  t.equal(Date.parse(renamed.updatedAt) - Date.parse(e.updatedAt), 5000, 'a real change still moves updatedAt');
  t.equal(updatedLines(), 1, 'and is logged');
  t.same(changed, [e.id], 'and reaches the listeners');
});

t.test('the same env in another key order is no change and restarts nothing', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody({ env: { A: '1', B: '2', C: '3' } }));
  const same = await mustPatch(t, a, e.id, { env: { C: '3', A: '1', B: '2' } });
  t.equal(same.restartRequired, false);
  t.same(same.restartReasons, []);
  const changed = await mustPatch(t, a, e.id, { env: { C: '3', A: '1', B: '4' } });
  t.same(changed.restartReasons, ['env'], 'a changed value still is');
});

t.test('workers merge and keep their rules', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody({ workers: { min: 1, max: 4, idleTimeout: 30 } }));
  t.same((await mustPatch(t, a, e.id, { workers: { max: 6 } })).workers, { min: 1, max: 6, idleTimeout: 30 }, 'workers merge per field');
  t.same((await mustPatch(t, a, e.id, { workers: { idleTimeout: 3600 } })).workers, { min: 1, max: 6, idleTimeout: 3600 });
  assertErrorAt(t, await patch(a, e.id, { workers: { min: 7 } }), 400, '/workers', 'min above the stored max');
  assertErrorAt(t, await patch(a, e.id, { workers: { max: 0 } }), 400, '/workers', 'max below the stored min');
  assertErrorAt(t, await patch(a, e.id, { workers: { idleTimeout: 0 } }), 400, '/workers/idleTimeout');
  assertErrorAt(t, await patch(a, e.id, { workers: { idleTimeout: 3601 } }), 400, '/workers/idleTimeout');
  assertErrorAt(t, await patch(a, e.id, { workers: { warm: 1 } }), 400, '/workers/warm', 'unknown property in workers');
  t.same((await a.req('GET', `/v2/serverless/${e.id}`)).json.workers, { min: 1, max: 6, idleTimeout: 3600 }, 'refused PATCHes changed nothing');
});

t.test('idleTimeout on PATCH follows the resulting type and scaling', async (t) => {
  const a = await startAgent(t);
  const rc = { type: 'REQUEST_COUNT', requestCount: 2 };
  const qd = { type: 'QUEUE_DELAY', queueDelay: 3 };
  const q = await mustCreate(t, a, queueBody({ workers: { idleTimeout: 45 } }));
  assertErrorAt(t, await patch(a, q.id, { scaling: rc, workers: { idleTimeout: 20 } }), 400, '/workers/idleTimeout', 'switching to REQUEST_COUNT with an idleTimeout');
  const switched = await mustPatch(t, a, q.id, { scaling: rc });
  t.same(switched.scaling, rc, 'the scaler can be switched on update');
  t.same(switched.workers, { min: 0, max: 3 }, 'idleTimeout hidden once QUEUE scales on REQUEST_COUNT');
  assertErrorAt(t, await patch(a, q.id, { workers: { idleTimeout: 20 } }), 400, '/workers/idleTimeout', 'rejected on update for QUEUE + REQUEST_COUNT');
  t.same((await mustPatch(t, a, q.id, { workers: { max: 5 } })).workers, { min: 0, max: 5 }, 'other worker fields still update');
  const back = await mustPatch(t, a, q.id, { scaling: qd, workers: { idleTimeout: 90 } });
  t.same(back.workers, { min: 0, max: 5, idleTimeout: 90 }, 'switching back with an idleTimeout in the same request is allowed');

  const lb = await mustCreate(t, a, queueBody({ type: 'LOAD_BALANCER', scaling: rc }));
  assertErrorAt(t, await patch(a, lb.id, { scaling: qd }), 400, '/scaling/type', 'LOAD_BALANCER cannot switch to QUEUE_DELAY');
  t.same((await mustPatch(t, a, lb.id, { scaling: { type: 'REQUEST_COUNT', requestCount: 9 }, workers: { idleTimeout: 5 } })).workers.idleTimeout, 5);
  assertErrorAt(t, await patch(a, lb.id, { scaling: { type: 'REQUEST_COUNT', requestCount: 0 } }), 400, '/scaling/requestCount');
  const health = await mustPatch(t, a, lb.id, { env: { HEALTH_CHECK_PATH: '/ready' } });
  t.equal(health.requestUrls.health, `${health.requestUrls.base}/ready`, 'the LB health URL follows HEALTH_CHECK_PATH on PATCH');
  t.equal((await mustPatch(t, a, lb.id, { env: {} })).requestUrls.health, `${health.requestUrls.base}/ping`, 'and falls back to /ping');
  assertErrorAt(t, await patch(a, lb.id, { env: { HEALTH_CHECK_PATH: 'ready' } }), 400, '/env/HEALTH_CHECK_PATH');
  assertErrorAt(t, await patch(a, lb.id, { scaling: { type: 'REQUEST_COUNT', requestCount: 2, queueDelay: 1 } }), 400, '/scaling/queueDelay');
});

t.test('type is fixed at creation', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody());
  assertErrorAt(t, await patch(a, e.id, { type: 'LOAD_BALANCER', scaling: { type: 'REQUEST_COUNT', requestCount: 1 } }), 400, '/type');
  t.equal((await mustPatch(t, a, e.id, { type: 'QUEUE' })).type, 'QUEUE', 'repeating the same type is fine');
  assertErrorAt(t, await patch(a, e.id, { type: 'queue' }), 400, '/type');
  assertErrorAt(t, await patch(a, e.id, { templateId: 'tpl_x' }), 400, '/templateId', 'templateId is create-only');
  assertErrorAt(t, await patch(a, e.id, { id: 'abc' }), 400, '/id');
  assertErrorAt(t, await patch(a, e.id, { name: '' }), 400, '/name');
  assertErrorAt(t, await patch(a, e.id, { image: '' }), 400, '/image');
});

t.test('gpu merges per field; pools and excludedTypes are one selection', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody({ gpu: { pools: ['AMPERE_24'], excludedTypes: ['NVIDIA L4'], count: 2, minCudaVersion: '12.1' } }));
  const counted = await mustPatch(t, a, e.id, { gpu: { count: 4 } });
  t.same(counted.gpu, { pools: ['AMPERE_24'], excludedTypes: ['NVIDIA L4'], count: 4, allowedCudaVersions: [], minCudaVersion: '12.1' }, 'omitting pools leaves pools and excludedTypes untouched');
  const floor = await mustPatch(t, a, e.id, { gpu: { minCudaVersion: '12.4' } });
  t.same([floor.gpu.minCudaVersion, floor.gpu.excludedTypes, floor.gpu.count], ['12.4', ['NVIDIA L4'], 4], 'one CUDA field merges alone');

  const repooled = await mustPatch(t, a, e.id, { gpu: { pools: ['AMPERE_24', 'ADA_24'] } });
  t.same(repooled.gpu.pools, ['AMPERE_24', 'ADA_24']);
  t.same(repooled.gpu.excludedTypes, [], 'sending pools without excludedTypes clears the exclusions');
  t.equal(repooled.gpu.count, 4, 'other gpu fields stay');

  const together = await mustPatch(t, a, e.id, { gpu: { pools: ['AMPERE_48'], excludedTypes: [' NVIDIA A40 '] } });
  t.same([together.gpu.pools, together.gpu.excludedTypes], [['AMPERE_48'], ['NVIDIA A40']], 'both replaced together, exclusions trimmed');
  const onlyExcluded = await mustPatch(t, a, e.id, { gpu: { excludedTypes: ['NVIDIA RTX A6000'] } });
  t.same([onlyExcluded.gpu.pools, onlyExcluded.gpu.excludedTypes], [['AMPERE_48'], ['NVIDIA RTX A6000']], 'excludedTypes alone are checked against the stored pools');

  assertErrorAt(t, await patch(a, e.id, { gpu: { excludedTypes: ['NVIDIA L4'] } }), 400, '/gpu/excludedTypes/0', 'an exclusion outside the stored pools');
  assertErrorAt(t, await patch(a, e.id, { gpu: { excludedTypes: ['NVIDIA A40', 'NVIDIA RTX A6000'] } }), 400, '/gpu/excludedTypes', 'excluding every type');
  assertErrorAt(t, await patch(a, e.id, { gpu: { pools: ['ADA_24'], excludedTypes: ['NVIDIA A40'] } }), 400, '/gpu/excludedTypes/0', 'new exclusions checked against the new pools');
  assertErrorAt(t, await patch(a, e.id, { gpu: { pools: ['NVIDIA A40'] } }), 400, '/gpu/pools/0', 'a GPU type id as pool');
  assertErrorAt(t, await patch(a, e.id, { gpu: { pools: [] } }), 400, '/gpu/pools');
  assertErrorAt(t, await patch(a, e.id, { gpu: { excludedTypes: ['-NVIDIA A40'] } }), 400, '/gpu/excludedTypes/0');
  assertErrorAt(t, await patch(a, e.id, { gpu: { excludedTypes: ['NVIDIA A40', 'NVIDIA A40 '] } }), 400, '/gpu/excludedTypes/1', 'duplicates after trimming');
  assertErrorAt(t, await patch(a, e.id, { gpu: { count: 0 } }), 400, '/gpu/count');
  assertErrorAt(t, await patch(a, e.id, { gpu: { size: 1 } }), 400, '/gpu/size', 'unknown property in gpu');

  assertErrorAt(t, await patch(a, e.id, { gpu: { allowedCudaVersions: ['12.8'] } }), 400, '/gpu', 'versions next to the stored floor conflict');
  const swapped = await mustPatch(t, a, e.id, { gpu: { allowedCudaVersions: ['12.8'], minCudaVersion: null } });
  t.same([swapped.gpu.allowedCudaVersions, swapped.gpu.minCudaVersion], [['12.8'], null], 'versions with the floor cleared in one request');
  assertErrorAt(t, await patch(a, e.id, { gpu: { minCudaVersion: '12.1' } }), 400, '/gpu', 'a floor next to stored versions conflicts');
  const floorAgain = await mustPatch(t, a, e.id, { gpu: { allowedCudaVersions: [], minCudaVersion: '12.11' } });
  t.same([floorAgain.gpu.allowedCudaVersions, floorAgain.gpu.minCudaVersion], [[], '12.11']);
  assertErrorAt(t, await patch(a, e.id, { gpu: { allowedCudaVersions: ['12'] } }), 400, '/gpu/allowedCudaVersions/0');
  assertErrorAt(t, await patch(a, e.id, { allowedCudaVersions: ['12.4'] }), 400, '/allowedCudaVersions', 'top-level CUDA on a GPU endpoint');
  assertErrorAt(t, await patch(a, e.id, { gpu: null }), 400, '/gpu', 'gpu: null would leave no hardware');
});

t.test('switching hardware between gpu and cpu', async (t) => {
  const a = await startAgent(t);
  const g = await mustCreate(t, a, queueBody({ gpu: { pools: ['ADA_24'], count: 2, allowedCudaVersions: ['12.4'] } }));
  const toCpu = await mustPatch(t, a, g.id, { cpu: [{ id: 'cpu5c', vcpuCount: 4 }, { id: 'cpu3g', vcpuCount: 2 }] });
  t.notOk('gpu' in toCpu, 'sending cpu to a GPU endpoint switches it: gpu is gone');
  t.same(toCpu.cpu, [{ id: 'cpu5c', vcpuCount: 4, memory: 8 }, { id: 'cpu3g', vcpuCount: 2, memory: 8 }]);
  t.ok(toCpu.restartRequired, 'a hardware change needs a restart');
  t.ok(toCpu.restartReasons.includes('cpu') && toCpu.restartReasons.includes('gpu'), `reasons: ${toCpu.restartReasons}`);

  assertErrorAt(t, await patch(a, g.id, { gpu: { allowedCudaVersions: ['12.4'] } }), 422, '/gpu/allowedCudaVersions', 'CUDA on a CPU endpoint is a 422');
  assertErrorAt(t, await patch(a, g.id, { minCudaVersion: '12.4' }), 422, '/minCudaVersion', 'top-level CUDA on a CPU endpoint is a 422');
  const hidden = await patch(a, g.id, { minCudaVersion: '12.4', gpu: { minCudaVersion: '12.4' }, foo: 1, timeout: -1 });
  assertErrorAt(t, hidden, 400, '/foo', 'schema errors first: the CUDA 422 comes only for an otherwise valid body');
  t.same(hidden.json?.errors, ['/foo: unknown property', '/timeout: must be >= 5000'], `every schema error, not the CUDA ones: ${hidden.text.slice(0, 300)}`);
  assertErrorAt(t, await patch(a, g.id, { gpu: { count: 2 } }), 400, '/gpu/pools', 'switching to GPU needs pools');
  assertErrorAt(t, await patch(a, g.id, { cpu: null }), 400, '/cpu', 'cpu: null would leave no hardware');
  assertErrorAt(t, await patch(a, g.id, { cpu: [] }), 400, '/cpu');
  assertErrorAt(t, await patch(a, g.id, { cpu: [{ id: 'cpu3c', vcpuCount: 2 }, { id: 'cpu3c', vcpuCount: 2 }] }), 400, '/cpu/1', 'exact duplicates');
  assertErrorAt(t, await patch(a, g.id, { cpu: [{ id: 'cpu3c', vcpuCount: 3 }] }), 400, '/cpu/0/vcpuCount');
  assertErrorAt(t, await patch(a, g.id, { cpu: [{ id: 'cpu3c', vcpuCount: 2 }], gpu: { pools: ['ADA_24'] } }), 400, '/cpu', 'both at once');

  const toGpu = await mustPatch(t, a, g.id, { gpu: { pools: ['AMPERE_80'], excludedTypes: ['NVIDIA A100-SXM4-80GB'] } });
  t.notOk('cpu' in toGpu, 'sending gpu.pools to a CPU endpoint switches it back: cpu is gone');
  t.same(toGpu.gpu, { pools: ['AMPERE_80'], excludedTypes: ['NVIDIA A100-SXM4-80GB'], count: 1, allowedCudaVersions: [], minCudaVersion: null }, 'a fresh gpu selection with defaults');

  const c = await mustCreate(t, a, cpuBody());
  const withCuda = await mustPatch(t, a, c.id, { gpu: { pools: ['ADA_24'], minCudaVersion: '12.2' } });
  t.same([withCuda.gpu.pools, withCuda.gpu.minCudaVersion], [['ADA_24'], '12.2'], 'CUDA fields are fine when the PATCH makes it a GPU endpoint');
});

t.test('restartRequired and restartReasons', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody({ workers: { min: 0, max: 4 } }));
  const reasons = async (body: unknown) => {
    const r = await mustPatch(t, a, e.id, body);
    t.type(r.restartRequired, 'boolean');
    t.ok(Array.isArray(r.restartReasons));
    t.equal(r.restartRequired, r.restartReasons.length > 0, 'restartRequired iff there are reasons');
    return r.restartReasons as string[];
  };
  t.same(await reasons({ name: 'no-restart' }), [], 'a name change needs no restart');
  t.same(await reasons({ workers: { max: 8 } }), [], 'raising max needs no restart');
  t.same(await reasons({ scaling: { type: 'QUEUE_DELAY', queueDelay: 9 } }), [], 'the scaler needs no restart');
  t.same(await reasons({ timeout: 6000 }), []);
  t.same(await reasons({ image: 'registry.local/worker:9' }), ['image']);
  t.same(await reasons({ image: 'registry.local/worker:9' }), [], 'an unchanged value is no change');
  t.same(await reasons({ env: { X: '1' } }), ['env']);
  t.same(await reasons({ args: 'python x.py' }), ['args']);
  t.same(await reasons({ gpu: { count: 2 } }), ['gpu'], 'GPU selection changes need a restart');
  t.same(await reasons({ workers: { max: 2 } }), [], 'lowering max with no worker above it stops nobody: no restart');
  t.same(await reasons({ flashboot: 'FLASHBOOT', disk: 40 }), ['disk', 'flashboot']);
  t.same(await reasons({ mounts: { global: [] } }), [], 'an unchanged mount list is no change');
});

t.test('registry on PATCH', async (t) => {
  const a = await startAgent(t);
  const reg = await makeRegistry(t, a);
  const e = await mustCreate(t, a, queueBody());
  t.equal((await mustPatch(t, a, e.id, { registry: reg.id })).registry, reg.id);
  t.equal((await mustPatch(t, a, e.id, { name: 'keep-registry' })).registry, reg.id, 'omitted: unchanged');
  assertErrorAt(t, await patch(a, e.id, { registry: 'reg_unknown000000000000' }), 404, '/registry', 'unknown credential');
  t.equal((await mustPatch(t, a, e.id, { registry: null })).registry, null, 'null detaches');
  t.equal((await a.req('DELETE', `/v2/registry-credentials/${reg.id}`)).status, 204, 'a detached credential can be deleted');
});

t.test('PATCH body and transport errors', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody());
  assertProblem(t, await a.req('PATCH', `/v2/serverless/${e.id}`, { raw: '{"name": "x"}' }), 415);
  assertProblem(t, await a.req('PATCH', `/v2/serverless/${e.id}`, { raw: '{"name": ', headers: { 'content-type': 'application/json' } }), 400);
  assertProblem(t, await a.req('PATCH', `/v2/serverless/${e.id}`, { raw: '"x"', headers: { 'content-type': 'application/json' } }), 400);
  assertProblem(t, await a.req('PATCH', '/v2/serverless/zzzzzzzzzzzzzz', { body: { name: 'x' } }), 404);
  t.equal((await a.req('PATCH', `/v2/serverless/${e.id}`, { raw: '{"name":"merge-patch"}', headers: { 'content-type': 'application/merge-patch+json' } })).status, 200, 'a +json media type is JSON');
});

t.test('an endpoint an older flashd stored with a timeout under 5 s still loads, lists, runs and takes a PATCH of other fields', async (t) => {
  const first = await startAgent(t);
  const e = await mustCreate(t, first, queueBody({ name: 'old-timeout' }));
  await first.agent.close();
  // Older versions accepted 1 ms up: write the stored spec as one of them left it.
  const db = new Database(join(first.dir, 'flashd.db'));
  db.prepare("UPDATE endpoints SET data = json_set(data, '$.timeout', 600) WHERE id = ?").run(e.id);
  db.close();

  const a = await startAgent(t, {}, { dir: first.dir });
  t.equal((await a.req('GET', `/v2/serverless/${e.id}`)).json?.timeout, 600, 'GET shows the stored value');
  t.ok((await a.req('GET', '/v2/serverless')).json.some((x: { id: string; timeout: number }) => x.id === e.id && x.timeout === 600), 'and the list');
  t.equal((await a.req('GET', `/v1/endpoints/${e.id}`)).json?.executionTimeoutMs, 600, 'and the older REST view');
  const renamed = await mustPatch(t, a, e.id, { name: 'old-timeout-2', workers: { max: 2 } });
  t.same([renamed.name, renamed.workers.max, renamed.timeout], ['old-timeout-2', 2, 600], 'a PATCH of other fields keeps it');
  assertErrorAt(t, await patch(a, e.id, { timeout: 600 }), 400, '/timeout', 'sent again, it is checked as any sent value');

  const run = await a.req('POST', `/v2/${e.id}/run`, { body: { input: { x: 1 } } });
  t.equal(run.status, 200, `a job is still accepted: ${run.text.slice(0, 200)}`);
  const worker = await TestWorker.create(a, e.id);
  const job = await worker.take();
  t.equal(job?.id, run.json.id, 'and handed to a worker');
  t.equal((await worker.done(run.json.id, { output: { ok: true } })).status, 200);
  t.match((await a.req('GET', `/v2/${e.id}/status/${run.json.id}`)).json, { status: /^(COMPLETED|TIMED_OUT)$/ }, 'and ends');
});
