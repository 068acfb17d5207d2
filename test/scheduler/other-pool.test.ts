/**
 * flashd's OTHER pool on a host whose only GPU is a model the catalog does not know: the fake
 * nvidia-smi's `old-driver-cuda11` recording (a `GeForce RTX 2070`, CUDA 11.2). RunPod's pools
 * never hold it, so before OTHER no endpoint could use it: `gpu.pools: ["OTHER"]` places a
 * worker on it (its type id is the name nvidia-smi prints), `excludedTypes` can name it, the
 * older `/v1` `gpuTypeIds` too, and the data-center catalog counts it under that name.
 */
import t from 'tap';
import { join } from 'node:path';
import { assertProblem, startAgent, queueBody, type TestAgent } from '../helpers/agent.js';
import { makeTemplate } from '../helpers/expect.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

process.env['PATH'] = `${join(REPO_ROOT, 'test/fixtures/nvidia-smi/bin')}:${process.env['PATH'] ?? ''}`;
process.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'old-driver-cuda11';
const NAME = 'GeForce RTX 2070';
const UUID = 'GPU-1b724e78-eef5-4163-d43c-e4da15d41176';

const systemLines = async (a: TestAgent, ep: string) =>
  ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string }[]).filter((l) => l.stream === 'system').map((l) => l.line);

const gpuEndpoint = async (a: TestAgent, gpu: Record<string, unknown>) => {
  const r = await a.req('POST', '/v2/serverless', {
    body: queueBody({ gpu, args: 'python3 -u test/fixtures/workers/env.py', workers: { min: 0, max: 1, idleTimeout: 1 } }),
  });
  if (r.status !== 201) throw new Error(r.text);
  return r.json.id as string;
};

const throttledWith = async (a: TestAgent, ep: string) => {
  await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  await until(`throttled on ${ep}`, async () => (await a.req('GET', `/v2/${ep}/health`)).json.workers.throttled >= 1);
  return until(`the reason in ${ep}'s log`, async () => (await systemLines(a, ep)).find((l) => l.startsWith('no worker can start')));
};

t.test('pools ["OTHER"] runs a job on a GPU model the catalog does not know', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const dcs = (await a.req('GET', '/v2/catalog/data-centers?include=GPU_AVAILABILITY')).json;
  t.same(dcs[0].gpuAvailability, [{ gpuTypeId: NAME, available: 1, total: 1, stockStatus: 'LOW' }], 'the data-center catalog counts it by its nvidia-smi name');

  const ep = await gpuEndpoint(a, { pools: ['OTHER'] });
  t.same((await a.req('GET', `/v2/serverless/${ep}`)).json.gpu.pools, ['OTHER']);
  const r = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { vars: ['CUDA_VISIBLE_DEVICES', 'RUNPOD_WEBHOOK_GET_JOB'] } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.equal(r.json.output.CUDA_VISIBLE_DEVICES, UUID, 'the worker is given the RTX 2070');
  t.match(r.json.output.RUNPOD_WEBHOOK_GET_JOB, /gpu=GeForce\+RTX\+2070/, 'and names it in its job URLs');
  const held = (await a.req('GET', '/v2/catalog/data-centers?include=GPU_AVAILABILITY')).json[0].gpuAvailability;
  t.same(held, [{ gpuTypeId: NAME, available: 0, total: 1, stockStatus: 'NONE' }], 'held while the worker lives');
  await a.req('DELETE', `/v2/serverless/${ep}`);

  const withOthers = await gpuEndpoint(a, { pools: ['ADA_24', 'OTHER'], excludedTypes: ['Tesla T4'] });
  const r2 = await a.req('POST', `/v2/${withOthers}/runsync`, { body: { input: { vars: ['CUDA_VISIBLE_DEVICES'] } } });
  t.equal(r2.json.status, 'COMPLETED', r2.text);
  t.equal(r2.json.output.CUDA_VISIBLE_DEVICES, UUID, 'OTHER beside a RunPod pool, with a pool-less catalog type excluded');
  await a.req('DELETE', `/v2/serverless/${withOthers}`);

  const excluded = await gpuEndpoint(a, { pools: ['OTHER'], excludedTypes: [` ${NAME} `] });
  t.match(await throttledWith(a, excluded), /^no worker can start: no GPU of an allowed type \(.*Tesla T4.*\); this host has 1× GeForce RTX 2070 \(not in the GPU catalog, pool OTHER\)/,
    'excluding it by name holds the endpoint back');
  const ada = await gpuEndpoint(a, { pools: ['ADA_24'] });
  t.match(await throttledWith(a, ada), /this host has 1× GeForce RTX 2070 \(not in the GPU catalog, pool OTHER\); jobs wait/, 'a RunPod pool never gets it; the log names the pool that does');
});

t.test('OTHER in validation and in the older /v1 gpuTypeIds', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  const create = (gpu: unknown) => a.req('POST', '/v2/serverless', { body: queueBody({ gpu }) });
  for (const gpu of [{ pools: ['OTHER'], excludedTypes: ['NVIDIA L4'] }, { pools: ['ADA_24'], excludedTypes: [NAME] }]) {
    const r = await create(gpu);
    assertProblem(t, r, 400);
    t.match(r.json.errors, ['/gpu/excludedTypes/0: ' + `"${gpu.excludedTypes[0]}" is not a GPU type in the selected pools (${gpu.pools.join(', ')})`], 'an exclusion outside the pools');
  }
  const asPool = await create({ pools: ['Tesla T4'] });
  assertProblem(t, asPool, 400);
  t.match(asPool.json.errors, [/^\/gpu\/pools\/0: "Tesla T4" is a GPU type id, not a pool id; it belongs to no RunPod serverless pool: use pool "OTHER"/]);
  // The display name /v2/catalog/gpus shows, in any letter case: named as the type it is.
  for (const name of ['RTX 4090', 'nvidia geforce rtx 4090']) {
    const byName = await create({ pools: [name] });
    assertProblem(t, byName, 400);
    t.match(byName.json.errors, [`/gpu/pools/0: "${name}" names the GPU type "NVIDIA GeForce RTX 4090", not a pool id; use pool "ADA_24" (and excludedTypes for the others)`], `${name}: its pool is named`);
  }
  const unknown = await create({ pools: ['ADA_4090'] });
  t.match(unknown.json.errors, [/pools are .*BLACKWELL_180, OTHER$/], 'the pool list names OTHER');
  t.equal((await create({ pools: ['OTHER'], excludedTypes: ['Tesla T4', NAME, 'Some Future GPU'] })).status, 201, 'any type of OTHER may be excluded');

  const tpl = await makeTemplate(t, a, { name: 'v1-other', args: 'python3 -u test/fixtures/workers/env.py' });
  const v1 = await a.req('POST', '/v1/endpoints', { body: { name: 'v1-2070', templateId: tpl.id, gpuTypeIds: [NAME, 'Tesla T4'], workersMax: 1, idleTimeout: 1 } });
  t.equal(v1.status, 201, v1.text);
  t.same(v1.json.gpuTypeIds, [NAME, 'Tesla T4'], 'a model this host reports and a pool-less catalog type');
  const v2 = (await a.req('GET', `/v2/serverless/${v1.json.id}`)).json;
  t.same(v2.gpu.pools, ['OTHER']);
  t.notOk(v2.gpu.excludedTypes.includes('Tesla T4'), 'the named types stay allowed');
  t.ok(v2.gpu.excludedTypes.includes('NVIDIA GeForce RTX 3080'), 'the other catalog types of OTHER are excluded');
  const r = await a.req('POST', `/v2/${v1.json.id}/runsync`, { body: { input: { vars: ['CUDA_VISIBLE_DEVICES'] } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.equal(r.json.output.CUDA_VISIBLE_DEVICES, UUID);

  const typo = await a.req('POST', '/v1/endpoints', { body: { name: 'v1-typo', templateId: tpl.id, gpuTypeIds: ['GeForce RTX 2070 Super'] } });
  assertProblem(t, typo, 400);
  t.match(typo.json.errors, ['/gpuTypeIds/0: unknown GPU type "GeForce RTX 2070 Super" (not in the GPU catalog, and no GPU of this host has that name)']);
});

t.test('a /v1 gpuTypeIds endpoint keeps its selection when the gpu its /v2 view shows is sent back or copied', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const tpl = await makeTemplate(t, a, { name: 'v1-t4', args: 'python3 -u test/fixtures/workers/env.py' });
  const v1 = await a.req('POST', '/v1/endpoints', { body: { name: 'v1-t4', templateId: tpl.id, gpuTypeIds: ['Tesla T4'], workersMax: 1, idleTimeout: 1 } });
  t.equal(v1.status, 201, v1.text);
  const id = v1.json.id as string;
  const view = (await a.req('GET', `/v2/serverless/${id}`)).json;
  t.same(view.gpu.pools, ['OTHER']);
  t.ok(view.gpu.excludedTypes.includes(NAME), 'the v2 view excludes the model of this host that gpuTypeIds did not name');

  const patched = await a.req('PATCH', `/v2/serverless/${id}`, { body: { gpu: { pools: view.gpu.pools, excludedTypes: view.gpu.excludedTypes } } });
  t.equal(patched.status, 200, patched.text);
  t.equal(patched.json.updatedAt, view.updatedAt, 'the same selection again stores nothing');
  t.same((await a.req('GET', `/v1/endpoints/${id}`)).json.gpuTypeIds, ['Tesla T4'], 'and keeps the gpuTypeIds');
  t.match(await throttledWith(a, id), /^no worker can start: no GPU of an allowed type \(Tesla T4\)/, 'the RTX 2070 stays out');

  const copy = await gpuEndpoint(a, { pools: view.gpu.pools, excludedTypes: view.gpu.excludedTypes });
  t.match(await throttledWith(a, copy), /^no worker can start: no GPU of an allowed type \(Tesla T4, or a model not in the GPU catalog\); this host has 1× GeForce RTX 2070/,
    'a /v2 endpoint made with the same gpu stays off it too (a model that appears later is not excluded)');

  const other = await gpuEndpoint(a, { pools: ['OTHER'], excludedTypes: ['Tesla T4'] });
  const shown = (await a.req('GET', `/v1/endpoints/${other}`)).json.gpuTypeIds as string[];
  t.ok(shown.includes(NAME), `the /v1 view of a /v2 OTHER endpoint lists the host's model it runs on: ${shown.join(', ')}`);
  t.notOk(shown.includes('Tesla T4'), 'and not what it excludes');
});

t.test('an exclusion that differs only in case from a host model or a catalog type is a 400 with the name meant', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  const create = (gpu: unknown) => a.req('POST', '/v2/serverless', { body: queueBody({ gpu }) });
  const model = await create({ pools: ['OTHER'], excludedTypes: ['Tesla T4', 'geforce rtx 2070'] });
  assertProblem(t, model, 400);
  t.same(model.json.errors, ['/gpu/excludedTypes/1: "geforce rtx 2070" is not a GPU type in the selected pools (OTHER); did you mean "GeForce RTX 2070" (names are case-sensitive)?'],
    'a GPU of this host, in other case: it would exclude nothing');
  const type = await create({ pools: ['OTHER'], excludedTypes: ['tesla t4'] });
  assertProblem(t, type, 400);
  t.same(type.json.errors, ['/gpu/excludedTypes/0: "tesla t4" is not a GPU type in the selected pools (OTHER); did you mean "Tesla T4" (names are case-sensitive)?'], 'a catalog type of the pools');
  const ada = await create({ pools: ['ADA_24'], excludedTypes: ['NVIDIA GeForce RTX 4090 '.toLowerCase()] });
  t.same(ada.json.errors, ['/gpu/excludedTypes/0: "nvidia geforce rtx 4090" is not a GPU type in the selected pools (ADA_24); did you mean "NVIDIA GeForce RTX 4090" (names are case-sensitive)?'],
    'in a RunPod pool too');
  const ok = await create({ pools: ['OTHER'], excludedTypes: [NAME, 'some future gpu'] });
  t.equal(ok.status, 201, `the exact name, and a name no GPU here has, are taken: ${ok.text.slice(0, 200)}`);
  const patched = await a.req('PATCH', `/v2/serverless/${ok.json.id}`, { body: { gpu: { excludedTypes: ['GEFORCE RTX 2070'] } } });
  assertProblem(t, patched, 400);
  t.match(patched.json.errors, [/did you mean "GeForce RTX 2070"/], 'and on PATCH');
});
