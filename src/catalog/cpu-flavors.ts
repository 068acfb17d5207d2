/**
 * CPU flavors with RunPod's ids. RAM per vCPU from flash `core/resources/cpu.py`
 * (cpu3g 4.0, cpu3c 2.0, cpu5c 2.0); cpu5g is unconfirmed upstream and follows cpu3g.
 */
export interface CpuFlavorInfo {
  readonly id: string;
  readonly displayName: string;
  /** GB of RAM per vCPU: an endpoint's `memory` is `vcpuCount × ramMultiplier`. */
  readonly ramMultiplier: number;
  /** vCPU counts a worker of this flavor may have. */
  readonly vcpuCounts: readonly number[];
  /** Container disk allowed per vCPU, in GB. */
  readonly diskPerVcpuGb: number;
}

export const CPU_FLAVORS: readonly CpuFlavorInfo[] = [
  { id: 'cpu3c', displayName: 'Compute-Optimized (Gen 3)', ramMultiplier: 2, vcpuCounts: [2, 4, 8, 16, 32], diskPerVcpuGb: 10 },
  { id: 'cpu3g', displayName: 'General Purpose (Gen 3)', ramMultiplier: 4, vcpuCounts: [2, 4, 8, 16, 32], diskPerVcpuGb: 10 },
  { id: 'cpu5c', displayName: 'Compute-Optimized (Gen 5)', ramMultiplier: 2, vcpuCounts: [2, 4, 8, 16, 32], diskPerVcpuGb: 15 },
  { id: 'cpu5g', displayName: 'General Purpose (Gen 5)', ramMultiplier: 4, vcpuCounts: [2, 4, 8, 16], diskPerVcpuGb: 15 },
];

const byId = new Map(CPU_FLAVORS.map((f) => [f.id, f]));

export function cpuFlavor(id: string): CpuFlavorInfo | undefined {
  return byId.get(id);
}
