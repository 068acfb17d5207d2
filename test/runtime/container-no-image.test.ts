/**
 * An endpoint made for `--runtime process` carries `"image":"none"` (README "3. Workers that
 * flashd starts": image is required, that runtime ignores it). Once flashd runs with a container
 * engine instead, such an endpoint has no image to run: no worker starts (no pull of an image
 * called `none`, no crash loop), and the endpoint log says so once, with what to do.
 * Real flashd, real HTTP, real SQLite, the Docker Engine API served by podman.
 */
import { start, logLines, health, IMAGE } from '../helpers/containers.js';
import t from 'tap';
import { setTimeout as sleep } from 'node:timers/promises';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

t.test('an endpoint with image "none" made for the process runtime starts no container and says why', async (t) => {
  const dir = testDataDir(t);
  const p = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT }, { dir });
  const r = await p.req('POST', '/v2/serverless', {
    body: cpuBody({ name: 'proc', image: 'none', args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  });
  t.equal(r.status, 201, r.text);
  t.equal(r.json.startBlocked, undefined, 'the process runtime starts it: nothing blocked');
  const ep = r.json.id as string;
  await p.agent.close();

  const d = await start(t, {}, dir);
  const said = await until('the endpoint log says why no worker starts', async () =>
    (await logLines(d, ep)).find((l) => /no worker can start/.test(l.line)), 30_000).catch(() => undefined);
  // Time for a pull, its failure and the crash loop after it, if any.
  await sleep(4000);
  const lines = (await logLines(d, ep)).filter((l) => l.stream === 'system').map((l) => l.line);
  t.same(lines.filter((l) => /failed to start|crash|starting worker .*docker/.test(l)), [], 'no container start, failed pull or crash loop');
  t.match(said?.line, /no worker can start: the endpoint has no image for the docker runtime \(image "none", as for --runtime process\)/, `one line says it: ${JSON.stringify(lines)}`);
  t.match(said?.line, /set one with a PATCH of image, or start flashd with --runtime process/, 'and what to do');
  t.equal(lines.filter((l) => /no image/.test(l)).length, 1, 'said once');
  const h = await health(d, ep);
  t.equal(h.workers.unhealthy, 0, 'no crashed worker in /health');
  t.equal(h.workers.throttled, 1, 'the worker workers.min wants is throttled');
  const view = (await d.req('GET', `/v2/serverless/${ep}`)).json;
  t.match(view.startBlocked, /^the endpoint has no image for the docker runtime .*start flashd with --runtime process$/, 'the endpoint view says it too');

  // Given an image, it starts one.
  const patched = await d.req('PATCH', `/v2/serverless/${ep}`, { body: { image: IMAGE, args: '' } });
  t.equal(patched.status, 200, patched.text);
  t.equal(patched.json.startBlocked, undefined, 'no longer blocked');
  t.ok(await until('a worker starts once the endpoint has an image', async () =>
    (await logLines(d, ep)).some((l) => /starting worker .*\(docker runtime\)/.test(l.line)), 30_000));
});
