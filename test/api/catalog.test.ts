/**
 * Catalogs: GPU types with RunPod's ids and pools (research/worker-protocol.md §6), CPU flavors with
 * their RAM multipliers, this installation's data centers and public templates. Every value the
 * catalog offers is accepted by create.
 */
import t from 'tap';
import { chmodSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { assertSchema } from '../../src/core/schemas.js';
import { assertProblem, cpuBody, queueBody, startAgent } from '../helpers/agent.js';
import { assertErrorAt, makeTemplate, makeUser, mustCreate } from '../helpers/expect.js';

/** research/worker-protocol.md §6, flash `POOLS_TO_TYPES` with its docstrings. */
const POOLS: Record<string, string[]> = {
  AMPERE_16: ['NVIDIA RTX A4000', 'NVIDIA RTX A4500', 'NVIDIA RTX 4000 Ada Generation', 'NVIDIA RTX 2000 Ada Generation'],
  AMPERE_24: ['NVIDIA RTX A5000', 'NVIDIA L4', 'NVIDIA GeForce RTX 3090'],
  ADA_24: ['NVIDIA GeForce RTX 4090'],
  ADA_32_PRO: ['NVIDIA GeForce RTX 5090'],
  AMPERE_48: ['NVIDIA A40', 'NVIDIA RTX A6000'],
  ADA_48_PRO: ['NVIDIA RTX 6000 Ada Generation', 'NVIDIA L40', 'NVIDIA L40S'],
  AMPERE_80: ['NVIDIA A100 80GB PCIe', 'NVIDIA A100-SXM4-80GB'],
  ADA_80_PRO: ['NVIDIA H100 80GB HBM3', 'NVIDIA H100 PCIe', 'NVIDIA H100 NVL'],
  HOPPER_141: ['NVIDIA H200'],
  BLACKWELL_96: ['NVIDIA RTX PRO 6000 Blackwell Server Edition', 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition', 'NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition'],
  BLACKWELL_180: ['NVIDIA B200'],
};

const BIN = fileURLToPath(new URL('../fixtures/nvidia-smi/bin', import.meta.url));

interface GpuType { id: string; pool: string | null; cudaVersions: string[]; memoryInGb: number; availability?: unknown }

t.test('GPU types: ids, pools, memory and CUDA versions', async (t) => {
  const a = await startAgent(t);
  const r = await a.req('GET', '/v2/catalog/gpus');
  t.equal(r.status, 200);
  const all = r.json as GpuType[];
  t.ok(Array.isArray(all), 'a bare array');
  for (const g of all) {
    t.doesNotThrow(() => assertSchema('GpuType', g), `${g.id} matches GpuType`);
    t.ok(g.pool === null || typeof g.pool === 'string', 'pool is a string or null');
    t.ok(Number.isInteger(g.memoryInGb) && g.memoryInGb > 0, `${g.id} memory`);
    t.ok(g.cudaVersions.length > 0 && g.cudaVersions.every((v) => /^\d+\.\d+$/.test(v)), `${g.id} CUDA versions are major.minor`);
    t.notOk('availability' in g, 'no availability unless asked');
  }
  t.equal(new Set(all.map((g) => g.id)).size, all.length, 'ids are unique');
  const byPool: Record<string, string[]> = {};
  for (const g of all) if (g.pool) (byPool[g.pool] ??= []).push(g.id);
  t.same(byPool, POOLS, 'pool memberships follow RunPod');
  for (const id of ['Tesla T4', 'NVIDIA A30', 'NVIDIA GeForce RTX 4080']) {
    t.equal(all.find((g) => g.id === id)?.pool, null, `${id} is listed with pool null`);
  }
  t.equal(all.find((g) => g.id === 'NVIDIA H100 80GB HBM3')?.memoryInGb, 80);
  t.notOk(all.find((g) => g.id === 'NVIDIA GeForce RTX 5090')?.cudaVersions.includes('12.4'), 'Blackwell needs CUDA 12.8 or later');

  const serverless = (await a.req('GET', '/v2/catalog/gpus?product=SERVERLESS')).json as GpuType[];
  t.ok(serverless.length > 0 && serverless.every((g) => g.pool !== null), 'product=SERVERLESS: only types in a pool');
  t.equal(serverless.length, Object.values(POOLS).flat().length);
  const avail = (await a.req('GET', '/v2/catalog/gpus?include=AVAILABILITY&product=SERVERLESS')).json as GpuType[];
  for (const g of avail) t.match(g.availability, { available: Number, total: Number, stockStatus: /^(HIGH|MEDIUM|LOW|NONE)$/ }, `${g.id} availability`);
  const badInclude = await a.req('GET', '/v2/catalog/gpus?include=PRICES');
  assertProblem(t, badInclude, 400, 'an unknown include value');
  t.match(badInclude.json.errors, [/^\?include: .*PRICES/], 'the error names the query parameter');
  assertProblem(t, await a.req('GET', '/v2/catalog/gpus?product=POD'), 400, 'an unknown product');
});

t.test('product=SERVERLESS also lists a type in no RunPod pool that this host has (pool OTHER reaches it)', async (t) => {
  // The rtx4090-single recording with its card renamed to a Tesla T4 (a type in no RunPod pool):
  // no recording of a T4 host is among the fixtures.
  const dir = t.testdir({
    'nvidia-smi': ['#!/bin/sh', `"${join(BIN, 'nvidia-smi')}" "$@" | sed 's/NVIDIA GeForce RTX 4090/Tesla T4/'`, ''].join('\n'),
  });
  chmodSync(join(dir, 'nvidia-smi'), 0o755);
  const saved = { PATH: process.env['PATH'], FAKE_NVIDIA_SMI_SCENARIO: process.env['FAKE_NVIDIA_SMI_SCENARIO'] };
  process.env['PATH'] = `${dir}${delimiter}${process.env['PATH'] ?? ''}`;
  process.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'rtx4090-single';
  t.teardown(() => {
    for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k]; else process.env[k] = v;
  });
  const a = await startAgent(t, { gpuRediscoverMs: 0 });
  const avail = (await a.req('GET', '/v2/catalog/gpus?product=SERVERLESS&include=AVAILABILITY')).json as GpuType[];
  const t4 = avail.find((g) => g.id === 'Tesla T4');
  t.match(t4, { pool: null, availability: { available: 1, total: 1, stockStatus: 'LOW' } }, 'the host\'s T4, with its stock');
  t.doesNotThrow(() => assertSchema('GpuType', t4), 'still a GpuType');
  t.notOk(avail.some((g) => g.pool === null && g.id !== 'Tesla T4'), 'no other type in no RunPod pool: this host has none');
  t.equal(avail.length, Object.values(POOLS).flat().length + 1);
  t.ok(((await a.req('GET', '/v2/catalog/gpus?product=SERVERLESS')).json as GpuType[]).some((g) => g.id === 'Tesla T4'), 'without include too');
  t.equal((await mustCreate(t, a, queueBody({ gpu: { pools: ['OTHER'] } }))).gpu.pools[0], 'OTHER', 'an endpoint reaches it through OTHER');
});

t.test('every pool and every GPU type of the catalog works in a create', async (t) => {
  const a = await startAgent(t);
  const serverless = (await a.req('GET', '/v2/catalog/gpus?product=SERVERLESS')).json as GpuType[];
  const pools = [...new Set(serverless.map((g) => g.pool as string))];
  for (const pool of pools) {
    const members = serverless.filter((g) => g.pool === pool).map((g) => g.id);
    const e = await mustCreate(t, a, queueBody({ name: pool, gpu: { pools: [pool], excludedTypes: members.slice(1) } }));
    t.same(e.gpu.excludedTypes, members.slice(1), `${pool}: all but one member excluded`);
  }
  assertErrorAt(t, await a.req('POST', '/v2/serverless', { body: queueBody({ gpu: { pools: [serverless[0]?.id] } }) }), 400, '/gpu/pools/0', 'a type id from the catalog is not a pool');
});

t.test('CPU flavors', async (t) => {
  const a = await startAgent(t);
  const r = await a.req('GET', '/v2/catalog/cpus');
  t.equal(r.status, 200);
  const flavors = r.json as { id: string; ramMultiplier: number; vcpuCounts: number[] }[];
  for (const f of flavors) t.doesNotThrow(() => assertSchema('CpuFlavor', f), `${f.id} matches CpuFlavor`);
  t.same(flavors.map((f) => [f.id, f.ramMultiplier]), [['cpu3c', 2], ['cpu3g', 4], ['cpu5c', 2], ['cpu5g', 4]], 'RunPod ids and RAM multipliers');
  for (const f of flavors) {
    t.ok(f.vcpuCounts.every((n) => n >= 2 && Number.isInteger(Math.log2(n))), `${f.id}: vCPU counts are powers of two ≥ 2`);
    const e = await mustCreate(t, a, cpuBody({ name: f.id, cpu: f.vcpuCounts.map((vcpuCount) => ({ id: f.id, vcpuCount })) }));
    t.same(e.cpu.map((c: { memory: number }) => c.memory), f.vcpuCounts.map((n) => n * f.ramMultiplier), `${f.id}: every offered count is accepted with memory derived`);
  }
});

t.test('data centers: this installation\'s site', async (t) => {
  const a = await startAgent(t, { dataCenterId: 'HOME-LAB-1' });
  const r = await a.req('GET', '/v2/catalog/data-centers');
  t.equal(r.status, 200);
  t.equal(r.json.length, 1, 'one site by default');
  t.equal(r.json[0].id, 'HOME-LAB-1', 'its id is a setting');
  t.doesNotThrow(() => assertSchema('DataCenter', r.json[0]));
  t.notOk('gpuAvailability' in r.json[0]);
  const withGpus = await a.req('GET', '/v2/catalog/data-centers?include=GPU_AVAILABILITY');
  t.ok(Array.isArray(withGpus.json[0].gpuAvailability), 'include=GPU_AVAILABILITY adds gpuAvailability');
  assertProblem(t, await a.req('GET', '/v2/catalog/data-centers?include=AVAILABILITY'), 400);
  t.equal((await mustCreate(t, a, queueBody({ dataCenterIds: ['HOME-LAB-1'] }))).dataCenterIds[0], 'HOME-LAB-1', 'the catalog id works in dataCenterIds');
});

t.test('public templates', async (t) => {
  const a = await startAgent(t);
  const u1 = await makeUser(t, a, 'publisher');
  const u2 = await makeUser(t, a, 'browser');
  const pub = await makeTemplate(t, a, { name: 'vllm', isPublic: true }, u1.key);
  const priv = await makeTemplate(t, a, { name: 'secret-sauce' }, u1.key);
  const mine = await makeTemplate(t, a, { name: 'mine-public', isPublic: true }, u2.key);
  const r = await a.req('GET', '/v2/catalog/templates', { key: u2.key });
  t.equal(r.status, 200);
  const ids = r.json.map((x: { id: string }) => x.id);
  t.ok(ids.includes(pub.id) && ids.includes(mine.id), 'public templates of every account');
  t.notOk(ids.includes(priv.id), 'never private ones');
  for (const x of r.json) t.doesNotThrow(() => assertSchema('Template', x));
  t.notOk((await a.req('GET', '/v2/templates', { key: u2.key })).text.includes(pub.id), '/v2/templates lists only the own account');
});
