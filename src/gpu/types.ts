/** Plain data shared by discovery, placement, the ledger and the catalog snapshot. */

/** One GPU as `nvidia-smi` reports it, mapped onto the catalog. */
export interface DiscoveredGpu {
  /** nvidia-smi's index (PCI bus order; can change between boots, so never used as an identity). */
  index: number;
  /** `GPU-…` UUID: the identity used for placement and for Docker `DeviceRequests`. */
  uuid: string;
  /** Product name exactly as nvidia-smi prints it. */
  name: string;
  /** Catalog GPU type id, or null for a model the catalog does not know. */
  gpuTypeId: string | null;
  /** Serverless pool of the type, or null (unknown model, or a type in no pool). */
  pool: string | null;
  /** `memory.total` in MiB, or null when the driver reports `[N/A]`. */
  memoryMiB: number | null;
  driverVersion: string | null;
  /** Highest CUDA version the host's driver supports (`CUDA Version:` of nvidia-smi), or null. */
  cudaVersion: string | null;
}

/** Why discovery found no GPU. `null` in {@link GpuDiscovery.noGpuReason} when it found some. */
export type NoGpuReason =
  | 'nvidia-smi-not-found'
  | 'driver-not-loaded'
  | 'no-devices'
  | 'timeout'
  | 'nvidia-smi-failed'
  | 'unparseable-output';

export interface GpuDiscovery {
  gpus: DiscoveredGpu[];
  driverVersion: string | null;
  cudaVersion: string | null;
  noGpuReason: NoGpuReason | null;
  /** Human-readable detail for logs (the first line nvidia-smi printed, the spawn error). */
  detail: string | null;
}

/** A GPU as placement sees it: where it is and what it offers. */
export interface PlacementGpu {
  uuid: string;
  gpuTypeId: string | null;
  cudaVersion: string | null;
  dataCenterId: string;
  /** Host that holds the GPU; a worker's GPUs are all on one host. @defaultValue `"local"` */
  hostId?: string;
}

/** A GPU endpoint's needs for one worker, as plain data (the adapter builds it from `EndpointSpec`). */
export interface GpuRequirement {
  /** GPUs per worker (>= 1), all of one type and on one host. */
  count: number;
  /**
   * Pool members minus `excludedTypes`, in priority order: the first type with room wins. A GPU
   * model the catalog does not know is matched by the name nvidia-smi prints.
   */
  allowedTypeIds: readonly string[];
  /** When non-empty, the host's CUDA version must be one of these exactly (string equality). */
  allowedCudaVersions: readonly string[];
  /** When set, the host's CUDA version must be at least this, compared numerically (12.11 > 12.2). */
  minCudaVersion: string | null;
  /** When non-empty, the GPU's data center must be one of these. */
  dataCenterIds: readonly string[];
  /**
   * The pool OTHER without a priority list: a GPU model the catalog does not know is allowed too,
   * after `allowedTypeIds`, under the name nvidia-smi prints, unless that name is in `excluded`.
   * The ledger adds the host's such names to `allowedTypeIds`. Absent: only `allowedTypeIds`.
   */
  uncatalogedModels?: { excluded: readonly string[] };
}

/** One entry of a CPU endpoint's `cpu` list. */
export interface CpuEntry {
  /** CPU flavor id (`cpu3c`, `cpu3g`, …). */
  id: string;
  vcpuCount: number;
}

/** A CPU endpoint's needs for one worker: its `cpu` entries, tried in order. */
export interface CpuRequirement {
  entries: readonly CpuEntry[];
  /** When non-empty, the host's data center must be one of these. */
  dataCenterIds?: readonly string[];
}

/** vCPUs and memory (GiB) of a host, or reserved on it. */
export interface CpuResources {
  vcpus: number;
  memoryGb: number;
}

/** What one worker needs: GPUs, or a CPU flavor. */
export type WorkerRequirement = { kind: 'gpu'; gpu: GpuRequirement } | { kind: 'cpu'; cpu: CpuRequirement };

/** One row per GPU for `/v2/catalog/*` availability (same shape as api's `InventoryGpu`). */
export interface InventoryGpuRow {
  gpuTypeId: string | null;
  name: string;
  cudaVersion: string | null;
  dataCenterId: string;
  free: boolean;
}
