/**
 * Placement decisions, pure: given what a worker needs, what the hosts offer and what is already
 * held, pick the devices for one worker or say why nothing fits. No I/O and no state; the ledger
 * (allocator.ts) calls these and records the result.
 *
 * GPU rules (spec "Create `gpu` object" and rules 4–6; issue 4 §4):
 *   - `count` free GPUs of one allowed type, all on one host; types are tried in the order of
 *     `allowedTypeIds` (pool members minus `excludedTypes`, priority order when given; the ledger
 *     adds the host's models not in the catalog when `uncatalogedModels` allows them);
 *   - `allowedCudaVersions`, when non-empty, must contain the host's CUDA version exactly;
 *   - `minCudaVersion`, when set, is compared numerically (12.11 > 12.2, catalog `compareCuda`);
 *   - `dataCenterIds`, when non-empty, must contain the GPU's data center;
 *   - a GPU belongs to one worker at a time (`held`).
 * CPU rules: the endpoint's `cpu` entries are tried in order; the first whose vCPUs and memory
 * (`vcpuCount × ramMultiplier` of the flavor) fit in what the host has left wins.
 */
import { compareCuda, cpuFlavor } from '../catalog/index.js';
import type { CpuEntry, CpuRequirement, CpuResources, GpuRequirement, PlacementGpu } from './types.js';

/**
 * Why no GPU worker fits, from the most to the least fundamental. Every reason but `busy`
 * holds until the hardware or the requirement changes; `busy` clears when a worker releases.
 */
export type GpuNoFitReason = 'invalid-requirement' | 'no-gpus' | 'no-allowed-type' | 'data-center' | 'cuda' | 'count' | 'busy';

export type GpuPlacement =
  | { ok: true; gpuUuids: string[]; gpuTypeId: string; hostId: string }
  | { ok: false; reason: GpuNoFitReason; detail: string };

const hostOf = (g: PlacementGpu): string => g.hostId ?? 'local';

/** Whether a GPU's host CUDA version satisfies the requirement (null: unknown, fails any constraint). */
export function cudaAllows(req: Pick<GpuRequirement, 'allowedCudaVersions' | 'minCudaVersion'>, cudaVersion: string | null): boolean {
  if (req.allowedCudaVersions.length > 0 && (cudaVersion === null || !req.allowedCudaVersions.includes(cudaVersion))) return false;
  if (req.minCudaVersion !== null && (cudaVersion === null || compareCuda(cudaVersion, req.minCudaVersion) < 0)) return false;
  return true;
}

function noFit(reason: GpuNoFitReason, detail: string): GpuPlacement {
  return { ok: false, reason, detail };
}

/** Picks `req.count` GPUs for one worker, or the reason nothing fits. */
export function placeGpuWorker(req: GpuRequirement, inventory: readonly PlacementGpu[], held: ReadonlySet<string>): GpuPlacement {
  if (!Number.isInteger(req.count) || req.count < 1) return noFit('invalid-requirement', `count must be an integer >= 1, got ${req.count}`);
  if (req.allowedTypeIds.length === 0 && !req.uncatalogedModels) return noFit('invalid-requirement', 'no GPU type is allowed (pools minus exclusions is empty)');
  if (inventory.length === 0) return noFit('no-gpus', 'this installation has no GPUs');

  const allowed = new Set(req.allowedTypeIds);
  const typed = inventory.filter((g) => g.gpuTypeId !== null && allowed.has(g.gpuTypeId));
  if (typed.length === 0) {
    const ids = req.allowedTypeIds.join(', ');
    const models = !req.uncatalogedModels ? '' : ids ? ', or a model not in the GPU catalog' : 'a model not in the GPU catalog';
    return noFit('no-allowed-type', `no GPU of an allowed type (${ids}${models})`);
  }
  const inDc = req.dataCenterIds.length === 0 ? typed : typed.filter((g) => req.dataCenterIds.includes(g.dataCenterId));
  if (inDc.length === 0) return noFit('data-center', `no GPU of an allowed type in data centers ${req.dataCenterIds.join(', ')}`);
  const eligible = inDc.filter((g) => cudaAllows(req, g.cudaVersion));
  if (eligible.length === 0) {
    const have = [...new Set(inDc.map((g) => g.cudaVersion ?? 'unknown'))].join(', ');
    const want = req.allowedCudaVersions.length > 0 ? `one of ${req.allowedCudaVersions.join(', ')}` : `>= ${req.minCudaVersion ?? '?'}`;
    return noFit('cuda', `host CUDA ${have}, endpoint needs ${want}`);
  }

  let enoughExist = false;
  for (const typeId of req.allowedTypeIds) {
    // Group this type's GPUs by host, keeping inventory order (nvidia-smi index order) inside a host.
    const byHost = new Map<string, PlacementGpu[]>();
    for (const g of eligible) {
      if (g.gpuTypeId !== typeId) continue;
      const list = byHost.get(hostOf(g)) ?? [];
      list.push(g);
      byHost.set(hostOf(g), list);
    }
    for (const [hostId, gpus] of byHost) {
      if (gpus.length >= req.count) enoughExist = true;
      const free = gpus.filter((g) => !held.has(g.uuid));
      if (free.length >= req.count) return { ok: true, gpuUuids: free.slice(0, req.count).map((g) => g.uuid), gpuTypeId: typeId, hostId };
    }
  }
  if (!enoughExist) return noFit('count', `no host has ${req.count} matching GPUs of one type`);
  return noFit('busy', `every matching GPU is held by another worker`);
}

export type CpuNoFitReason = 'invalid-requirement' | 'data-center' | 'unknown-flavor' | 'too-large' | 'busy';

export type CpuPlacement =
  | { ok: true; entry: CpuEntry; entryIndex: number; vcpus: number; memoryGb: number }
  | { ok: false; reason: CpuNoFitReason; detail: string };

/** Memory of a CPU entry in GB (`vcpuCount × ramMultiplier`), or null for an unknown flavor. */
export function cpuEntryMemoryGb(entry: CpuEntry): number | null {
  const flavor = cpuFlavor(entry.id);
  return flavor ? entry.vcpuCount * flavor.ramMultiplier : null;
}

/**
 * Picks the first `cpu` entry that fits in `host` minus `reserved`, or the reason none does:
 * `too-large` when no entry would fit even on an empty host, `busy` when one would after releases.
 */
export function placeCpuWorker(req: CpuRequirement, host: CpuResources & { dataCenterId?: string }, reserved: CpuResources): CpuPlacement {
  if (req.entries.length === 0) return { ok: false, reason: 'invalid-requirement', detail: 'no cpu entries' };
  const dcs = req.dataCenterIds ?? [];
  if (dcs.length > 0 && (host.dataCenterId === undefined || !dcs.includes(host.dataCenterId))) {
    return { ok: false, reason: 'data-center', detail: `host is not in data centers ${dcs.join(', ')}` };
  }
  let known = false;
  let fitsEmpty = false;
  for (const [entryIndex, entry] of req.entries.entries()) {
    const memoryGb = cpuEntryMemoryGb(entry);
    if (memoryGb === null || !Number.isInteger(entry.vcpuCount) || entry.vcpuCount < 1) continue;
    known = true;
    if (entry.vcpuCount <= host.vcpus && memoryGb <= host.memoryGb) fitsEmpty = true;
    if (entry.vcpuCount <= host.vcpus - reserved.vcpus && memoryGb <= host.memoryGb - reserved.memoryGb) {
      return { ok: true, entry, entryIndex, vcpus: entry.vcpuCount, memoryGb };
    }
  }
  if (!known) return { ok: false, reason: 'unknown-flavor', detail: `no known flavor among ${req.entries.map((e) => e.id).join(', ')}` };
  const have = `${host.vcpus} vCPU / ${host.memoryGb.toFixed(1)} GiB`;
  if (!fitsEmpty) return { ok: false, reason: 'too-large', detail: `no cpu entry fits this host (${have})` };
  return { ok: false, reason: 'busy', detail: `host has ${host.vcpus - reserved.vcpus} vCPU / ${(host.memoryGb - reserved.memoryGb).toFixed(1)} GiB left of ${have}` };
}
