/**
 * A protocol-level worker for tests: speaks RunPod's worker protocol to a real flashd over
 * HTTP, exactly as runpod-python does (raw key, form content type on results).
 */
import { connect } from 'node:net';
import type { TestAgent } from './agent.js';

export interface WorkerEnv {
  workerId: string;
  env: Record<string, string>;
}

export class TestWorker {
  readonly workerId: string;
  readonly key: string;
  readonly #env: Record<string, string>;

  constructor(w: WorkerEnv) {
    this.workerId = w.workerId;
    this.#env = w.env;
    this.key = w.env['RUNPOD_AI_API_KEY'] as string;
  }

  /** The same worker (id and key) talking to a server at another address (after a restart). */
  rebase(fromUrl: string, toUrl: string): TestWorker {
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(this.#env)) env[k] = v.split(fromUrl).join(toUrl);
    return new TestWorker({ workerId: this.workerId, env });
  }

  static async create(a: TestAgent, endpointId: string): Promise<TestWorker> {
    const r = await a.req('GET', `/v2/serverless/${endpointId}/worker-env`);
    if (r.status !== 200) throw new Error(`worker-env: ${r.status} ${r.text}`);
    return new TestWorker(r.json as WorkerEnv);
  }

  /** The URL a result (`done`) or stream chunk (`stream`) of `jobId` is posted to. */
  postUrl(kind: 'done' | 'stream', jobId: string): string {
    return `${this.#url(kind === 'done' ? 'RUNPOD_WEBHOOK_POST_OUTPUT' : 'RUNPOD_WEBHOOK_POST_STREAM', jobId)}&isStream=false`;
  }

  #url(name: string, jobId?: string): string {
    let u = this.#env[name] as string;
    u = u.replace('$RUNPOD_POD_ID', this.workerId);
    return name === 'RUNPOD_WEBHOOK_GET_JOB' ? u.replace('$ID', this.workerId) : u.replace('$ID', jobId ?? '');
  }

  /** One job-take; null on 204. */
  async take(inProgress = false, signal?: AbortSignal): Promise<{ id: string; input: unknown; [k: string]: unknown } | null> {
    const res = await fetch(`${this.#url('RUNPOD_WEBHOOK_GET_JOB')}&job_in_progress=${inProgress ? 1 : 0}`, {
      headers: { authorization: this.key },
      ...(signal ? { signal } : {}),
    });
    if (res.status === 204) return null;
    if (res.status !== 200) throw new Error(`job-take: ${res.status} ${await res.text()}`);
    return (await res.json()) as { id: string; input: unknown };
  }

  async takeBatch(size: number): Promise<{ status: number; jobs: { id: string; input: unknown }[] }> {
    const url = this.#url('RUNPOD_WEBHOOK_GET_JOB').replace('/job-take/', '/job-take-batch/');
    const res = await fetch(`${url}&batch_size=${size}&job_in_progress=0`, { headers: { authorization: this.key } });
    return { status: res.status, jobs: res.status === 200 ? ((await res.json()) as { id: string; input: unknown }[]) : [] };
  }

  /** job-done with the raw body runpod-python sends. */
  async done(jobId: string, body: unknown, isStream = false): Promise<{ status: number; json: any }> {
    const res = await fetch(`${this.#url('RUNPOD_WEBHOOK_POST_OUTPUT', jobId)}&isStream=${isStream}`, {
      method: 'POST',
      headers: { authorization: this.key, 'content-type': 'application/x-www-form-urlencoded', charset: 'utf-8' },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, json: text ? JSON.parse(text) : undefined };
  }

  async stream(jobId: string, output: unknown): Promise<number> {
    const res = await fetch(`${this.#url('RUNPOD_WEBHOOK_POST_STREAM', jobId)}&isStream=false`, {
      method: 'POST',
      headers: { authorization: this.key, 'content-type': 'application/x-www-form-urlencoded' },
      body: JSON.stringify({ output }),
    });
    await res.arrayBuffer();
    return res.status;
  }

  async ping(jobIds: string[] = []): Promise<number> {
    const q = jobIds.length ? `&job_id=${jobIds.join(',')}` : '';
    const res = await fetch(`${this.#url('RUNPOD_WEBHOOK_PING')}${q}&runpod_version=1.12.0`, { headers: { authorization: this.key } });
    await res.arrayBuffer();
    return res.status;
  }

  /** job-stop: ids to stop, or [] on 204. */
  async stops(signal?: AbortSignal): Promise<string[]> {
    const url = this.#url('RUNPOD_WEBHOOK_GET_JOB').replace('/job-take/', '/job-stop/');
    const res = await fetch(url, { headers: { authorization: this.key }, ...(signal ? { signal } : {}) });
    if (res.status === 204) return [];
    return ((await res.json()) as { jobsToStop: string[] }).jobsToStop;
  }
}

/** The largest body of a worker's result or stream chunk post (64 MiB). */
export const WORKER_POST_LIMIT = 64 * 1024 * 1024;

/**
 * POSTs a body 10 bytes over the worker-post limit, all of it before reading, as runpod-python
 * does; resolves with the status line.
 */
export function postOversized(url: string, key: string): Promise<string> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(u.port), u.hostname, () => {
      socket.write(`POST ${u.pathname}${u.search} HTTP/1.1\r\nHost: x\r\nAuthorization: ${key}\r\nContent-Type: application/json\r\nContent-Length: ${WORKER_POST_LIMIT + 10}\r\n\r\n{"output":"`);
      socket.write(Buffer.alloc(WORKER_POST_LIMIT + 10 - 13, 'a'));
      socket.write('"}');
    });
    let got = '';
    socket.on('data', (d) => {
      got += d.toString();
      if (got.includes('\r\n')) {
        resolve(got.slice(0, got.indexOf('\r\n')));
        socket.destroy();
      }
    });
    socket.on('error', reject);
  });
}
