/** The ledger: reserve, release, capacity, the catalog snapshot, and the scheduler's Placement shape. */
import t from 'tap';
import { delimiter } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { InventoryGpu } from '../../src/api/index.js';
import { OTHER_POOL_TYPES } from '../../src/catalog/index.js';
import type { EndpointSpec } from '../../src/endpoints/index.js';
import type { Placement } from '../../src/scheduler/index.js';
import {
  createLedgerPlacement,
  inventorySnapshot,
  probeHost,
  ResourceLedger,
  workerRequirement,
  type LedgerHost,
  type WorkerRequirement,
} from '../../src/gpu/index.js';

const A100 = 'NVIDIA A100-SXM4-80GB';
const L4 = 'NVIDIA L4';

const mixedHost = (): LedgerHost => ({
  dataCenterId: 'dc-a',
  gpus: [
    { uuid: 'L4-0', name: L4, gpuTypeId: L4, cudaVersion: '12.5' },
    { uuid: 'A100-1', name: A100, gpuTypeId: A100, cudaVersion: '12.5' },
    { uuid: 'A100-2', name: A100, gpuTypeId: A100, cudaVersion: '12.5' },
    { uuid: 'X-3', name: 'GeForce RTX 2070', gpuTypeId: null, cudaVersion: '12.5' },
  ],
  cpu: { vcpus: 16, memoryGb: 64 },
});

const gpuReq = (count: number, types: string[] = [A100], extra: Partial<Extract<WorkerRequirement, { kind: 'gpu' }>['gpu']> = {}): WorkerRequirement => ({
  kind: 'gpu',
  gpu: { count, allowedTypeIds: types, allowedCudaVersions: [], minCudaVersion: null, dataCenterIds: [], ...extra },
});
const cpuReq = (id: string, vcpuCount: number): WorkerRequirement => ({ kind: 'cpu', cpu: { entries: [{ id, vcpuCount }] } });

t.test('reserve gives GPUs to one worker at a time; release frees them', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  const a = ledger.reserve('w1', gpuReq(1));
  t.same(a, { ok: true, workerId: 'w1', gpuDeviceIds: ['A100-1'], gpuName: A100, cpu: null });
  const b = ledger.reserve('w2', gpuReq(1));
  t.match(b, { ok: true, gpuDeviceIds: ['A100-2'] }, 'the second worker gets the other A100');
  t.match(ledger.reserve('w3', gpuReq(1)), { ok: false, reason: 'busy' }, 'no third A100');
  t.same([...ledger.heldGpuUuids()].sort(), ['A100-1', 'A100-2']);
  t.same(ledger.holding('w1'), { workerId: 'w1', endpointId: null, gpuUuids: ['A100-1'], gpuTypeId: A100, vcpus: 0, memoryGb: 0, cpuFlavorId: null });

  t.equal(ledger.release('w1'), true);
  t.equal(ledger.release('w1'), false, 'releasing twice is harmless');
  t.equal(ledger.release('never'), false);
  t.match(ledger.reserve('w3', gpuReq(1)), { ok: true, gpuDeviceIds: ['A100-1'] }, 'the freed GPU goes to the next worker');
});

t.test('a worker cannot hold two reservations', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  ledger.reserve('w1', gpuReq(1));
  t.throws(() => ledger.reserve('w1', gpuReq(1)), { code: 'CONFLICT' });
  t.equal(ledger.heldGpuUuids().size, 1, 'nothing more was held');
});

t.test('a failed reserve holds nothing', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  t.match(ledger.reserve('w1', gpuReq(3)), { ok: false, reason: 'count' });
  t.match(ledger.reserve('w2', gpuReq(1, [A100], { minCudaVersion: '12.8' })), { ok: false, reason: 'cuda' });
  t.match(ledger.reserve('w3', gpuReq(1, [A100], { dataCenterIds: ['dc-z'] })), { ok: false, reason: 'data-center' });
  t.same(ledger.holdings(), []);
});

t.test('capacity: how many more workers fit', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  t.equal(ledger.capacity(gpuReq(1)), 2, 'two A100 workers of one GPU');
  t.equal(ledger.capacity(gpuReq(2)), 1, 'one worker of two A100s');
  t.equal(ledger.capacity(gpuReq(3)), 0, 'three A100s never fit');
  t.equal(ledger.capacity(gpuReq(1, [A100, L4])), 3, 'either type: three workers');
  t.equal(ledger.capacity(gpuReq(1, ['NVIDIA H100 80GB HBM3'])), 0, 'a type this host lacks');
  ledger.reserve('w1', gpuReq(1));
  t.equal(ledger.capacity(gpuReq(1)), 1, 'one less after a reservation');
  t.equal(ledger.capacity(gpuReq(2)), 0);
  t.equal(ledger.heldGpuUuids().size, 1, 'capacity reserves nothing');
  t.match(ledger.whyNot(gpuReq(2)), { ok: false, reason: 'busy' });
  t.equal(ledger.whyNot(gpuReq(1)), null);
});

t.test('whyNot says what the host has: the types it holds, or why discovery found no GPU', async (t) => {
  const mixed = new ResourceLedger(mixedHost());
  t.match(mixed.whyNot(gpuReq(1, ['NVIDIA H100 80GB HBM3'])), {
    reason: 'no-allowed-type',
    detail: 'no GPU of an allowed type (NVIDIA H100 80GB HBM3); this host has 1× NVIDIA L4, 2× NVIDIA A100-SXM4-80GB, 1× GeForce RTX 2070 (not in the GPU catalog, pool OTHER)',
  });
  const none = new ResourceLedger({ ...mixedHost(), gpus: [], discovery: { noGpuReason: 'driver-not-loaded', detail: 'NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver.' } });
  t.match(none.whyNot(gpuReq(1)), {
    reason: 'no-gpus',
    detail: 'this installation has no GPUs (GPU discovery: driver-not-loaded, NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver.)',
  });
  t.match(new ResourceLedger({ ...mixedHost(), gpus: [] }).whyNot(gpuReq(1)), { detail: 'this installation has no GPUs' }, 'no discovery detail given: the bare reason');
});

t.test('pool OTHER: catalog types in no RunPod pool and models the catalog does not know', async (t) => {
  const T4 = 'Tesla T4';
  const homelab = new ResourceLedger({
    dataCenterId: 'dc-a',
    gpus: [
      { uuid: 'T4-0', name: T4, gpuTypeId: T4, cudaVersion: '12.2' },
      { uuid: 'L4-1', name: L4, gpuTypeId: L4, cudaVersion: '12.2' },
      { uuid: 'X-2', name: 'GeForce RTX 2070', gpuTypeId: null, cudaVersion: '12.2' },
    ],
    cpu: { vcpus: 16, memoryGb: 64 },
  });
  const req = (pools: string[], excludedTypes: string[] = [], gpuTypePriority: string[] = []) =>
    workerRequirement({ gpu: { pools, excludedTypes, count: 1, allowedCudaVersions: [], minCudaVersion: null }, cpu: null, dataCenterIds: [], gpuTypePriority });
  t.equal(homelab.capacity(req(['AMPERE_24'])), 1, 'a RunPod pool gets only the L4');
  t.equal(homelab.capacity(req(['OTHER'])), 2, 'OTHER gets the T4 and the RTX 2070');
  t.match(homelab.reserve('w1', req(['OTHER'])), { ok: true, gpuDeviceIds: ['T4-0'], gpuName: T4 }, 'catalog types first');
  t.match(homelab.reserve('w2', req(['OTHER'])), { ok: true, gpuDeviceIds: ['X-2'], gpuName: 'GeForce RTX 2070' }, 'then the unknown model, by its name');
  t.match(homelab.reserve('w3', req(['OTHER', 'AMPERE_24'])), { ok: true, gpuDeviceIds: ['L4-1'] });
  homelab.release('w1');
  homelab.release('w2');
  homelab.release('w3');
  t.equal(homelab.capacity(req(['OTHER'], [T4, 'GeForce RTX 2070'])), 0, 'excludedTypes may name either kind');
  t.match(homelab.whyNot(req(['OTHER'], [T4, 'GeForce RTX 2070'])), {
    reason: 'no-allowed-type',
    detail: /^no GPU of an allowed type \(NVIDIA A30, .*, or a model not in the GPU catalog\); this host has 1× Tesla T4 \(pool OTHER\), 1× NVIDIA L4, 1× GeForce RTX 2070 \(not in the GPU catalog, pool OTHER\)$/,
  });
  const onlyUnknown = new ResourceLedger({ dataCenterId: 'dc-a', gpus: [{ uuid: 'T4-0', name: T4, gpuTypeId: T4, cudaVersion: '12.2' }], cpu: { vcpus: 16, memoryGb: 64 } });
  t.match(onlyUnknown.whyNot(req(['OTHER'], [...OTHER_POOL_TYPES])), {
    reason: 'no-allowed-type',
    detail: 'no GPU of an allowed type (a model not in the GPU catalog); this host has 1× Tesla T4 (pool OTHER)',
  }, 'every catalog type of OTHER excluded: only models not in the catalog are left');
  t.match(homelab.reserve('w4', req(['OTHER'], [], ['GeForce RTX 2070', T4])), { ok: true, gpuDeviceIds: ['X-2'] }, 'a priority list (v1 gpuTypeIds) may name the unknown model first');
  t.equal(homelab.capacity(req(['OTHER'], [], [T4])), 1, 'a priority list without it leaves the unknown model out');
});

t.test('CPU workers: vCPUs and memory from the flavor, entries in order', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  t.equal(ledger.capacity(cpuReq('cpu3g', 4)), 4, '16 vCPU / 64 GiB holds four cpu3g-4 (16 GB each)');
  t.equal(ledger.capacity(cpuReq('cpu3c', 4)), 4, 'vCPUs bind first for cpu3c-4 (8 GB each)');
  const r = ledger.reserve('c1', { kind: 'cpu', cpu: { entries: [{ id: 'cpu3g', vcpuCount: 32 }, { id: 'cpu3g', vcpuCount: 8 }] } });
  t.same(r, { ok: true, workerId: 'c1', gpuDeviceIds: [], gpuName: 'cpu', cpu: { id: 'cpu3g', vcpuCount: 8, memoryGb: 32 } });
  t.same(ledger.reservedCpu(), { vcpus: 8, memoryGb: 32 });
  t.equal(ledger.capacity(cpuReq('cpu3g', 4)), 2);
  t.match(ledger.reserve('c2', cpuReq('cpu3g', 16)), { ok: false, reason: 'busy' });
  t.match(ledger.reserve('c3', cpuReq('cpu3g', 32)), { ok: false, reason: 'too-large' });
  ledger.release('c1');
  t.same(ledger.reservedCpu(), { vcpus: 0, memoryGb: 0 });
  t.equal(ledger.capacity(cpuReq('cpu3g', 16)), 1);
});

t.test('a busy reason names the endpoints whose workers hold the GPUs, vCPUs and memory', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  ledger.reserve('w1', gpuReq(1), 'ep-a');
  ledger.reserve('w2', gpuReq(1, [A100, L4]), 'ep-b');
  ledger.reserve('w3', gpuReq(1, [L4]), 'ep-c');
  t.same(ledger.whyNot(gpuReq(1)), {
    ok: false, reason: 'busy',
    detail: 'every matching GPU is held by another worker: 1 worker of endpoint ep-a (1 GPU), 1 worker of endpoint ep-b (1 GPU)',
  }, 'the holders of the matching GPUs only (not ep-c, on the L4)');

  // 16 vCPU / 64 GiB: ep-a's two cpu3c-4 hold 8 vCPU / 16 GiB, ep-b's cpu3g-4 4 vCPU / 16 GiB, ep-d's cpu3c-2 2 / 4.
  const cpu = new ResourceLedger(mixedHost());
  cpu.reserve('c1', cpuReq('cpu3c', 4), 'ep-a');
  cpu.reserve('c2', cpuReq('cpu3c', 4), 'ep-a');
  cpu.reserve('c3', cpuReq('cpu3g', 4), 'ep-b');
  cpu.reserve('c4', cpuReq('cpu3c', 2), 'ep-d');
  cpu.reserve('g1', gpuReq(1), 'ep-gpu');
  t.same(cpu.whyNot(cpuReq('cpu3c', 4)), {
    ok: false, reason: 'busy',
    detail: 'host has 2 vCPU / 28.0 GiB left of 16 vCPU / 64.0 GiB, held by 2 workers of endpoint ep-a (8 vCPU / 16.0 GiB), '
      + '1 worker of endpoint ep-b (4 vCPU / 16.0 GiB), 1 worker of endpoint ep-d (2 vCPU / 4.0 GiB)',
  }, 'the endpoints holding most first; a GPU worker holds no vCPUs here and is not named');

  // Bounded: three endpoints named, the rest counted.
  const many = new ResourceLedger({ ...mixedHost(), cpu: { vcpus: 6, memoryGb: 64 } });
  for (const ep of ['ep-1', 'ep-2', 'ep-3', 'ep-4', 'ep-5', 'ep-6']) many.reserve(`w-${ep}`, cpuReq('cpu3c', 1), ep);
  t.match(many.whyNot(cpuReq('cpu3c', 1))?.detail, /, held by 1 worker of endpoint ep-1 \(1 vCPU \/ 2\.0 GiB\), 1 worker of endpoint ep-2 \(.*\), 1 worker of endpoint ep-3 \(.*\) and 3 more endpoints$/);

  // Through the scheduler's Placement shape, which passes the endpoint id along.
  const placement: Placement = createLedgerPlacement<EndpointSpec>(new ResourceLedger(mixedHost()), workerRequirement);
  const cpuSpec = { gpu: null, cpu: [{ id: 'cpu3c', vcpuCount: 8 }], dataCenterIds: [] } as unknown as EndpointSpec;
  placement.reserve('ep1', 'c1', cpuSpec);
  placement.reserve('ep1', 'c2', cpuSpec);
  t.equal(placement.whyNot('ep2', cpuSpec), 'host has 0 vCPU / 32.0 GiB left of 16 vCPU / 64.0 GiB, held by 2 workers of endpoint ep1 (16 vCPU / 32.0 GiB)');
});

t.test('inventory(): one catalog row per GPU, free until held', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  ledger.reserve('w1', gpuReq(1));
  const rows: InventoryGpu[] = ledger.inventory(); // same shape as api's InventoryGpu
  t.same(rows, [
    { gpuTypeId: L4, name: L4, cudaVersion: '12.5', dataCenterId: 'dc-a', free: true },
    { gpuTypeId: A100, name: A100, cudaVersion: '12.5', dataCenterId: 'dc-a', free: false },
    { gpuTypeId: A100, name: A100, cudaVersion: '12.5', dataCenterId: 'dc-a', free: true },
    { gpuTypeId: null, name: 'GeForce RTX 2070', cudaVersion: '12.5', dataCenterId: 'dc-a', free: true },
  ]);
  t.same(inventorySnapshot([], new Set()), []);
});

t.test('setHost: a new discovery keeps existing holdings', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  ledger.reserve('w1', gpuReq(2));
  ledger.setHost({ ...mixedHost(), gpus: mixedHost().gpus.filter((g) => g.uuid !== 'A100-2') });
  t.same(ledger.holding('w1')?.gpuUuids, ['A100-1', 'A100-2'], 'still held until released');
  t.equal(ledger.capacity(gpuReq(1)), 0);
  ledger.release('w1');
  t.equal(ledger.capacity(gpuReq(1)), 1, 'only the A100 still present');
});

t.test('createLedgerPlacement has the scheduler Placement shape, with workerRequirement as the EndpointSpec adapter', async (t) => {
  const ledger = new ResourceLedger(mixedHost());
  const placement: Placement = createLedgerPlacement<EndpointSpec>(ledger, workerRequirement);
  const gpuSpec = {
    gpu: { pools: ['AMPERE_80'], excludedTypes: ['NVIDIA A100 80GB PCIe'], count: 1, allowedCudaVersions: [], minCudaVersion: '12.4' },
    cpu: null,
    dataCenterIds: [],
  } as unknown as EndpointSpec;
  t.equal(placement.capacity('ep1', gpuSpec), 2);
  t.same(placement.reserve('ep1', 'w1', gpuSpec), { gpuDeviceIds: ['A100-1'], gpuName: A100, cpu: null });
  t.same(placement.reserve('ep1', 'w2', gpuSpec), { gpuDeviceIds: ['A100-2'], gpuName: A100, cpu: null });
  t.equal(placement.reserve('ep1', 'w3', gpuSpec), undefined, 'nothing fits: undefined, as Placement says');
  placement.release('w1');
  t.equal(placement.capacity('ep1', gpuSpec), 1);

  const tooNew = { ...gpuSpec, gpu: { ...gpuSpec.gpu, minCudaVersion: '12.6' } } as EndpointSpec;
  t.equal(placement.capacity('ep2', tooNew), 0, 'host CUDA 12.5 fails a 12.6 floor: throttled');

  const cpuSpec = { gpu: null, cpu: [{ id: 'cpu3c', vcpuCount: 8 }], dataCenterIds: [] } as unknown as EndpointSpec;
  t.equal(placement.capacity('ep3', cpuSpec), 2);
  t.same(placement.reserve('ep3', 'c1', cpuSpec), { gpuDeviceIds: [], gpuName: 'cpu', cpu: { id: 'cpu3c', vcpuCount: 8, memoryGb: 16 } });
  // 8 vCPUs left: the first entry (16 vCPUs) does not fit, the second does, and the reservation
  // says which (the container's limits are that entry's).
  const twoEntries = { gpu: null, cpu: [{ id: 'cpu3g', vcpuCount: 16 }, { id: 'cpu3c', vcpuCount: 4 }], dataCenterIds: [] } as unknown as EndpointSpec;
  t.same(placement.reserve('ep4', 'c2', twoEntries), { gpuDeviceIds: [], gpuName: 'cpu', cpu: { id: 'cpu3c', vcpuCount: 4, memoryGb: 8 } });
});

t.test('workerRequirement builds plain requirements from endpoint fields', async (t) => {
  t.same(
    workerRequirement({
      gpu: { pools: ['AMPERE_24', 'ADA_24'], excludedTypes: ['NVIDIA GeForce RTX 3090'], count: 2, allowedCudaVersions: ['12.4'], minCudaVersion: null },
      cpu: null,
      dataCenterIds: ['dc-a'],
      gpuTypePriority: ['NVIDIA GeForce RTX 4090'],
    }),
    {
      kind: 'gpu',
      gpu: {
        count: 2,
        allowedTypeIds: ['NVIDIA GeForce RTX 4090', 'NVIDIA RTX A5000', 'NVIDIA L4'],
        allowedCudaVersions: ['12.4'],
        minCudaVersion: null,
        dataCenterIds: ['dc-a'],
      },
    },
  );
  t.same(workerRequirement({ gpu: null, cpu: [{ id: 'cpu5c', vcpuCount: 4 }], dataCenterIds: [] }), {
    kind: 'cpu',
    cpu: { entries: [{ id: 'cpu5c', vcpuCount: 4 }], dataCenterIds: [] },
  });
});

t.test('end to end: the 8x H100 fixture through discovery into the ledger', async (t) => {
  const bin = fileURLToPath(new URL('../fixtures/nvidia-smi/bin', import.meta.url));
  const env = { ...process.env, PATH: `${bin}${delimiter}${process.env['PATH'] ?? ''}`, FAKE_NVIDIA_SMI_SCENARIO: 'h100-sxm-x8' };
  const host = await probeHost({ env, dataCenterId: 'dc-a' });
  const ledger = new ResourceLedger(host);
  const h100 = gpuReq(2, ['NVIDIA H100 80GB HBM3'], { allowedCudaVersions: ['12.7'] });
  t.equal(ledger.capacity(h100), 4);
  for (const w of ['w1', 'w2', 'w3']) t.match(ledger.reserve(w, h100), { ok: true });
  t.equal(ledger.inventory().filter((r) => r.free).length, 2);
  t.equal(ledger.capacity(gpuReq(4, ['NVIDIA H100 80GB HBM3'])), 0);
  t.equal(ledger.capacity(gpuReq(1, ['NVIDIA H100 80GB HBM3'], { minCudaVersion: '12.11' })), 0, '12.7 < 12.11');
  t.equal(ledger.capacity(gpuReq(1, ['NVIDIA H100 80GB HBM3'], { minCudaVersion: '12.2' })), 2, '12.7 >= 12.2');
});
