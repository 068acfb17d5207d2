/**
 * Builds placement requirements from an endpoint's `gpu`/`cpu` fields given as plain data (the
 * same shape as `endpoints/`'s `GpuSpec`/`CpuSpec`, which gpu/ may not import).
 */
import { GPU_POOLS } from '../catalog/index.js';
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
 */
export function allowedGpuTypes(pools: readonly string[], excludedTypes: readonly string[], priority: readonly string[] = []): string[] {
  const excluded = new Set(excludedTypes.map((t) => t.trim()));
  const members = [...new Set(pools.flatMap((p) => GPU_POOLS.get(p) ?? []))].filter((t) => !excluded.has(t));
  const first = priority.filter((t, i) => members.includes(t) && priority.indexOf(t) === i);
  return [...first, ...members.filter((t) => !first.includes(t))];
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
    return { kind: 'gpu', gpu };
  }
  return { kind: 'cpu', cpu: { entries: [...(fields.cpu ?? [])], dataCenterIds: [...fields.dataCenterIds] } };
}
