/** Stored records to API response objects. Only this file decides what a client sees. */
import { cpuFlavor } from '../catalog/index.js';
import type { ResourceRow } from '../store/index.js';
import {
  DEFAULT_HEALTH_CHECK_PATH, NO_COMMAND_REASON, hasNoCommand, hasNoImage, idleTimeoutApplies, noImageReason,
  type EndpointSpec, type GlobalVolumeSpec, type NetworkVolumeSpec, type RegistryCredentialSpec, type TemplateSpec,
} from './types.js';

/** Where clients reach this installation; resolved after listen, since the port may be 0. */
export interface PublicUrls {
  /** queue_base_url, e.g. http://127.0.0.1:8000 */
  queueBaseUrl(): string;
  /** endpoint_host, e.g. lb.localhost:8000 */
  endpointHost(): string;
  endpointScheme: 'http' | 'https';
}

const iso = (ms: number): string => new Date(ms).toISOString();

export function requestUrls(id: string, spec: Pick<EndpointSpec, 'type' | 'env'>, urls: PublicUrls): Record<string, string> {
  if (spec.type === 'LOAD_BALANCER') {
    const base = `${urls.endpointScheme}://${id}.${urls.endpointHost()}`;
    return { base, health: base + (spec.env['HEALTH_CHECK_PATH'] ?? DEFAULT_HEALTH_CHECK_PATH) };
  }
  const q = `${urls.queueBaseUrl()}/v2/${id}`;
  return {
    run: `${q}/run`,
    runSync: `${q}/runsync`,
    status: `${q}/status/{job_id}`,
    stream: `${q}/stream/{job_id}`,
    cancel: `${q}/cancel/{job_id}`,
    retry: `${q}/retry/{job_id}`,
    purgeQueue: `${q}/purge-queue`,
    health: `${q}/health`,
  };
}

/**
 * `containerRuntime`: the name of the container runtime flashd starts workers with (`docker`),
 * null with another runtime or none; an endpoint it cannot start (no image) says why in
 * `startBlocked`. `hostRuntime`: workers run as host processes (`--runtime process`), where an
 * endpoint with no command cannot start, said there too.
 */
export function endpointView(row: ResourceRow<EndpointSpec>, urls: PublicUrls, containerRuntime: string | null = null, hostRuntime = false): Record<string, unknown> {
  const s = row.data;
  const workers: Record<string, number> = { min: s.workers.min, max: s.workers.max };
  if (idleTimeoutApplies(s.type, s.scaling)) workers['idleTimeout'] = s.workers.idleTimeout;
  const out: Record<string, unknown> = {
    id: row.id,
    name: s.name,
    type: s.type,
    requestUrls: requestUrls(row.id, s, urls),
    image: s.image,
    args: s.args,
    entrypoint: s.entrypoint,
    cmd: s.cmd,
  };
  if (s.disk !== null) out['disk'] = s.disk;
  Object.assign(out, { ports: s.ports, env: s.env, registry: s.registry });
  if (s.gpu) out['gpu'] = { ...s.gpu };
  if (s.cpu) {
    out['cpu'] = s.cpu.map((c) => ({ id: c.id, vcpuCount: c.vcpuCount, memory: Math.max(1, Math.round(c.vcpuCount * (cpuFlavor(c.id)?.ramMultiplier ?? 1))) }));
  }
  Object.assign(out, {
    workers,
    scaling: s.scaling,
    dataCenterIds: s.dataCenterIds,
    networkVolumes: s.mounts.network,
    mounts: { network: s.mounts.network.map((volumeId) => ({ volumeId })), global: s.mounts.global.map((volumeId) => ({ volumeId })) },
    timeout: s.timeout,
    flashboot: s.flashboot,
    templateId: s.templateId,
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
  });
  if (containerRuntime !== null && s.type === 'QUEUE' && hasNoImage(s.image)) out['startBlocked'] = noImageReason(containerRuntime);
  if (hostRuntime && s.type === 'QUEUE' && hasNoCommand(s)) out['startBlocked'] = NO_COMMAND_REASON;
  return out;
}

export function templateView(row: ResourceRow<TemplateSpec>): Record<string, unknown> {
  const t = row.data;
  const out: Record<string, unknown> = { id: row.id, name: t.name, image: t.image, args: t.args };
  if (t.disk !== null) out['disk'] = t.disk;
  Object.assign(out, {
    ports: t.ports, env: t.env, registry: t.registry, isServerless: t.isServerless, allowedCudaVersions: t.allowedCudaVersions,
    startSsh: t.startSsh, startJupyter: t.startJupyter, isPublic: row.isPublic, readme: t.readme,
    createdAt: iso(row.createdAt), updatedAt: iso(row.updatedAt),
  });
  return out;
}

export function networkVolumeView(row: ResourceRow<NetworkVolumeSpec>): Record<string, unknown> {
  return { id: row.id, ...row.data, createdAt: iso(row.createdAt), updatedAt: iso(row.updatedAt) };
}

export function globalVolumeView(row: ResourceRow<GlobalVolumeSpec>): Record<string, unknown> {
  return { id: row.id, ...row.data, createdAt: iso(row.createdAt), updatedAt: iso(row.updatedAt) };
}

/** The password is write-only: this view is the only way a credential leaves, and it has none. */
export function registryView(row: ResourceRow<RegistryCredentialSpec>): Record<string, unknown> {
  return { id: row.id, name: row.data.name, username: row.data.username, createdAt: iso(row.createdAt), updatedAt: iso(row.updatedAt) };
}
