/**
 * The test helpers close flashd before they remove its data directory: tap removed a
 * t.testdir() before the teardowns that close flashd, so flashd ran on, and was closed on, a
 * deleted directory, and a file it wrote meanwhile failed the removal and skipped the close.
 */
import t from 'tap';
import { existsSync } from 'node:fs';
import { startAgent, cpuBody, type TestAgent } from './agent.js';
import { REPO_ROOT } from './spawn-flashd.js';
import { until } from './wait.js';

let a: TestAgent | undefined;

t.test('a flashd with a running process worker, closed on teardown', async (t) => {
  a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, workerStopGraceMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'sleep 60', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  await until('the worker to start', async () => (await a!.req('GET', `/v2/${ep}/health`)).json.workers.initializing === 1, 10_000);
  t.ok(existsSync(`${a.dir}/process-workers.pids`), 'its pid is recorded in the data directory');
});

t.test('was closed while its data directory was still there, which is removed after', async (t) => {
  if (!a) return t.fail('no agent');
  // The close stops the worker, and its exit rewrites the pid file: in a deleted directory it warns.
  t.ok(a.logs.some((l) => /worker stopping/.test(l)), 'the worker was stopped by the close');
  t.same(a.logs.filter((l) => /cannot record worker pids|shutdown failed/.test(l)), [], 'no step of the close found its data directory gone');
  t.notOk(existsSync(a.dir), 'the directory is removed after the close');
});
