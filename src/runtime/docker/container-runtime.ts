/**
 * Container runtime (`--runtime docker`, or `auto` with an engine socket): each worker is a
 * container created through the Docker Engine API, which Docker and Podman both serve.
 *
 * - Launch: pull when missing (credentials only in `X-Registry-Auth`), create with the safe
 *   HostConfig of container-spec.ts, attach, start. Or restart a kept FlashBoot container.
 * - Supervision: `POST /containers/{id}/wait` per container; the engine's restart policy is
 *   off. Each launch ends in exactly one `events.exit`.
 * - Stop: `POST /containers/{id}/stop?t=`; then the container is removed (`OFF`, a crash,
 *   shutdown) or kept stopped for a restart (`FLASHBOOT`, `PRIORITY_FLASHBOOT`; kept-pool.ts).
 * - Restarts of flashd: its containers are labelled with this data directory's instance id
 *   and the flashd process that made them; at start every one left from a previous run is
 *   removed (their worker keys and leases belonged to the old process, so not even a kept one
 *   can be restored). Those of another live flashd of this host with the same instance id (a
 *   copy of this data directory) are left alone, and the start refused.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { constants } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../core/logger.js';
import { lineSplitter } from '../line-splitter.js';
import { isOtherLiveProcess, thisProcess, type ProcessIdentity } from '../process-identity.js';
import type { ExitInfo, LaunchResult, LaunchSpec, WorkerEvents, WorkerRuntime } from '../types.js';
import type { ContainerSummary, EngineVersion, PullProgress } from './api-types.js';
import { DockerClient } from './client.js';
import { LABELS, containerName, createBody, gpuAttachFor, ownerOf, volumeName, type GpuAttach } from './container-spec.js';
import { DockerError, isDockerError } from './errors.js';
import { DEFAULT_KEPT_POOL, KeptPool, type KeepMode, type KeptEntry, type KeptPoolOptions } from './kept-pool.js';
import { WorkerRelay } from './worker-relay.js';

export interface ContainerRuntimeOptions {
  /** The engine's unix socket (Docker or `podman system service`). */
  socketPath: string;
  /** flashd's data directory: holds the instance id that labels its containers. */
  dataDir: string;
  log: Logger;
  /** Base URL workers use to reach flashd (`--worker-url`); null: derived in `start()`. */
  workerUrl?: string | null;
  /** FlashBoot limits. @defaultValue DEFAULT_KEPT_POOL */
  keptPool?: KeptPoolOptions;
  /** Called once per started container with the time each step took (bench hook). */
  onLaunchTiming?(timing: LaunchTiming): void;
  /** Pause between tries while the engine is unreachable, in ms. @defaultValue 5000 */
  reconnectMs?: number;
  /** `--container-gpu-driver`: the device request for GPUs on Docker. @defaultValue `"auto"` */
  gpuDriver?: 'auto' | 'nvidia' | 'cdi';
  /**
   * What this data directory's database says of flashd volumes (network or global). Without it
   * no engine volume is removed at connection.
   */
  volumes?: VolumeRecords;
  /**
   * `--image-pull-idle-timeout-ms`: a pull the engine reports no progress of for this long fails
   * (a registry that stalls), and with it the launches waiting for it. @defaultValue 300000
   */
  pullIdleTimeoutMs?: number;
  /**
   * While a pull runs, a `still pulling image` line this often (layers and bytes so far, when
   * the engine's progress stream reports them); 0: none. @defaultValue 15000
   */
  pullProgressMs?: number;
  /**
   * How many GPUs the host has now (the hardware probe, then `--gpu-rediscover-ms`), or
   * undefined while not known. With none, an engine that cannot attach GPUs is said at `info`
   * level (no GPU worker could start anyway); otherwise, and without this, it is a warning.
   */
  hostGpus?(): number | undefined;
}

/** The database's word on flashd volumes, for their engine volumes (`flashd-volume-<id>`). */
export interface VolumeRecords {
  /**
   * `exists`; `deleted`: deleted through the API, its engine volume still to be removed (the
   * removal was pending when a previous run stopped or crashed); `unknown`: neither (a volume
   * made after the backup this database was restored from, or by a copy of this data
   * directory), whose engine volume is never removed.
   */
  state(id: string): 'exists' | 'deleted' | 'unknown';
  /** The engine volume of deleted flashd volume `id` is gone: its record can go. */
  removed(id: string): void;
}

/** A pull in flight, shared by the launches of its image; given up when the last of them is stopped. */
interface Pull {
  done: Promise<void>;
  waiters: number;
  abort: AbortController;
}

export interface LaunchTiming {
  endpointId: string;
  workerId: string;
  /** A kept container restarted (start only) rather than a new one created. */
  reused: boolean;
  /** Image inspect and, when missing, pull. */
  imageMs: number;
  /** `POST /containers/create` (0 when reused). */
  createMs: number;
  /** Attach + `POST /containers/{id}/start`. */
  startMs: number;
  totalMs: number;
}

/** Where flashd listens, for the default worker URL. */
export interface ListenAddress {
  host: string;
  port: number;
}

interface Running {
  workerId: string;
  endpointId: string;
  containerId: string;
  configHash: string;
  flashboot: LaunchSpec['flashboot'];
  events: WorkerEvents;
  /** A stop was asked for (its exit is then `requested`), whether or not the engine got it yet. */
  stopping: boolean;
  /** The engine took the stop (or the kill after it): not sent again. */
  stopSent?: boolean;
  /** The stop (or kill) request in flight: a second `stop()` joins it instead of sending another. */
  stopSending?: Promise<void> | null;
  /** The grace of the first stop asked for, for a stop sent again once the engine answers. */
  stopGraceMs?: number;
  /** Stopped with `keep: false` (unhealthy, its endpoint deleted, shutdown): removed, never kept for FlashBoot. */
  noKeep?: boolean;
  /** Resolves once the exit was handled (container removed or kept, `events.exit` called). */
  exited: Promise<void>;
}

interface Kept {
  containerId: string;
  events: WorkerEvents;
  timer: NodeJS.Timeout;
}

/** An engine's refusal of `StorageOpt.size` (overlay without xfs project quota, vfs, btrfs...). */
function refusesDiskLimit(err: unknown): boolean {
  // The engine gives no code for this; its message is the only signal (Docker and Podman both
  // say "--storage-opt is supported only for overlay over xfs with 'pquota' mount option").
  return isDockerError(err) && err.code !== 'DOCKER_UNREACHABLE' && /storage[- ]?opt|quota/i.test(err.message);
}

/**
 * An engine without its init binary, refusing `HostConfig.Init`: Podman at create ("container-init
 * binary not found on the host: stat /usr/libexec/podman/catatonit"), Docker at start
 * (`exec: "docker-init": executable file not found`). Again only the message tells.
 */
function refusesInit(err: unknown): boolean {
  return isDockerError(err) && err.code !== 'DOCKER_UNREACHABLE' && /init binary not found|"?docker-init"?: executable file not found/i.test(err.message);
}

/** `--image-pull-idle-timeout-ms`'s default: 5 minutes without progress from the engine. */
export const DEFAULT_PULL_IDLE_TIMEOUT_MS = 300_000;

/** How often a pull in flight is logged (`pullProgressMs`). */
export const DEFAULT_PULL_PROGRESS_MS = 15_000;

/** A layer's download status lines in a pull's progress stream (Docker's and Podman's). */
const LAYER_DOWNLOADED = new Set(['Download complete', 'Pull complete', 'Already exists']);
const mb = (bytes: number): number => Math.round(bytes / 104857.6) / 10;

/**
 * What a pull's progress stream said so far, per layer id: bytes downloaded of how many, and
 * whether the layer is downloaded. Lines without a layer (`Pulling from …` names the tag,
 * `Digest:`, `Status:`) and Docker's extraction bytes are left out.
 */
class PullTally {
  readonly #layers = new Map<string, { current: number; total: number; done: boolean }>();

  add(p: PullProgress): void {
    if (!p.id || !p.status || p.status.startsWith('Pulling from ')) return;
    let layer = this.#layers.get(p.id);
    if (!layer) this.#layers.set(p.id, (layer = { current: 0, total: 0, done: false }));
    const { current, total } = p.progressDetail ?? {};
    if (p.status === 'Downloading' && total !== undefined && total > 0) {
      layer.total = total;
      layer.current = current ?? layer.current;
    } else if (LAYER_DOWNLOADED.has(p.status)) {
      layer.done = true;
      layer.current = layer.total;
    }
  }

  /** Log fields: `layersDownloaded=1/3`, and `downloadedMb`/`totalMb` once a size is known; none before the first layer. */
  fields(): Record<string, unknown> {
    if (this.#layers.size === 0) return {};
    let done = 0;
    let current = 0;
    let total = 0;
    for (const l of this.#layers.values()) {
      if (l.done) done++;
      current += l.current;
      total += l.total;
    }
    return { layersDownloaded: `${done}/${this.#layers.size}`, ...(total > 0 ? { downloadedMb: mb(current), totalMb: mb(total) } : {}) };
  }
}

const SIGNALS = new Map(Object.entries(constants.signals).map(([name, n]) => [n, name]));
const isLoopback = (host: string): boolean => host === 'localhost' || host === '::1' || host.startsWith('127.');
const isWildcard = (host: string): boolean => host === '0.0.0.0' || host === '::';
const hostPort = (host: string, port: number): string => `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms).unref());

/** This data directory's instance id (created once, kept across restarts). */
function instanceId(dataDir: string): string {
  const file = join(dataDir, 'container-instance-id');
  if (existsSync(file)) {
    const id = readFileSync(file, 'utf8').trim();
    if (/^[a-z0-9]{8,64}$/.test(id)) return id;
  }
  const id = randomBytes(10).toString('hex');
  writeFileSync(file, id + '\n', { mode: 0o600 });
  return id;
}

/** Other live flashd processes' containers of this instance (pid to count), for a message: `pid 12 (2 containers), …`. */
function ownerPids(others: ReadonlyMap<number, number>): string {
  return [...others].map(([pid, n]) => `pid ${pid} (${n} container${n > 1 ? 's' : ''})`).join(', ');
}

export class ContainerRuntime implements WorkerRuntime {
  readonly name = 'docker';
  readonly client: DockerClient;
  readonly instanceId: string;
  readonly #o: ContainerRuntimeOptions;
  readonly #log: Logger;
  readonly #running = new Map<string, Running>();
  /** Launches in progress, by the launch's worker id (a stop waits for them). */
  readonly #launching = new Map<string, Promise<unknown>>();
  /** Per launch in progress: aborted by `stop()`, so a launch still waiting for its image gives up at once. */
  readonly #launchAborts = new Map<string, AbortController>();
  readonly #kept: KeptPool<Kept>;
  readonly #pulls = new Map<string, Pull>();
  readonly #volumes = new Map<string, Promise<void>>();
  /** Engine volumes of deleted flashd volumes that a container still used when they were deleted: name, flashd volume id. */
  readonly #deletedVolumes = new Map<string, string>();
  /** Engine volumes of this instance unknown to the database, already warned of. */
  readonly #unknownVolumesWarned = new Set<string>();
  #removingVolumes: Promise<void> | null = null;
  /** Asked again while a pass was under way (a container was removed meanwhile): one more pass. */
  #volumesAgain = false;
  #listen: ListenAddress | null = null;
  #workerUrl: string | null;
  #relay: WorkerRelay | null = null;
  #ready = false;
  #connecting: Promise<boolean> | null = null;
  #reconnect: NodeJS.Timeout | undefined;
  #diskLimit: 'unknown' | 'supported' | 'unsupported' = 'unknown';
  /** The engine refused `HostConfig.Init` (no init binary): containers get none from then on. */
  #noInit = false;
  /** How this engine attaches GPUs (known once it answered). */
  #gpu: GpuAttach | null = null;
  #closing = false;
  /** A second signal removed every container (`removeAllNow`): a launch that gets one started removes it. */
  #killed = false;
  /** Aborts pulls in flight at shutdown. */
  readonly #shutdown = new AbortController();
  /** This process (owner labels of the containers it makes); null where /proc cannot tell. */
  readonly #owner: ProcessIdentity | null = thisProcess();
  /** Why `start()` refuses: another live flashd uses this instance id. */
  #refused: string | null = null;
  /**
   * What `refuseSharedInstance()` got from the engine (its version and this instance's
   * containers, or why it did not answer), for the first connection of `start()`: the engine is
   * asked once at start-up, and one that hangs is waited for once.
   */
  #asked: { version: EngineVersion; containers: ContainerSummary[] } | { error: unknown } | null = null;

  constructor(options: ContainerRuntimeOptions) {
    this.#o = options;
    this.#log = options.log;
    this.client = new DockerClient({ socketPath: options.socketPath });
    this.instanceId = instanceId(options.dataDir);
    this.#kept = new KeptPool(options.keptPool ?? DEFAULT_KEPT_POOL);
    this.#workerUrl = options.workerUrl ?? null;
  }

  /**
   * Connects to the engine: API version, removal of this instance's leftover containers, and
   * the worker URL. While the engine is unreachable, capacity is 0 and this is retried every
   * `reconnectMs`. Rejects only when another live flashd of this host uses this instance id (a
   * copy of this data directory, or the original of this copy): starting would remove its containers.
   */
  async start(listen: ListenAddress): Promise<void> {
    this.#listen = listen;
    await this.#connect(true);
    if (this.#refused !== null) throw new Error(this.#refused);
  }

  /**
   * Before the start recovers jobs and releases the previous run's workers in this database:
   * rejects, as start() does, when another live flashd of this host runs with this instance id,
   * so that a refused copy of a data directory says so before any line about work it did. An
   * engine that does not answer is no refusal here. What the engine said, or that it did not
   * answer, is kept for start(), which does not ask again: a hung engine is waited for once.
   */
  async refuseSharedInstance(): Promise<void> {
    let containers;
    try {
      const version = await this.client.negotiate();
      containers = await this.#listMine();
      this.#asked = { version, containers };
    } catch (error) {
      this.#asked = { error };
      return;
    }
    const others = new Map<number, number>();
    for (const c of containers) {
      const owner = ownerOf(c.Labels);
      if (owner && isOtherLiveProcess(owner)) others.set(owner.pid, (others.get(owner.pid) ?? 0) + 1);
    }
    if (!others.size) return;
    this.client.close();
    throw new Error(this.#refusal(others));
  }

  /** This instance's managed containers, stopped ones included. */
  #listMine(): Promise<ContainerSummary[]> {
    return this.client.listContainers({ all: true, labels: [`${LABELS.managed}=true`, `${LABELS.instance}=${this.instanceId}`] });
  }

  /** Why this start is refused: another live flashd (`others`: pid to container count) has this instance id. */
  #refusal(others: ReadonlyMap<number, number>): string {
    return `another flashd on this host, ${ownerPids(others)}, runs with this data directory's container instance id ${this.instanceId} `
      + `(${join(this.#o.dataDir, 'container-instance-id')}): one of the two data directories is a copy of the other, and this start would remove `
      + 'that flashd\'s containers. To run both on this engine, stop the copy and delete container-instance-id in its data directory: it gets an id of its own at its next start';
  }

  /** Whether the engine answered and the runtime can launch. */
  get ready(): boolean {
    return this.#ready;
  }

  /** Whether `StorageOpt.size` works on this engine (unknown until a launch with a disk size). */
  get diskLimit(): 'unknown' | 'supported' | 'unsupported' {
    return this.#diskLimit;
  }

  /** The base URL workers reach flashd at (configured, or derived in `start()`). */
  workerBaseUrl(): string | null {
    return this.#workerUrl;
  }

  capacity(): number {
    return this.#ready && !this.#closing ? Number.POSITIVE_INFINITY : 0;
  }

  /** Why GPU workers cannot start on this engine, or null (also while it is not known yet). */
  gpuBlocked(): string | null {
    return this.#gpu?.reason ?? null;
  }

  /** `atStart`: the first connection, which another live flashd with this instance id fails (`#refused`). */
  #connect(atStart = false): Promise<boolean> {
    this.#connecting ??= (async () => {
      // At start, what refuseSharedInstance() learnt (no container was launched since).
      const asked = atStart ? this.#asked : null;
      this.#asked = null;
      try {
        if (asked && 'error' in asked) throw asked.error;
        const v = asked?.version ?? await this.client.negotiate();
        const others = await this.#removeLeftovers(asked?.containers);
        if (others.size) {
          if (atStart) {
            this.#refused = this.#refusal(others);
            return false;
          }
          this.#log.error('another flashd on this host runs with this instance id (a copy of this data directory, or its original): its containers are left alone', {
            instance: this.instanceId, owners: ownerPids(others), hint: `stop the copy and delete container-instance-id in its data directory`,
          });
        }
        await this.#findDeletedVolumes();
        // Derived once: kept containers hold it in their env.
        this.#workerUrl ??= await this.#deriveWorkerUrl();
        this.#ready = true;
        this.#resendStops();
        if (this.#deletedVolumes.size) void this.#removeDeletedVolumes();
        const component = v.Components?.find((c) => /engine/i.test(c.Name));
        const engine = component?.Name ?? 'Docker Engine';
        this.#gpu = gpuAttachFor({ name: engine, version: component?.Version ?? v.Version ?? '' }, this.#o.gpuDriver ?? 'auto');
        this.#log.info('container engine ready', {
          socket: this.client.socketPath, engine, version: v.Version, api: this.client.apiVersion, workerUrl: this.#workerUrl, instance: this.instanceId,
          gpus: this.#gpu.driver ?? 'none',
        });
        if (this.#gpu.reason) {
          // A warning where GPU endpoints would wait for it; on a host with no GPU, nothing to meet.
          const hostGpus = this.#o.hostGpus?.();
          if (hostGpus === 0) this.#log.info('GPU workers cannot start on this engine', { reason: this.#gpu.reason, hostGpus });
          else this.#log.warn('GPU workers cannot start on this engine', { reason: this.#gpu.reason });
        }
        return true;
      } catch (err) {
        this.#unreachable(err);
        return false;
      } finally {
        this.#connecting = null;
      }
    })();
    return this.#connecting;
  }

  /** Marks the engine unreachable (capacity 0) and retries the connection on a timer. */
  #unreachable(err: unknown): void {
    if (this.#ready || this.#reconnect === undefined) {
      this.#log.warn('container engine unreachable', { socket: this.client.socketPath, reason: (err as Error).message, retryMs: this.#o.reconnectMs ?? 5000 });
    }
    this.#ready = false;
    if (this.#reconnect !== undefined || this.#closing) return;
    this.#reconnect = setInterval(() => {
      void this.#connect().then((ok) => {
        if (ok || this.#closing) {
          clearInterval(this.#reconnect);
          this.#reconnect = undefined;
        }
      });
    }, this.#o.reconnectMs ?? 5000);
    this.#reconnect.unref();
  }

  /**
   * Removes containers of this instance that this process does not know (a previous run's).
   * Those whose owner labels name another live flashd process of this host are left alone:
   * resolves with their count per owner pid. A container without owner labels (an older
   * flashd's) or whose owner is on another host (an engine shared by hosts: its pid cannot be
   * checked from here) counts as a previous run's. `listed`: this instance's containers, already
   * asked for (at start, by refuseSharedInstance).
   */
  async #removeLeftovers(listed?: ContainerSummary[]): Promise<Map<number, number>> {
    const mine = listed ?? await this.#listMine();
    const known = new Set([...this.#running.values()].map((w) => w.containerId));
    for (const e of this.#kept.list()) known.add(e.value.containerId);
    const others = new Map<number, number>();
    const leftovers = mine.filter((c) => {
      if (known.has(c.Id) || this.#launching.has(c.Labels?.[LABELS.worker] ?? '')) return false;
      const owner = ownerOf(c.Labels);
      if (!owner || !isOtherLiveProcess(owner)) return true;
      others.set(owner.pid, (others.get(owner.pid) ?? 0) + 1);
      return false;
    });
    await Promise.all(leftovers.map((c) => this.#remove(c.Id)));
    if (leftovers.length) this.#log.info('removed containers left by a previous run', { count: leftovers.length });
    return others;
  }

  /**
   * Engine volumes of this data directory whose flashd volume the database records as deleted:
   * a removal refused while a container still used the volume is retried only in memory, so a
   * run that stopped or crashed before it succeeded left the volume and its data behind. They
   * join the pending removals (done once `#connect` is ready). One whose flashd volume the
   * database does not know at all is never removed (a restored backup older than the volume, a
   * copy of this data directory): said once, with the command that removes it. Volumes made
   * before flashd labelled them with its instance are not recognised.
   */
  async #findDeletedVolumes(): Promise<void> {
    const records = this.#o.volumes;
    if (!records) return;
    let managed;
    try {
      // Checked here, not only in the filter: Podman 4.3 matches a volume with any of several labels.
      managed = await this.client.listVolumes({ labels: [`${LABELS.managed}=true`] });
    } catch (err) {
      // Only an unreachable engine fails the connection; a refused listing costs this cleanup only.
      if (isDockerError(err, 'DOCKER_UNREACHABLE')) throw err;
      this.#log.warn('cannot list volumes; those of deleted flashd volumes stay until the next connection', { reason: (err as Error).message });
      return;
    }
    const unknown: string[] = [];
    for (const v of managed) {
      const id = v.Labels?.[LABELS.volume];
      if (v.Labels?.[LABELS.instance] !== this.instanceId || !id || v.Name !== volumeName(id)) continue;
      const state = records.state(id);
      if (state === 'deleted') this.#deletedVolumes.set(v.Name, id);
      else if (state === 'unknown' && !this.#unknownVolumesWarned.has(v.Name)) unknown.push(v.Name);
    }
    if (!unknown.length) return;
    for (const name of unknown) this.#unknownVolumesWarned.add(name);
    this.#log.warn('engine volumes of this instance whose flashd volume this database does not know are left in place (a restored backup older than them, or a copy of this data directory made them); remove them by hand once no flashd uses them', {
      volumes: unknown.join(','), command: `docker volume rm ${unknown.join(' ')}`,
    });
  }

  /**
   * The URL workers use when `--worker-url` is not set. Containers on the bridge reach the
   * host at the bridge's gateway address; flashd listens there directly when it listens on
   * all addresses, through a relay when it listens on loopback only, and a specific
   * non-loopback address is reachable from containers as it is.
   */
  async #deriveWorkerUrl(): Promise<string> {
    const listen = this.#listen ?? { host: '127.0.0.1', port: 8000 };
    if (!isLoopback(listen.host) && !isWildcard(listen.host)) return hostPort(listen.host, listen.port);
    const net = await this.client.inspectNetwork('bridge');
    const ipam = net?.IPAM?.Config ?? [];
    const gateway = ipam.map((c) => c.Gateway).find((g): g is string => typeof g === 'string' && g.includes('.'));
    // The relay forwards the containers of this network only (the gateway address is reachable
    // from the local network too).
    const subnets = ipam.map((c) => c.Subnet).filter((n): n is string => typeof n === 'string' && n.includes('.'));
    if (!gateway) {
      this.#log.warn('the engine reports no bridge gateway; workers may not reach flashd', { hint: 'set --worker-url' });
      return hostPort('host.docker.internal', listen.port);
    }
    if (isLoopback(listen.host) && !this.#relay) {
      this.#relay = new WorkerRelay({
        listenHost: gateway, listenPort: listen.port, targetHost: listen.host === 'localhost' ? '127.0.0.1' : listen.host, targetPort: listen.port,
        allowedSubnets: subnets, log: this.#log,
      });
      if (!subnets.length) this.#log.warn('the engine reports no bridge subnet; the worker relay forwards every connection to its address', { address: gateway });
      await this.#relay.ensure();
    }
    return hostPort(gateway, listen.port);
  }

  /**
   * The kept container `launch` would restart now: a ready runtime takes it from the pool in
   * the same turn as the call (an engine not ready yet reconnects first, so: null).
   */
  keptWorker(endpointId: string, configHash: string): string | null {
    if (!this.#ready || this.#closing) return null;
    return this.#kept.peek(endpointId, configHash)?.workerId ?? null;
  }

  async launch(spec: LaunchSpec, events: WorkerEvents): Promise<LaunchResult> {
    if (this.#closing) throw new Error('the container runtime is shutting down');
    if (!this.#ready && !(await this.#connect())) {
      throw new DockerError('DOCKER_UNREACHABLE', `the container engine at ${this.client.socketPath} is unreachable`, { request: 'launch' });
    }
    const t0 = performance.now();
    const stopped = new AbortController();
    const launching = (async () => (await this.#restartKept(spec, events, t0)) ?? (await this.#create(spec, events, t0, stopped.signal)))();
    this.#launching.set(spec.workerId, launching);
    this.#launchAborts.set(spec.workerId, stopped);
    try {
      return await launching;
    } catch (err) {
      if (isDockerError(err, 'DOCKER_UNREACHABLE')) this.#unreachable(err);
      throw err;
    } finally {
      this.#launching.delete(spec.workerId);
      this.#launchAborts.delete(spec.workerId);
    }
  }

  /** FlashBoot: restarts the newest kept container with this config hash, if there is one. */
  async #restartKept(spec: LaunchSpec, events: WorkerEvents, t0: number): Promise<LaunchResult | null> {
    const { hit, stale } = this.#kept.take(spec.endpointId, spec.configHash);
    for (const e of stale) void this.#discard(e, 'configuration changed');
    if (!hit) return null;
    clearTimeout(hit.value.timer);
    try {
      const startMs = await this.#run(hit.value.containerId, { ...spec, workerId: hit.workerId }, events);
      this.#timed({ endpointId: spec.endpointId, workerId: hit.workerId, reused: true, imageMs: 0, createMs: 0, startMs, totalMs: performance.now() - t0 });
      return { workerId: hit.workerId, reused: true };
    } catch (err) {
      // Its identity goes with it either way; an unreachable engine fails the launch too.
      await this.#discard(hit, 'restart failed');
      // Shutting down (a second signal removed it meanwhile): no new container to remove again.
      if (isDockerError(err, 'DOCKER_UNREACHABLE') || this.#closing) throw err;
      this.#log.warn('kept container could not be restarted; creating a new one', { workerId: hit.workerId, reason: (err as Error).message });
      return null;
    }
  }

  /** `stopped`: the worker was stopped meanwhile; before its container exists, the launch gives up. */
  async #create(spec: LaunchSpec, events: WorkerEvents, t0: number, stopped: AbortSignal): Promise<LaunchResult> {
    await this.#ensureImage(spec, stopped);
    if (spec.volume) await this.#ensureVolume(spec.volume.id, spec.volume.kind);
    if (stopped.aborted) throw new Error('it was stopped before its container was created');
    const tImage = performance.now();
    for (;;) {
      const { id, init } = await this.#createContainer(spec);
      const tCreate = performance.now();
      try {
        if (this.#closing) throw new Error('the container runtime is shutting down');
        const startMs = await this.#run(id, spec, events);
        this.#timed({ endpointId: spec.endpointId, workerId: spec.workerId, reused: false, imageMs: tImage - t0, createMs: tCreate - tImage, startMs, totalMs: performance.now() - t0 });
        return { workerId: spec.workerId, reused: false };
      } catch (err) {
        await this.#remove(id);
        // Docker refuses a missing docker-init at start: once more, without the init.
        if (init && this.#initRefused(err)) continue;
        throw err;
      }
    }
  }

  /** When `err` is the engine's refusal of `HostConfig.Init`: init off from now on (logged once). */
  #initRefused(err: unknown): boolean {
    if (!refusesInit(err)) return false;
    if (!this.#noInit) {
      this.#noInit = true;
      this.#log.warn('the container engine has no init binary; workers run without an init process, so one whose PID 1 ignores SIGTERM (Python without a handler) takes the whole stop grace to stop', {
        reason: (err as Error).message, hint: 'install catatonit (Podman) or docker-init (Docker)',
      });
    }
    return true;
  }

  #timed(timing: LaunchTiming): void {
    const round = (n: number): number => Math.round(n * 10) / 10;
    this.#log.info('container started', {
      endpointId: timing.endpointId, workerId: timing.workerId, reused: timing.reused,
      imageMs: round(timing.imageMs), createMs: round(timing.createMs), startMs: round(timing.startMs), totalMs: round(timing.totalMs),
    });
    this.#o.onLaunchTiming?.(timing);
  }

  /**
   * Pulls the image when it is not present (one pull per image and registry credential at a
   * time, which later launches of the image with that credential join). A launch whose worker is stopped meanwhile stops waiting at once; the
   * pull is given up when no launch waits for it any more. A pull without progress for
   * `pullIdleTimeoutMs` fails (the client's idle bound), and with it every launch waiting.
   * Until it ends, a line every `pullProgressMs` says it still runs, with what it got so far.
   */
  async #ensureImage(spec: LaunchSpec, stopped: AbortSignal): Promise<void> {
    if (await this.client.inspectImage(spec.image)) return;
    // Shared by image and credential: a launch with the right credential must not join (and
    // fail with) a pull that another endpoint started with a wrong one or none. A hash, so the
    // map holds no password.
    const key = `${spec.image}\u0000${spec.registryAuth ? createHash('sha256').update(JSON.stringify(spec.registryAuth)).digest('hex') : ''}`;
    let pull = this.#pulls.get(key);
    if (!pull) {
      const abort = new AbortController();
      const signal = AbortSignal.any([this.#shutdown.signal, abort.signal]);
      this.#log.info('pulling image', { image: spec.image, endpointId: spec.endpointId, authenticated: spec.registryAuth !== null });
      const tally = new PullTally();
      const began = performance.now();
      const every = this.#o.pullProgressMs ?? DEFAULT_PULL_PROGRESS_MS;
      const ticker = every <= 0 ? undefined : setInterval(() => {
        if (signal.aborted) return clearInterval(ticker);
        this.#log.info('still pulling image', { image: spec.image, elapsedMs: Math.round(performance.now() - began), ...tally.fields() });
      }, every).unref();
      const done = this.client.pullImage(spec.image, {
        auth: spec.registryAuth, signal, idleTimeoutMs: this.#o.pullIdleTimeoutMs ?? DEFAULT_PULL_IDLE_TIMEOUT_MS, onProgress: (p) => tally.add(p),
      }).finally(() => {
        clearInterval(ticker);
        if (this.#pulls.get(key) === created) this.#pulls.delete(key);
      });
      // Given up with no launch left to hear it: not an unhandled rejection.
      done.catch(() => undefined);
      const created: Pull = { done, waiters: 0, abort };
      this.#pulls.set(key, created);
      pull = created;
    }
    const shared = pull;
    shared.waiters++;
    try {
      await new Promise<void>((resolve, reject) => {
        const onStop = (): void => reject(new Error(`its image ${spec.image} was still being pulled`));
        if (stopped.aborted) return onStop();
        stopped.addEventListener('abort', onStop, { once: true });
        shared.done.then(resolve, reject).finally(() => stopped.removeEventListener('abort', onStop));
      });
    } finally {
      if (--shared.waiters === 0 && stopped.aborted) {
        if (this.#pulls.get(key) === shared) this.#pulls.delete(key);
        shared.abort.abort();
      }
    }
  }

  /** Creates the named volume of a flashd volume id when it does not exist yet. */
  async #ensureVolume(id: string, kind: 'network' | 'global'): Promise<void> {
    const name = volumeName(id);
    let pending = this.#volumes.get(name);
    if (!pending) {
      pending = (async () => {
        if (await this.client.inspectVolume(name)) return;
        try {
          await this.client.createVolume(name, {
            [LABELS.managed]: 'true', [LABELS.volume]: id, [LABELS.instance]: this.instanceId, 'dev.flashd.volume-kind': kind,
          });
          this.#log.info('volume created', { volume: name });
        } catch (err) {
          if (!isDockerError(err, 'DOCKER_CONFLICT')) throw err;
        }
      })().finally(() => this.#volumes.delete(name));
      this.#volumes.set(name, pending);
    }
    await pending;
  }

  /**
   * Removes the engine volume of a deleted flashd volume, with its data. The API refuses the
   * deletion while an endpoint mounts the volume, but a worker of an older configuration may
   * still be finishing its jobs with it (or the engine be unreachable): then the removal is
   * tried again each time a container is removed and at reconnection. Never rejects.
   */
  async removeVolume(id: string): Promise<void> {
    const name = volumeName(id);
    this.#deletedVolumes.set(name, id);
    await this.#removeDeletedVolumes();
    if (this.#deletedVolumes.has(name)) {
      this.#log.info('volume of a deleted flashd volume still in use; it goes once its containers are gone', { volume: name });
    }
  }

  #removeDeletedVolumes(): Promise<void> {
    this.#volumesAgain = true;
    this.#removingVolumes ??= (async () => {
      while (this.#volumesAgain) {
        this.#volumesAgain = false;
        for (const [name, id] of [...this.#deletedVolumes]) await this.#removeDeletedVolume(name, id);
      }
    })().finally(() => (this.#removingVolumes = null));
    return this.#removingVolumes;
  }

  /**
   * One labelled with another instance is left: a copy of a data directory given an id of its
   * own still names its volumes as the original did, and the original's data is not this
   * flashd's to delete.
   */
  async #removeDeletedVolume(name: string, id: string): Promise<void> {
    try {
      const owner = (await this.client.inspectVolume(name))?.Labels?.[LABELS.instance];
      if (owner !== undefined && owner !== this.instanceId) {
        // Its data may still be that flashd's (the original of a copied data directory): the
        // operator removes it, and only the operator knows when it is no longer used.
        this.#log.warn('volume of a deleted flashd volume left in place: another flashd instance made it (the original of this data directory, or a copy of it), so its data may still be in use there; remove it by hand once no flashd of that instance uses it', {
          volume: name, instance: owner, command: `docker volume rm ${name}`,
        });
      } else {
        await this.client.removeVolume(name);
        this.#log.info('volume removed', { volume: name });
      }
      this.#deletedVolumes.delete(name);
      this.#o.volumes?.removed(id);
    } catch (err) {
      // In use (409) or the engine away: kept for the next try. Anything else is final.
      if (isDockerError(err, 'DOCKER_CONFLICT') || isDockerError(err, 'DOCKER_UNREACHABLE')) return;
      this.#deletedVolumes.delete(name);
      this.#log.warn('cannot remove volume', { volume: name, reason: (err as Error).message });
    }
  }

  /**
   * Creates the container. The first launch with a disk size learns whether the engine can
   * limit it; when it cannot, the launch goes on without the limit (logged once). Likewise an
   * engine without an init binary: the container is created again without `Init` (logged once).
   */
  async #createContainer(spec: LaunchSpec): Promise<{ id: string; init: boolean }> {
    const body = createBody(spec, {
      instanceId: this.instanceId, owner: this.#owner, diskLimit: this.#diskLimit !== 'unsupported', gpuDriver: this.#gpu?.driver ?? 'nvidia', init: !this.#noInit,
    });
    try {
      const { Id } = await this.client.createContainer(body, containerName(spec.workerId));
      if (body.HostConfig.StorageOpt) this.#diskLimit = 'supported';
      return { id: Id, init: body.HostConfig.Init === true };
    } catch (err) {
      if (body.HostConfig.Init && this.#initRefused(err)) return this.#createContainer(spec);
      if (!body.HostConfig.StorageOpt || !refusesDiskLimit(err)) throw err;
      this.#diskLimit = 'unsupported';
      this.#log.warn('the container engine cannot limit container disk size; workers run without a disk limit', { reason: (err as Error).message });
      return this.#createContainer(spec);
    }
  }

  /**
   * Attaches to a created or stopped container, starts it and begins supervising it.
   * Resolves with the time attach + start took. Output before the launch resolves is held
   * back a turn, so the caller can file it under the right worker id (a reused one).
   */
  async #run(containerId: string, spec: LaunchSpec, events: WorkerEvents): Promise<number> {
    const t = performance.now();
    let announced = false;
    const held: [stream: 'stdout' | 'stderr', line: string][] = [];
    const emit = (stream: 'stdout' | 'stderr', line: string): void => {
      if (announced) events.log(stream, line);
      else held.push([stream, line]);
    };
    const out = lineSplitter((l) => emit('stdout', l));
    const err = lineSplitter((l) => emit('stderr', l));
    const attached = await this.client.attach(containerId, (stream, payload) => (stream === 'stderr' ? err : out).push(payload));
    try {
      await this.client.startContainer(containerId);
      // Started after removeAllNow looked: the caller removes it (the engine may have already).
      if (this.#killed) throw new Error('the container runtime is shutting down');
    } catch (e) {
      attached.detach();
      throw e;
    }
    void this.#relay?.ensure();
    let announce!: () => void;
    const gate = new Promise<void>((resolve) => (announce = resolve));
    setImmediate(() => {
      announced = true;
      for (const [s, l] of held.splice(0)) events.log(s, l);
      announce();
    });
    const w: Running = {
      workerId: spec.workerId, endpointId: spec.endpointId, containerId, configHash: spec.configHash, flashboot: spec.flashboot,
      events, stopping: false, exited: Promise.resolve(),
    };
    w.exited = (async () => {
      const code = await this.#waitExit(containerId);
      const removed = await this.#removedOutside(containerId);
      // Let the last output arrive before the exit is reported (bounded: the engine may hold it).
      await Promise.race([attached.ended, sleep(2000)]);
      attached.detach();
      out.end();
      err.end();
      await gate;
      await this.#exited(w, removed ? null : code, removed);
    })();
    this.#running.set(spec.workerId, w);
    return performance.now() - t;
  }

  /** The container's exit code once it stops; null when it vanished. Survives engine hiccups. */
  async #waitExit(containerId: string): Promise<number | null> {
    // Gone, or unreachable while shutting down: nothing more will be learnt.
    const hopeless = (err: unknown): boolean => isDockerError(err, 'DOCKER_NOT_FOUND') || (this.#closing && isDockerError(err, 'DOCKER_UNREACHABLE'));
    for (;;) {
      try {
        return (await this.client.wait(containerId, 'not-running')).StatusCode;
      } catch (err) {
        if (hopeless(err)) return null;
      }
      // The wait connection broke (engine restart, socket trouble): poll until it answers.
      await sleep(1000);
      try {
        const state = (await this.client.inspectContainer(containerId)).State;
        if (!state.Running) return state.ExitCode;
      } catch (err) {
        if (hopeless(err)) return null;
      }
    }
  }

  /**
   * Whether a container whose wait ended is gone although flashd did not remove it (`docker rm
   * -f`, `podman rm -f`): its exit code is then the engine's guess (Podman 4.3 answers 0, or 137),
   * not the handler's.
   */
  async #removedOutside(containerId: string): Promise<boolean> {
    try {
      await this.client.inspectContainer(containerId);
      return false;
    } catch (err) {
      // removeAllNow (a second signal) removes running containers itself.
      return isDockerError(err, 'DOCKER_NOT_FOUND') && !this.#killed;
    }
  }

  /**
   * One exit of one launch: keep (FlashBoot, asked to stop) or remove, then `events.exit`.
   * `removed`: its container was removed outside flashd (code null), said in its log.
   */
  async #exited(w: Running, code: number | null, removed = false): Promise<void> {
    this.#running.delete(w.workerId);
    if (removed) {
      w.events.log('stderr', 'flashd: the container was removed outside flashd (docker/podman rm); its exit code is unknown');
      this.#log.warn('worker container removed outside flashd', { endpointId: w.endpointId, workerId: w.workerId, containerId: w.containerId });
    }
    const signal = code !== null && code > 128 ? SIGNALS.get(code - 128) ?? null : null;
    if (signal === 'SIGKILL' && !w.stopping) {
      // Say why when the kernel's OOM killer ended it: the exit code alone reads like a kill.
      const state = await this.client.inspectContainer(w.containerId).then((i) => i.State, () => null);
      if (state?.OOMKilled) w.events.log('stderr', 'flashd: the container ran out of memory (its memory limit) and was killed');
    }
    const info: ExitInfo = { code, signal, requested: w.stopping };
    if (w.stopping && !w.noKeep && w.flashboot !== 'OFF' && !this.#closing && code !== null) {
      const mode: KeepMode = w.flashboot;
      const entry = { workerId: w.workerId, endpointId: w.endpointId, configHash: w.configHash, mode, keptAt: Date.now() };
      const timer = setTimeout(() => {
        const e = this.#kept.remove(w.workerId);
        if (e) void this.#discard(e, 'kept long enough');
      }, this.#kept.ttlMs(mode));
      timer.unref();
      const { kept, evicted } = this.#kept.add({ ...entry, value: { containerId: w.containerId, events: w.events, timer } });
      for (const e of evicted) void this.#discard(e, 'FlashBoot limit');
      if (kept) {
        this.#log.info('container kept for FlashBoot', { endpointId: w.endpointId, workerId: w.workerId, mode });
        w.events.exit({ ...info, kept: true });
        return;
      }
      clearTimeout(timer);
    }
    await this.#remove(w.containerId);
    w.events.exit(info);
  }

  /** Removes a kept container for good and tells its last launch (`discarded`). */
  async #discard(e: KeptEntry<Kept>, reason: string): Promise<void> {
    clearTimeout(e.value.timer);
    await this.#remove(e.value.containerId);
    this.#log.info('kept container removed', { endpointId: e.endpointId, workerId: e.workerId, reason });
    e.value.events.discarded?.();
  }

  /** Force-removes a container (and its anonymous volumes); failures are logged, not thrown. */
  async #remove(containerId: string): Promise<void> {
    try {
      await this.client.removeContainer(containerId, { force: true, volumes: true });
    } catch (err) {
      if (!isDockerError(err, 'DOCKER_NOT_FOUND')) this.#log.warn('cannot remove container', { containerId, reason: (err as Error).message });
    }
    if (this.#deletedVolumes.size) void this.#removeDeletedVolumes();
  }

  /**
   * Stops a worker's container (SIGTERM, SIGKILL after `graceMs`) and resolves once its exit was
   * handled. A stop the engine did not get (its API down) is sent again when it answers (see
   * `#connect`), or at the next `stop()` of the worker: until then the container runs on,
   * holding its place, and its exit cannot be reported anyway.
   */
  async stop(workerId: string, graceMs: number, options: { keep?: boolean } = {}): Promise<void> {
    // A worker still being launched is stopped once it runs (or not at all when it fails); one
    // still waiting for its image gives up the wait (#ensureImage).
    this.#launchAborts.get(workerId)?.abort();
    await this.#launching.get(workerId)?.catch(() => undefined);
    const w = this.#running.get(workerId);
    if (!w) return;
    if (options.keep === false) w.noKeep = true;
    w.stopping = true;
    w.stopGraceMs ??= graceMs;
    if (!w.stopSent) await this.#sendStop(w, graceMs);
    await w.exited;
  }

  /**
   * `POST /containers/{id}/stop`, then a kill when that fails. When neither reached the engine
   * the stop stays unsent (`stopSent` false): the engine is marked unreachable, and the stop is
   * sent again once it answers. Concurrent calls share one request.
   */
  #sendStop(w: Running, graceMs: number): Promise<void> {
    w.stopSending ??= (async () => {
      const { workerId, containerId } = w;
      try {
        await this.client.stopContainer(containerId, graceMs / 1000);
        w.stopSent = true;
        return;
      } catch (err) {
        // Gone already: its wait reports the exit.
        if (isDockerError(err, 'DOCKER_NOT_FOUND')) {
          w.stopSent = true;
          return;
        }
        this.#log.warn('cannot stop container; killing it', { workerId, reason: (err as Error).message });
      }
      try {
        await this.client.killContainer(containerId);
        w.stopSent = true;
      } catch (err) {
        // 404: gone. 409: not running any more (it exited meanwhile): its wait reports the exit.
        if (isDockerError(err, 'DOCKER_NOT_FOUND') || isDockerError(err, 'DOCKER_CONFLICT')) {
          w.stopSent = true;
          return;
        }
        const unreachable = isDockerError(err, 'DOCKER_UNREACHABLE');
        this.#log.warn(unreachable ? 'cannot kill container: the engine is unreachable; the stop is sent again when it answers'
          : 'cannot kill container; the next stop of this worker tries again', { workerId, containerId, reason: (err as Error).message });
        if (unreachable) this.#unreachable(err);
      }
    })().finally(() => (w.stopSending = null));
    return w.stopSending;
  }

  /** Stops that did not reach the engine while it was unreachable: sent now that it answers. */
  #resendStops(): void {
    for (const w of this.#running.values()) {
      if (!w.stopping || w.stopSent || w.stopSending) continue;
      this.#log.info('container stop sent again: the engine answers again', { workerId: w.workerId, endpointId: w.endpointId });
      void this.#sendStop(w, w.stopGraceMs ?? 10_000);
    }
  }

  async discardEndpoint(endpointId: string, reason = 'endpoint deleted'): Promise<void> {
    await Promise.all(this.#kept.removeEndpoint(endpointId).map((e) => this.#discard(e, reason)));
  }

  /**
   * A second signal during shutdown: force-removes every container of this process at once,
   * running (no grace) and kept, so none outlives flashd (the next start would remove them,
   * but it may never come). Those of launches still in flight are found by this instance's
   * label (created, not yet registered) or remove themselves (`#killed`, checked once the
   * engine started them), and this waits for those launches. Resolves with how many it removed.
   */
  async removeAllNow(): Promise<number> {
    this.#closing = true;
    this.#killed = true;
    clearInterval(this.#reconnect);
    this.#shutdown.abort();
    const ids = new Set([...this.#running.values()].map((w) => w.containerId));
    for (const e of this.#kept.list()) ids.add(e.value.containerId);
    try {
      const mine = await this.#listMine();
      // Not those of another live flashd with this instance id (a copy of this data directory).
      for (const c of mine) {
        const owner = ownerOf(c.Labels);
        if (!owner || !isOtherLiveProcess(owner)) ids.add(c.Id);
      }
    } catch {
      // The engine is away: what this process knows is all it can remove.
    }
    const removed = await Promise.all([...ids].map((id) => this.client.removeContainer(id, { force: true, volumes: true }).then(() => 1, () => 0)));
    await Promise.all([...this.#launching.values()].map((p) => p.catch(() => undefined)));
    return removed.reduce<number>((a, b) => a + b, 0);
  }

  /** Stops and removes every container of this process, kept ones included. */
  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    clearInterval(this.#reconnect);
    this.#shutdown.abort();
    await Promise.all([...this.#launching.values()].map((p) => p.catch(() => undefined)));
    await Promise.all([...this.#running.keys()].map((id) => this.stop(id, 2000)));
    await Promise.all(this.#kept.drain().map((e) => this.#discard(e, 'shutdown')));
    if (this.#deletedVolumes.size) await this.#removeDeletedVolumes();
    await this.#relay?.close();
    this.client.close();
  }
}
