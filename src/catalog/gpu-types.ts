/**
 * GPU types and serverless pools, with RunPod's identifiers so configurations carry over
 * (research/worker-protocol.md §6; flash `POOLS_TO_TYPES` taken as authoritative). A GPU type id
 * is the name `nvidia-smi` prints for the model; `aliases` catch other spellings of the same card.
 */

export interface GpuTypeInfo {
  /** RunPod GPU type id, e.g. `NVIDIA GeForce RTX 4090`. */
  readonly id: string;
  readonly displayName: string;
  readonly memoryInGb: number;
  /** Serverless pool id, or null when the type belongs to no serverless pool. */
  readonly pool: string | null;
  /** Lowest CUDA version whose driver supports the architecture. */
  readonly minCuda: string;
  /** Other `nvidia-smi` names for the same model. */
  readonly aliases?: readonly string[];
}

/** Every CUDA version the catalog knows (flash `CudaVersion`: 11.8, 12.0–12.9, 13.0). */
export const CUDA_VERSIONS: readonly string[] = ['11.8', '12.0', '12.1', '12.2', '12.3', '12.4', '12.5', '12.6', '12.7', '12.8', '12.9', '13.0'];

const T = (id: string, displayName: string, memoryInGb: number, pool: string | null, minCuda = '11.8', aliases?: string[]): GpuTypeInfo =>
  aliases ? { id, displayName, memoryInGb, pool, minCuda, aliases } : { id, displayName, memoryInGb, pool, minCuda };

export const GPU_TYPES: readonly GpuTypeInfo[] = [
  T('NVIDIA RTX A4000', 'RTX A4000', 16, 'AMPERE_16'),
  T('NVIDIA RTX A4500', 'RTX A4500', 20, 'AMPERE_16'),
  T('NVIDIA RTX 4000 Ada Generation', 'RTX 4000 Ada', 20, 'AMPERE_16'),
  T('NVIDIA RTX 2000 Ada Generation', 'RTX 2000 Ada', 16, 'AMPERE_16'),
  T('NVIDIA RTX A5000', 'RTX A5000', 24, 'AMPERE_24'),
  T('NVIDIA L4', 'L4', 24, 'AMPERE_24'),
  T('NVIDIA GeForce RTX 3090', 'RTX 3090', 24, 'AMPERE_24'),
  T('NVIDIA GeForce RTX 4090', 'RTX 4090', 24, 'ADA_24'),
  T('NVIDIA GeForce RTX 5090', 'RTX 5090', 32, 'ADA_32_PRO', '12.8'),
  T('NVIDIA A40', 'A40', 48, 'AMPERE_48'),
  T('NVIDIA RTX A6000', 'RTX A6000', 48, 'AMPERE_48'),
  T('NVIDIA RTX 6000 Ada Generation', 'RTX 6000 Ada', 48, 'ADA_48_PRO'),
  T('NVIDIA L40', 'L40', 48, 'ADA_48_PRO'),
  T('NVIDIA L40S', 'L40S', 48, 'ADA_48_PRO'),
  T('NVIDIA A100 80GB PCIe', 'A100 PCIe', 80, 'AMPERE_80'),
  T('NVIDIA A100-SXM4-80GB', 'A100 SXM', 80, 'AMPERE_80'),
  T('NVIDIA H100 80GB HBM3', 'H100 SXM', 80, 'ADA_80_PRO'),
  T('NVIDIA H100 PCIe', 'H100 PCIe', 80, 'ADA_80_PRO'),
  T('NVIDIA H100 NVL', 'H100 NVL', 94, 'ADA_80_PRO'),
  T('NVIDIA H200', 'H200 SXM', 141, 'HOPPER_141', '12.0', ['NVIDIA H200 NVL']),
  T('NVIDIA RTX PRO 6000 Blackwell Server Edition', 'RTX PRO 6000 Server', 96, 'BLACKWELL_96', '12.8'),
  T('NVIDIA RTX PRO 6000 Blackwell Workstation Edition', 'RTX PRO 6000 WK', 96, 'BLACKWELL_96', '12.8'),
  T('NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition', 'RTX PRO 6000 Max-Q', 96, 'BLACKWELL_96', '12.8'),
  T('NVIDIA B200', 'B200', 180, 'BLACKWELL_180', '12.8'),
  // Types RunPod lists with no serverless pool.
  T('NVIDIA A30', 'A30', 24, null),
  T('NVIDIA RTX A2000', 'RTX A2000', 6, null),
  T('NVIDIA RTX 5000 Ada Generation', 'RTX 5000 Ada', 32, null),
  T('NVIDIA GeForce RTX 3080', 'RTX 3080', 10, null),
  T('NVIDIA GeForce RTX 3080 Ti', 'RTX 3080 Ti', 12, null),
  T('NVIDIA GeForce RTX 3070', 'RTX 3070', 8, null),
  T('NVIDIA GeForce RTX 4080', 'RTX 4080', 16, null),
  T('NVIDIA GeForce RTX 4080 SUPER', 'RTX 4080 SUPER', 16, null),
  T('NVIDIA GeForce RTX 4070 Ti', 'RTX 4070 Ti', 12, null),
  T('NVIDIA GeForce RTX 5080', 'RTX 5080', 16, null, '12.8'),
  T('Tesla V100-SXM2-16GB', 'V100 SXM2', 16, null, '11.8', ['Tesla V100-SXM2-32GB']),
  T('Tesla T4', 'T4', 16, null),
  T('NVIDIA B300 SXM6 AC', 'B300', 288, null, '12.8'),
  T('AMD Instinct MI300X OAM', 'MI300X', 192, null),
];

export const GPU_POOLS: ReadonlyMap<string, readonly string[]> = (() => {
  const pools = new Map<string, string[]>();
  for (const t of GPU_TYPES) {
    if (t.pool === null) continue;
    const list = pools.get(t.pool) ?? [];
    list.push(t.id);
    pools.set(t.pool, list);
  }
  return pools;
})();

/**
 * flashd's own pool, which RunPod does not have: every catalog type in no serverless pool, plus
 * every GPU model a host reports that the catalog does not know (its type id is then the name
 * nvidia-smi prints), so a homelab's T4s or RTX 3080s can serve endpoints too.
 */
export const OTHER_POOL = 'OTHER';

/** The catalog types of {@link OTHER_POOL} (models the catalog does not know join them on the host). */
export const OTHER_POOL_TYPES: readonly string[] = GPU_TYPES.filter((t) => t.pool === null).map((t) => t.id);

/** The catalog types of a pool id, {@link OTHER_POOL} included; undefined for an unknown pool. */
export function poolTypes(pool: string): readonly string[] | undefined {
  return pool === OTHER_POOL ? OTHER_POOL_TYPES : GPU_POOLS.get(pool);
}

/** Every pool id an endpoint may name: RunPod's serverless pools, then {@link OTHER_POOL}. */
export const POOL_IDS: readonly string[] = [...GPU_POOLS.keys(), OTHER_POOL];

const byId = new Map(GPU_TYPES.map((t) => [t.id, t]));
const byName = new Map<string, GpuTypeInfo>();
for (const t of GPU_TYPES) {
  byName.set(t.id.toLowerCase(), t);
  for (const a of t.aliases ?? []) byName.set(a.toLowerCase(), t);
}

export function gpuType(id: string): GpuTypeInfo | undefined {
  return byId.get(id);
}

// displayName ("RTX 4090") → type, for hints only; a displayName two types share is left out.
const byDisplayName = new Map<string, GpuTypeInfo | null>();
for (const t of GPU_TYPES) {
  const key = t.displayName.toLowerCase();
  byDisplayName.set(key, byDisplayName.has(key) ? null : t);
}

/**
 * The catalog type a name that is no type id nearly names, for an error's "did you mean" only:
 * its id in another letter case, an `nvidia-smi` alias, or its `displayName` (`RTX 4090`, what
 * `/v2/catalog/gpus` shows beside the id `NVIDIA GeForce RTX 4090`).
 */
export function gpuTypeMeant(name: string): GpuTypeInfo | undefined {
  const key = name.trim().toLowerCase();
  return byName.get(key) ?? byDisplayName.get(key) ?? undefined;
}

/** Maps a name printed by `nvidia-smi` onto a catalog type (undefined for unknown models). */
export function gpuTypeForName(name: string): GpuTypeInfo | undefined {
  return byName.get(name.trim().toLowerCase());
}

/** CUDA versions from the catalog that an architecture supports. */
export function cudaVersionsFor(t: GpuTypeInfo): string[] {
  return CUDA_VERSIONS.filter((v) => compareCuda(v, t.minCuda) >= 0);
}

/** Numeric comparison of `major.minor` CUDA versions, so 12.11 > 12.2. */
export function compareCuda(a: string, b: string): number {
  const [amaj = 0, amin = 0] = a.split('.').map(Number);
  const [bmaj = 0, bmin = 0] = b.split('.').map(Number);
  return amaj - bmaj || amin - bmin;
}
