/** /v2/serverless, /v2/templates, /v2/network-volumes, /v2/global-volumes, /v2/registry-credentials. */
import type { Principal } from '../auth/index.js';
import { AgentError } from '../core/errors.js';
import type { ResourceRepo, ResourceRow } from '../store/index.js';
import {
  endpointView, globalVolumeView, LAUNCH_REASONS, networkVolumeView, registryView, templateView,
} from '../endpoints/index.js';
import type { RouteDef } from './route.js';
import type { ApiServices } from './services.js';

/**
 * With the process runtime an endpoint's command runs on the host as flashd's user, which can
 * read the data directory (admin-api-key, secret.key, flashd.db): `endpoints:write` there would
 * be admin in all but name. So creating an endpoint (`what` 'creating an endpoint') or changing
 * what it runs needs the admin scope; other runtimes keep the route's own scope.
 */
export function requireAdminForHostCommand(s: ApiServices, principal: Principal, what: string): void {
  if (!s.commandsRunOnHost || principal.scopes.has('admin')) return;
  throw new AgentError('FORBIDDEN',
    `With the process runtime, endpoint commands run on the host as flashd's user, so ${what} needs the "admin" scope, `
    + 'which the credential lacks; ask an admin, or run flashd with a container runtime (--runtime docker).');
}

const READ = [401, 403, 404, 429];
const WRITE = [400, 401, 403, 404, 413, 415, 422, 429];

interface CrudSpec<T> {
  base: string;
  tag: string;
  noun: string;
  id: string;
  schema: string;
  repo: (s: ApiServices) => ResourceRepo<T>;
  view: (row: ResourceRow<T>) => Record<string, unknown>;
  create: (s: ApiServices, ownerId: string, body: unknown) => ResourceRow<T>;
  update: (s: ApiServices, ownerId: string, id: string, body: unknown) => ResourceRow<T>;
}

/** The same five operations for every referenced resource. */
function crudRoutes<T>(s: ApiServices, c: CrudSpec<T>): RouteDef[] {
  const one = `${c.base}/{${c.id}}`;
  const op = c.schema;
  return [
    {
      method: 'POST', path: c.base, operationId: `create${op}`, summary: `Create a ${c.noun}`, tag: c.tag, auth: 'user',
      scope: 'endpoints:write', body: 'json', requestSchema: `${op}Create`, successStatus: 201, responseSchema: op, problems: WRITE,
      handle: ({ principal, body }) => ({ status: 201, body: c.view(c.create(s, principal.ownerId, body)) }),
    },
    {
      method: 'GET', path: c.base, operationId: `list${op}s`, summary: `List ${c.noun}s`, tag: c.tag, auth: 'user',
      scope: 'endpoints:read', successStatus: 200, responseSchema: op, responseIsArray: true, problems: READ,
      handle: ({ principal }) => ({ status: 200, body: c.repo(s).list(principal.ownerId).map(c.view) }),
    },
    {
      method: 'GET', path: one, operationId: `get${op}`, summary: `Get a ${c.noun}`, tag: c.tag, auth: 'user',
      scope: 'endpoints:read', successStatus: 200, responseSchema: op, problems: READ,
      handle: ({ principal, params }) => ({ status: 200, body: c.view(s.endpoints.getOwned(c.repo(s), principal.ownerId, params[c.id] as string, c.noun)) }),
    },
    {
      method: 'PATCH', path: one, operationId: `update${op}`, summary: `Update a ${c.noun}`, tag: c.tag, auth: 'user',
      scope: 'endpoints:write', body: 'json', requestSchema: `${op}Update`, successStatus: 200, responseSchema: op, problems: WRITE,
      handle: ({ principal, params, body }) => ({ status: 200, body: c.view(c.update(s, principal.ownerId, params[c.id] as string, body)) }),
    },
    {
      method: 'DELETE', path: one, operationId: `delete${op}`, summary: `Delete a ${c.noun}`, tag: c.tag, auth: 'user',
      scope: 'endpoints:write', successStatus: 204, responseSchema: null, problems: [...READ, 409],
      handle: ({ principal, params }) => {
        s.endpoints.deleteResource(c.repo(s), principal.ownerId, params[c.id] as string, c.noun);
        return { status: 204 };
      },
    },
  ];
}

export function managementRoutes(s: ApiServices): RouteDef[] {
  const view = (row: Parameters<typeof endpointView>[0]) => endpointView(row, s.urls, s.containerRuntime, s.commandsRunOnHost);
  return [
    {
      method: 'POST', path: '/v2/serverless', operationId: 'createEndpoint', summary: 'Create a serverless endpoint', tag: 'Endpoints',
      auth: 'user', scope: 'endpoints:write', body: 'json', requestSchema: 'EndpointCreate', successStatus: 201, responseSchema: 'Endpoint',
      problems: WRITE,
      handle: ({ principal, body }) => {
        requireAdminForHostCommand(s, principal, 'creating an endpoint');
        return { status: 201, body: view(s.endpoints.create(principal.ownerId, body, { commandByAdmin: principal.scopes.has('admin') })) };
      },
    },
    {
      method: 'GET', path: '/v2/serverless', operationId: 'listEndpoints', summary: 'List serverless endpoints', tag: 'Endpoints',
      auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'Endpoint', responseIsArray: true, problems: READ,
      handle: ({ principal }) => ({ status: 200, body: s.endpoints.list(principal.ownerId).map(view) }),
    },
    {
      method: 'GET', path: '/v2/serverless/{endpointId}', operationId: 'getEndpoint', summary: 'Get a serverless endpoint', tag: 'Endpoints',
      auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'Endpoint', problems: READ,
      handle: ({ principal, params }) => ({ status: 200, body: view(s.endpoints.get(principal.ownerId, params['endpointId'] as string)) }),
    },
    {
      method: 'PATCH', path: '/v2/serverless/{endpointId}', operationId: 'updateEndpoint',
      summary: 'Update a serverless endpoint (pools and excludedTypes replace together; mount lists replace, [] detaches)', tag: 'Endpoints',
      auth: 'user', scope: 'endpoints:write', body: 'json', requestSchema: 'EndpointUpdate', successStatus: 200, responseSchema: 'EndpointUpdateResult',
      problems: WRITE,
      handle: ({ principal, params, body }) => {
        const { row, restartReasons } = s.endpoints.update(principal.ownerId, params['endpointId'] as string, body, principal.scopes.has('admin'), (reasons) => {
          const changed = reasons.filter((r) => LAUNCH_REASONS.has(r));
          if (changed.length) requireAdminForHostCommand(s, principal, `changing what an endpoint runs (this request changes ${changed.join(', ')})`);
        });
        return { status: 200, body: { ...view(row), restartRequired: restartReasons.length > 0, restartReasons } };
      },
    },
    {
      method: 'DELETE', path: '/v2/serverless/{endpointId}', operationId: 'deleteEndpoint',
      summary: 'Delete a serverless endpoint with its logs and job history, for good', tag: 'Endpoints',
      auth: 'user', scope: 'endpoints:write', successStatus: 204, responseSchema: null, problems: READ,
      handle: ({ principal, params }) => {
        s.endpoints.delete(principal.ownerId, params['endpointId'] as string);
        return { status: 204 };
      },
    },
    ...crudRoutes(s, {
      base: '/v2/templates', tag: 'Templates', noun: 'template', id: 'templateId', schema: 'Template',
      repo: (x) => x.endpoints.templates, view: templateView,
      create: (x, o, b) => x.endpoints.createTemplate(o, b), update: (x, o, i, b) => x.endpoints.updateTemplate(o, i, b),
    }),
    ...crudRoutes(s, {
      base: '/v2/network-volumes', tag: 'Volumes', noun: 'network volume', id: 'volumeId', schema: 'NetworkVolume',
      repo: (x) => x.endpoints.networkVolumes, view: networkVolumeView,
      create: (x, o, b) => x.endpoints.createNetworkVolume(o, b), update: (x, o, i, b) => x.endpoints.updateNetworkVolume(o, i, b),
    }),
    ...crudRoutes(s, {
      base: '/v2/global-volumes', tag: 'Volumes', noun: 'global volume', id: 'volumeId', schema: 'GlobalVolume',
      repo: (x) => x.endpoints.globalVolumes, view: globalVolumeView,
      create: (x, o, b) => x.endpoints.createGlobalVolume(o, b), update: (x, o, i, b) => x.endpoints.updateGlobalVolume(o, i, b),
    }),
    ...crudRoutes(s, {
      base: '/v2/registry-credentials', tag: 'Registry credentials', noun: 'registry credential', id: 'credentialId', schema: 'RegistryCredential',
      repo: (x) => x.endpoints.registries, view: registryView,
      create: (x, o, b) => x.endpoints.createRegistry(o, b), update: (x, o, i, b) => x.endpoints.updateRegistry(o, i, b),
    }),
  ];
}
