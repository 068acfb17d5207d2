/**
 * Builds placement requirements from an endpoint's `gpu`/`cpu` fields given as plain data (the
 * same shape as `endpoints/`'s `GpuSpec`/`CpuSpec`, which gpu/ may not import).
 */
import { OTHER_POOL, gpuTypeForName, poolTypes } from '../catalog/index.js';
import type { CpuEntry, GpuRequirement, WorkerRequirement } from './types.js';

/** An endpoint's `gpu` object (spec "Create `gpu` object"). */
export interface GpuFields {
  pools: readonly string[];
  excludedTypes: readonly string[];
  count: number;
  allowedCudaVersions: readonly string[];
  minCudaVersion: string | null;
}

/**
 * GPU type ids a worker may get: the members of `pools` minus `excludedTypes`, in pool order,
 * with the types of `priority` (the older REST `gpuTypeIds`, "first available wins") moved first.
 * With {@link OTHER_POOL}, a priority type may also be a model the catalog does not know (the name
 * nvidia-smi prints); without a priority, such models are allowed by {@link uncatalogedModels}.
 */
export function allowedGpuTypes(pools: readonly string[], excludedTypes: readonly string[], priority: readonly string[] = []): string[] {
  const excluded = new Set(excludedTypes.map((t) => t.trim()));
  const members = [...new Set(pools.flatMap((p) => poolTypes(p) ?? []))].filter((t) => !excluded.has(t));
  const uncataloged = (t: string) => pools.includes(OTHER_POOL) && !excluded.has(t) && gpuTypeForName(t) === undefined;
  const first = priority.filter((t, i) => (members.includes(t) || uncataloged(t)) && priority.indexOf(t) === i);
  return [...first, ...members.filter((t) => !first.includes(t))];
}

/**
 * For {@link OTHER_POOL} without a priority list: every GPU model the catalog does not know is
 * allowed, except the names in `excludedTypes`. Undefined otherwise (a priority list names the
 * models it allows).
 */
export function uncatalogedModels(pools: readonly string[], excludedTypes: readonly string[], priority: readonly string[] = []): GpuRequirement['uncatalogedModels'] {
  if (!pools.includes(OTHER_POOL) || priority.length > 0) return undefined;
  return { excluded: excludedTypes.map((t) => t.trim()) };
}

/** The requirement of one worker of an endpoint, from its `gpu` or `cpu` fields. */
export function workerRequirement(fields: {
  gpu: GpuFields | null;
  cpu: readonly CpuEntry[] | null;
  dataCenterIds: readonly string[];
  gpuTypePriority?: readonly string[];
}): WorkerRequirement {
  if (fields.gpu) {
    const g = fields.gpu;
    const gpu: GpuRequirement = {
      count: g.count,
      allowedTypeIds: allowedGpuTypes(g.pools, g.excludedTypes, fields.gpuTypePriority ?? []),
      allowedCudaVersions: [...g.allowedCudaVersions],
      minCudaVersion: g.minCudaVersion,
      dataCenterIds: [...fields.dataCenterIds],
    };
    const other = uncatalogedModels(g.pools, g.excludedTypes, fields.gpuTypePriority ?? []);
    if (other) gpu.uncatalogedModels = other;
    return { kind: 'gpu', gpu };
  }
  return { kind: 'cpu', cpu: { entries: [...(fields.cpu ?? [])], dataCenterIds: [...fields.dataCenterIds] } };
}
