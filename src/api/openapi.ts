/**
 * The OpenAPI 3.1 document, generated from the route table and the same `schema/` documents
 * that validate requests, so it cannot drift from what is served.
 */
import { SCHEMA_DOCUMENTS } from '../core/schemas.js';
import type { RouteDef } from './route.js';

const STATUS_TEXT: Record<number, string> = {
  400: 'Malformed or conflicting request', 401: 'Missing, malformed, expired, revoked or unknown token', 403: 'Token lacks access to the resource or action',
  404: 'Not found or not accessible', 405: 'Method not allowed', 409: 'Conflict with the current state', 410: 'Gone', 413: 'Body too large',
  415: 'Body is not JSON, or is compressed (Content-Encoding)', 422: 'Valid syntax, failed validation', 429: 'Rate limit exceeded (Retry-After in seconds)', 500: 'Internal error',
  503: 'Shutting down, or the database could not be written (a full disk, an I/O error: Retry-After in seconds); nothing was changed',
};

/** Rewrites `#/$defs/X` and `file.schema.json#/$defs/X` into `#/components/schemas/X`. */
function rewriteRefs(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(rewriteRefs);
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      if (k === '$ref' && typeof v === 'string') out[k] = `#/components/schemas/${v.slice(v.lastIndexOf('/') + 1)}`;
      else out[k] = rewriteRefs(v);
    }
    return out;
  }
  return value;
}

export function buildOpenApi(routes: readonly RouteDef[], version: string): Record<string, unknown> {
  const schemas: Record<string, unknown> = {};
  for (const doc of Object.values(SCHEMA_DOCUMENTS)) {
    for (const [name, schema] of Object.entries(doc.$defs)) schemas[name] = rewriteRefs(schema);
  }
  const paths: Record<string, Record<string, unknown>> = {};
  for (const r of routes) {
    const params = [...r.path.matchAll(/\{(\w+)\}/g)].map((m) => ({ name: m[1], in: 'path', required: true, schema: { type: 'string' } }));
    const query = (r.query ?? []).map((q) => ({ name: q.name, in: 'query', required: false, description: q.description, schema: q.schema }));
    const responses: Record<string, unknown> = {};
    const ref = r.responseSchema ? { $ref: `#/components/schemas/${r.responseSchema}` } : undefined;
    responses[String(r.successStatus)] = ref
      ? { description: 'Success', content: { 'application/json': { schema: r.responseIsArray ? { type: 'array', items: ref } : ref } } }
      : { description: 'Success, no body' };
    if (r.responseHeaders) (responses[String(r.successStatus)] as Record<string, unknown>)['headers'] = r.responseHeaders;
    // Any route may meet a failure, a shutdown or a disk it cannot write.
    for (const status of [...new Set([...r.problems, 500, 503])].sort()) {
      // A strict route says in its 400 that a parameter it does not list is refused, not ignored.
      const strict = status === 400 && r.strictQuery ? `, or a query parameter other than ${(r.query ?? []).map((q) => q.name).join(', ')}` : '';
      responses[String(status)] = {
        description: (STATUS_TEXT[status] ?? 'Error') + strict,
        content: { 'application/problem+json': { schema: { $ref: '#/components/schemas/Problem' } } },
      };
    }
    const op: Record<string, unknown> = {
      operationId: r.operationId,
      summary: r.summary,
      tags: [r.tag],
      parameters: [...params, ...query],
      responses,
      security: r.auth === 'none' ? [] : [{ bearerAuth: [] }],
    };
    if (r.scope) op['x-scope'] = r.scope;
    if (r.requestSchema) {
      op['requestBody'] = { required: r.body === 'json', content: { 'application/json': { schema: { $ref: `#/components/schemas/${r.requestSchema}` } } } };
    }
    (paths[r.path] ??= {})[r.method.toLowerCase()] = op;
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'flashd',
      version: '2.0.0',
      description: `Self-hosted serverless GPU endpoints (flashd ${version}). Management API under /v2, older REST under /v1, queue jobs under /v2/{endpoint_id}. Errors are application/problem+json.`,
    },
    jsonSchemaDialect: 'https://json-schema.org/draft/2020-12/schema',
    paths,
    components: {
      schemas,
      securitySchemes: {
        bearerAuth: { type: 'http', scheme: 'bearer', description: 'Authorization: Bearer <API key or session token>. Queue and worker routes also accept the raw key without "Bearer ".' },
      },
    },
  };
}
