/**
 * runpod-python's "realtime" mode: with RUNPOD_REALTIME_PORT set (not 0) `runpod.serverless.start`
 * serves its local FastAPI app on that port and never enters the job-take loop, though its
 * heartbeat pings on (research/worker-protocol.md §1.1). flashd hands jobs only through the
 * queue, so such a worker would hold its place as an idle worker while every job waits in the
 * queue until its TTL. Images bake `ENV RUNPOD_REALTIME_PORT=8000` in for local testing, and an
 * endpoint's env may carry it: every worker environment flashd gives sets it back to 0.
 * (The stdlib SDK the fixture worker runs ignores the variable, so the job completes either way:
 * what is checked is the value a runpod worker would read.)
 */
import t from 'tap';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';

t.test("worker-env sets RUNPOD_REALTIME_PORT=0, so an image's ENV cannot turn the worker into runpod-python's local HTTP server", async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const r = await a.req('GET', `/v2/serverless/${ep}/worker-env`);
  t.equal(r.status, 200, r.text);
  t.equal(r.json.env.RUNPOD_REALTIME_PORT, '0', 'queue mode: the worker takes jobs');
});

t.test("a worker flashd starts takes jobs though the endpoint's env sets RUNPOD_REALTIME_PORT", async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ env: { RUNPOD_REALTIME_PORT: '8000', RUNPOD_REALTIME_CONCURRENCY: '2' }, args: 'python3 -u test/fixtures/workers/env.py', workers: { min: 0, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const r = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { vars: ['RUNPOD_REALTIME_PORT'] } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.same(r.json.output, { RUNPOD_REALTIME_PORT: '0' }, "flashd's value, after the endpoint's env");
});
