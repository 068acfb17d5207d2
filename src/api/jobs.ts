/**
 * The queue job API, `{queue_base_url}/v2/{endpoint_id}/…` (spec "Queue-based job operations").
 * `Authorization` works with or without `Bearer ` (runpod clients send the raw key).
 * Limited per endpoint with RunPod's quotas (`jobRateGroup`, auth/job-rate-limit.ts), not per user.
 */
import { pause } from '../core/abort.js';
import { AgentError, validationError } from '../core/errors.js';
import { jsonDepth, rawMember, rawMemberDepth } from '../core/json-raw.js';
import { assertSchema } from '../core/schemas.js';
import { withMillisecondHint, type EndpointService, type EndpointSpec } from '../endpoints/index.js';
import { TERMINAL, checkWebhookUrl, jobNotFound, statusBody, type Job, type JobQueue, type JobSnapshot } from '../queue/index.js';
import type { ResourceRow } from '../store/index.js';
import type { Principal } from '../auth/index.js';
import type { ApiContext, ApiResult, RouteDef } from './route.js';

export interface JobRouteServices {
  queue: JobQueue;
  endpoints: EndpointService;
  now(): number;
  /** --webhook-allow-private: without it, a webhook to a private address is refused at submit. */
  webhookAllowPrivate: boolean;
}

const MB = 1024 * 1024;
/** Longest `/status?ttl=`: 7 days, as `policy.ttl`. */
const MAX_STATUS_TTL_MS = 7 * 86_400_000;
/**
 * A `/stream` poll without `?wait` that comes within this long of the last answer for its job
 * (runpod-sdk's stream() polls again at once, no pause) is answered this long after it: at most
 * 10 polls a second of one job, well within the "status" quota, with chunks in between batched.
 */
const STREAM_PACE_MS = 100;
/** ... and held this long at most, as `?wait=` holds one, when it has nothing to read. */
const STREAM_HOT_WAIT_MS = 1000;

/** `null` members are taken as left out (a Python client's `"webhook": None`). */
interface SubmitBody {
  input: Record<string, unknown>;
  webhook?: string | null;
  /** runpod-sdk's (npm) other name for a webhook URL: delivered as `webhook` is. */
  webhookV2?: string | null;
  /** Its members too; other members are dropped. */
  policy?: { executionTimeout?: number | null; ttl?: number | null; lowPriority?: boolean | null } | null;
  s3Config?: Record<string, unknown> | null;
}

/** The floors of `policy`'s millisecond members (schema/jobs.schema.json `JobPolicy`). */
const POLICY_FLOORS_MS = { executionTimeout: 5000, ttl: 10_000 } as const;

/**
 * `assertSchema('JobSubmit')`, with the unit spelled out when a `policy.executionTimeout` or
 * `policy.ttl` is under its floor, as for an endpoint's `timeout`: RunPod's console shows both in
 * seconds, so `600` meant as ten minutes would otherwise get only `must be >= 5000`.
 */
function assertSubmitBody(body: unknown): SubmitBody {
  try {
    return assertSchema<SubmitBody>('JobSubmit', body);
  } catch (err) {
    const policy = (body as { policy?: unknown } | null)?.policy;
    if (!(err instanceof AgentError) || !err.errors || policy === null || typeof policy !== 'object') throw err;
    const members = policy as Record<string, unknown>;
    throw validationError(err.errors.map((e) => Object.entries(POLICY_FLOORS_MS)
      .reduce((msg, [name, floor]) => withMillisecondHint(msg, `/policy/${name}`, members[name], floor), e)));
  }
}

/** The caller's endpoint (cached by EndpointService.byId), or a 404 for anyone else's. */
export function endpointOf(endpoints: EndpointService, principal: Principal, id: string): ResourceRow<EndpointSpec> {
  const row = endpoints.byId(id);
  if (!row || row.ownerId !== principal.ownerId) throw new AgentError('NOT_FOUND', `Endpoint ${id} not found.`);
  return row;
}

function queueEndpoint(row: ResourceRow<EndpointSpec>): ResourceRow<EndpointSpec> {
  if (row.data.type !== 'QUEUE') {
    // Not "send it to requestUrls.base": flashd stores load-balancing endpoints but routes none of their traffic yet.
    throw new AgentError('BAD_REQUEST', `Endpoint ${row.id} is a LOAD_BALANCER endpoint: only QUEUE endpoints take jobs (run, runsync, status, stream, cancel, retry, purge-queue, health). Its workers would serve HTTP at its requestUrls.base, but flashd does not route load-balancing traffic yet.`);
  }
  return row;
}

function intQuery(query: URLSearchParams, name: string, min: number, max: number): number | undefined {
  // Twice is ambiguous: taking the first would drop the other, even a wrong one, unsaid.
  const count = query.getAll(name).length;
  if (count > 1) {
    throw new AgentError('VALIDATION_FAILED', `?${name} was given ${count} times; give it once, an integer from ${min} to ${max} (milliseconds).`, {
      errors: [`?${name}: was given ${count} times; give it once`],
    });
  }
  const raw = query.get(name);
  // Absent only when not given: an empty `?wait=` is a non-integer like `?wait=abc`.
  if (raw === null) return undefined;
  if (!/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
    throw new AgentError('VALIDATION_FAILED', `?${name} must be an integer from ${min} to ${max} (milliseconds).`, {
      errors: [`?${name}: must be an integer from ${min} to ${max}`],
    });
  }
  return Number(raw);
}

/**
 * The deepest a job's `input` may nest (arrays and objects, its own level counting 1): Python's
 * json module gives up near its recursion limit (1000), so a deeper input reaches no worker.
 */
export const MAX_INPUT_DEPTH = 512;

const json = (status: number, body: string): ApiResult => ({ status, body, headers: { 'content-type': 'application/json' } });
const ref = (j: Pick<JobSnapshot, 'id' | 'status'>) => `{"id":${JSON.stringify(j.id)},"status":"${j.status}"}`;

export function jobRoutes(s: JobRouteServices): RouteDef[] {
  const endpointFor = (principal: Principal, id: string) => endpointOf(s.endpoints, principal, id);
  const P = '/v2/{endpointId}';
  const READ = [400, 401, 403, 404, 429];
  /**
   * POSTs that take no body (/cancel, /retry, /purge-queue, the Go SDK's POSTed reads): one sent
   * is read up to the limit and dropped unparsed, as a management DELETE's is. runpod-python and
   * the Go SDK send none (with a JSON Content-Type), `curl -X POST -d x` sends a form: refusing
   * it (400 bad JSON, or /run's 415) would stop a cancel over bytes nothing reads.
   */
  const NO_BODY = [...READ, 413];

  /** The endpoint was deleted while the job waited (/runsync, /status-sync, /stream?wait=): its jobs went with it. */
  const deletedWhileWaiting = (job: Job): boolean => (job.status === 'IN_QUEUE' || job.status === 'IN_PROGRESS') && s.queue.live(job.id) !== job;
  const endpointDeletedWhileWaiting = (job: Job): AgentError =>
    new AgentError('NOT_FOUND', `Endpoint ${job.endpointId} was deleted while job ${job.id} waited; the job is gone.`);

  /**
   * When the last `/stream` poll without `?wait` of each job was answered (performance.now()),
   * oldest first; entries older than STREAM_PACE_MS are dropped at each answer, so it holds only
   * the jobs polled within the last 100 ms.
   */
  const streamPolls = new Map<string, number>();
  const answeredStream = (jobId: string): void => {
    const now = performance.now();
    streamPolls.delete(jobId);
    streamPolls.set(jobId, now);
    for (const [id, at] of streamPolls) {
      if (now - at < STREAM_PACE_MS) break;
      streamPolls.delete(id);
    }
  };

  /** One `/stream` poll: the chunks since the last one, after holding it up to `wait` ms while there are none. */
  const stream = async (req: ApiContext['req'], endpointId: string, jobId: string, wait: number): Promise<ApiResult> => {
    await s.queue.durable();
    // Gone while the writes in flight were synced: nothing is drained into a reply nobody
    // reads; the chunks stay for its next poll.
    if (req.cancel.aborted) return json(200, '{"stream":[]}');
    let drained = s.queue.drainStream(endpointId, jobId);
    const live = wait > 0 && drained?.stream.length === 0 && !TERMINAL.has(drained.status) ? s.queue.live(jobId) : undefined;
    if (live && live.endpointId === endpointId) {
      await s.queue.waitStream(live, wait, req.cancel);
      // Gone: the chunks stay for its next poll.
      if (req.cancel.aborted) return json(200, `{"status":"${live.status}","stream":[]}`);
      if (deletedWhileWaiting(live)) throw endpointDeletedWhileWaiting(live);
      await s.queue.durable();
      if (req.cancel.aborted) return json(200, `{"status":"${live.status}","stream":[]}`);
      drained = s.queue.drainStream(endpointId, jobId);
    }
    if (!drained) throw jobNotFound(jobId);
    // Each chunk is stored as the JSON text of its element.
    return json(200, `{"status":"${drained.status}","stream":[${drained.stream.join(',')}]}`);
  };

  const submit = (principal: Principal, endpointId: string, body: unknown, text: string | undefined, retentionMs: number, deferInsert = false) => {
    const ep = queueEndpoint(endpointFor(principal, endpointId));
    const b = assertSubmitBody(body);
    for (const name of ['webhook', 'webhookV2'] as const) {
      const url = b[name];
      if (url == null) continue;
      const problem = checkWebhookUrl(url, s.webhookAllowPrivate, name);
      if (problem) throw new AgentError('VALIDATION_FAILED', problem, { errors: [`/${name}: ${problem}`] });
    }
    // runpod-sdk types both; a job has one webhook, so two different URLs are refused, not one dropped.
    if (b.webhook != null && b.webhookV2 != null && b.webhook !== b.webhookV2) {
      const problem = 'give webhook and webhookV2 the same URL, or only one of them: a job has one webhook';
      throw new AgentError('VALIDATION_FAILED', problem, { errors: [`/webhookV2: ${problem}`] });
    }
    // The input as the client sent it: never parsed again or re-serialised. Its depth comes
    // from the scan that sliced it.
    const raw = text === undefined ? undefined : rawMember(text, 'input');
    const input = raw ?? JSON.stringify(b.input);
    const depth = raw !== undefined ? rawMemberDepth() : jsonDepth(input);
    if (depth > MAX_INPUT_DEPTH) {
      const problem = `nests ${depth} levels of arrays and objects, more than the ${MAX_INPUT_DEPTH} allowed: Python workers (flashd's SDK, runpod-python) cannot decode JSON nested about 1000 deep, so the job could never run`;
      throw new AgentError('VALIDATION_FAILED', `The job's input ${problem}.`, { errors: [`/input: ${problem}`] });
    }
    return s.queue.submit({
      endpointId: ep.id,
      input,
      extra: b.s3Config == null ? null : JSON.stringify({ s3Config: b.s3Config }),
      webhook: b.webhook ?? b.webhookV2 ?? null,
      executionTimeoutMs: b.policy?.executionTimeout ?? ep.data.timeout,
      ttlMs: b.policy?.ttl ?? s.queue.settings.defaultTtlMs,
      lowPriority: b.policy?.lowPriority ?? false,
      retentionMs,
    }, deferInsert);
  };

  const routes: RouteDef[] = [
    {
      method: 'POST', path: `${P}/run`, operationId: 'runJob', jobRateGroup: 'run', summary: 'Queue a job; replies at once with its id', tag: 'Jobs',
      auth: 'user', scope: 'jobs:run', body: 'json', requestSchema: 'JobSubmit', successStatus: 200, responseSchema: 'JobAccepted',
      problems: [400, 401, 403, 404, 413, 415, 429], maxBodyBytes: 10 * MB,
      admit: ({ principal, params }) => void queueEndpoint(endpointFor(principal, params['endpointId'] as string)),
      handle: async ({ principal, params, body, bodyText }) => {
        const job = await submit(principal, params['endpointId'] as string, body, bodyText, s.queue.settings.runRetentionMs);
        // Always IN_QUEUE: the job was queued when accepted, even if a parked worker took it
        // before the commit completed.
        return json(200, ref({ id: job.id, status: 'IN_QUEUE' }));
      },
    },
    {
      method: 'POST', path: `${P}/runsync`, operationId: 'runJobSync', jobRateGroup: 'runsync',
      summary: 'Queue a job and wait up to ?wait ms (1000–300000, default 90000) for its result; the job goes on after the wait',
      tag: 'Jobs', auth: 'user', scope: 'jobs:run', body: 'json', requestSchema: 'JobSubmit', successStatus: 200, responseSchema: 'JobStatus',
      problems: [400, 401, 403, 404, 413, 415, 429], maxBodyBytes: 20 * MB,
      admit: ({ req, principal, params }) => {
        intQuery(req.query, 'wait', 1000, 300_000);
        queueEndpoint(endpointFor(principal, params['endpointId'] as string));
      },
      query: [{ name: 'wait', description: 'ms to wait for completion, 1000–300000 (default 90000).', schema: { type: 'integer', minimum: 1000, maximum: 300000 } }],
      handle: async ({ req, principal, params, body, bodyText }) => {
        const wait = intQuery(req.query, 'wait', 1000, 300_000);
        const { syncRetentionMs, maxSyncRetentionMs } = s.queue.settings;
        const retention = wait === undefined ? syncRetentionMs : Math.min(maxSyncRetentionMs, Math.max(syncRetentionMs, wait));
        // Written once, by its final state, when it finishes within SYNC_INSERT_DELAY_MS (queue/job-queue.ts).
        const job = await submit(principal, params['endpointId'] as string, body, bodyText, retention, true);
        // A client that goes away stops waiting; it never cancels the job.
        await s.queue.waitFinal(job, wait ?? 90_000, req.cancel);
        if (deletedWhileWaiting(job)) throw endpointDeletedWhileWaiting(job);
        // Still running, or its result not yet durable: written and synced before its id is told.
        // No await when there is nothing to wait for: one more hop here halved S2 (the reply
        // then went out uncorked, about three times the kernel time per job; bench:profile s2).
        const pending = s.queue.persist(job);
        if (pending) await pending;
        return json(200, statusBody(job, s.now()));
      },
    },
    {
      method: 'GET', path: `${P}/status/{jobId}`, operationId: 'jobStatus', jobRateGroup: 'status', summary: 'Job status and result (?ttl ms sets how long the result is kept)',
      tag: 'Jobs', auth: 'user', scope: 'jobs:read', successStatus: 200, responseSchema: 'JobStatus', problems: READ,
      query: [{ name: 'ttl', description: 'Keep the result this many ms from now (or from completion), 1000 to 604800000 (7 days).', schema: { type: 'integer', minimum: 1000, maximum: MAX_STATUS_TTL_MS } }],
      handle: async ({ req, principal, params }) => {
        const ep = queueEndpoint(endpointFor(principal, params['endpointId'] as string));
        const ttl = intQuery(req.query, 'ttl', 1000, MAX_STATUS_TTL_MS);
        const jobId = params['jobId'] as string;
        const snap = await s.queue.findDurable(ep.id, jobId);
        if (!snap) throw jobNotFound(jobId);
        // Answered once the ttl is durable: a crash after the reply keeps it.
        if (ttl !== undefined) await s.queue.setRetention(ep.id, jobId, ttl);
        return json(200, statusBody(snap, s.now()));
      },
    },
    {
      // runpod-sdk (npm) polls this after a /runsync that was not done within its wait.
      method: 'GET', path: `${P}/status-sync/{jobId}`, operationId: 'jobStatusSync', jobRateGroup: 'status',
      summary: 'Job status, waiting up to ?wait ms (1000–300000, default 90000) for the job to end',
      tag: 'Jobs', auth: 'user', scope: 'jobs:read', successStatus: 200, responseSchema: 'JobStatus', problems: READ,
      query: [{ name: 'wait', description: 'ms to wait for the job to end, 1000–300000 (default 90000).', schema: { type: 'integer', minimum: 1000, maximum: 300000 } }],
      handle: async ({ req, principal, params }) => {
        const ep = queueEndpoint(endpointFor(principal, params['endpointId'] as string));
        const wait = intQuery(req.query, 'wait', 1000, 300_000);
        const jobId = params['jobId'] as string;
        const live = s.queue.live(jobId);
        // A client that goes away stops waiting; the job goes on.
        if (live && live.endpointId === ep.id && !TERMINAL.has(live.status)) {
          await s.queue.waitFinal(live, wait ?? 90_000, req.cancel);
          if (deletedWhileWaiting(live)) throw endpointDeletedWhileWaiting(live);
        }
        const snap = await s.queue.findDurable(ep.id, jobId);
        if (!snap) throw jobNotFound(jobId);
        return json(200, statusBody(snap, s.now()));
      },
    },
    {
      method: 'GET', path: `${P}/stream/{jobId}`, operationId: 'jobStream', jobRateGroup: 'status', summary: 'Stream chunks posted since the last poll',
      headRefused: 'hands out the chunks posted since the last poll',
      tag: 'Jobs', auth: 'user', scope: 'jobs:read', successStatus: 200, responseSchema: 'JobStream', problems: READ,
      query: [{ name: 'wait', description: `ms to hold a poll that has no chunks yet, until one comes or the job ends 0 to 300000 (RunPod's Go SDK sends it). 0: the poll answers at once. Without it, the poll answers at once too, unless it comes within ${STREAM_PACE_MS} ms of the last answer for the job (a loop with no pause, as runpod-sdk's stream()): then it is answered ${STREAM_PACE_MS} ms after that one, held up to ${STREAM_HOT_WAIT_MS} ms when there is nothing to read. Any other value (not an integer, out of range, given twice) is a 400.`, schema: { type: 'integer', minimum: 0, maximum: 300000 } }],
      handle: async ({ req, principal, params }) => {
        const ep = queueEndpoint(endpointFor(principal, params['endpointId'] as string));
        const jobId = params['jobId'] as string;
        // Checked as /status-sync's, from 0: RunPod's Go SDK sends its timeout in ms (90000 at
        // most, 0 when told 0); runpod-python and runpod-sdk send none.
        const given = intQuery(req.query, 'wait', 0, 300_000);
        if (given !== undefined) return stream(req, ep.id, jobId, given);
        // runpod-sdk's stream() polls again as soon as an answer comes, which over loopback is
        // hundreds of polls a second: it spun and ran into the "status" quota (a 429 ended its
        // stream). A poll within STREAM_PACE_MS of the last answer for the job waits out the
        // rest of it, and is held like a ?wait= poll when there is nothing to read.
        const since = performance.now() - (streamPolls.get(jobId) ?? -Infinity);
        try {
          if (since >= STREAM_PACE_MS) return await stream(req, ep.id, jobId, 0);
          await pause(STREAM_PACE_MS - since, req.cancel);
          return await stream(req, ep.id, jobId, STREAM_HOT_WAIT_MS);
        } finally {
          answeredStream(jobId);
        }
      },
    },
    {
      method: 'POST', path: `${P}/cancel/{jobId}`, operationId: 'cancelJob', jobRateGroup: 'cancel', summary: 'Cancel a queued or running job',
      tag: 'Jobs', auth: 'user', scope: 'jobs:run', successStatus: 200, responseSchema: 'JobRef', problems: NO_BODY,
      handle: async ({ principal, params }) => {
        const ep = queueEndpoint(endpointFor(principal, params['endpointId'] as string));
        return json(200, ref(await s.queue.cancel(ep.id, params['jobId'] as string)));
      },
    },
    {
      method: 'POST', path: `${P}/retry/{jobId}`, operationId: 'retryJob', jobRateGroup: 'run', summary: 'Queue a FAILED or TIMED_OUT job again (same id and input)',
      tag: 'Jobs', auth: 'user', scope: 'jobs:run', successStatus: 200, responseSchema: 'JobRef', problems: [...NO_BODY, 409],
      handle: async ({ principal, params }) => {
        const ep = queueEndpoint(endpointFor(principal, params['endpointId'] as string));
        const job = await s.queue.retry(ep.id, params['jobId'] as string);
        // Queued again when accepted, as /run says, even if a parked worker took it before the commit.
        return json(200, ref({ id: job.id, status: 'IN_QUEUE' }));
      },
    },
    {
      method: 'POST', path: `${P}/purge-queue`, operationId: 'purgeQueue', jobRateGroup: 'purge-queue', summary: 'Remove every queued job; running jobs go on',
      tag: 'Jobs', auth: 'user', scope: 'jobs:run', successStatus: 200, responseSchema: 'PurgeResult', problems: NO_BODY,
      handle: async ({ principal, params }) => {
        const ep = queueEndpoint(endpointFor(principal, params['endpointId'] as string));
        const removed = await s.queue.purge(ep.id);
        return { status: 200, body: { removed, status: 'completed' } };
      },
    },
    {
      method: 'GET', path: `${P}/health`, operationId: 'endpointHealth', jobRateGroup: 'status', summary: 'Job and worker counters of the endpoint',
      tag: 'Jobs', auth: 'user', scope: 'jobs:read', successStatus: 200, responseSchema: 'EndpointHealth', problems: READ,
      handle: ({ principal, params }) => {
        const ep = queueEndpoint(endpointFor(principal, params['endpointId'] as string));
        return { status: 200, body: s.queue.health(ep.id) };
      },
    },
  ];
  // RunPod's Go SDK (runpod/go-sdk) POSTs, with an empty body, what the other clients GET.
  for (const id of ['jobStatus', 'jobStatusSync', 'jobStream']) {
    const get = routes.find((r) => r.operationId === id) as RouteDef;
    routes.push({ ...get, method: 'POST', operationId: `${id}Post`, summary: `${get.summary} (POST, as RunPod's Go SDK sends it)`,
      problems: [...new Set([...get.problems, ...NO_BODY])].sort((x, y) => x - y) });
  }
  return routes;
}
