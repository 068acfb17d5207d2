/**
 * Older REST create (`POST /v1/endpoints`, spec "Older REST create"). The body is translated
 * into a v2 create and checked by the same rules. `gpuTypeIds` are tried in priority order:
 * they become the pools they belong to (flashd's OTHER for a type in no RunPod pool or a model
 * of this host the catalog does not know), with every other member of those pools excluded, and
 * the order is kept for placement.
 */
import { GPU_POOLS, OTHER_POOL, gpuType, gpuTypeMeant, poolTypes } from '../catalog/index.js';
import { AgentError, validationError } from '../core/errors.js';
import { assertWithTimeoutHint, withShapeHints, type EndpointSpec } from '../endpoints/index.js';
import type { ResourceRow } from '../store/index.js';
import { requireAdminForHostCommand } from './management.js';
import type { RouteDef } from './route.js';
import type { ApiServices } from './services.js';

interface LegacyBody {
  name: string;
  templateId: string;
  type?: 'QB' | 'LB' | 'QUEUE' | 'LOAD_BALANCER';
  computeType?: 'GPU' | 'CPU';
  gpuTypeIds?: string[];
  gpuCount?: number;
  cpuFlavorIds?: string[];
  vcpuCount?: number;
  allowedCudaVersions?: string[];
  workersMin?: number;
  workersMax?: number;
  idleTimeout?: number;
  scalerType?: 'QUEUE_DELAY' | 'REQUEST_COUNT';
  scalerValue?: number;
  executionTimeoutMs?: number;
  flashboot?: boolean;
  dataCenterIds?: string[];
  networkVolumeId?: string;
}

/**
 * Maps GPU type ids (priority order) onto pools and exclusions. A catalog type in no RunPod pool
 * maps onto flashd's pool OTHER, and so does a model the catalog does not know when one of
 * `hostModels` (the nvidia-smi names of this host's uncataloged GPUs) has that name. With OTHER,
 * the host's models not named are excluded too: placement keeps them out by the priority list
 * already, but the v2 view shows only the exclusions, and that `gpu` sent back or copied into a
 * new endpoint would otherwise let them in.
 */
export function gpuSelectionFor(typeIds: readonly string[], hostModels: readonly string[] = []): { pools: string[]; excludedTypes: string[] } {
  const errors: string[] = [];
  const pools: string[] = [];
  const add = (pool: string) => void (pools.includes(pool) || pools.push(pool));
  typeIds.forEach((id, i) => {
    const t = gpuType(id);
    if (t) add(t.pool ?? OTHER_POOL);
    else if (hostModels.includes(id)) add(OTHER_POOL);
    else {
      const meant = gpuTypeMeant(id);
      errors.push(`/gpuTypeIds/${i}: unknown GPU type "${id}" (not in the GPU catalog, and no GPU of this host has that name)${meant ? `; did you mean "${meant.id}"?` : ''}`);
    }
  });
  if (errors.length) throw validationError(errors);
  const excludedTypes = pools.flatMap((p) => (poolTypes(p) ?? []).filter((t) => !typeIds.includes(t)));
  if (pools.includes(OTHER_POOL)) excludedTypes.push(...new Set(hostModels.filter((m) => !typeIds.includes(m))));
  return { pools, excludedTypes };
}

function toV2(b: LegacyBody, hostModels: readonly string[]): Record<string, unknown> {
  const type = b.type === 'LB' || b.type === 'LOAD_BALANCER' ? 'LOAD_BALANCER' : 'QUEUE';
  const scalerType = b.scalerType ?? (type === 'LOAD_BALANCER' ? 'REQUEST_COUNT' : 'QUEUE_DELAY');
  const value = b.scalerValue ?? 4;
  const v2: Record<string, unknown> = {
    name: b.name,
    type,
    templateId: b.templateId,
    scaling: scalerType === 'QUEUE_DELAY' ? { type: scalerType, queueDelay: value } : { type: scalerType, requestCount: Math.max(1, Math.round(value)) },
    flashboot: b.flashboot === false ? 'OFF' : 'FLASHBOOT',
  };
  const workers: Record<string, number> = {};
  if (b.workersMin !== undefined) workers['min'] = b.workersMin;
  if (b.workersMax !== undefined) workers['max'] = b.workersMax;
  if (b.idleTimeout !== undefined) workers['idleTimeout'] = b.idleTimeout;
  if (Object.keys(workers).length) v2['workers'] = workers;
  if (b.executionTimeoutMs !== undefined) v2['timeout'] = b.executionTimeoutMs;
  if (b.dataCenterIds !== undefined) v2['dataCenterIds'] = b.dataCenterIds;
  if (b.networkVolumeId !== undefined) v2['mounts'] = { network: [{ volumeId: b.networkVolumeId }] };
  if (b.computeType === 'CPU') {
    // As v2 refuses gpu beside cpu: GPU fields on a CPU endpoint are a contradiction, not dropped.
    const gpuFields = (['gpuTypeIds', 'gpuCount'] as const).filter((k) => b[k] !== undefined);
    if (gpuFields.length) throw validationError(gpuFields.map((k) => `/${k}: only for computeType GPU; a CPU endpoint takes cpuFlavorIds and vcpuCount`));
    const vcpuCount = b.vcpuCount ?? 2;
    v2['cpu'] = (b.cpuFlavorIds ?? ['cpu3c']).map((id) => ({ id, vcpuCount }));
    if (b.allowedCudaVersions !== undefined) v2['allowedCudaVersions'] = b.allowedCudaVersions;
  } else {
    const gpu: Record<string, unknown> = b.gpuTypeIds ? gpuSelectionFor(b.gpuTypeIds, hostModels) : { pools: [...GPU_POOLS.keys()] };
    if (b.gpuCount !== undefined) gpu['count'] = b.gpuCount;
    if (b.allowedCudaVersions !== undefined) gpu['allowedCudaVersions'] = b.allowedCudaVersions;
    v2['gpu'] = gpu;
  }
  return v2;
}

/** v2 pointers (the translated body) back to the v1 fields they came from; first match wins. */
const V1_POINTERS: readonly [RegExp, string][] = [
  [/^\/workers\/idleTimeout(?=[/:]|$)/, '/idleTimeout'],
  [/^\/workers\/min(?=[/:]|$)/, '/workersMin'],
  [/^\/workers\/max(?=[/:]|$)/, '/workersMax'],
  [/^\/workers(?=[/:]|$)/, '/workersMin'],
  [/^\/scaling\/(queueDelay|requestCount)(?=[/:]|$)/, '/scalerValue'],
  [/^\/scaling(\/type)?(?=[/:]|$)/, '/scalerType'],
  [/^\/timeout(?=[/:]|$)/, '/executionTimeoutMs'],
  [/^\/mounts(\/network\/\d+)?(?=[/:]|$)/, '/networkVolumeId'],
  [/^\/gpu\/allowedCudaVersions(?=[/:]|$)/, '/allowedCudaVersions'],
  [/^\/gpu\/count(?=[/:]|$)/, '/gpuCount'],
  [/^\/gpu(\/[A-Za-z]+(\/\d+)?)?(?=[/:]|$)/, '/gpuTypeIds'],
  [/^\/cpu\/\d+\/vcpuCount(?=[/:]|$)/, '/vcpuCount'],
  [/^\/cpu(\/\d+(\/id)?)?(?=[/:]|$)/, '/cpuFlavorIds'],
];

function v1Pointer(entry: string): string {
  for (const [re, to] of V1_POINTERS) if (re.test(entry)) return entry.replace(re, to);
  return entry;
}

/** The v2 rules report v2 pointers; a v1 client sent v1 fields, so its errors name those. */
function toV1Error(err: unknown): unknown {
  if (!(err instanceof AgentError) || !err.errors?.length) return err;
  const errors = err.errors.map(v1Pointer);
  const detail = errors.length === 1 ? (errors[0] as string) : `${errors.length} validation errors: ${errors.join('; ')}`;
  return new AgentError(err.code, err.code === 'VALIDATION_FAILED' || err.code === 'UNPROCESSABLE' ? detail : err.message, {
    errors, ...(err.extensions ? { extensions: err.extensions } : {}), ...(err.headers ? { headers: err.headers } : {}), cause: err,
  });
}

/**
 * `hostModels`: the nvidia-smi names of this host's GPUs the catalog does not know. Without a
 * priority list, an endpoint with pool OTHER also runs on those it does not exclude, so
 * `gpuTypeIds` lists them after the catalog types.
 */
export function legacyView(row: ResourceRow<EndpointSpec>, hostModels: readonly string[] = []): Record<string, unknown> {
  const s = row.data;
  const scalerValue = s.scaling.type === 'QUEUE_DELAY' ? s.scaling.queueDelay : s.scaling.requestCount;
  const allowed = (g: NonNullable<EndpointSpec['gpu']>) => [
    ...g.pools.flatMap((p) => poolTypes(p) ?? []),
    ...(g.pools.includes(OTHER_POOL) ? new Set(hostModels) : []),
  ].filter((t) => !g.excludedTypes.includes(t));
  const gpuTypeIds = s.gpuTypePriority?.length ? s.gpuTypePriority : s.gpu ? allowed(s.gpu) : [];
  return {
    id: row.id, name: s.name, templateId: s.templateId, type: s.type === 'QUEUE' ? 'QB' : 'LB',
    computeType: s.gpu ? 'GPU' : 'CPU',
    gpuTypeIds, gpuCount: s.gpu?.count ?? 0,
    cpuFlavorIds: s.cpu ? [...new Set(s.cpu.map((c) => c.id))] : [], vcpuCount: s.cpu?.[0]?.vcpuCount ?? 0,
    allowedCudaVersions: s.gpu?.allowedCudaVersions ?? [],
    workersMin: s.workers.min, workersMax: s.workers.max, idleTimeout: s.workers.idleTimeout,
    scalerType: s.scaling.type, scalerValue, executionTimeoutMs: s.timeout, flashboot: s.flashboot !== 'OFF',
    dataCenterIds: s.dataCenterIds, networkVolumeId: s.mounts.network[0] ?? null, createdAt: new Date(row.createdAt).toISOString(),
  };
}

export function legacyRoutes(s: ApiServices): RouteDef[] {
  const hostModels = (): string[] => s.inventory().filter((g) => g.gpuTypeId === null).map((g) => g.name);
  return [
    {
      method: 'POST', path: '/v1/endpoints', operationId: 'createEndpointV1', summary: 'Older REST create', tag: 'Older REST API',
      auth: 'user', scope: 'endpoints:write', body: 'json', requestSchema: 'LegacyEndpointCreate', successStatus: 201, responseSchema: 'LegacyEndpoint',
      problems: [400, 401, 403, 404, 413, 415, 422, 429],
      handle: ({ principal, body }) => {
        requireAdminForHostCommand(s, principal, 'creating an endpoint');
        const b = withShapeHints(() => assertWithTimeoutHint<LegacyBody>('LegacyEndpointCreate', body, 'executionTimeoutMs'), body);
        const v2 = toV2(b, hostModels());
        let row: ResourceRow<EndpointSpec>;
        try {
          row = s.endpoints.create(principal.ownerId, v2, {
            commandByAdmin: principal.scopes.has('admin'),
            ...(b.computeType !== 'CPU' && b.gpuTypeIds ? { gpuTypePriority: b.gpuTypeIds } : {}),
          });
        } catch (err) {
          throw toV1Error(err);
        }
        return { status: 201, body: legacyView(row, hostModels()) };
      },
    },
    {
      method: 'GET', path: '/v1/endpoints', operationId: 'listEndpointsV1', summary: 'Older REST list', tag: 'Older REST API',
      auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'LegacyEndpoint', responseIsArray: true, problems: [401, 403, 429],
      handle: ({ principal }) => ({ status: 200, body: s.endpoints.list(principal.ownerId).map((row) => legacyView(row, hostModels())) }),
    },
    {
      method: 'GET', path: '/v1/endpoints/{endpointId}', operationId: 'getEndpointV1', summary: 'Older REST get', tag: 'Older REST API',
      auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'LegacyEndpoint', problems: [401, 403, 404, 429],
      handle: ({ principal, params }) => ({ status: 200, body: legacyView(s.endpoints.get(principal.ownerId, params['endpointId'] as string), hostModels()) }),
    },
  ];
}
