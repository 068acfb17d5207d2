import type { AuthService, JobRateLimiter, RateLimiter } from '../auth/index.js';
import type { FailureStreak } from '../core/failure-streak.js';
import type { Logger } from '../core/logger.js';
import type { OutgoingReply, RouteDecision } from '../http/index.js';
import { catalogRoutes } from './catalog.js';
import { createDispatcher, type WorkerKeyMistake } from './dispatch.js';
import { identityRoutes } from './identity.js';
import { loadBalancerHosts } from './lb-host.js';
import { legacyRoutes } from './legacy.js';
import { managementRoutes } from './management.js';
import { buildOpenApi } from './openapi.js';
import { problemReply } from './problem.js';
import { AgentError } from '../core/errors.js';
import type { RouteDef } from './route.js';
import type { ApiServices } from './services.js';

export type { ApiServices, InventoryGpu } from './services.js';
export type { RouteDef } from './route.js';
export type { WorkerKeyMistake } from './dispatch.js';
export { buildOpenApi } from './openapi.js';
export { jobRoutes, type JobRouteServices } from './jobs.js';
export { workerRoutes, type WorkerRouteServices } from './worker.js';

export interface Api {
  routes: readonly RouteDef[];
  resolve(method: string, path: string, headers: Readonly<Record<string, string>>): RouteDecision;
  earlyError(kind: 'payload-too-large' | 'bad-request' | 'internal' | 'unavailable', detail: string, requestId: string): OutgoingReply;
}

export interface CreateApiOptions {
  services: ApiServices;
  rateLimiter: RateLimiter;
  /** Per-endpoint limits of the queue job routes. */
  jobRateLimiter: JobRateLimiter;
  auth: AuthService;
  log: Logger;
  /** Requests refused because the database could not be written are logged here (see DispatcherOptions). */
  storeFailures: FailureStreak;
  maxBodyBytes: number;
  /** Routes contributed by other components (queue, workers, logs). */
  extraRoutes?: readonly RouteDef[];
  /** See DispatcherOptions.onWorkerKeyMistake. */
  onWorkerKeyMistake?: (endpointId: string, workerId: string | undefined, kind: WorkerKeyMistake) => void;
}

const EARLY_CODES = { 'payload-too-large': 'PAYLOAD_TOO_LARGE', 'bad-request': 'BAD_REQUEST', internal: 'INTERNAL', unavailable: 'UNAVAILABLE' } as const;

export function createApi(options: CreateApiOptions): Api {
  const s = options.services;
  const routes: RouteDef[] = [
    {
      method: 'GET', path: '/healthz', operationId: 'healthz', summary: 'Liveness and readiness (no auth)', tag: 'Meta', auth: 'none',
      successStatus: 200, responseSchema: 'Healthz', problems: [],
      handle: () => ({ status: 200, body: { status: 'ok', version: s.version } }),
    },
    ...managementRoutes(s),
    ...catalogRoutes(s),
    ...identityRoutes(s),
    ...legacyRoutes(s),
    ...(options.extraRoutes ?? []),
  ];
  let openapi: string | undefined;
  routes.push({
    method: 'GET', path: '/v2/openapi.json', operationId: 'openapi', summary: 'This OpenAPI 3.1 document', tag: 'Meta', auth: 'none',
    successStatus: 200, responseSchema: null, problems: [],
    handle: () => {
      openapi ??= JSON.stringify(buildOpenApi(routes, s.version));
      return { status: 200, body: openapi };
    },
  });
  const resolve = createDispatcher({
    routes, auth: options.auth, rateLimiter: options.rateLimiter, jobRateLimiter: options.jobRateLimiter,
    endpointOwner: (id) => s.endpoints.byId(id)?.ownerId, log: options.log, storeFailures: options.storeFailures, maxBodyBytes: options.maxBodyBytes,
    ...(options.onWorkerKeyMistake ? { onWorkerKeyMistake: options.onWorkerKeyMistake } : {}),
    // A load-balancing endpoint's host: a 404 for any path, not flashd's own routes.
    hostHandler: loadBalancerHosts(s.urls, options.maxBodyBytes, (id) => s.endpoints.byId(id)?.data.type),
  });
  return {
    routes,
    resolve,
    earlyError: (kind, detail, requestId) =>
      problemReply(new AgentError(EARLY_CODES[kind], detail), requestId),
  };
}
