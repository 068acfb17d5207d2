/** Placement decisions as tables: every rule of spec "Create `gpu` object" and issue 4 §4. */
import t from 'tap';
import {
  allowedGpuTypes,
  cpuEntryMemoryGb,
  cudaAllows,
  placeCpuWorker,
  placeGpuWorker,
  type CpuRequirement,
  type CpuResources,
  type GpuNoFitReason,
  type GpuRequirement,
  type PlacementGpu,
} from '../../src/gpu/index.js';

const H100 = 'NVIDIA H100 80GB HBM3';
const A100 = 'NVIDIA A100-SXM4-80GB';
const A100P = 'NVIDIA A100 80GB PCIe';
const L4 = 'NVIDIA L4';
const RTX4090 = 'NVIDIA GeForce RTX 4090';

const gpu = (uuid: string, gpuTypeId: string | null, cudaVersion: string | null = '12.4', dataCenterId = 'dc-a', hostId?: string): PlacementGpu =>
  hostId === undefined ? { uuid, gpuTypeId, cudaVersion, dataCenterId } : { uuid, gpuTypeId, cudaVersion, dataCenterId, hostId };

/** The mixed fixture machine as placement sees it (CUDA 12.5). */
const MIXED = [gpu('L4-0', L4, '12.5'), gpu('A100-1', A100, '12.5'), gpu('A100-2', A100, '12.5')];
const H100X8 = Array.from({ length: 8 }, (_, i) => gpu(`H100-${i}`, H100, '12.7'));

const req = (r: Partial<GpuRequirement>): GpuRequirement => ({
  count: 1, allowedTypeIds: [A100], allowedCudaVersions: [], minCudaVersion: null, dataCenterIds: [], ...r,
});

interface Row {
  name: string;
  req: Partial<GpuRequirement>;
  inventory: PlacementGpu[];
  held?: string[];
  want: string[] | GpuNoFitReason;
}

const rows: Row[] = [
  // Types, pools and exclusions
  { name: 'one GPU of the allowed type', req: {}, inventory: MIXED, want: ['A100-1'] },
  { name: 'a type outside the allowed set is never given', req: { allowedTypeIds: [H100] }, inventory: MIXED, want: 'no-allowed-type' },
  { name: 'pool AMPERE_80 minus the SXM (excluded) leaves only PCIe: none here', req: { allowedTypeIds: allowedGpuTypes(['AMPERE_80'], [A100]) }, inventory: MIXED, want: 'no-allowed-type' },
  { name: 'pool AMPERE_24 holds the L4', req: { allowedTypeIds: allowedGpuTypes(['AMPERE_24'], []) }, inventory: MIXED, want: ['L4-0'] },
  { name: 'two pools: the first type in order with room wins', req: { allowedTypeIds: [L4, A100] }, inventory: MIXED, want: ['L4-0'] },
  { name: 'priority order decides between types', req: { allowedTypeIds: [A100, L4] }, inventory: MIXED, want: ['A100-1'] },
  { name: 'the first type is full: the next type is used', req: { allowedTypeIds: [L4, A100] }, inventory: MIXED, held: ['L4-0'], want: ['A100-1'] },
  { name: 'unknown models (no type id) never match', req: { allowedTypeIds: [A100] }, inventory: [gpu('X', null)], want: 'no-allowed-type' },
  { name: 'empty allowed set is an invalid requirement', req: { allowedTypeIds: [] }, inventory: MIXED, want: 'invalid-requirement' },
  { name: 'no GPUs at all', req: {}, inventory: [], want: 'no-gpus' },
  // count > 1, one type, one host
  { name: 'count 2 on the two A100s', req: { count: 2 }, inventory: MIXED, want: ['A100-1', 'A100-2'] },
  { name: 'count 3 A100 cannot be met by 2 A100 + an L4 of another type', req: { count: 3, allowedTypeIds: [A100, L4] }, inventory: MIXED, want: 'count' },
  { name: 'count 8 takes the whole 8x H100 host', req: { count: 8, allowedTypeIds: [H100] }, inventory: H100X8, want: H100X8.map((g) => g.uuid) },
  { name: 'count 4 with 5 held of 8: busy, not impossible', req: { count: 4, allowedTypeIds: [H100] }, inventory: H100X8, held: ['H100-0', 'H100-1', 'H100-2', 'H100-3', 'H100-4'], want: 'busy' },
  { name: 'count 3 skips held GPUs', req: { count: 3, allowedTypeIds: [H100] }, inventory: H100X8, held: ['H100-0', 'H100-2'], want: ['H100-1', 'H100-3', 'H100-4'] },
  {
    name: 'a worker\'s GPUs are on one host: 1 + 1 on two hosts is not 2',
    req: { count: 2, allowedTypeIds: [A100] },
    inventory: [gpu('h1-a', A100, '12.4', 'dc-a', 'h1'), gpu('h2-a', A100, '12.4', 'dc-a', 'h2')],
    want: 'count',
  },
  {
    name: 'the host with enough free GPUs is chosen',
    req: { count: 2, allowedTypeIds: [A100] },
    inventory: [gpu('h1-a', A100, '12.4', 'dc-a', 'h1'), gpu('h2-a', A100, '12.4', 'dc-a', 'h2'), gpu('h2-b', A100, '12.4', 'dc-a', 'h2')],
    want: ['h2-a', 'h2-b'],
  },
  { name: 'count 0 is invalid', req: { count: 0 }, inventory: MIXED, want: 'invalid-requirement' },
  // One worker per GPU
  { name: 'a held GPU is never given again', req: {}, inventory: MIXED, held: ['A100-1'], want: ['A100-2'] },
  { name: 'every allowed GPU held: busy', req: {}, inventory: MIXED, held: ['A100-1', 'A100-2'], want: 'busy' },
  // allowedCudaVersions: exact match
  { name: 'allowedCudaVersions contains the host version', req: { allowedCudaVersions: ['12.4', '12.5'] }, inventory: MIXED, want: ['A100-1'] },
  { name: 'allowedCudaVersions without the host version', req: { allowedCudaVersions: ['12.4', '12.6'] }, inventory: MIXED, want: 'cuda' },
  { name: 'exact string match: 12.1 is not 12.10', req: { allowedCudaVersions: ['12.1'] }, inventory: [gpu('g', A100, '12.10')], want: 'cuda' },
  { name: 'exact: a newer host does not satisfy an older allowed version', req: { allowedCudaVersions: ['12.4'] }, inventory: [gpu('g', A100, '12.7')], want: 'cuda' },
  { name: 'unknown host CUDA fails an allowed list', req: { allowedCudaVersions: ['12.4'] }, inventory: [gpu('g', A100, null)], want: 'cuda' },
  { name: 'unknown host CUDA is fine without constraints', req: {}, inventory: [gpu('g', A100, null)], want: ['g'] },
  // minCudaVersion: numeric
  { name: 'min 12.2 on a 12.11 host: 12.11 > 12.2', req: { minCudaVersion: '12.2' }, inventory: [gpu('g', A100, '12.11')], want: ['g'] },
  { name: 'min 12.11 on a 12.2 host: too old', req: { minCudaVersion: '12.11' }, inventory: [gpu('g', A100, '12.2')], want: 'cuda' },
  { name: 'min equal to the host version fits', req: { minCudaVersion: '12.5' }, inventory: MIXED, want: ['A100-1'] },
  { name: 'min 12.0 on the old-driver host (CUDA 11.2) fails', req: { minCudaVersion: '12.0' }, inventory: [gpu('g', A100, '11.2')], want: 'cuda' },
  { name: 'min 11.8 on CUDA 13.0 fits (major wins)', req: { minCudaVersion: '11.8' }, inventory: [gpu('g', A100, '13.0')], want: ['g'] },
  { name: 'unknown host CUDA fails a floor', req: { minCudaVersion: '11.8' }, inventory: [gpu('g', A100, null)], want: 'cuda' },
  // Data centers
  { name: 'dataCenterIds empty: anywhere', req: { dataCenterIds: [] }, inventory: [gpu('g', A100, '12.4', 'dc-b')], want: ['g'] },
  { name: 'dataCenterIds contains the GPU\'s', req: { dataCenterIds: ['dc-x', 'dc-b'] }, inventory: [gpu('g', A100, '12.4', 'dc-b')], want: ['g'] },
  { name: 'dataCenterIds without the GPU\'s', req: { dataCenterIds: ['dc-x'] }, inventory: [gpu('g', A100, '12.4', 'dc-b')], want: 'data-center' },
  {
    name: 'only GPUs in the allowed data center are used',
    req: { dataCenterIds: ['dc-b'] },
    inventory: [gpu('a', A100, '12.4', 'dc-a', 'h1'), gpu('b', A100, '12.4', 'dc-b', 'h2')],
    want: ['b'],
  },
  // Rules together
  {
    name: 'type, data center and CUDA together pick the one GPU that passes all',
    req: { allowedTypeIds: [A100P, A100], dataCenterIds: ['dc-b'], minCudaVersion: '12.4' },
    inventory: [
      gpu('wrong-type', RTX4090, '12.8', 'dc-b', 'h1'),
      gpu('wrong-dc', A100, '12.8', 'dc-a', 'h2'),
      gpu('old-cuda', A100, '12.2', 'dc-b', 'h3'),
      gpu('good', A100, '12.4', 'dc-b', 'h4'),
    ],
    want: ['good'],
  },
];

t.test('placeGpuWorker table', async (t) => {
  for (const row of rows) {
    const got = placeGpuWorker(req(row.req), row.inventory, new Set(row.held ?? []));
    if (typeof row.want === 'string') {
      t.equal(got.ok, false, `${row.name}: no fit`);
      if (!got.ok) {
        t.equal(got.reason, row.want, `${row.name}: reason`);
        t.ok(got.detail.length > 0, `${row.name}: detail "${got.detail}"`);
      }
    } else {
      t.same(got.ok ? got.gpuUuids : got, row.want, row.name);
    }
  }
});

t.test('a placement names its type and host', async (t) => {
  const got = placeGpuWorker(req({ count: 2 }), MIXED, new Set());
  t.same(got, { ok: true, gpuUuids: ['A100-1', 'A100-2'], gpuTypeId: A100, hostId: 'local' });
});

t.test('placeGpuWorker is pure: the inputs are not changed', async (t) => {
  const inventory = structuredClone(MIXED);
  const held = new Set(['A100-1']);
  placeGpuWorker(req({}), inventory, held);
  t.same(inventory, MIXED);
  t.same([...held], ['A100-1']);
});

t.test('cudaAllows', async (t) => {
  const cases: [string[], string | null, string | null, boolean][] = [
    [[], null, '12.4', true],
    [['12.4'], null, '12.4', true],
    [['12.4'], null, '12.40', false],
    [[], '12.2', '12.11', true],
    [[], '12.11', '12.9', false],
    [[], '12.4', '12.4', true],
    [['12.4'], '12.5', '12.4', false],
  ];
  for (const [allowed, min, host, want] of cases) t.equal(cudaAllows({ allowedCudaVersions: allowed, minCudaVersion: min }, host), want, `${JSON.stringify(allowed)} min ${min} host ${host}`);
});

t.test('allowedGpuTypes: pool members minus exclusions, priority first', async (t) => {
  t.same(allowedGpuTypes(['AMPERE_80'], []), [A100P, A100]);
  t.same(allowedGpuTypes(['AMPERE_80'], [A100P]), [A100]);
  t.same(allowedGpuTypes(['AMPERE_80'], [`  ${A100P} `]), [A100], 'exclusions are trimmed');
  t.same(allowedGpuTypes(['ADA_24', 'AMPERE_80'], []), [RTX4090, A100P, A100], 'pools in order');
  t.same(allowedGpuTypes(['ADA_24', 'AMPERE_80'], [], [A100, 'NVIDIA B200', A100]), [A100, RTX4090, A100P], 'priority types first, unknown or repeated ones ignored');
  t.same(allowedGpuTypes(['NO_SUCH_POOL'], []), []);
});

// CPU placement: cpu3c = 2 GB/vCPU, cpu3g = 4 GB/vCPU (catalog/cpu-flavors.ts).
const host: CpuResources = { vcpus: 16, memoryGb: 62.5 };
const none: CpuResources = { vcpus: 0, memoryGb: 0 };

interface CpuRow {
  name: string;
  req: CpuRequirement;
  reserved?: CpuResources;
  dc?: string;
  want: { id: string; vcpuCount: number; index: number; memoryGb: number } | string;
}

const cpuRows: CpuRow[] = [
  { name: 'the first entry fits', req: { entries: [{ id: 'cpu3c', vcpuCount: 4 }] }, want: { id: 'cpu3c', vcpuCount: 4, index: 0, memoryGb: 8 } },
  { name: 'memory is vcpuCount x multiplier (cpu3g: 4)', req: { entries: [{ id: 'cpu3g', vcpuCount: 8 }] }, want: { id: 'cpu3g', vcpuCount: 8, index: 0, memoryGb: 32 } },
  {
    name: 'entries in order: the first that fits wins, even if a later one is smaller',
    req: { entries: [{ id: 'cpu3g', vcpuCount: 32 }, { id: 'cpu3g', vcpuCount: 8 }, { id: 'cpu3c', vcpuCount: 2 }] },
    want: { id: 'cpu3g', vcpuCount: 8, index: 1, memoryGb: 32 },
  },
  {
    name: 'vCPUs fit but memory does not: next entry',
    req: { entries: [{ id: 'cpu3g', vcpuCount: 16 }, { id: 'cpu3c', vcpuCount: 16 }] },
    want: { id: 'cpu3c', vcpuCount: 16, index: 1, memoryGb: 32 },
  },
  {
    name: 'what is reserved counts against the host',
    req: { entries: [{ id: 'cpu3c', vcpuCount: 8 }, { id: 'cpu3c', vcpuCount: 4 }] },
    reserved: { vcpus: 10, memoryGb: 20 },
    want: { id: 'cpu3c', vcpuCount: 4, index: 1, memoryGb: 8 },
  },
  { name: 'exactly full still fits', req: { entries: [{ id: 'cpu3c', vcpuCount: 4 }] }, reserved: { vcpus: 12, memoryGb: 54.5 }, want: { id: 'cpu3c', vcpuCount: 4, index: 0, memoryGb: 8 } },
  { name: 'reserved leaves too little: busy', req: { entries: [{ id: 'cpu3c', vcpuCount: 4 }] }, reserved: { vcpus: 14, memoryGb: 10 }, want: 'busy' },
  { name: 'memory left too small: busy', req: { entries: [{ id: 'cpu3g', vcpuCount: 2 }] }, reserved: { vcpus: 0, memoryGb: 60 }, want: 'busy' },
  { name: 'larger than the host even when empty: too-large', req: { entries: [{ id: 'cpu3c', vcpuCount: 32 }] }, want: 'too-large' },
  { name: 'unknown flavors are skipped', req: { entries: [{ id: 'cpu9x', vcpuCount: 2 }, { id: 'cpu5c', vcpuCount: 2 }] }, want: { id: 'cpu5c', vcpuCount: 2, index: 1, memoryGb: 4 } },
  { name: 'only unknown flavors', req: { entries: [{ id: 'cpu9x', vcpuCount: 2 }] }, want: 'unknown-flavor' },
  { name: 'no entries', req: { entries: [] }, want: 'invalid-requirement' },
  { name: 'data center allowed', req: { entries: [{ id: 'cpu3c', vcpuCount: 2 }], dataCenterIds: ['dc-a'] }, dc: 'dc-a', want: { id: 'cpu3c', vcpuCount: 2, index: 0, memoryGb: 4 } },
  { name: 'data center not allowed', req: { entries: [{ id: 'cpu3c', vcpuCount: 2 }], dataCenterIds: ['dc-b'] }, dc: 'dc-a', want: 'data-center' },
];

t.test('placeCpuWorker table', async (t) => {
  for (const row of cpuRows) {
    const got = placeCpuWorker(row.req, { ...host, dataCenterId: row.dc ?? 'dc-a' }, row.reserved ?? none);
    if (typeof row.want === 'string') {
      t.match(got, { ok: false, reason: row.want }, row.name);
    } else {
      t.same(got, { ok: true, entry: { id: row.want.id, vcpuCount: row.want.vcpuCount }, entryIndex: row.want.index, vcpus: row.want.vcpuCount, memoryGb: row.want.memoryGb }, row.name);
    }
  }
});

t.test('cpuEntryMemoryGb', async (t) => {
  t.equal(cpuEntryMemoryGb({ id: 'cpu3c', vcpuCount: 4 }), 8);
  t.equal(cpuEntryMemoryGb({ id: 'cpu5g', vcpuCount: 16 }), 64);
  t.equal(cpuEntryMemoryGb({ id: 'nope', vcpuCount: 4 }), null);
});
