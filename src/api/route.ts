import type { JobRateGroup, Principal, Scope } from '../auth/index.js';
import type { IncomingRequest, OutgoingReply } from '../http/index.js';
import { closestName } from '../core/names.js';
import { echoId } from './problem.js';

export interface QueryParam {
  name: string;
  description: string;
  schema: Record<string, unknown>;
}

/**
 * Headers of a reply that carries a credential (a new API key, a worker key, a session token):
 * no cache or proxy keeps a copy, and a browser's back button does not show it again.
 */
export const NO_STORE: Readonly<Record<string, string>> = Object.freeze({ 'cache-control': 'no-store' });

export interface ApiContext {
  req: IncomingRequest;
  params: Record<string, string>;
  /** Present on every route whose `auth` is not `none`. */
  principal: Principal;
  /** Parsed JSON body (routes with `body: 'json'`), or undefined. */
  body: unknown;
  /** The text `body` was parsed from, for slicing raw members out of it (core/json-raw.ts). */
  bodyText?: string | undefined;
}

export interface ApiResult {
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
  /** A reply built by hand (streams, non-JSON bodies). */
  reply?: OutgoingReply;
}

/** One served route: the router, the dispatcher and the OpenAPI document all read this. */
export interface RouteDef {
  method: 'GET' | 'POST' | 'PATCH' | 'PUT' | 'DELETE';
  path: string;
  operationId: string;
  summary: string;
  tag: string;
  /** `none`: public. `user`: API key or session. `worker`: worker key of the endpoint and worker id in the path (or an admin). */
  auth: 'none' | 'user' | 'worker';
  scope?: Scope;
  /**
   * `json`: the body must be JSON (415 otherwise). `raw`: any content type, parsed as JSON anyway.
   * Left out: a body sent is read (up to maxBodyBytes) and dropped unparsed.
   */
  body?: 'json' | 'raw';
  /** Schema component that documents the body (validation happens in the domain). */
  requestSchema?: string;
  successStatus: number;
  /** Schema component of the success body; null for no body. */
  responseSchema: string | null;
  /** Wrap responseSchema as an array in the document. */
  responseIsArray?: boolean;
  /** Headers of the success reply, for the document. */
  responseHeaders?: Record<string, { description: string; schema: Record<string, unknown> }>;
  problems: number[];
  query?: readonly QueryParam[];
  /**
   * A query parameter not in `query` is a 400 (the handler checks it with unknownQuery), and the
   * document's 400 says so. Without it unknown parameters are ignored: the queue job API and the
   * worker protocol must be, since RunPod clients send parameters flashd does not know.
   */
  strictQuery?: true;
  maxBodyBytes?: number;
  /**
   * What a `GET` here changes ("hands a job to the worker"): `HEAD`, which otherwise takes the
   * `GET` route, gets 405 saying so, instead of running it and dropping the body.
   */
  headRefused?: string;
  /** Requests that do not count against or report rate limits (worker protocol). */
  skipRateLimit?: boolean;
  /**
   * Queue job routes (path parameter `endpointId`): limited per endpoint with RunPod's quota
   * of this operation group (auth/job-rate-limit.ts) instead of the per-user windows. A request
   * for an endpoint the caller does not own (a 404 to come) counts per user as before.
   */
  jobRateGroup?: JobRateGroup;
  /**
   * A long-poll a worker repeats at once on any error (runpod-python re-polls job-take at once
   * on every status ≥ 400): its error replies wait this long, so a worker with a revoked key or
   * a deleted endpoint polls about once per hold instead of in a tight loop.
   */
  holdErrorsMs?: number;
  /**
   * A synchronous check of what the headers and path alone decide (the endpoint exists and is
   * the caller's, the worker key is this worker's): it runs after authentication and scope,
   * before any byte of the body is read, so a request that will be refused never has its body
   * buffered. It throws the refusal; the handler still checks again once the body is in.
   */
  admit?(ctx: Omit<ApiContext, 'body' | 'bodyText'>): void;
  handle(ctx: ApiContext): ApiResult | Promise<ApiResult>;
  /**
   * Runs, authenticated, when the body is over `maxBodyBytes` (no body is read), before the 413:
   * a worker's result too large to take fails its job at once instead of being lost.
   */
  onTooLarge?(ctx: Omit<ApiContext, 'body' | 'bodyText'>, limit: number): void | Promise<void>;
}

/** How many unknown query parameters unknownQuery names; the rest are counted. */
const UNKNOWN_QUERY_NAMED = 5;

/**
 * The errors[] entries for the query parameters of a `strictQuery` route that are not in
 * `accepted`: each name once, in the order given (at most UNKNOWN_QUERY_NAMED, then a count), a
 * name that is no plain word quoted as JSON and cut as ids are; `hints` adds a word for a name
 * another tool uses (Docker's `tail`). Empty when every parameter is known.
 */
export function unknownQuery(query: URLSearchParams, accepted: readonly QueryParam[], hints: Readonly<Record<string, string>> = {}): string[] {
  const known = new Set(accepted.map((q) => q.name));
  const names = [...new Set([...query.keys()])].filter((n) => !known.has(n));
  if (names.length === 0) return [];
  const list = accepted.map((q) => q.name);
  const takes = `this route takes ${list.length > 1 ? `${list.slice(0, -1).join(', ')} and ${list[list.length - 1]}` : list.join('')}`;
  const shown = (n: string): string => {
    const cut = echoId(n);
    return /^[A-Za-z0-9_.\-]+$/.test(n) ? cut : JSON.stringify(cut);
  };
  const errors = names.slice(0, UNKNOWN_QUERY_NAMED).map((n) => `?${shown(n)}: unknown parameter${Object.hasOwn(hints, n) ? ` (${hints[n]})` : ''}; ${takes}`);
  if (names.length > UNKNOWN_QUERY_NAMED) errors.push(`${names.length - UNKNOWN_QUERY_NAMED} more unknown parameters; ${takes}`);
  return errors;
}

/**
 * A `Flashd-Hint` header for a lenient route (the queue job API) given a query parameter it does
 * not take that nearly names one it does (`?wiat=5000`, `?wait_ms=`, `?Wait=`, `?tll=`): the
 * request is still served as if the parameter were absent (RunPod clients may send parameters
 * flashd does not know), but the reply says it was ignored. Undefined when there is none. Only
 * plain names are echoed, so the header holds no control or non-ASCII characters.
 */
export function queryHint(query: URLSearchParams, accepted: readonly QueryParam[]): string | undefined {
  if (accepted.length === 0) return undefined;
  const known = accepted.map((q) => q.name);
  const hints: string[] = [];
  for (const name of new Set(query.keys())) {
    if (known.includes(name) || !/^[A-Za-z0-9_.\-]{1,64}$/.test(name)) continue;
    const meant = closestName(name, known);
    if (meant !== undefined) hints.push(`?${name} is no parameter of this route and was ignored; did you mean ?${meant}?`);
    if (hints.length === 3) break;
  }
  return hints.length === 0 ? undefined : hints.join(' ');
}

