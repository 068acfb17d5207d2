/**
 * The worker protocol (RunPod-compatible; research/worker-protocol.md §0–§1) plus the admin
 * routes that hand out worker environments and serve endpoint logs.
 */
import type { AuthService, Principal } from '../auth/index.js';
import type { Logger } from '../core/logger.js';
import { AgentError } from '../core/errors.js';
import { newId } from '../core/ids.js';
import { nonFiniteToNull, rawMember } from '../core/json-raw.js';
import type { EndpointService } from '../endpoints/index.js';
import type { IncomingRequest, OutgoingReply } from '../http/index.js';
import { SDK_DEFAULT_ENV, workerEnv, workerJobBody, type DoneBody, type DoneOutcome, type JobQueue } from '../queue/index.js';
import type { LogLine } from '../store/index.js';
import type { LogHub } from '../scheduler/index.js';
import { jsonSyntaxDetail, withoutBom } from './dispatch.js';
import { echoId } from './problem.js';
import { NO_STORE, unknownQuery, type QueryParam, type RouteDef } from './route.js';

export interface WorkerRouteServices {
  queue: JobQueue;
  endpoints: EndpointService;
  auth: AuthService;
  /** Worker output: stored lines and followers of new ones. */
  logs: Pick<LogHub, 'readPage' | 'follow' | 'droppedAfter'>;
  /** queue_base_url as workers reach it. */
  baseUrl(): string;
  pingIntervalMs: number;
  /** A job failed for an oversized worker post is said here, at warn. */
  log: Logger;
}

const MB = 1024 * 1024;
const W = '/v2/{endpointId}';
/** How long a job-take's error reply waits (RouteDef.holdErrorsMs). */
export const POLL_ERROR_HOLD_MS = 1000;

/** The most characters of a ping's `check` or `reason` that are kept (runpod-python sends at most 256). */
export const REPORT_CHARS = 256;

/**
 * A ping's `check` or `reason` as flashd's log and the endpoint log show it: control characters
 * (a newline, an escape sequence) become a space, so it stays one line that cannot pass for
 * another, and at most REPORT_CHARS characters are kept.
 */
function reportText(value: string | null): string {
  const text = (value ?? '').replace(/[\u0000-\u001f\u007f-\u009f]+/g, ' ').trim();
  return Array.from(text).slice(0, REPORT_CHARS).join('').trimEnd();
}

/**
 * A worker key may act only for its own endpoint and as its own worker (the id in the path:
 * runpod-python puts RUNPOD_POD_ID there, the id the key was made for), so one worker's key
 * cannot take, renew, stop or post the jobs of another. Admins may act as any worker of the
 * endpoints they own.
 */
function checkWorker(s: WorkerRouteServices, principal: Principal, endpointId: string, workerId: string): void {
  const row = s.endpoints.byId(endpointId);
  if (principal.scopes.has('worker')) {
    if (principal.endpointId !== endpointId) throw new AgentError('FORBIDDEN', 'This worker key belongs to another endpoint.');
    if (!row) throw new AgentError('NOT_FOUND', `Endpoint ${endpointId} not found.`);
    if (principal.workerId !== workerId) {
      throw new AgentError('FORBIDDEN', principal.workerId === null
        ? 'This worker key is bound to no worker id, so it cannot act as any worker.'
        : `This worker key belongs to worker ${principal.workerId}, not to worker ${workerId} named in the path.`);
    }
  } else if (!row || row.ownerId !== principal.ownerId) {
    throw new AgentError('NOT_FOUND', `Endpoint ${endpointId} not found.`);
  }
}

/**
 * A result or stream chunk over the body limit: runpod-python drops it after the 413 and goes
 * on, so the job would run again after its lease and fail with a wrong reason. It fails now,
 * saying why, if this worker holds it (the same checks as any result post).
 */
async function failTooLarge(s: WorkerRouteServices, { req, principal, params }: { req: IncomingRequest; principal: Principal; params: Record<string, string> }, limit: number, what: string): Promise<void> {
  const endpointId = params['endpointId'] as string;
  checkWorker(s, principal, endpointId, params['workerId'] as string);
  const declared = Number(req.headers['content-length']);
  const known = Number.isFinite(declared) && declared > limit;
  const size = known ? `${declared} bytes` : `more than ${limit} bytes`;
  // A generator job's final post (isStream=true) is large only as the list of every yield, which
  // the SDKs send with return_aggregate_stream: its chunks went to /stream already.
  const aggregate = what === 'result' && req.query.get('isStream') === 'true';
  const error = aggregate
    ? `The worker's result (the list of its generator's yields, sent because return_aggregate_stream is on) was ${size}, over the ${limit}-byte limit of a worker post (HTTP 413): the result could not be stored, so the job failed; pass large data as a URL or a path instead, or turn return_aggregate_stream off: the yields were streamed and /stream still has those not read yet.`
    : `The worker's ${what} was ${size}, over the ${limit}-byte limit of a worker post (HTTP 413): the ${what} could not be stored, so the job failed; pass large data as a URL or a path instead.`;
  const jobId = params['jobId'] as string;
  const workerId = params['workerId'] as string;
  // Only the job's end is at debug: without this an operator sees nothing of why it failed.
  if (await s.queue.done(endpointId, workerId, jobId, { error }) === 'accepted') {
    s.log.warn('job failed: worker post over the limit', { jobId, endpointId, workerId, what, bytes: known ? declared : undefined, limit });
  }
}

/** The query parameters of the endpoint log; any other is a 400 (strictQuery). */
const LOG_QUERY: readonly QueryParam[] = [
  { name: 'since', description: 'Only lines with seq greater than this. When lines after it were already deleted (flashd keeps the newest 10,000 lines per endpoint), the reply says so in X-Logs-Dropped-Through.', schema: { type: 'integer', minimum: 0 } },
  { name: 'limit', description: 'At most this many lines (default 500, max 10000), and at most 16 MiB of line text as sent (UTF-8, JSON escapes included: a NUL is 6 bytes): the newest lines that fit, or with since the oldest after it (X-Logs-Truncated says when the 16 MiB cut it short).', schema: { type: 'integer', minimum: 1, maximum: 10000 } },
  { name: 'follow', description: 'true (or 1): keep the response open and stream new lines as NDJSON (with an empty line after 15 s without one, and at the start when there is none yet: skip empty lines); false (or 0), the default: a snapshot.', schema: { type: 'boolean' } },
];

/** A word beside an unknown log parameter that another tool uses for one flashd has. */
const LOG_QUERY_HINTS: Readonly<Record<string, string>> = { tail: 'for the last N lines, give ?limit=N' };

/** What a worker may post to job-done and to job-stream, for the detail of a refused body. */
const SEND = {
  result: 'Send a JSON object: {"output": …}, {"error": "…"} or a progress update {"status": "IN_PROGRESS", "output": …}.',
  'stream chunk': 'Send a JSON object: {"output": …}.',
} as const;

/** "an array", "a string", "null": what a JSON value that is not an object is. */
function jsonKind(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

/** Why a job-stream body without `output` is refused: empty, or the members it has (the first 5, names cut as ids are (echoId)). */
function noOutputDetail(raw: Buffer, body: DoneBody): string {
  const send = 'Send {"output": …} ({"output": null} for a null chunk); an error that ends the job goes to job-done as {"error": "…"}.';
  if (raw.length === 0) return `The stream chunk body is empty. ${send}`;
  const names = Object.keys(body);
  const shown = names.slice(0, 5).map((n) => JSON.stringify(echoId(n))).join(', ');
  const has = names.length === 0 ? 'none' : names.length > 5 ? `${shown} and ${names.length - 5} more` : shown;
  return `The stream chunk body has no "output" member (it has ${has}). ${send}`;
}

function parseRaw(body: Buffer, what: keyof typeof SEND): DoneBody {
  // runpod-python posts JSON as application/x-www-form-urlencoded: read the raw bytes as JSON.
  if (body.length === 0) return {};
  // A leading byte order mark is ignored, as on a client's body; the raw members (rawMember) are
  // sliced from this text, so their offsets leave it out too.
  let text = withoutBom(body.toString('utf8'));
  let parsed: unknown;
  let syntax: unknown;
  try {
    parsed = JSON.parse(text) as unknown;
  } catch (err) {
    syntax = err;
    // A Python worker's NaN or Infinity (json.dumps allows them): stored as null, as JavaScript would.
    const finite = nonFiniteToNull(text);
    try {
      if (finite !== undefined) {
        // A NaN or infinite `error` is truthy in Python, so the job failed: keep it as text.
        const error = rawMember(text, 'error');
        [parsed, text] = [JSON.parse(finite) as unknown, finite];
        if (error !== undefined && /^-?(?:NaN|Infinity)$/.test(error.trim()) && parsed !== null && typeof parsed === 'object') {
          (parsed as DoneBody).error = error.trim();
        }
        syntax = undefined;
      }
    } catch {
      // Invalid for another reason: refused below, with JSON.parse's first complaint.
    }
  }
  // Refused without touching the job: it stays with this worker, which may post again.
  if (syntax !== undefined) throw new AgentError('INVALID_JSON', `The ${what} body is not valid JSON: ${jsonSyntaxDetail(syntax)}. ${SEND[what]}`);
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new AgentError('INVALID_JSON', `The ${what} body must be a JSON object, not ${jsonKind(parsed)}. ${SEND[what].replace('Send a JSON object: ', 'Send ')}`);
  }
  const done = parsed as DoneBody;
  // The output as the worker sent it, so it is stored and served without re-serialising.
  if (done.output !== undefined) done.outputJson = rawMember(text, 'output');
  return done;
}

function outcomeReply(outcome: DoneOutcome, jobId: string): { status: number; body?: unknown } {
  switch (outcome) {
    case 'accepted':
      return { status: 200, body: { ok: true } };
    case 'duplicate':
      // A re-post of this worker's own result, already recorded (lost ack): nothing changes.
      return { status: 200, body: { ok: true, duplicate: true } };
    case 'finished':
      // A progress update or stream chunk after this worker's own result: the job is over, and it is not a re-post of that result.
      return { status: 200, body: { ok: true, discarded: true, reason: "the job already ended with this worker's result; a progress update or stream chunk posted after it is not kept" } };
    case 'ended':
      // flashd ended the job (cancel, timeout, attempts used up) while this worker held it: discarded, without an error on the worker's side.
      return { status: 200, body: { ok: true, discarded: true, reason: 'the job was already ended by flashd (cancelled, timed out, or failed after its attempts were used up)' } };
    case 'stale':
      throw new AgentError('STALE_ATTEMPT', `Job ${jobId} is no longer held by this worker (finished, cancelled, or reassigned); the result was discarded.`);
    case 'unknown':
      throw new AgentError('NOT_FOUND', `Job ${jobId} not found.`);
  }
}

const jobsReply = (jobs: { id: string; input: string; extra: string | null }[], batch: boolean): OutgoingReply | undefined => {
  if (!batch) {
    const job = jobs[0];
    return job ? { status: 200, headers: { 'content-type': 'application/json' }, body: workerJobBody(job) } : undefined;
  }
  return { status: 200, headers: { 'content-type': 'application/json' }, body: `[${jobs.map(workerJobBody).join(',')}]` };
};

/**
 * How often a log follow checks that the key that opened it is still good, besides at each line:
 * one revoked or expired while the endpoint prints nothing ends the stream within this.
 */
const FOLLOW_AUTH_CHECK_MS = 2000;
/** A log follow that wrote nothing for this long sends an empty line (readers skip them). */
const FOLLOW_KEEPALIVE_MS = 15_000;
const logView = (l: LogLine) => ({ seq: l.seq, at: new Date(l.at).toISOString(), workerId: l.workerId, stream: l.stream, line: l.line });

export function workerRoutes(s: WorkerRouteServices): RouteDef[] {
  const take = (batch: boolean): RouteDef => ({
    method: 'GET', path: `${W}/${batch ? 'job-take-batch' : 'job-take'}/{workerId}`, operationId: batch ? 'workerTakeBatch' : 'workerTake',
    summary: batch ? 'Worker: take up to ?batch_size jobs (long-poll; JSON array)' : 'Worker: take one job (long-poll; 204 when none arrived)',
    tag: 'Worker protocol', auth: 'worker', skipRateLimit: true, holdErrorsMs: POLL_ERROR_HOLD_MS, successStatus: 200, responseSchema: 'WorkerJob', responseIsArray: batch,
    headRefused: batch ? 'hands jobs to the worker' : 'hands a job to the worker',
    problems: [401, 403, 404],
    handle: async ({ req, principal, params }) => {
      const endpointId = params['endpointId'] as string;
      checkWorker(s, principal, endpointId, params['workerId'] as string);
      const size = batch ? Math.min(256, Math.max(1, Number(req.query.get('batch_size') ?? '1') || 1)) : 1;
      // The take may wait up to --take-hold-ms: a job that arrives after the key was revoked
      // (or expired) must not go to it. Each hand-out checks the key again (a cache hit).
      const stillAllowed = (): boolean => {
        try {
          return s.auth.authenticate(req.headers).keyId === principal.keyId;
        } catch {
          return false;
        }
      };
      const jobs = await s.queue.take(endpointId, params['workerId'] as string, size, req.cancel, stillAllowed, undefined, principal.keyId);
      // Refused during the hold: the 401 (revoked, expired) a new poll would get.
      if (jobs.length === 0 && !req.cancel.aborted) s.auth.authenticate(req.headers);
      const reply = jobsReply(jobs, batch);
      return reply ? { status: 200, reply } : { status: 204 };
    },
  });
  return [
    take(false),
    take(true),
    {
      method: 'POST', path: `${W}/job-done/{workerId}/{jobId}`, operationId: 'workerDone',
      summary: 'Worker: post a result or progress ({"status":"IN_PROGRESS"}); any content type, parsed as JSON',
      tag: 'Worker protocol', auth: 'worker', skipRateLimit: true, body: 'raw', successStatus: 200, responseSchema: null, problems: [400, 401, 403, 404, 409, 413, 415],
      maxBodyBytes: 64 * MB,
      onTooLarge: (ctx, limit) => failTooLarge(s, ctx, limit, 'result'),
      admit: ({ principal, params }) => checkWorker(s, principal, params['endpointId'] as string, params['workerId'] as string),
      handle: async ({ req, principal, params }) => {
        const endpointId = params['endpointId'] as string;
        checkWorker(s, principal, endpointId, params['workerId'] as string);
        const jobId = params['jobId'] as string;
        return outcomeReply(await s.queue.done(endpointId, params['workerId'] as string, jobId, parseRaw(req.body, 'result')), jobId);
      },
    },
    {
      method: 'POST', path: `${W}/job-stream/{workerId}/{jobId}`, operationId: 'workerStream', summary: 'Worker: post a stream chunk ({"output": …})',
      tag: 'Worker protocol', auth: 'worker', skipRateLimit: true, body: 'raw', successStatus: 200, responseSchema: null, problems: [400, 401, 403, 404, 409, 413, 415],
      maxBodyBytes: 64 * MB,
      onTooLarge: (ctx, limit) => failTooLarge(s, ctx, limit, 'stream chunk'),
      admit: ({ principal, params }) => checkWorker(s, principal, params['endpointId'] as string, params['workerId'] as string),
      handle: async ({ req, principal, params }) => {
        const endpointId = params['endpointId'] as string;
        checkWorker(s, principal, endpointId, params['workerId'] as string);
        const jobId = params['jobId'] as string;
        // `chunk`: the worker's number for this chunk (1, 2, …), so that a retried post is stored once.
        const chunkRaw = req.query.get('chunk');
        const chunk = chunkRaw !== null && /^[1-9][0-9]{0,14}$/.test(chunkRaw) ? Number(chunkRaw) : undefined;
        const body = parseRaw(req.body, 'stream chunk');
        // Every SDK posts a yield as {"output": v} ({"output": null} for None): a body without it is
        // a worker's bug (an error meant for job-done), refused rather than stored as a null chunk.
        if (!Object.hasOwn(body, 'output')) throw new AgentError('BAD_REQUEST', noOutputDetail(req.body, body));
        // Answered once the chunk is durable in SQLite (job_chunks).
        return outcomeReply(await s.queue.stream(endpointId, params['workerId'] as string, jobId, body, chunk), jobId);
      },
    },
    {
      method: 'GET', path: `${W}/job-stop/{workerId}`, operationId: 'workerStop', summary: 'Worker: jobs to stop (long-poll; 204 when none)',
      headRefused: 'hands out the jobs the worker must stop',
      tag: 'Worker protocol', auth: 'worker', skipRateLimit: true, successStatus: 200, responseSchema: 'JobsToStop', problems: [401, 403, 404],
      handle: async ({ req, principal, params }) => {
        const endpointId = params['endpointId'] as string;
        checkWorker(s, principal, endpointId, params['workerId'] as string);
        const ids = await s.queue.stopSignals(endpointId, params['workerId'] as string, req.signal, undefined, principal.keyId);
        // Answered early because the key was revoked (JobQueue.keyRevoked): the 401 a new poll would get.
        if (ids.length === 0 && !req.signal.aborted) s.auth.authenticate(req.headers);
        return ids.length ? { status: 200, body: { jobsToStop: ids } } : { status: 204 };
      },
    },
    {
      method: 'GET', path: `${W}/ping/{workerId}`, operationId: 'workerPing', summary: 'Worker: heartbeat listing the jobs it holds (?job_id=a,b); renews their leases',
      tag: 'Worker protocol', auth: 'worker', skipRateLimit: true, successStatus: 200, responseSchema: null, problems: [401, 403, 404],
      handle: ({ req, principal, params }) => {
        const endpointId = params['endpointId'] as string;
        checkWorker(s, principal, endpointId, params['workerId'] as string);
        const ids = (req.query.get('job_id') ?? '').split(',').map((x) => x.trim()).filter(Boolean);
        const unhealthy = req.query.get('status') === 'unhealthy'
          ? { check: reportText(req.query.get('check')), reason: reportText(req.query.get('reason')) }
          : undefined;
        s.queue.ping(endpointId, params['workerId'] as string, ids, unhealthy, principal.keyId);
        return { status: 200, body: { ok: true } };
      },
    },
    {
      method: 'GET', path: '/v2/serverless/{endpointId}/worker-env', operationId: 'workerEnv',
      headRefused: 'makes a new worker id and key',
      summary: 'Admin: a new worker id and key, and the environment an external worker needs', tag: 'Workers',
      auth: 'user', scope: 'admin', successStatus: 200, responseSchema: 'WorkerEnv', problems: [401, 403, 404, 409, 429],
      handle: ({ req, principal, params }) => {
        const ep = s.endpoints.get(principal.ownerId, params['endpointId'] as string);
        if (ep.data.type !== 'QUEUE') {
          // No key is made: it could only take jobs, and this endpoint has none.
          throw new AgentError('CONFLICT', `Endpoint ${ep.id} is a LOAD_BALANCER endpoint: its workers serve HTTP themselves (PORT, PORT_HEALTH, HEALTH_CHECK_PATH) and take no jobs from the queue, so there is no queue worker environment for it. flashd does not route load-balancing traffic yet.`);
        }
        const workerId = newId('wkr');
        const { key, row } = s.auth.createEnvWorkerKey(principal.userId, principal.teamId, ep.id, workerId, principal.keyId);
        const gpu = req.query.get('gpu') ?? (ep.data.gpu ? 'gpu' : 'cpu');
        return {
          status: 200,
          headers: { ...NO_STORE },
          body: { workerId, keyId: row.id, env: { ...SDK_DEFAULT_ENV, ...workerEnv({ baseUrl: s.baseUrl(), endpointId: ep.id, workerId, key, gpu, pingIntervalMs: s.pingIntervalMs }) } },
        };
      },
    },
    {
      method: 'GET', path: '/v2/serverless/{endpointId}/logs', operationId: 'endpointLogs',
      summary: "Workers' stdout/stderr: the last ?limit lines, or lines after ?since; ?follow=true streams new lines as NDJSON", tag: 'Workers',
      auth: 'user', scope: 'endpoints:read', successStatus: 200, responseSchema: 'LogLine', responseIsArray: true, problems: [400, 401, 403, 404, 429],
      strictQuery: true,
      query: LOG_QUERY,
      responseHeaders: {
        'X-Logs-Dropped-Through': {
          description: 'Only with ?since, when lines after it were deleted before they were read (the oldest beyond the 10,000 kept per endpoint): every line of the endpoint up to this seq is gone, so the reader missed some. The reply starts at the oldest line kept.',
          schema: { type: 'integer' },
        },
        'X-Logs-Truncated': {
          description: 'true when the 16 MiB cap on line text ended the reply before ?limit lines while more lines were there: with ?since, read on with since set to the last seq; without it, older lines were left out (read them with ?since). Not sent on a follow with ?since, which sends the rest.',
          schema: { type: 'string', enum: ['true'] },
        },
        'X-Accel-Buffering': {
          description: 'no, on a follow: tells nginx in front to pass the lines on as they come, even where proxy_buffering is on.',
          schema: { type: 'string', enum: ['no'] },
        },
      },
      handle: ({ req, principal, params }) => {
        const ep = s.endpoints.get(principal.ownerId, params['endpointId'] as string);
        const sinceRaw = req.query.get('since');
        const limitRaw = req.query.get('limit');
        const followRaw = req.query.get('follow');
        const errors: string[] = [];
        // Twice is ambiguous (`follow=true&follow=false` followed), as ?wait and ?ttl on the job routes.
        for (const name of ['since', 'limit', 'follow']) {
          const count = req.query.getAll(name).length;
          if (count > 1) errors.push(`?${name}: was given ${count} times; give it once`);
        }
        if (sinceRaw !== null && !/^\d+$/.test(sinceRaw)) errors.push('?since: must be a non-negative integer');
        if (limitRaw !== null && (!/^\d+$/.test(limitRaw) || Number(limitRaw) < 1 || Number(limitRaw) > 10_000)) errors.push('?limit: must be an integer from 1 to 10000');
        // Exactly these four, the error says which (curl users write 1; `TRUE` or `yes` are refused rather than guessed).
        if (followRaw !== null && !['true', 'false', '1', '0'].includes(followRaw)) errors.push('?follow: must be true, false, 1 or 0');
        // Docker's ?tail, a filter there is none of (?stream), a typo (?limt) got the default 500
        // lines with no hint; the routes RunPod clients call ignore unknown parameters instead.
        errors.push(...unknownQuery(req.query, LOG_QUERY, LOG_QUERY_HINTS));
        // The detail names only the parameters that are wrong, as every other validation error does.
        if (errors.length) throw new AgentError('VALIDATION_FAILED', `${errors.join('; ')}.`, { errors });
        const limit = limitRaw === null ? 500 : Number(limitRaw);
        const since = sinceRaw === null ? undefined : Number(sinceRaw);
        const page = s.logs.readPage(ep.id, since, limit);
        let lines = page.lines;
        const follows = followRaw === 'true' || followRaw === '1';
        // seq is shared by every endpoint: a reader cannot tell a gap from lines trimmed away.
        const dropped = since === undefined ? null : s.logs.droppedAfter(ep.id, since);
        const logHeaders: Record<string, string> = dropped === null ? {} : { 'x-logs-dropped-through': String(dropped) };
        // Fewer than ?limit lines because of the 16 MiB cap, with more there: a pager that stops
        // at a short page stopped at the first one. A follow from ?since sends the rest anyway.
        if (page.truncated && (!follows || since === undefined)) logHeaders['x-logs-truncated'] = 'true';
        if (!follows) return { status: 200, headers: logHeaders, body: lines.map(logView) };
        return {
          status: 200,
          reply: {
            status: 200,
            // X-Accel-Buffering: nginx in front (README "Behind a TLS proxy") passes the lines on as they
            // come even where proxy_buffering is on, its default; it drops the header itself.
            headers: { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store', 'x-accel-buffering': 'no', ...logHeaders },
            stream: (w) => {
              // The stream outlives the request's authentication: each new line is sent only
              // while the credential that opened it is still good (a key revoked or expired since,
              // a session of such a key, a team key whose user left the team end the stream).
              const stillAllowed = (): boolean => {
                try {
                  return s.auth.authenticate(req.headers).keyId === principal.keyId;
                } catch {
                  return false;
                }
              };
              // Checked at each line and every FOLLOW_AUTH_CHECK_MS: on an endpoint that prints
              // nothing more, a follow opened with a key revoked or expired since stayed open.
              // The same tick sends an empty line after FOLLOW_KEEPALIVE_MS without a write: a
              // proxy in front (nginx's proxy_read_timeout is 60 s) cut a quiet follow, and a
              // client gone without a word was never noticed, since nothing was written to it.
              const check = setInterval(() => {
                if (!stillAllowed()) {
                  off();
                  stop();
                  return;
                }
                if (waiting || Date.now() - wroteAt < FOLLOW_KEEPALIVE_MS) return;
                if (send('\n')) return;
                off();
                holdUntilDrained();
              }, FOLLOW_AUTH_CHECK_MS).unref();
              const stop = (): void => {
                clearInterval(check);
                w.end();
              };
              // A client that stops reading (a paused `curl | less`) must not make flashd buffer
              // every new line for it: once a write is held back, the follow lets go of the hub
              // and picks up after the last line sent when the socket drains (the lines wait in
              // SQLite, up to the retention per endpoint). One that never reads again is closed
              // STREAM_STALL_MS after that held-back write (http/server.ts), since nothing more is
              // written to it; on a quiet endpoint the keepalive lines (a few bytes every 15 s)
              // practically never fill the socket's buffers, so such a follow stays open.
              let last = since ?? 0;
              let off = (): void => undefined;
              let wroteAt = Date.now();
              /** Held back: waiting for the socket to drain, off the hub. */
              let waiting = false;
              const send = (chunk: string): boolean => {
                wroteAt = Date.now();
                return w.write(chunk);
              };
              const holdUntilDrained = (): void => {
                waiting = true;
                w.drained(() => {
                  waiting = false;
                  follow();
                });
              };
              const follow = (): void => {
                let paused = false;
                const unfollow = s.logs.follow(ep.id, last, (l) => {
                  if (paused) return;
                  if (!stillAllowed()) {
                    unfollow();
                    stop();
                    return;
                  }
                  last = l.seq;
                  if (send(JSON.stringify(logView(l)) + '\n')) return;
                  paused = true;
                  unfollow();
                  holdUntilDrained();
                }, stop);
                off = unfollow;
              };
              // The last lines (up to 10,000 of up to 16 KB each) go out under the same rule: a
              // client that reads none of them holds back the rest, which wait in SQLite for the
              // follow (it reads on after the last one sent). The array is let go either way.
              let held = false;
              for (const l of lines) {
                last = l.seq;
                if (!send(JSON.stringify(logView(l)) + '\n')) {
                  held = true;
                  break;
                }
              }
              lines = [];
              if (held) holdUntilDrained();
              else follow();
              w.signal.addEventListener('abort', () => {
                clearInterval(check);
                off();
              }, { once: true });
            },
          },
        };
      },
    },
  ];
}
