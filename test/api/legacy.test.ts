/**
 * Older REST create (spec, "Older REST create"): POST /v1/endpoints with bearer auth and the fields
 * name, templateId, gpuTypeIds (priority order), workersMin, workersMax, idleTimeout. GPU type ids
 * become their pools with the pools' other members excluded, so the v2 endpoint behaves the same.
 */
import t from 'tap';
import { assertProblem, startAgent, type TestAgent } from '../helpers/agent.js';
import { assertErrorAt, makeTemplate } from '../helpers/expect.js';

const v1 = (a: TestAgent, body: unknown) => a.req('POST', '/v1/endpoints', { body });

t.test('the spec fields, mapped onto pools and exclusions', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { name: 'v1-tpl', image: 'registry.local/v1:1', args: 'python handler.py', env: { A: '1' } });
  const r = await v1(a, {
    name: 'legacy', templateId: tpl.id, gpuTypeIds: ['NVIDIA L4', 'NVIDIA GeForce RTX 4090', 'NVIDIA RTX A5000'],
    workersMin: 1, workersMax: 4, idleTimeout: 30,
  });
  t.equal(r.status, 201, r.text.slice(0, 300));
  const e = r.json;
  t.match(e, { id: /^[a-z0-9]{14}$/, name: 'legacy', templateId: tpl.id, workersMin: 1, workersMax: 4, idleTimeout: 30, type: 'QB', computeType: 'GPU' });
  t.same(e.gpuTypeIds, ['NVIDIA L4', 'NVIDIA GeForce RTX 4090', 'NVIDIA RTX A5000'], 'gpuTypeIds in the given priority order');
  t.notOk('gpu' in e || 'workers' in e, 'a v1-shaped object, not a v2 Endpoint');

  const v2 = (await a.req('GET', `/v2/serverless/${e.id}`)).json;
  t.same(v2.gpu.pools, ['AMPERE_24', 'ADA_24'], 'the pools of the given types, in priority order');
  t.same(v2.gpu.excludedTypes, ['NVIDIA GeForce RTX 3090'], 'every other member of those pools is excluded');
  t.same(v2.workers, { min: 1, max: 4, idleTimeout: 30 });
  t.same([v2.image, v2.cmd, v2.env], ['registry.local/v1:1', ['python', 'handler.py'], { A: '1' }], 'container settings from the template');
  t.same((await a.req('GET', `/v1/endpoints/${e.id}`)).json, e, 'GET /v1/endpoints/{id} answers the same');
  t.ok((await a.req('GET', '/v1/endpoints')).json.some((x: { id: string }) => x.id === e.id), 'and the v1 list');

  const single = (await v1(a, { name: 'one-type', templateId: tpl.id, gpuTypeIds: ['NVIDIA H100 PCIe'] })).json;
  const s2 = (await a.req('GET', `/v2/serverless/${single.id}`)).json;
  t.same([s2.gpu.pools, s2.gpu.excludedTypes], [['ADA_80_PRO'], ['NVIDIA H100 80GB HBM3', 'NVIDIA H100 NVL']], 'one type: its pool minus its siblings');
  const whole = (await v1(a, { name: 'whole-pool', templateId: tpl.id, gpuTypeIds: ['NVIDIA GeForce RTX 4090'] })).json;
  t.same((await a.req('GET', `/v2/serverless/${whole.id}`)).json.gpu.excludedTypes, [], 'a pool with one member needs no exclusion');
  const any = (await v1(a, { name: 'any-gpu', templateId: tpl.id })).json;
  t.ok(any.gpuTypeIds.length > 10, 'without gpuTypeIds: every serverless GPU type');
});

t.test('older REST rules and errors', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { name: 'v1-rules' });
  const pod = await makeTemplate(t, a, { name: 'v1-pod', isServerless: false });
  const base = { name: 'v1', templateId: tpl.id };
  const cases: [string, Record<string, unknown>, number, string][] = [
    ['no name', { templateId: tpl.id }, 400, '/name'],
    ['no templateId', { name: 'v1' }, 400, '/templateId'],
    ['a pool id as gpuTypeId', { ...base, gpuTypeIds: ['ADA_24'] }, 400, '/gpuTypeIds/0'],
    ['an unknown type', { ...base, gpuTypeIds: ['NVIDIA GeForce RTX 9090'] }, 400, '/gpuTypeIds/0'],
    ['duplicate types', { ...base, gpuTypeIds: ['NVIDIA L4', 'NVIDIA L4'] }, 400, '/gpuTypeIds'],
    ['empty gpuTypeIds', { ...base, gpuTypeIds: [] }, 400, '/gpuTypeIds'],
    ['workersMin > workersMax', { ...base, workersMin: 3, workersMax: 1 }, 400, '/workersMin'],
    ['idleTimeout with QUEUE + REQUEST_COUNT', { ...base, scalerType: 'REQUEST_COUNT', scalerValue: 2, idleTimeout: 5 }, 400, '/idleTimeout'],
    ['scalerValue not an integer for REQUEST_COUNT', { ...base, type: 'LB', scalerType: 'REQUEST_COUNT', scalerValue: 0.6 }, 201, ''],
    ['an unknown data center', { ...base, dataCenterIds: ['MARS-1'] }, 400, '/dataCenterIds/0'],
    ['an unknown network volume', { ...base, networkVolumeId: 'nv_unknown00000000000000' }, 404, '/networkVolumeId'],
    ['gpuCount 0', { ...base, gpuCount: 0 }, 400, '/gpuCount'],
    ['negative workersMin', { ...base, workersMin: -1 }, 400, '/workersMin'],
    ['idleTimeout 0', { ...base, idleTimeout: 0 }, 400, '/idleTimeout'],
    ['idleTimeout 3601', { ...base, idleTimeout: 3601 }, 400, '/idleTimeout'],
    ['unknown property', { ...base, gpuIds: 'ADA_24' }, 400, '/gpuIds'],
    ['unknown template', { ...base, templateId: 'tpl_unknown0000000000000' }, 404, '/templateId'],
    ['non-serverless template', { ...base, templateId: pod.id }, 422, '/templateId'],
    ['executionTimeoutMs under 5 s', { ...base, executionTimeoutMs: 4999 }, 400, '/executionTimeoutMs'],
  ];
  for (const [label, body, status, pointer] of cases) {
    const r = await v1(a, body);
    if (status < 300) t.equal(r.status, status, label);
    else assertErrorAt(t, r, status, pointer, `${label}: ${r.text.slice(0, 200)}`);
  }
  const seconds = await v1(a, { ...base, executionTimeoutMs: 600 });
  t.equal(seconds.json?.detail, '/executionTimeoutMs: must be >= 5000 (5 s): it is in milliseconds, so 600 is 0.6 s; did you mean 600000?', 'a timeout meant in seconds is told so');
  const noAuth = await a.req('POST', '/v1/endpoints', { body: base, key: null });
  assertProblem(t, noAuth, 401, 'bearer authentication is required');
  t.match(noAuth.headers.get('www-authenticate'), /^Bearer/);
});

t.test('other older REST fields', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { name: 'v1-more' });
  const cpu = await v1(a, { name: 'v1-cpu', templateId: tpl.id, computeType: 'CPU', cpuFlavorIds: ['cpu3g', 'cpu5c'], vcpuCount: 4 });
  t.equal(cpu.status, 201, cpu.text.slice(0, 300));
  t.match(cpu.json, { computeType: 'CPU', cpuFlavorIds: ['cpu3g', 'cpu5c'], vcpuCount: 4, gpuTypeIds: [] });
  t.same((await a.req('GET', `/v2/serverless/${cpu.json.id}`)).json.cpu, [{ id: 'cpu3g', vcpuCount: 4, memory: 16 }, { id: 'cpu5c', vcpuCount: 4, memory: 8 }]);
  const lb = await v1(a, { name: 'v1-lb', templateId: tpl.id, type: 'LB', scalerType: 'REQUEST_COUNT', scalerValue: 3, executionTimeoutMs: 60000, flashboot: false });
  t.equal(lb.status, 201);
  const lb2 = (await a.req('GET', `/v2/serverless/${lb.json.id}`)).json;
  t.same([lb2.type, lb2.scaling, lb2.timeout, lb2.flashboot], ['LOAD_BALANCER', { type: 'REQUEST_COUNT', requestCount: 3 }, 60000, 'OFF']);
  assertErrorAt(t, await v1(a, { name: 'v1-lb-bad', templateId: tpl.id, type: 'LB', scalerType: 'QUEUE_DELAY' }), 400, '/scalerType', 'LB with QUEUE_DELAY');
  assertErrorAt(t, await v1(a, { name: 'v1-cpu-bad', templateId: tpl.id, computeType: 'CPU', cpuFlavorIds: ['cpu5g'], vcpuCount: 32 }), 400, '/vcpuCount', 'a vCPU count the flavor lacks');
  assertErrorAt(t, await v1(a, { name: 'v1-cpu-bad2', templateId: tpl.id, computeType: 'CPU', cpuFlavorIds: ['cpu7x'] }), 400, '/cpuFlavorIds', 'an unknown flavor');
  assertErrorAt(t, await v1(a, { name: 'v1-cuda-cpu', templateId: tpl.id, computeType: 'CPU', allowedCudaVersions: ['12.4'] }), 422, '/allowedCudaVersions', 'CUDA on a CPU create is a 422 here too');
  // GPU fields on a CPU create contradict it, as gpu beside cpu does in v2: refused, not dropped.
  const gpuOnCpu = await v1(a, { name: 'v1-gpu-cpu', templateId: tpl.id, computeType: 'CPU', gpuTypeIds: ['NVIDIA L4'], gpuCount: 2 });
  assertErrorAt(t, gpuOnCpu, 400, '/gpuTypeIds', 'gpuTypeIds on a CPU create');
  assertErrorAt(t, gpuOnCpu, 400, '/gpuCount', 'gpuCount on a CPU create');
  t.match(gpuOnCpu.json.errors, [/only for computeType GPU/, /only for computeType GPU/]);
  assertErrorAt(t, await v1(a, { name: 'v1-count-cpu', templateId: tpl.id, computeType: 'CPU', gpuCount: 1 }), 400, '/gpuCount', 'gpuCount alone');
  const names = ((await a.req('GET', '/v1/endpoints')).json as { name: string }[]).map((x) => x.name);
  t.notOk(names.includes('v1-gpu-cpu') || names.includes('v1-count-cpu'), `none of them was created: ${names.join(', ')}`);
  const cuda = await v1(a, { name: 'v1-cuda', templateId: tpl.id, gpuTypeIds: ['NVIDIA L4'], allowedCudaVersions: ['12.4'] });
  t.same(cuda.json.allowedCudaVersions, ['12.4']);
});

t.test('a v2 PATCH keeps the gpuTypeIds priority unless it brings a new selection', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { name: 'v1-order' });
  const order = ['NVIDIA GeForce RTX 3090', 'NVIDIA L4'];
  const id = (await v1(a, { name: 'v1-order', templateId: tpl.id, gpuTypeIds: order })).json.id as string;
  const typeIds = async () => (await a.req('GET', `/v1/endpoints/${id}`)).json.gpuTypeIds as string[];
  t.same(await typeIds(), order);
  const patch = async (body: unknown) => {
    const r = await a.req('PATCH', `/v2/serverless/${id}`, { body });
    t.equal(r.status, 200, r.text.slice(0, 300));
  };
  for (const gpu of [{ count: 1 }, { count: 2 }, { minCudaVersion: '12.4' }, { minCudaVersion: null, allowedCudaVersions: ['12.4', '12.8'] }]) {
    await patch({ gpu });
    t.same(await typeIds(), order, `gpu ${JSON.stringify(gpu)} leaves the priority order as it was`);
  }
  t.same((await a.req('GET', `/v2/serverless/${id}`)).json.gpu.count, 2, 'while the fields it names change');
  const shown = (await a.req('GET', `/v2/serverless/${id}`)).json;
  const again = await a.req('PATCH', `/v2/serverless/${id}`, { body: { gpu: { pools: shown.gpu.pools, excludedTypes: [...shown.gpu.excludedTypes].reverse() } } });
  t.equal(again.status, 200, again.text.slice(0, 300));
  t.same(await typeIds(), order, 'the selection GET shows, sent again, is no new selection: the order stays');
  t.equal(again.json.updatedAt, shown.updatedAt, 'and nothing is stored');
  await patch({ gpu: { excludedTypes: [] } });
  t.same(await typeIds(), ['NVIDIA RTX A5000', 'NVIDIA L4', 'NVIDIA GeForce RTX 3090'], 'new exclusions are a new selection: in pool order');
  await patch({ gpu: { pools: ['AMPERE_24'], excludedTypes: ['NVIDIA RTX A5000'] } });
  t.same(await typeIds(), ['NVIDIA L4', 'NVIDIA GeForce RTX 3090'], 'and so are new pools');
});

t.test('a GPU named by its catalog displayName ("RTX 4090") or in another letter case is refused with the id meant', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { name: 'v1-names', image: 'registry.local/v1:1' });
  // /v2/catalog/gpus lists "displayName":"RTX 4090" beside "id":"NVIDIA GeForce RTX 4090": the
  // short name is the one a RunPod console shows, and it was refused as an unknown type alone.
  const r = await v1(a, { name: 'legacy', templateId: tpl.id, gpuTypeIds: ['RTX 4090', 'nvidia l4', 'Quantum 9000'] });
  assertProblem(t, r, 400);
  t.same(r.json.errors, [
    '/gpuTypeIds/0: unknown GPU type "RTX 4090" (not in the GPU catalog, and no GPU of this host has that name); did you mean "NVIDIA GeForce RTX 4090"?',
    '/gpuTypeIds/1: unknown GPU type "nvidia l4" (not in the GPU catalog, and no GPU of this host has that name); did you mean "NVIDIA L4"?',
    '/gpuTypeIds/2: unknown GPU type "Quantum 9000" (not in the GPU catalog, and no GPU of this host has that name)',
  ]);
  // /v2 alike, for an exclusion named by its displayName.
  const v2 = await a.req('POST', '/v2/serverless', { body: { name: 'x', type: 'QUEUE', image: 'busybox', scaling: { type: 'QUEUE_DELAY', queueDelay: 4 }, gpu: { pools: ['ADA_24'], excludedTypes: ['RTX 4090'] } } });
  assertProblem(t, v2, 400);
  t.same(v2.json.errors, ['/gpu/excludedTypes/0: "RTX 4090" is not a GPU type in the selected pools (ADA_24); did you mean "NVIDIA GeForce RTX 4090"?']);
});

t.test('RunPod console habits in a POST /v1/endpoints body (numbers and booleans as strings, idleTimeout in ms) say what the field takes', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { name: 'v1-habits' });
  const r = await a.req('POST', '/v1/endpoints', { body: { name: 'v1', templateId: tpl.id, workersMax: '3', gpuCount: '1', idleTimeout: 60000, flashboot: 'true' } });
  assertProblem(t, r, 400);
  t.same([...r.json.errors].sort(), [
    '/workersMax: must be integer (a JSON number: 3, not the string "3")',
    '/gpuCount: must be integer (a JSON number: 1, not the string "1")',
    '/idleTimeout: must be <= 3600 (it is in seconds, not milliseconds: did you mean 60?)',
    '/flashboot: must be boolean (true, not the string "true")',
  ].sort());
});
