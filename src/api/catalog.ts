/** /v2/catalog/*: GPU types, CPU flavors, data centers and public templates. */
import { CPU_FLAVORS, GPU_TYPES, cudaVersionsFor, compareCuda } from '../catalog/index.js';
import { AgentError } from '../core/errors.js';
import { templateView } from '../endpoints/index.js';
import type { QueryParam, RouteDef } from './route.js';
import type { ApiServices, InventoryGpu } from './services.js';

function enumQuery(query: URLSearchParams, name: string, allowed: string[]): Set<string> {
  const values = query.getAll(name).flatMap((v) => v.split(',')).map((v) => v.trim()).filter(Boolean);
  const bad = values.filter((v) => !allowed.includes(v));
  if (bad.length) {
    throw new AgentError('VALIDATION_FAILED', `Unknown ${name} value ${bad.map((b) => JSON.stringify(b)).join(', ')}; allowed: ${allowed.join(', ')}.`, {
      errors: bad.map((b) => `?${name}: unknown value "${b}"`),
    });
  }
  return new Set(values);
}

function stock(available: number): 'HIGH' | 'MEDIUM' | 'LOW' | 'NONE' {
  return available === 0 ? 'NONE' : available <= 1 ? 'LOW' : available <= 3 ? 'MEDIUM' : 'HIGH';
}

/** A GPU's type id; a model the catalog does not know goes by its nvidia-smi name (pool OTHER). */
const typeOf = (g: InventoryGpu): string => g.gpuTypeId ?? g.name;

function count(gpus: readonly InventoryGpu[], typeId: string) {
  const mine = gpus.filter((g) => typeOf(g) === typeId);
  const available = mine.filter((g) => g.free).length;
  return { available, total: mine.length, stockStatus: stock(available) };
}

const include = (values: string): QueryParam => ({ name: 'include', description: `Extra data: ${values}.`, schema: { type: 'string', enum: [values] } });

export function catalogRoutes(s: ApiServices): RouteDef[] {
  return [
    {
      method: 'GET', path: '/v2/catalog/gpus', operationId: 'listGpuTypes', summary: 'GPU types with their serverless pool, memory and CUDA versions',
      tag: 'Catalog', auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'GpuType', responseIsArray: true,
      problems: [400, 401, 403, 429],
      query: [include('AVAILABILITY'), {
        name: 'product',
        description: 'SERVERLESS: only types serverless endpoints can get: those in a RunPod serverless pool, and those in none (pool null) that this host has, which flashd\'s pool OTHER reaches.',
        schema: { type: 'string', enum: ['SERVERLESS'] },
      }],
      handle: ({ req }) => {
        const inc = enumQuery(req.query, 'include', ['AVAILABILITY']);
        const product = enumQuery(req.query, 'product', ['SERVERLESS']);
        const gpus = s.inventory();
        // A type in no RunPod pool is serverless here through pool OTHER, but only this host's
        // count: listing every such type would offer cards no endpoint can get.
        const serverless = (t: (typeof GPU_TYPES)[number]) => t.pool !== null || gpus.some((g) => g.gpuTypeId === t.id);
        const items = GPU_TYPES.filter((t) => !product.has('SERVERLESS') || serverless(t)).map((t) => {
          // Installed drivers decide the CUDA versions once a GPU of this type is known.
          const hosts = [...new Set(gpus.filter((g) => g.gpuTypeId === t.id && g.cudaVersion).map((g) => g.cudaVersion as string))].sort(compareCuda);
          const out: Record<string, unknown> = {
            id: t.id, displayName: t.displayName, memoryInGb: t.memoryInGb, pool: t.pool,
            cudaVersions: hosts.length ? hosts : cudaVersionsFor(t),
          };
          if (inc.has('AVAILABILITY')) out['availability'] = count(gpus, t.id);
          return out;
        });
        return { status: 200, body: items };
      },
    },
    {
      method: 'GET', path: '/v2/catalog/cpus', operationId: 'listCpuFlavors', summary: 'CPU flavors with RAM per vCPU and vCPU counts',
      tag: 'Catalog', auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'CpuFlavor', responseIsArray: true,
      problems: [401, 403, 429],
      handle: () => ({ status: 200, body: CPU_FLAVORS.map((f) => ({ ...f, vcpuCounts: [...f.vcpuCounts] })) }),
    },
    {
      method: 'GET', path: '/v2/catalog/data-centers', operationId: 'listDataCenters', summary: "This installation's sites",
      tag: 'Catalog', auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'DataCenter', responseIsArray: true,
      problems: [400, 401, 403, 429], query: [include('GPU_AVAILABILITY')],
      handle: ({ req }) => {
        const inc = enumQuery(req.query, 'include', ['GPU_AVAILABILITY']);
        const gpus = s.inventory();
        const items = s.dataCenters().map((dc) => {
          const out: Record<string, unknown> = { id: dc.id, name: dc.name };
          if (inc.has('GPU_AVAILABILITY')) {
            const here = gpus.filter((g) => g.dataCenterId === dc.id);
            const types = [...new Set(here.map(typeOf))];
            out['gpuAvailability'] = types.map((gpuTypeId) => ({ gpuTypeId, ...count(here, gpuTypeId) }));
          }
          return out;
        });
        return { status: 200, body: items };
      },
    },
    {
      method: 'GET', path: '/v2/catalog/templates', operationId: 'listPublicTemplates', summary: 'Public templates any account can use',
      tag: 'Catalog', auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'Template', responseIsArray: true,
      problems: [401, 403, 429],
      handle: () => ({ status: 200, body: s.endpoints.templates.listPublic().map(templateView) }),
    },
  ];
}
