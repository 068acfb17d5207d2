/**
 * Request flow for every route: match (404/405) → authenticate (401) → rate limit (429) →
 * scope (403) → content type (415) and JSON (400) → handler → JSON reply. Any thrown value
 * becomes problem+json in `problemReply`, carrying the rate-limit headers already earned.
 * The steps up to scope, and the route's own `admit` check, need only the headers: when a body
 * is coming the server runs them (`RouteDecision.admit`) before reading it, so a request that
 * will be refused never has its body kept.
 * Rate limits: per user (minute/hour/day) for the management API, per endpoint and operation
 * group (10 s) for the queue job routes, none for worker routes and exempt keys.
 */
import { isUtf8 } from 'node:buffer';
import { JOB_RATE_WINDOW_SECONDS, requireScope, type AuthService, type JobRateGroup, type JobRateLimiter, type Principal, type RateLimiter } from '../auth/index.js';
import { pause } from '../core/abort.js';
import { AgentError, storageFailureCode } from '../core/errors.js';
import type { FailureStreak } from '../core/failure-streak.js';
import { checkKeyFormat } from '../core/key-format.js';
import type { Logger } from '../core/logger.js';
import type { IncomingRequest, OutgoingReply, RouteDecision } from '../http/index.js';
import { echoPath, problemReply, toAgentError } from './problem.js';
import { queryHint, type RouteDef } from './route.js';
import { Router } from './router.js';

export interface DispatcherOptions {
  routes: readonly RouteDef[];
  auth: AuthService;
  rateLimiter: RateLimiter;
  /** Per-endpoint limits of the routes with `jobRateGroup`. */
  jobRateLimiter: JobRateLimiter;
  /** The owner (user or team id) of an endpoint, or undefined when there is none. */
  endpointOwner(endpointId: string): string | undefined;
  log: Logger;
  /**
   * Where a request refused because the database could not be written (a 503: full disk, I/O
   * error) is logged: the first of a streak in full, then a count at most once a minute, so a
   * client retrying in a loop cannot flood the log. The store's own commit failures count there too.
   */
  storeFailures: FailureStreak;
  maxBodyBytes: number;
  /**
   * Told of a worker route refused with a 401 for a key that is not in flashd's format (no
   * `fd_` key, `foreign`) or for an Authorization header that is there but empty (`empty`):
   * runpod-python sends the `api_key` of a `~/.runpod/config.toml` in the image instead of
   * RUNPOD_AI_API_KEY, and "" when that file's `[default]` has none. `workerId` is the one in
   * the path. Never given the key.
   */
  onWorkerKeyMistake?: (endpointId: string, workerId: string | undefined, kind: WorkerKeyMistake) => void;
  /** A host-based handler (load-balancing endpoints) tried before the route table. */
  hostHandler?: (method: string, path: string, headers: Readonly<Record<string, string>>) => RouteDecision | undefined;
}

/** Shared empty header set of requests that earn no rate-limit headers (never written to). */
const NO_HEADERS: Record<string, string> = Object.freeze({}) as Record<string, string>;

/** The `window` problem member of a per-endpoint 429. */
const JOB_RATE_WINDOW = `${JOB_RATE_WINDOW_SECONDS}s`;

const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

export function isJsonContentType(value: string | undefined): boolean {
  return value !== undefined && JSON_TYPE.test(value.trim());
}

/**
 * What JSON.parse said about a body, without the piece of the body V8 quotes in some messages
 * (`Unexpected token 'S', "{"password":S…" is not valid JSON`): a body may hold a key or a
 * password, and error details are logged by clients and proxies. Messages that only give a
 * position are kept as they are.
 */
export function jsonSyntaxDetail(err: unknown): string {
  const message = err instanceof Error ? err.message : '';
  // "Unexpected non-whitespace character after JSON at position 13": a second value after the first.
  if (/ (?:in|after) JSON at position \d+(?: \(line \d+ column \d+\))?$/.test(message) || message === 'Unexpected end of JSON input') return message;
  return message.startsWith('Unexpected token') ? 'Unexpected token' : 'Syntax error';
}

/**
 * A body's text without a leading byte order mark (a file saved by Notepad, sent with curl
 * --data-binary @f), which RFC 8259 §8.1 allows a parser to ignore: JSON.parse said only
 * "Unexpected token" of it. One mark only.
 */
export function withoutBom(text: string): string {
  return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
}

/** What a worker refused with a 401 sent that its image may be the cause of. */
export type WorkerKeyMistake = 'foreign' | 'empty';

/**
 * `foreign` when the Authorization header holds a key that is not in flashd's format: not an
 * `fd_` key (a malformed one included) nor a session token (an operator's FLASHD_ADMIN_API_KEY is
 * foreign too, but it authenticates and is never refused); `empty` when the header is there with
 * nothing in it (no header at all, as a hand-written client sends, is neither).
 */
function workerKeyMistake(headers: Readonly<Record<string, string>>): WorkerKeyMistake | undefined {
  const raw = headers['authorization'];
  if (raw === undefined) return undefined;
  if (raw.trim() === '') return 'empty';
  const m = /^\s*(?:Bearer\s+)?(\S+)\s*$/i.exec(raw);
  return m !== null && !/^Bearer$/i.test(m[1] as string) && !(m[1] as string).startsWith('fds_') && checkKeyFormat(m[1] as string) === 'foreign' ? 'foreign' : undefined;
}

export function createDispatcher(options: DispatcherOptions): (method: string, path: string, headers: Readonly<Record<string, string>>) => RouteDecision {
  const router = new Router<RouteDef>();
  for (const r of options.routes) router.add(r.method, r.path, r);
  const { auth, rateLimiter, jobRateLimiter, endpointOwner, log, storeFailures } = options;

  /** One request of `group` for `endpointId`: its rate-limit headers, or a 429. */
  const takeJobRate = (endpointId: string, group: JobRateGroup): Record<string, string> => {
    const decision = jobRateLimiter.take(endpointId, group);
    if (!decision.allowed) {
      const { quota, operations } = decision.limit;
      throw new AgentError('RATE_LIMITED', `Rate limit exceeded for the "${group}" operations (${operations}) of endpoint ${endpointId}: ${quota} requests per ${JOB_RATE_WINDOW_SECONDS} s window. Retry after ${decision.retryAfter} s.`, {
        extensions: { window: JOB_RATE_WINDOW, endpointId, group, 'violated-policies': [group] },
        headers: decision.headers,
      });
    }
    return decision.headers;
  };

  /** One request of a user on the management windows: its rate-limit headers, or a 429. */
  const takeUserRate = (userId: string): Record<string, string> => {
    const decision = rateLimiter.take(userId);
    if (!decision.allowed && decision.violated) {
      const w = decision.violated.window;
      throw new AgentError('RATE_LIMITED', `Rate limit exceeded for the "${w.name}" window (${w.quota} requests per ${w.seconds} s). Retry after ${decision.violated.retryAfter} s.`, {
        extensions: { window: w.name, 'violated-policies': [w.name] },
        headers: decision.headers,
      });
    }
    return decision.headers;
  };

  /** 403 unless the credential may call the route: worker keys only worker routes, and the route's scope. */
  const authorize = (route: RouteDef, principal: Principal): void => {
    if (route.auth === 'worker') {
      if (!principal.scopes.has('worker') && !principal.scopes.has('admin')) {
        throw new AgentError('FORBIDDEN', 'This route is for worker keys.');
      }
    } else if (principal.scopes.has('worker')) {
      throw new AgentError('FORBIDDEN', 'Worker keys can only take jobs and post results for their endpoint.');
    }
    if (route.scope) requireScope(principal, route.scope);
  };

  // Read once: a refusal checks a boolean, and builds the debug line's fields only when it is on.
  const debug = log.debugEnabled;
  /**
   * The problem reply for `err`. With --log-level debug, a 401 or 403 (and any 4xx of a worker
   * route: a stale attempt, another endpoint's or worker's job) is logged with the reason and
   * the public id of the key when known: never the key itself or a header.
   */
  const fail = (err: unknown, req: IncomingRequest, headers: Record<string, string> = {}, route?: RouteDef, principal?: Principal, params?: Readonly<Record<string, string>>): OutgoingReply => {
    const e = toAgentError(err);
    if (e.status >= 500) {
      const cause = e.cause ?? e;
      if (e.code === 'UNAVAILABLE' && storageFailureCode(cause)) storeFailures.fail(cause, { requestId: req.id, method: req.method, path: req.path });
      else log.error('request failed', { err: cause, requestId: req.id, method: req.method, path: req.path });
    } else if (debug && (e.status === 401 || e.status === 403 || (route?.auth === 'worker' && e.status >= 400))) {
      log.debug(route?.auth === 'worker' ? 'worker request refused' : 'request refused', {
        status: e.status, code: e.code, method: req.method, path: req.path, keyId: principal?.keyId, ...e.logFields, reason: e.message, requestId: req.id,
      });
    }
    return problemReply(e, req.id, headers, params);
  };

  const staticError = (err: AgentError, headers: Record<string, string> = {}): RouteDecision => ({
    maxBodyBytes: options.maxBodyBytes,
    handle: (req) => problemReply(err, req.id, headers),
  });

  return (method, path, headers) => {
    const viaHost = options.hostHandler?.(method, path, headers);
    if (viaHost) return viaHost;
    const { match, allowed, emptyParam } = router.find(method, path);
    if (emptyParam !== undefined) {
      // endpointId → "endpoint id": the path's own word for it, so the reply names the real cause.
      const what = emptyParam.replace(/([a-z])([A-Z])/g, '$1 $2').toLowerCase();
      return staticError(new AgentError('ROUTE_NOT_FOUND', `The ${what} in the path is empty (${method} ${echoPath(path)}): was the variable that should hold it unset?`));
    }
    if (!match) {
      if (allowed) {
        // HEAD is served wherever GET is (router.ts), unless that GET refuses it (RFC 9110 §10.2.1: Allow lists them all).
        if (allowed.includes('GET') && router.find('GET', path).match?.route.headRefused === undefined) allowed.push('HEAD');
        return staticError(new AgentError('METHOD_NOT_ALLOWED', `${method} is not allowed on ${echoPath(path)}; allowed: ${allowed.join(', ')}.`), { allow: allowed.join(', ') });
      }
      // A near miss (`/runSync`, `/v2/serverless/{id}/run`) names the route meant.
      const meant = router.suggest(method, path);
      return staticError(new AgentError('ROUTE_NOT_FOUND', `No route for ${method} ${echoPath(path)}${meant === undefined ? '.' : `; did you mean ${method} ${echoPath(meant)}?`}`));
    }
    const route = match.route;
    if (method === 'HEAD' && route.headRefused !== undefined) {
      // No route takes OPTIONS: this lists the methods the path has.
      const others = router.find('OPTIONS', path).allowed ?? [route.method];
      return staticError(new AgentError('METHOD_NOT_ALLOWED', `HEAD is not allowed on ${echoPath(path)}: a GET there ${route.headRefused}, which a reply without a body would lose; allowed: ${others.join(', ')}.`), { allow: others.join(', ') });
    }
    const maxBodyBytes = route.maxBodyBytes ?? options.maxBodyBytes;
    const onTooLarge = route.onTooLarge;
    // What the headers alone decide (authenticate, rate limit, scope, route.admit): run by the
    // server before the body is read when one is coming (RouteDecision.admit), else by handle().
    let principal: Principal | undefined;
    let rateHeaders: Record<string, string> = NO_HEADERS;
    let refused: unknown;
    let gated = false;
    /** False when the request is refused (`refused` holds why). */
    const gate = (req: IncomingRequest): boolean => {
      gated = true;
      try {
        let authorized = false;
        if (route.auth !== 'none') {
          principal = auth.authenticate(req.headers);
          if (!principal.exempt && !route.skipRateLimit) {
            const group = route.jobRateGroup;
            const endpointId = group === undefined ? undefined : match.params['endpointId'];
            // Job routes: RunPod's per-endpoint quotas, not the management API's per-user ones.
            if (group !== undefined && endpointId !== undefined && endpointOwner(endpointId) === principal.ownerId) {
              if (jobRateLimiter.enabled) {
                // Every key of the account shares the endpoint's quota: one that may not make
                // this call (a jobs:read key, a worker key from a worker's environment) gets
                // its 403 without spending it, or it could lock the others out of /run or
                // /purge-queue. The reply still reports the quota.
                try {
                  authorize(route, principal);
                } catch (err) {
                  rateHeaders = jobRateLimiter.peek(endpointId, group);
                  throw err;
                }
                authorized = true;
                rateHeaders = takeJobRate(endpointId, group);
              }
            } else {
              rateHeaders = takeUserRate(principal.userId);
            }
          }
          if (!authorized) authorize(route, principal);
        }
        route.admit?.({ req, params: match.params, principal: principal as Principal });
        return true;
      } catch (err) {
        refused = err;
        const endpointId = match.params['endpointId'];
        if (route.auth === 'worker' && endpointId !== undefined && options.onWorkerKeyMistake && toAgentError(err).status === 401) {
          const mistake = workerKeyMistake(req.headers);
          if (mistake !== undefined) options.onWorkerKeyMistake(endpointId, match.params['workerId'], mistake);
        }
        return false;
      }
    };
    return {
      maxBodyBytes,
      ...(onTooLarge ? {
        tooLarge: async (req: IncomingRequest) => {
          try {
            const principal = auth.authenticate(req.headers);
            if (route.auth !== 'worker' || principal.scopes.has('worker') || principal.scopes.has('admin')) {
              await onTooLarge({ req, params: match.params, principal }, maxBodyBytes);
            }
          } catch (err) {
            // Not allowed to act on it (bad key, another endpoint's worker): the 413 alone.
            if (toAgentError(err).status >= 500) log.error('too-large hook failed', { err, requestId: req.id });
          }
          return problemReply(new AgentError('PAYLOAD_TOO_LARGE', `The request body is larger than the ${maxBodyBytes} bytes this route accepts.`), req.id);
        },
      } : {}),
      // Not for a route whose errors wait (job-take): an early reply would skip the wait, and a
      // worker re-polling at once would spin. Its body (none is expected) is at most maxBodyBytes.
      ...((route.auth === 'none' && !route.admit) || route.holdErrorsMs ? {} : { admit: (req: IncomingRequest) => (gate(req) ? undefined : fail(refused, req, rateHeaders, route, principal, match.params)) }),
      handle: async (req) => {
        try {
          if (!gated) gate(req);
          if (refused !== undefined) throw refused;
          let body: unknown;
          let bodyText: string | undefined;
          if (route.body !== undefined) {
            const hasBody = req.body.length > 0;
            // A compressed body would be read as JSON text and refused as "not UTF-8" (gzip) or
            // as a syntax error; one labelled compressed but sent plain would be taken as it is.
            // flashd decodes no content coding: 415 saying so (RFC 9110 §15.5.16).
            const coding = req.headers['content-encoding'];
            if (hasBody && coding !== undefined && !/^\s*(?:identity\s*)?$/i.test(coding)) {
              throw new AgentError('UNSUPPORTED_MEDIA_TYPE', `Content-Encoding ${JSON.stringify(coding)} is not supported: send the body uncompressed, without a Content-Encoding header.`, {
                headers: { 'accept-encoding': 'identity' },
              });
            }
            if (route.body === 'json' && !isJsonContentType(req.headers['content-type'])) {
              const type = req.headers['content-type'];
              // curl -d without a Content-Type header sends this one: name the header to add.
              const curl = type !== undefined && /^\s*application\/x-www-form-urlencoded\s*(;|$)/i.test(type) ? ", what curl -d sends unless given -H 'Content-Type: application/json'" : '';
              throw new AgentError('UNSUPPORTED_MEDIA_TYPE', `Send the body as application/json (got ${type ? JSON.stringify(type) : 'no Content-Type'}${curl}).`);
            }
            if (route.body === 'json' && !hasBody) throw new AgentError('BAD_REQUEST', 'A JSON request body is required.');
            if (hasBody && route.body !== 'raw') {
              // JSON is UTF-8 (RFC 8259 §8.1): other bytes would be stored as U+FFFD, silently.
              if (!isUtf8(req.body)) throw new AgentError('INVALID_JSON', 'The body is not valid JSON: it is not UTF-8 text.');
              bodyText = withoutBom(req.body.toString('utf8'));
              try {
                body = JSON.parse(bodyText);
              } catch (err) {
                throw new AgentError('INVALID_JSON', `The body is not valid JSON: ${jsonSyntaxDetail(err)}.`);
              }
            }
          }
          const result = await route.handle({ req, params: match.params, principal: principal as Principal, body, bodyText });
          if (result.reply) {
            if (rateHeaders !== NO_HEADERS) result.reply.headers = { ...rateHeaders, ...result.reply.headers };
            return result.reply;
          }
          const headers: Record<string, string> = rateHeaders === NO_HEADERS && result.headers ? result.headers : { ...rateHeaders, ...result.headers };
          // A job route ignores parameters it does not know; a near miss of one it takes is said.
          const hint = route.jobRateGroup !== undefined && route.query !== undefined && route.strictQuery === undefined && req.query.size > 0 ? queryHint(req.query, route.query) : undefined;
          if (hint !== undefined) headers['flashd-hint'] = hint;
          if (result.body === undefined) return { status: result.status, headers };
          headers['content-type'] ??= 'application/json';
          return { status: result.status, headers, body: typeof result.body === 'string' ? result.body : JSON.stringify(result.body) };
        } catch (err) {
          const reply = fail(err, req, rateHeaders, route, principal, match.params);
          if (route.holdErrorsMs && !req.cancel.aborted) await pause(route.holdErrorsMs, req.cancel);
          return reply;
        }
      },
    };
  };
}
