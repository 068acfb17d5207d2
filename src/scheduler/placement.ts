/**
 * What the autoscaler needs from placement (gpu/ implements it for GPU endpoints): how many
 * more workers of an endpoint fit right now, and reserving/releasing the devices of one.
 */
import { cpuFlavor } from '../catalog/index.js';
import type { EndpointSpec } from '../endpoints/index.js';

export interface Reservation {
  /** GPU UUIDs for the worker; [] for CPU workers. */
  gpuDeviceIds: string[];
  /** GPU model name for the worker's URLs (`?gpu=`), or "cpu". */
  gpuName: string;
  /**
   * A CPU worker's `cpu` entry, the one placement chose (the first that fits, not always the
   * first), with its memory in GiB: its container's limits come from it. null for a GPU worker.
   */
  cpu: { id: string; vcpuCount: number; memoryGb: number } | null;
}

/** The first `cpu` entry, for a placement that reserves no vCPUs (it takes the first entry as it is). */
function firstCpuEntry(spec: EndpointSpec): Reservation['cpu'] {
  const first = spec.cpu?.[0];
  return first ? { id: first.id, vcpuCount: first.vcpuCount, memoryGb: first.vcpuCount * (cpuFlavor(first.id)?.ramMultiplier ?? 2) } : null;
}

export interface Placement {
  /** Workers of this endpoint that could start now (0: nothing fits, jobs wait throttled). */
  capacity(endpointId: string, spec: EndpointSpec): number;
  /** Reserves devices for one worker, or undefined when nothing fits. */
  reserve(endpointId: string, workerId: string, spec: EndpointSpec): Reservation | undefined;
  /** Frees what a worker held. */
  release(workerId: string): void;
  /** Why no worker of this endpoint could start now, or null when one could (for the endpoint log). */
  whyNot(endpointId: string, spec: EndpointSpec): string | null;
}

/** Without a placement component: CPU workers everywhere, GPU workers nowhere. */
export const CPU_ONLY_PLACEMENT: Placement = {
  capacity: (_id, spec) => (spec.gpu ? 0 : Number.POSITIVE_INFINITY),
  reserve: (_id, _w, spec) => (spec.gpu ? undefined : { gpuDeviceIds: [], gpuName: 'cpu', cpu: firstCpuEntry(spec) }),
  release: () => undefined,
  whyNot: (_id, spec) => (spec.gpu ? 'this flashd places no GPU workers' : null),
};

/**
 * For host processes (`--runtime process`), which get no CPU or memory limit: CPU workers take
 * nothing from `placement` (reserving a flavor's vCPUs would only cap how many run, one `cpu3c`
 * worker on a 2-vCPU host), while GPU workers still get their GPUs exclusively from it.
 */
export function unreservedCpu(placement: Placement): Placement {
  return {
    capacity: (id, spec) => (spec.gpu ? placement.capacity(id, spec) : CPU_ONLY_PLACEMENT.capacity(id, spec)),
    reserve: (id, workerId, spec) => (spec.gpu ? placement.reserve(id, workerId, spec) : CPU_ONLY_PLACEMENT.reserve(id, workerId, spec)),
    release: (workerId) => placement.release(workerId),
    whyNot: (id, spec) => (spec.gpu ? placement.whyNot(id, spec) : null),
  };
}
