/**
 * The host's resources for placement: GPUs from {@link discoverGpus}, vCPUs and memory from
 * systeminformation (the one adapter to it). Memory is in GiB (bytes / 2^30), the unit a
 * container memory limit is set in, and the unit flavor memory (`vcpuCount × ramMultiplier`) is read in.
 */
import si from 'systeminformation';
import type { Logger } from '../core/logger.js';
import { discoverGpus, type DiscoverGpusOptions } from './discovery.js';
import type { CpuResources, DiscoveredGpu, GpuDiscovery } from './types.js';

/** Logical CPUs and total memory of this machine. Falls back to 0 on a probe failure (logged). */
export async function probeCpu(log?: Logger): Promise<CpuResources> {
  try {
    const [cpu, mem] = await Promise.all([si.cpu(), si.mem()]);
    return { vcpus: cpu.cores, memoryGb: mem.total / 2 ** 30 };
  } catch (err) {
    log?.warn('cpu probe failed', { err });
    return { vcpus: 0, memoryGb: 0 };
  }
}

/** Everything placement knows about one host. */
export interface HostResources {
  hostId: string;
  dataCenterId: string;
  gpus: readonly DiscoveredGpu[];
  cpu: CpuResources;
  /** The discovery result, for logs and health (why there are no GPUs). */
  discovery: GpuDiscovery;
}

export interface ProbeHostOptions extends DiscoverGpusOptions {
  /** Data center this host belongs to. */
  dataCenterId: string;
  /** @defaultValue `"local"` */
  hostId?: string;
}

/** Discovers GPUs and probes CPU and memory, together. Never throws. */
export async function probeHost(options: ProbeHostOptions): Promise<HostResources> {
  const [discovery, cpu] = await Promise.all([discoverGpus(options), probeCpu(options.log)]);
  return { hostId: options.hostId ?? 'local', dataCenterId: options.dataCenterId, gpus: discovery.gpus, cpu, discovery };
}
