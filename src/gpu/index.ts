/**
 * gpu/: what hardware this host has and who holds it. Discovery (nvidia-smi, systeminformation),
 * pure placement decisions for GPU and CPU workers, the ledger of reservations, and the catalog
 * snapshot. Imports only core/ and catalog/.
 */
export type {
  DiscoveredGpu,
  NoGpuReason,
  GpuDiscovery,
  PlacementGpu,
  GpuRequirement,
  CpuEntry,
  CpuRequirement,
  CpuResources,
  WorkerRequirement,
  InventoryGpuRow,
} from './types.js';
export { discoverGpus, parseQueryGpuCsv, parseSmiHeader, QUERY_GPU_ARGS } from './discovery.js';
export type { DiscoverGpusOptions, QueryGpuRow } from './discovery.js';
export { probeCpu, probeHost } from './host.js';
export type { HostResources, ProbeHostOptions } from './host.js';
export { placeGpuWorker, placeCpuWorker, cudaAllows, cpuEntryMemoryGb } from './placement.js';
export type { GpuPlacement, GpuNoFitReason, CpuPlacement, CpuNoFitReason } from './placement.js';
export { ResourceLedger, inventorySnapshot, createLedgerPlacement } from './allocator.js';
export type { LedgerHost, Holding, LedgerReservation, LedgerNoFit, LedgerPlacement } from './allocator.js';
export { allowedGpuTypes, workerRequirement } from './requirement.js';
export { GpuWatch, startDiscoveryLogger } from './watch.js';
export type { GpuWatchOptions } from './watch.js';
export type { GpuFields } from './requirement.js';
