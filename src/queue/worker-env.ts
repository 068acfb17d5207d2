/**
 * The environment a worker needs: flashd's names and RunPod's, so the public runpod SDK runs
 * unchanged (research/worker-protocol.md §0.1). Each URL already holds a `?query`, because the
 * SDK appends `&param=` by string concatenation.
 */
export interface WorkerEnvInput {
  /** queue_base_url as workers reach it. */
  baseUrl: string;
  endpointId: string;
  workerId: string;
  key: string;
  /** GPU model name, or "cpu". */
  gpu: string;
  pingIntervalMs: number;
}

/**
 * Set for every worker flashd hands an environment to, before the endpoint's own env (which may
 * set it back): runpod-python >=1.9 kills a worker whose host fails its fitness checks (a TCP
 * connection to 8.8.8.8:53, 4 GB free), and isolated self-hosted boxes often would.
 */
export const SDK_DEFAULT_ENV: Readonly<Record<string, string>> = { RUNPOD_SKIP_AUTO_SYSTEM_CHECKS: 'true' };

export function workerEnv(i: WorkerEnvInput): Record<string, string> {
  // `'` too (encodeURIComponent keeps it): no value may hold one, so `worker-env --format shell`
  // single-quotes every value in the one form sh and docker compose's env_file both read.
  const q = `?gpu=${encodeURIComponent(i.gpu).replace(/%20/g, '+').replace(/'/g, '%27')}`;
  const base = `${i.baseUrl}/v2/${i.endpointId}`;
  const pairs: [string, string][] = [
    ['WEBHOOK_GET_JOB', `${base}/job-take/$ID${q}`],
    ['WEBHOOK_POST_OUTPUT', `${base}/job-done/${i.workerId}/$ID${q}`],
    ['WEBHOOK_POST_STREAM', `${base}/job-stream/${i.workerId}/$ID${q}`],
    ['WEBHOOK_PING', `${base}/ping/${i.workerId}${q}`],
    ['POD_ID', i.workerId],
    ['AI_API_KEY', i.key],
    ['ENDPOINT_ID', i.endpointId],
    ['PING_INTERVAL', String(Math.max(1000, Math.round(i.pingIntervalMs)))],
  ];
  const env: Record<string, string> = {};
  for (const [name, value] of pairs) {
    env[`VENDOR_${name}`] = value;
    env[`RUNPOD_${name}`] = value;
  }
  // runpod-python with RUNPOD_REALTIME_PORT set (not 0) serves its local FastAPI app on that
  // port instead of taking jobs, its heartbeat pinging on (research/worker-protocol.md §1.1):
  // flashd hands jobs only through the queue, so that worker would count idle while every job
  // waited for its TTL. Images bake `ENV RUNPOD_REALTIME_PORT=8000` in for local tests; this
  // comes after the image's ENV and the endpoint's env, as the URLs above do.
  env['RUNPOD_REALTIME_PORT'] = '0';
  return env;
}
