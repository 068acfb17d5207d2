/**
 * The `POST /containers/create` body of a worker: a pure function of the launch spec, so the
 * safe defaults can be table-tested without an engine (test/runtime/container-spec.test.ts)
 * and checked again on a real container's inspect. reliability-anchors §3.5 is the source of
 * the defaults; ARCHITECTURE.md ("Containers") lists them with the reasons.
 */
import { withPodHostname } from '../pod-hostname.js';
import type { ProcessIdentity } from '../process-identity.js';
import type { LaunchSpec } from '../types.js';
import type { ContainerCreateBody, HostConfig } from './api-types.js';

/** Labels on every container (and volume) flashd makes. */
export const LABELS = {
  managed: 'dev.flashd.managed',
  /**
   * Which flashd (data directory) owns it. A copy of a data directory has the same: the owner
   * labels below tell a live flashd's containers from a previous run's.
   */
  instance: 'dev.flashd.instance',
  /** The flashd process that made a container (process-identity.ts): host, pid, start. */
  ownerHost: 'dev.flashd.owner-host',
  ownerPid: 'dev.flashd.owner-pid',
  ownerStart: 'dev.flashd.owner-start',
  endpoint: 'dev.flashd.endpoint',
  worker: 'dev.flashd.worker',
  configHash: 'dev.flashd.config-hash',
  flashboot: 'dev.flashd.flashboot',
  volume: 'dev.flashd.volume',
} as const;

/** Where an endpoint's volume appears inside its workers (spec, "Mounts"). */
export const VOLUME_PATH = '/vendor-volume';

const GIB = 1024 ** 3;

/** Fixed limits every worker gets. */
export const SAFE_LIMITS = {
  /** Processes and threads per container (fork-bomb guard; PyTorch spawns many threads). */
  pidsLimit: 8192,
  /** Engine-side log file: flashd streams the output into its own log, so little is kept. */
  logMaxSize: '10m',
  logMaxFiles: '3',
  /** /dev/shm of GPU workers (PyTorch data loaders share tensors through it). */
  gpuShmBytes: 8 * GIB,
  /** /dev/shm of CPU workers is at most this, and at most half their memory limit. */
  cpuShmBytes: 1 * GIB,
} as const;

/** The engine volume that holds flashd volume `id`. */
export function volumeName(id: string): string {
  return `flashd-volume-${id}`;
}

/** The container of worker `workerId` (worker ids are `wkr_<base36>`: a valid container name). */
export function containerName(workerId: string): string {
  return `flashd-${workerId}`;
}

/**
 * The container's host name, set at create so that its env can say it (`RUNPOD_POD_HOSTNAME`):
 * the engine's default, the container id's first 12 characters, is not known before. The worker
 * id as a valid host name (RFC 1123 label: lower case letters, digits and hyphens, at most 63).
 */
export function containerHostname(workerId: string): string {
  return workerId.toLowerCase().replace(/[^a-z0-9-]/g, '-').slice(0, 63).replace(/^-+|-+$/g, '') || 'worker';
}

/**
 * The worker's environment as `KEY=value` lines, with its host name (containerHostname) as
 * `RUNPOD_POD_HOSTNAME` and `VENDOR_POD_HOSTNAME` unless the endpoint's env sets one. Every
 * `NVIDIA_*` variable the user set is dropped: with the NVIDIA container toolkit,
 * `NVIDIA_VISIBLE_DEVICES=all` in a container's env can hand it every GPU of the host. flashd
 * then sets the pair itself: a GPU worker's own device UUIDs (the same list as its device
 * request), and `void` for a CPU worker, which also overrides an image's
 * `ENV NVIDIA_VISIBLE_DEVICES=all` (CUDA base images set it).
 */
export function containerEnv(spec: Pick<LaunchSpec, 'env' | 'gpuDeviceIds' | 'workerId'>): string[] {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(withPodHostname(spec.env, containerHostname(spec.workerId)))) if (!/^NVIDIA_/i.test(k)) env[k] = v;
  if (spec.gpuDeviceIds.length > 0) {
    env['NVIDIA_VISIBLE_DEVICES'] = spec.gpuDeviceIds.join(',');
    env['NVIDIA_DRIVER_CAPABILITIES'] = 'compute,utility';
  } else {
    env['NVIDIA_VISIBLE_DEVICES'] = 'void';
  }
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

/** `8000/http` → `8000/tcp`; `53/udp` stays. Entries that are not `port/protocol` are skipped. */
export function exposedPorts(ports: readonly string[]): Record<string, Record<string, never>> {
  const out: Record<string, Record<string, never>> = {};
  for (const p of ports) {
    const m = /^(\d{1,5})\/([a-z]+)$/i.exec(p.trim());
    if (!m) continue;
    out[`${m[1]}/${(m[2] as string).toLowerCase() === 'udp' ? 'udp' : 'tcp'}`] = {};
  }
  return out;
}

/**
 * How an engine gives a container its GPUs through the Docker API: Docker's `nvidia` device
 * driver (the NVIDIA container toolkit's runtime hook), or a CDI device request naming
 * `nvidia.com/gpu=<UUID>` (a CDI spec from `nvidia-ctk cdi generate`, which names every GPU by
 * index and by UUID). Podman's compat API honours only the latter, and only from 5.4 on
 * (containers/podman#25171); before that it drops every device request and the container would
 * run without its GPU while flashd counted the GPU as held.
 */
export type GpuAttach = { driver: 'nvidia' | 'cdi'; reason?: undefined } | { driver: null; reason: string };

/** The engine's GPU attach, from its `/version` (`Components[].Name`, `Version`) and `--container-gpu-driver`. */
export function gpuAttachFor(engine: { name: string; version: string }, setting: 'auto' | 'nvidia' | 'cdi'): GpuAttach {
  if (!/podman/i.test(engine.name)) return { driver: setting === 'cdi' ? 'cdi' : 'nvidia' };
  const m = /^v?(\d+)\.(\d+)/.exec(engine.version.trim());
  const [major, minor] = m ? [Number(m[1]), Number(m[2])] : [0, 0];
  if (major > 5 || (major === 5 && minor >= 4)) return { driver: 'cdi' };
  return {
    driver: null,
    reason: `podman ${engine.version} cannot give a container a GPU through its Docker API (CDI device requests need podman 5.4 or later); use podman 5.4+ or Docker with the NVIDIA container toolkit, or --runtime process`,
  };
}

export interface CreateBodyOptions {
  /** The owning flashd's instance id (label). */
  instanceId: string;
  /** The flashd process creating it (owner labels); null or unset: none (where /proc cannot tell). */
  owner?: ProcessIdentity | null;
  /** Whether to ask for `StorageOpt.size` (false once the engine said it cannot). */
  diskLimit: boolean;
  /** The device request for GPUs. @defaultValue `"nvidia"` */
  gpuDriver?: 'nvidia' | 'cdi';
  /** An init process as PID 1 (`HostConfig.Init`; false once the engine said it has none). @defaultValue true */
  init?: boolean;
}

/** A container's owner labels. */
export function ownerLabels(owner: ProcessIdentity): Record<string, string> {
  return { [LABELS.ownerHost]: owner.host, [LABELS.ownerPid]: String(owner.pid), [LABELS.ownerStart]: owner.start };
}

/** The process a container's owner labels name; null when it has none (made by an older flashd, or where /proc could not tell). */
export function ownerOf(labels: Record<string, string> | null | undefined): ProcessIdentity | null {
  const host = labels?.[LABELS.ownerHost];
  const pid = Number(labels?.[LABELS.ownerPid]);
  const start = labels?.[LABELS.ownerStart];
  return host && start && Number.isSafeInteger(pid) && pid > 0 ? { host, pid, start } : null;
}

/** The HostConfig: safe defaults first, then the worker's resources. */
export function hostConfig(spec: LaunchSpec, options: Pick<CreateBodyOptions, 'diskLimit' | 'gpuDriver' | 'init'>): HostConfig {
  const hc: HostConfig = {
    Privileged: false,
    CapDrop: ['ALL'],
    CapAdd: [],
    SecurityOpt: ['no-new-privileges:true'],
    PidsLimit: SAFE_LIMITS.pidsLimit,
    NetworkMode: 'bridge',
    IpcMode: 'private',
    PublishAllPorts: false,
    RestartPolicy: { Name: 'no' },
    LogConfig: { Type: 'json-file', Config: { 'max-size': SAFE_LIMITS.logMaxSize, 'max-file': SAFE_LIMITS.logMaxFiles } },
    Mounts: spec.volume ? [{ Type: 'volume', Source: volumeName(spec.volume.id), Target: VOLUME_PATH }] : [],
  };
  // `docker run --init`: PID 1 is the engine's init (docker-init, Podman's catatonit), which
  // forwards signals and reaps zombies. A process that is PID 1 itself gets no default signal
  // action: Python without a SIGTERM handler (the SDK sets none) ignores `docker stop` and
  // would take the whole stop grace.
  if (options.init !== false) hc.Init = true;
  if (spec.gpuDeviceIds.length > 0) {
    hc.DeviceRequests = options.gpuDriver === 'cdi'
      ? [{ Driver: 'cdi', DeviceIDs: spec.gpuDeviceIds.map((uuid) => `nvidia.com/gpu=${uuid}`) }]
      : [{ Driver: 'nvidia', DeviceIDs: [...spec.gpuDeviceIds], Capabilities: [['gpu']] }];
    hc.ShmSize = SAFE_LIMITS.gpuShmBytes;
  }
  if (spec.cpu) {
    const memory = Math.round(spec.cpu.memoryGb * GIB);
    hc.NanoCpus = Math.round(spec.cpu.vcpuCount * 1e9);
    hc.Memory = memory;
    hc.MemorySwap = memory;
    hc.ShmSize = Math.min(SAFE_LIMITS.cpuShmBytes, Math.floor(memory / 2));
  }
  if (options.diskLimit && spec.diskGb !== null && spec.diskGb > 0) hc.StorageOpt = { size: `${spec.diskGb}G` };
  return hc;
}

/** The whole create body of a worker container. Empty entrypoint/cmd keep the image's own. */
export function createBody(spec: LaunchSpec, options: CreateBodyOptions): ContainerCreateBody {
  const body: ContainerCreateBody = {
    Image: spec.image,
    Hostname: containerHostname(spec.workerId),
    Env: containerEnv(spec),
    Labels: {
      [LABELS.managed]: 'true',
      [LABELS.instance]: options.instanceId,
      [LABELS.endpoint]: spec.endpointId,
      [LABELS.worker]: spec.workerId,
      [LABELS.configHash]: spec.configHash,
      [LABELS.flashboot]: spec.flashboot,
      ...(options.owner ? ownerLabels(options.owner) : {}),
    },
    Tty: false,
    OpenStdin: false,
    AttachStdin: false,
    AttachStdout: true,
    AttachStderr: true,
    HostConfig: hostConfig(spec, options),
  };
  if (spec.entrypoint.length > 0) body.Entrypoint = [...spec.entrypoint];
  if (spec.cmd.length > 0) body.Cmd = [...spec.cmd];
  const ports = exposedPorts(spec.ports);
  if (Object.keys(ports).length > 0) body.ExposedPorts = ports;
  return body;
}
