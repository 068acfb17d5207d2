/**
 * Runs GPU discovery again on a timer, so the ledger follows the host: a driver that loaded after
 * flashd started (a boot-order race, a DKMS rebuild after a kernel update), a GPU added, or one
 * gone. Only a run that answered replaces what the ledger knows (GPUs found, or nvidia-smi
 * saying there are none or being absent): a run that failed (a timeout, a driver error) keeps
 * the GPUs found before, so one hiccup of nvidia-smi does not throttle every GPU endpoint. A GPU
 * that vanished while a worker held it stays held until that worker is released.
 */
import type { Logger } from '../core/logger.js';
import type { ResourceLedger } from './allocator.js';
import { discoverGpus, type DiscoverGpusOptions } from './discovery.js';
import type { DiscoveredGpu, GpuDiscovery, NoGpuReason } from './types.js';

/** Reasons that say what the host has; the others say nvidia-smi could not tell. */
const ANSWERED: ReadonlySet<NoGpuReason> = new Set(['no-devices', 'nvidia-smi-not-found']);

const identity = (g: Pick<DiscoveredGpu, 'uuid' | 'name' | 'cudaVersion'>) => `${g.uuid}\u0000${g.name}\u0000${g.cudaVersion ?? ''}`;

export interface GpuWatchOptions extends Pick<DiscoverGpusOptions, 'command' | 'env' | 'timeoutMs'> {
  ledger: ResourceLedger;
  intervalMs: number;
  log: Logger;
}

export class GpuWatch {
  readonly #o: GpuWatchOptions;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | null = null;
  /** The failure last warned about while keeping known GPUs (one warning per reason). */
  #warned: NoGpuReason | null = null;

  constructor(options: GpuWatchOptions) {
    this.#o = options;
  }

  start(): void {
    if (this.#o.intervalMs <= 0 || this.#timer) return;
    this.#timer = setInterval(() => void this.check(), this.#o.intervalMs);
    this.#timer.unref();
  }

  /** One discovery run, applied to the ledger (concurrent calls share the run in flight). */
  check(): Promise<void> {
    this.#running ??= (async () => {
      try {
        const { command, env, timeoutMs } = this.#o;
        this.#apply(await discoverGpus({ ...(command ? { command } : {}), ...(env ? { env } : {}), ...(timeoutMs ? { timeoutMs } : {}) }));
      } catch (err) {
        this.#o.log.error('gpu rediscovery failed', { err });
      } finally {
        this.#running = null;
      }
    })();
    return this.#running;
  }

  #apply(found: GpuDiscovery): void {
    const host = this.#o.ledger.host;
    const before = host.gpus;
    if (found.noGpuReason !== null && !ANSWERED.has(found.noGpuReason) && before.length > 0) {
      if (this.#warned !== found.noGpuReason) {
        this.#warned = found.noGpuReason;
        this.#o.log.warn('gpu rediscovery failed; keeping the GPUs found before', { reason: found.noGpuReason, detail: found.detail ?? undefined, gpus: before.length });
      }
      return;
    }
    this.#warned = null;
    const was = new Map(before.map((g) => [identity(g), g]));
    const now = new Map(found.gpus.map((g) => [identity(g), g]));
    const added = found.gpus.filter((g) => !was.has(identity(g)));
    const removed = before.filter((g) => !now.has(identity(g)));
    const reasonChanged = (host.discovery?.noGpuReason ?? null) !== found.noGpuReason;
    if (added.length === 0 && removed.length === 0 && !reasonChanged) return;
    this.#o.ledger.setHost({ ...host, gpus: found.gpus, discovery: found });
    const label = (g: Pick<DiscoveredGpu, 'uuid' | 'name'>) => `${g.name} ${g.uuid}`;
    this.#o.log.info('gpus changed', {
      count: found.gpus.length, cuda: found.cudaVersion ?? undefined,
      added: added.length ? added.map(label).join(', ') : undefined,
      removed: removed.length ? removed.map(label).join(', ') : undefined,
      noGpu: found.noGpuReason ?? undefined,
    });
  }

  close(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
