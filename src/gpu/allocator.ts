/**
 * The ledger: which worker holds which GPUs, vCPUs and memory on this host. It decides with the
 * pure functions of placement.ts and records the result, so a GPU belongs to one worker at a time.
 * It takes plain requirement objects; the scheduler's adapter builds them from `EndpointSpec`
 * (gpu/ imports neither scheduler/ nor endpoints/). {@link createLedgerPlacement} gives an object
 * with the shape of the scheduler's `Placement` interface.
 */
import { OTHER_POOL, gpuType } from '../catalog/index.js';
import { AgentError } from '../core/errors.js';
import { placeCpuWorker, placeGpuWorker, type CpuNoFitReason, type GpuNoFitReason } from './placement.js';
import type { CpuResources, DiscoveredGpu, GpuDiscovery, GpuRequirement, InventoryGpuRow, PlacementGpu, WorkerRequirement } from './types.js';

/** The host as the ledger sees it. */
export interface LedgerHost {
  /** @defaultValue `"local"` */
  hostId?: string;
  dataCenterId: string;
  gpus: readonly Pick<DiscoveredGpu, 'uuid' | 'name' | 'gpuTypeId' | 'cudaVersion'>[];
  cpu: CpuResources;
  /**
   * Why discovery found no GPU, for {@link ResourceLedger.whyNot}'s explanation; the driver and
   * CUDA versions it found, for the next rediscovery (GpuWatch).
   */
  discovery?: Pick<GpuDiscovery, 'noGpuReason' | 'detail'> & Partial<Pick<GpuDiscovery, 'driverVersion' | 'cudaVersion'>>;
}

/** What one worker holds. */
export interface Holding {
  workerId: string;
  /** The worker's endpoint, for naming who holds what when nothing fits (null: not given). */
  endpointId: string | null;
  gpuUuids: string[];
  gpuTypeId: string | null;
  vcpus: number;
  memoryGb: number;
  /** The CPU flavor entry for a CPU worker. */
  cpuFlavorId: string | null;
}

/** A successful reservation. `gpuDeviceIds`/`gpuName`/`cpu` match the scheduler's `Reservation`. */
export interface LedgerReservation {
  ok: true;
  workerId: string;
  /** GPU UUIDs for Docker `DeviceRequests`; [] for a CPU worker. */
  gpuDeviceIds: string[];
  /** GPU type id for the worker's URLs (`?gpu=`), or "cpu". */
  gpuName: string;
  /** For a CPU worker: the `cpu` entry chosen, with its vCPUs and memory (GiB). */
  cpu: { id: string; vcpuCount: number; memoryGb: number } | null;
}

export type LedgerNoFit = { ok: false; reason: GpuNoFitReason | CpuNoFitReason; detail: string };

/** Upper bound for {@link ResourceLedger.capacity}'s simulation (a host never runs more workers). */
const MAX_CAPACITY = 10_000;

/** The most endpoints a `busy` reason names; the rest are counted (a log line stays one line). */
const MAX_HOLDERS_NAMED = 3;

/**
 * Who holds what, for a `busy` reason: `2 workers of endpoint abc (2 GPUs), 1 worker of endpoint
 * def (1 GPU)`, the endpoints holding most first, at most {@link MAX_HOLDERS_NAMED} of them and
 * `and N more endpoints` after; `what` says what a group of holdings holds.
 */
function holdersText(holdings: readonly Holding[], what: (held: readonly Holding[]) => string): string {
  const byEndpoint = new Map<string | null, Holding[]>();
  for (const h of holdings) {
    const list = byEndpoint.get(h.endpointId) ?? [];
    list.push(h);
    byEndpoint.set(h.endpointId, list);
  }
  const groups = [...byEndpoint].sort((a, b) => b[1].length - a[1].length);
  const named = groups.slice(0, MAX_HOLDERS_NAMED).map(([endpointId, held]) =>
    `${held.length} worker${held.length === 1 ? '' : 's'} ${endpointId === null ? 'of no endpoint' : `of endpoint ${endpointId}`} (${what(held)})`);
  const more = groups.length - named.length;
  return named.join(', ') + (more > 0 ? ` and ${more} more endpoint${more === 1 ? '' : 's'}` : '');
}

export class ResourceLedger {
  #host: LedgerHost;
  #holdings = new Map<string, Holding>();

  constructor(host: LedgerHost) {
    this.#host = host;
  }

  /** Replaces the host's resources after a new discovery; holdings stay (a vanished GPU stays held until released). */
  setHost(host: LedgerHost): void {
    this.#host = host;
  }

  get host(): LedgerHost {
    return this.#host;
  }

  #placementGpus(): PlacementGpu[] {
    const hostId = this.#host.hostId ?? 'local';
    // A model the catalog does not know goes by the name nvidia-smi prints (pool OTHER).
    return this.#host.gpus.map((g) => ({ uuid: g.uuid, gpuTypeId: g.gpuTypeId ?? g.name, cudaVersion: g.cudaVersion, dataCenterId: this.#host.dataCenterId, hostId }));
  }

  /** The requirement with this host's uncataloged models added when it allows them (pool OTHER). */
  #withHostModels(req: GpuRequirement): GpuRequirement {
    if (!req.uncatalogedModels) return req;
    const excluded = new Set(req.uncatalogedModels.excluded);
    const names = this.#host.gpus.filter((g) => g.gpuTypeId === null && !excluded.has(g.name)).map((g) => g.name);
    const extra = [...new Set(names)].filter((n) => !req.allowedTypeIds.includes(n));
    return extra.length ? { ...req, allowedTypeIds: [...req.allowedTypeIds, ...extra] } : req;
  }

  /** UUIDs of every GPU some worker holds. */
  heldGpuUuids(): Set<string> {
    return new Set([...this.#holdings.values()].flatMap((h) => h.gpuUuids));
  }

  /** vCPUs and memory held by all workers (GPU workers hold none here: their limits come from the GPU type). */
  reservedCpu(): CpuResources {
    let vcpus = 0;
    let memoryGb = 0;
    for (const h of this.#holdings.values()) {
      vcpus += h.vcpus;
      memoryGb += h.memoryGb;
    }
    return { vcpus, memoryGb };
  }

  holding(workerId: string): Holding | undefined {
    const h = this.#holdings.get(workerId);
    return h ? { ...h, gpuUuids: [...h.gpuUuids] } : undefined;
  }

  holdings(): Holding[] {
    return [...this.#holdings.values()].map((h) => ({ ...h, gpuUuids: [...h.gpuUuids] }));
  }

  /** Where one more worker with this requirement would go, without recording it. */
  #decide(req: WorkerRequirement, heldGpus: ReadonlySet<string>, reservedCpu: CpuResources): Omit<Holding, 'workerId' | 'endpointId'> | LedgerNoFit {
    if (req.kind === 'gpu') {
      const p = placeGpuWorker(this.#withHostModels(req.gpu), this.#placementGpus(), heldGpus);
      if (!p.ok) return p;
      return { gpuUuids: p.gpuUuids, gpuTypeId: p.gpuTypeId, vcpus: 0, memoryGb: 0, cpuFlavorId: null };
    }
    const p = placeCpuWorker(req.cpu, { ...this.#host.cpu, dataCenterId: this.#host.dataCenterId }, reservedCpu);
    if (!p.ok) return p;
    return { gpuUuids: [], gpuTypeId: null, vcpus: p.vcpus, memoryGb: p.memoryGb, cpuFlavorId: p.entry.id };
  }

  /**
   * Reserves devices for one worker, or says why nothing fits. A worker holds one reservation at a
   * time; `endpointId` names its endpoint in the reasons other endpoints wait for.
   */
  reserve(workerId: string, req: WorkerRequirement, endpointId: string | null = null): LedgerReservation | LedgerNoFit {
    if (this.#holdings.has(workerId)) throw new AgentError('CONFLICT', `Worker ${workerId} already holds a reservation.`);
    const d = this.#decide(req, this.heldGpuUuids(), this.reservedCpu());
    if ('ok' in d) return d;
    this.#holdings.set(workerId, { workerId, endpointId, ...d });
    return {
      ok: true,
      workerId,
      gpuDeviceIds: [...d.gpuUuids],
      gpuName: d.gpuTypeId ?? 'cpu',
      cpu: d.cpuFlavorId === null ? null : { id: d.cpuFlavorId, vcpuCount: d.vcpus, memoryGb: d.memoryGb },
    };
  }

  /** Frees what a worker held; false when it held nothing. */
  release(workerId: string): boolean {
    return this.#holdings.delete(workerId);
  }

  /** How many more workers with this requirement would fit now (0: nothing fits, jobs wait throttled). */
  capacity(req: WorkerRequirement): number {
    const held = this.heldGpuUuids();
    const reserved = this.reservedCpu();
    let n = 0;
    while (n < MAX_CAPACITY) {
      const d = this.#decide(req, held, reserved);
      if ('ok' in d) break;
      for (const u of d.gpuUuids) held.add(u);
      reserved.vcpus += d.vcpus;
      reserved.memoryGb += d.memoryGb;
      n += 1;
      if (d.gpuUuids.length === 0 && d.vcpus === 0) break; // a requirement that takes nothing cannot be counted
    }
    return n;
  }

  /** Why a worker with this requirement would not fit now, or null when it would. */
  whyNot(req: WorkerRequirement): LedgerNoFit | null {
    const d = this.#decide(req, this.heldGpuUuids(), this.reservedCpu());
    if (!('ok' in d)) return null;
    if (d.reason === 'busy') {
      // Who holds it: the endpoints whose workers the waiting one waits for.
      if (req.kind === 'gpu') {
        const matching = new Set(this.#withHostModels(req.gpu).allowedTypeIds);
        const uuids = new Set(this.#placementGpus().filter((g) => g.gpuTypeId !== null && matching.has(g.gpuTypeId)).map((g) => g.uuid));
        const holders = [...this.#holdings.values()].filter((h) => h.gpuUuids.some((u) => uuids.has(u)));
        if (holders.length === 0) return d;
        return { ...d, detail: `${d.detail}: ${holdersText(holders, (held) => {
          const n = held.reduce((sum, h) => sum + h.gpuUuids.filter((u) => uuids.has(u)).length, 0);
          return `${n} GPU${n === 1 ? '' : 's'}`;
        })}` };
      }
      const holders = [...this.#holdings.values()].filter((h) => h.vcpus > 0 || h.memoryGb > 0);
      if (holders.length === 0) return d;
      return { ...d, detail: `${d.detail}, held by ${holdersText(holders, (held) =>
        `${held.reduce((sum, h) => sum + h.vcpus, 0)} vCPU / ${held.reduce((sum, h) => sum + h.memoryGb, 0).toFixed(1)} GiB`)}` };
    }
    // The host side of the story: what discovery found, so the reason can be acted on.
    const found = this.#host.discovery;
    if (d.reason === 'no-gpus' && found?.noGpuReason) {
      return { ...d, detail: `${d.detail} (GPU discovery: ${found.noGpuReason}${found.detail ? `, ${found.detail}` : ''})` };
    }
    if (d.reason === 'no-allowed-type') {
      const have = new Map<string, number>();
      for (const g of this.#host.gpus) {
        const label = g.gpuTypeId === null ? `${g.name} (not in the GPU catalog, pool ${OTHER_POOL})`
          : gpuType(g.gpuTypeId)?.pool === null ? `${g.gpuTypeId} (pool ${OTHER_POOL})` : g.gpuTypeId;
        have.set(label, (have.get(label) ?? 0) + 1);
      }
      return { ...d, detail: `${d.detail}; this host has ${[...have].map(([label, n]) => `${n}× ${label}`).join(', ')}` };
    }
    return d;
  }

  /** One row per GPU for the catalogs' availability. */
  inventory(): InventoryGpuRow[] {
    return inventorySnapshot(this.#host.gpus.map((g) => ({ ...g, dataCenterId: this.#host.dataCenterId })), this.heldGpuUuids());
  }
}

/**
 * `InventoryGpu`-shaped rows (api/services.ts) for `/v2/catalog/gpus?include=AVAILABILITY` and
 * `/v2/catalog/data-centers?include=GPU_AVAILABILITY`: a GPU is free when no worker holds it.
 */
export function inventorySnapshot(
  gpus: readonly (Pick<DiscoveredGpu, 'uuid' | 'name' | 'gpuTypeId' | 'cudaVersion'> & { dataCenterId: string })[],
  held: ReadonlySet<string>,
): InventoryGpuRow[] {
  return gpus.map((g) => ({ gpuTypeId: g.gpuTypeId, name: g.name, cudaVersion: g.cudaVersion, dataCenterId: g.dataCenterId, free: !held.has(g.uuid) }));
}

/** The scheduler's `Placement` shape, for a ledger and a function from the scheduler's spec type to a requirement. */
export interface LedgerPlacement<S> {
  capacity(endpointId: string, spec: S): number;
  reserve(endpointId: string, workerId: string, spec: S): Pick<LedgerReservation, 'gpuDeviceIds' | 'gpuName' | 'cpu'> | undefined;
  release(workerId: string): void;
  whyNot(endpointId: string, spec: S): string | null;
}

/**
 * Adapts a ledger to the scheduler's `Placement` interface structurally: `toRequirement` turns the
 * scheduler's `EndpointSpec` into a {@link WorkerRequirement} (written where both are visible).
 */
export function createLedgerPlacement<S>(ledger: ResourceLedger, toRequirement: (spec: S) => WorkerRequirement): LedgerPlacement<S> {
  return {
    capacity: (_endpointId, spec) => ledger.capacity(toRequirement(spec)),
    reserve: (endpointId, workerId, spec) => {
      const r = ledger.reserve(workerId, toRequirement(spec), endpointId);
      return r.ok ? { gpuDeviceIds: r.gpuDeviceIds, gpuName: r.gpuName, cpu: r.cpu } : undefined;
    },
    release: (workerId) => {
      ledger.release(workerId);
    },
    whyNot: (_endpointId, spec) => ledger.whyNot(toRequirement(spec))?.detail ?? null,
  };
}
