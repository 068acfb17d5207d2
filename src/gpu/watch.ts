/**
 * Runs GPU discovery again on a timer, so the ledger follows the host: a driver that loaded after
 * flashd started (a boot-order race, a DKMS rebuild after a kernel update), a GPU added, or one
 * gone. Only a run that answered replaces what the ledger knows (GPUs found, or nvidia-smi
 * saying there are none or being absent): a run that failed (a timeout, a driver error) keeps
 * the GPUs found before, so one hiccup of nvidia-smi does not throttle every GPU endpoint. So does
 * a run whose summary call alone failed (GPUs, but no `CUDA Version:`): on the same driver the GPUs
 * keep the CUDA version found before, which endpoints with CUDA constraints are placed by. A GPU
 * is the same GPU when its UUID is; a new name or CUDA version is logged as a change. A GPU that
 * vanished while a worker held it stays held until that worker is released.
 */
import type { Logger } from '../core/logger.js';
import type { ResourceLedger } from './allocator.js';
import { discoverGpus, type DiscoverGpusOptions } from './discovery.js';
import type { DiscoveredGpu, GpuDiscovery, NoGpuReason } from './types.js';

/** Reasons that say what the host has; the others say nvidia-smi could not tell. */
const ANSWERED: ReadonlySet<NoGpuReason> = new Set(['no-devices', 'nvidia-smi-not-found']);

type KnownGpu = Pick<DiscoveredGpu, 'uuid' | 'name' | 'cudaVersion'>;

const label = (g: KnownGpu) => `${g.name} ${g.uuid}`;

/** What changed on a GPU seen in both runs (`… cuda 12.7 -> 12.8`), or null. */
function change(was: KnownGpu, now: KnownGpu): string | null {
  const parts: string[] = [];
  if (was.name !== now.name) parts.push(`name ${was.name} -> ${now.name}`);
  if (was.cudaVersion !== now.cudaVersion) parts.push(`cuda ${was.cudaVersion ?? 'unknown'} -> ${now.cudaVersion ?? 'unknown'}`);
  return parts.length ? `${label(now)} ${parts.join(' ')}` : null;
}

/**
 * The logger a discovery run gets: a line the run before also wrote is not written again, so a
 * condition (a model not in the catalog, an unknown CUDA version) is said when it appears, not at
 * every run, and again if it comes back after it went away. Debug lines always pass.
 */
function onceLogger(log: Logger, before: ReadonlySet<string>, now: Set<string>): Logger {
  const once = (level: 'info' | 'warn' | 'error') => (msg: string, fields?: Record<string, unknown>): void => {
    const key = `${level}\u0000${msg}\u0000${JSON.stringify(fields ?? {})}`;
    now.add(key);
    if (!before.has(key)) log[level](msg, fields);
  };
  return { debugEnabled: log.debugEnabled, debug: (m, f) => log.debug(m, f), info: once('info'), warn: once('warn'), error: once('error'), child: (b) => log.child(b) };
}

/**
 * The logger for the start's discovery (probeHost): it writes every line and adds it to `said`,
 * which GpuWatch then takes as `startLines` so that its first run does not say them again.
 */
export function startDiscoveryLogger(log: Logger, said: Set<string>): Logger {
  return onceLogger(log, new Set(), said);
}

export interface GpuWatchOptions extends Pick<DiscoverGpusOptions, 'command' | 'env' | 'timeoutMs'> {
  ledger: ResourceLedger;
  intervalMs: number;
  log: Logger;
  /** The lines the start's discovery wrote (startDiscoveryLogger), as if a run before had. */
  startLines?: ReadonlySet<string>;
}

export class GpuWatch {
  readonly #o: GpuWatchOptions;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | null = null;
  /** The failure last warned about while keeping known GPUs (one warning per reason). */
  #warned: NoGpuReason | null = null;
  /** Whether the last run kept the CUDA version found before (warned once per episode). */
  #keptCuda = false;
  /** The lines discovery wrote in the last run, or at start (see {@link onceLogger}). */
  #said: ReadonlySet<string>;

  constructor(options: GpuWatchOptions) {
    this.#o = options;
    this.#said = options.startLines ?? new Set();
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
        const said = new Set<string>();
        const log = onceLogger(this.#o.log, this.#said, said);
        const found = await discoverGpus({ ...(command ? { command } : {}), ...(env ? { env } : {}), ...(timeoutMs ? { timeoutMs } : {}), log, again: true });
        this.#said = said;
        this.#apply(found);
      } catch (err) {
        this.#o.log.error('gpu rediscovery failed', { err });
      } finally {
        this.#running = null;
      }
    })();
    return this.#running;
  }

  #apply(run: GpuDiscovery): void {
    const host = this.#o.ledger.host;
    const before = host.gpus;
    if (run.noGpuReason !== null && !ANSWERED.has(run.noGpuReason) && before.length > 0) {
      if (this.#warned !== run.noGpuReason) {
        this.#warned = run.noGpuReason;
        this.#o.log.warn('gpu rediscovery failed; keeping the GPUs found before', { reason: run.noGpuReason, detail: run.detail ?? undefined, gpus: before.length });
      }
      return;
    }
    const failedBefore = this.#warned !== null;
    const keptBefore = this.#keptCuda;
    this.#warned = null;
    const found = this.#keepCuda(run);
    // Whoever read the warning about a failed run learns that it is over (as `store writes work again`).
    if (failedBefore || (keptBefore && found.cudaVersion !== null && !this.#keptCuda)) {
      this.#o.log.info('gpu rediscovery works again', { gpus: found.gpus.length, cuda: found.cudaVersion ?? undefined });
    }
    const was = new Map(before.map((g) => [g.uuid, g]));
    const now = new Set(found.gpus.map((g) => g.uuid));
    const added = found.gpus.filter((g) => !was.has(g.uuid));
    const removed = before.filter((g) => !now.has(g.uuid));
    const changed = found.gpus.flatMap((g) => {
      const old = was.get(g.uuid);
      const what = old ? change(old, g) : null;
      return what === null ? [] : [what];
    });
    const reasonChanged = (host.discovery?.noGpuReason ?? null) !== found.noGpuReason;
    const driverChanged = (host.discovery?.driverVersion ?? null) !== found.driverVersion;
    if (added.length === 0 && removed.length === 0 && changed.length === 0 && !reasonChanged && !driverChanged) return;
    // The driver version is kept even when nothing else changed: #keepCuda compares with it.
    this.#o.ledger.setHost({ ...host, gpus: found.gpus, discovery: found });
    if (added.length === 0 && removed.length === 0 && changed.length === 0 && !reasonChanged) {
      this.#o.log.info('gpu driver changed', { driverVersion: found.driverVersion ?? undefined, gpus: found.gpus.length });
      return;
    }
    this.#o.log.info('gpus changed', {
      count: found.gpus.length, cuda: found.cudaVersion ?? undefined,
      added: added.length ? added.map(label).join(', ') : undefined,
      removed: removed.length ? removed.map(label).join(', ') : undefined,
      changed: changed.length ? changed.join(', ') : undefined,
      noGpu: found.noGpuReason ?? undefined,
    });
  }

  /**
   * The CUDA version `nvidia-smi` prints is the driver's: a run that found GPUs but no version (its
   * summary call failed or hung while the query call answered) on the driver seen before keeps the
   * version found before, rather than throttling every endpoint with a CUDA constraint.
   */
  #keepCuda(found: GpuDiscovery): GpuDiscovery {
    const before = this.#o.ledger.host.discovery;
    const kept = before?.cudaVersion ?? null;
    if (found.gpus.length === 0 || found.cudaVersion !== null || kept === null || (before?.driverVersion ?? null) !== found.driverVersion) {
      this.#keptCuda = false;
      return found;
    }
    if (!this.#keptCuda) {
      this.#keptCuda = true;
      this.#o.log.warn('gpu rediscovery found no cuda version; keeping the one found before', { cuda: kept, gpus: found.gpus.length });
    }
    return { ...found, cudaVersion: kept, gpus: found.gpus.map((g) => ({ ...g, cudaVersion: g.cudaVersion ?? kept })) };
  }

  close(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
