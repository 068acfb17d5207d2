/**
 * Assertions shared by the endpoint and API tests: a problem reply whose `errors` name a JSON
 * pointer, and small creators for the resources an endpoint can reference.
 */
import type { Test } from 'tap';
import { assertProblem, type Reply, type TestAgent } from './agent.js';

/** True when `entry` is about `pointer` itself or something below it (`/gpu` matches `/gpu/pools/0: …`). */
export function pointsAt(entry: string, pointer: string): boolean {
  if (!entry.startsWith(pointer)) return false;
  const next = entry.charAt(pointer.length);
  return next === ':' || next === '/';
}

/** A problem+json reply with `status` whose `errors` has an entry for `pointer`. */
export function assertErrorAt(t: Test, r: Reply, status: number, pointer: string, message?: string): void {
  assertProblem(t, r, status, message);
  const errors: unknown = r.json?.errors;
  t.ok(Array.isArray(errors), `errors[] present (${message ?? pointer})`);
  if (!Array.isArray(errors)) return;
  t.ok(errors.every((e) => typeof e === 'string' && /^\//.test(e)), `every error starts with a JSON pointer: ${JSON.stringify(errors)}`);
  t.ok(errors.some((e: string) => pointsAt(e, pointer)), `an error points at ${pointer}: ${JSON.stringify(errors)}`);
}

/** POST a body to /v2/serverless and return the reply. */
export function createEndpoint(a: TestAgent, body: unknown, key?: string | null): Promise<Reply> {
  return a.req('POST', '/v2/serverless', key === undefined ? { body } : { body, key });
}

/** Creates an endpoint and fails the test unless it is a 201; returns the Endpoint object. */
export async function mustCreate(t: Test, a: TestAgent, body: unknown, key?: string): Promise<any> {
  const r = await createEndpoint(a, body, key);
  t.equal(r.status, 201, `create: ${r.text.slice(0, 400)}`);
  return r.json;
}

export async function mustPost(t: Test, a: TestAgent, path: string, body: unknown, key?: string): Promise<any> {
  const r = await a.req('POST', path, key === undefined ? { body } : { body, key });
  t.equal(r.status, 201, `POST ${path}: ${r.text.slice(0, 400)}`);
  return r.json;
}

export const makeTemplate = (t: Test, a: TestAgent, body: Record<string, unknown>, key?: string): Promise<any> =>
  mustPost(t, a, '/v2/templates', { name: 'tpl', image: 'registry.local/tpl:1', isServerless: true, ...body }, key);

export const makeNetworkVolume = (t: Test, a: TestAgent, body: Record<string, unknown> = {}, key?: string): Promise<any> =>
  mustPost(t, a, '/v2/network-volumes', { name: 'nv', size: 10, ...body }, key);

export const makeGlobalVolume = (t: Test, a: TestAgent, body: Record<string, unknown> = {}, key?: string): Promise<any> =>
  mustPost(t, a, '/v2/global-volumes', { name: 'gv', size: 10, ...body }, key);

export const makeRegistry = (t: Test, a: TestAgent, body: Record<string, unknown> = {}, key?: string): Promise<any> =>
  mustPost(t, a, '/v2/registry-credentials', { name: 'reg', username: 'robot', password: 'pw-not-shown', ...body }, key);

/** A user with a key holding `scopes` (created by the admin), optionally in a team. */
export async function makeUser(t: Test, a: TestAgent, name: string, scopes: string[] = ['endpoints:read', 'endpoints:write', 'jobs:run', 'jobs:read']): Promise<{ id: string; key: string; keyId: string }> {
  const user = await mustPost(t, a, '/v2/users', { name });
  const key = await mustPost(t, a, '/v2/api-keys', { name: `${name}-key`, scopes, userId: user.id });
  return { id: user.id, key: key.key, keyId: key.id };
}
