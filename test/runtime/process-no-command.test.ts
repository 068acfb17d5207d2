/**
 * With `--runtime process` an endpoint that names no command (`image: "none"` and no `args`,
 * `entrypoint` or `cmd`: README "1. A worker"'s endpoint, made for `worker-env` workers, once
 * its `workers.max` is raised) has nothing to run on the host. flashd starts no worker for it,
 * rather than a loop of workers that fail to start (`the endpoint has no command`, `unhealthy`,
 * a growing crash backoff), counts the workers it wants as `throttled`, says why once in the
 * endpoint log and in the endpoint view's `startBlocked`, and starts one as soon as a PATCH gives
 * it a command.
 * Real flashd, real HTTP, real SQLite, a real worker process once it has a command.
 */
import t from 'tap';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

t.test('process runtime: an endpoint with no command starts no worker and says why, until a PATCH gives it one', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000 });
  const created = await a.req('POST', '/v2/serverless', { body: cpuBody({ image: 'none', workers: { min: 0, max: 2, idleTimeout: 5 } }) });
  t.equal(created.status, 201, created.text.slice(0, 300));
  const ep = created.json.id as string;
  t.same([created.json.entrypoint, created.json.cmd], [[], []], 'the endpoint names no command');
  t.match(created.json.startBlocked, /^the endpoint has no command for the process runtime .*set args \(or entrypoint\/cmd\) with a PATCH/, 'the endpoint view says why it cannot start, as for an image "none" under a container runtime');
  const job = await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } });
  t.equal(job.status, 200);

  const lines = async () => ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line);
  const why = 'no worker can start: the endpoint has no command for the process runtime';
  await until('the endpoint log says why no worker starts', async () => (await lines()).some((l) => l.startsWith(why)), 10_000);
  await sleep(2500); // a crash loop would have started (and failed) several workers by now
  const log = await lines();
  t.same(log.filter((l) => / failed to start|crashed in a row|^starting worker/.test(l)), [], `no worker was started: ${JSON.stringify(log)}`);
  t.equal(log.filter((l) => l.startsWith(why)).length, 1, 'the reason is said once');
  t.match(log.find((l) => l.startsWith(why)), /set args \(or entrypoint\/cmd\) with a PATCH/, 'and what to do');
  const health = (await a.req('GET', `/v2/${ep}/health`)).json;
  t.match(health, { jobs: { inQueue: 1 }, workers: { throttled: 1, unhealthy: 0, initializing: 0 } }, `the wanted worker is throttled: ${JSON.stringify(health)}`);

  const handler = "import vendor_flash; vendor_flash.serverless.start({'handler': lambda job: {'ran': job['input']}})";
  const patched = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { cmd: ['python3', '-u', '-c', handler], env: { PYTHONPATH: join(REPO_ROOT, 'python') } } });
  t.equal(patched.status, 200, patched.text.slice(0, 300));
  t.equal(patched.json.startBlocked, undefined, 'no longer blocked');
  const done = await until('the job completes once the endpoint has a command', async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${job.json.id}`)).json;
    return s.status === 'COMPLETED' ? s : undefined;
  }, 30_000);
  t.same(done.output, { ran: { n: 1 } });
});
