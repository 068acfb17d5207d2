/**
 * FlashBoot and worker keys, end to end: a worker flashd stopped and kept keeps its key in the
 * container's env, which must not act as a worker while it is kept (a ping would bring back an
 * idle worker in /health that is not running) and must work again once the container restarts.
 * A real flashd with `runtime: docker` on the engine podman serves (test/helpers/containers.ts);
 * its own file, as container-runtime.test.ts is close to tap's 120 s per file.
 */
import { until, containersOf, docker, start, endpoint, runsync, health, noWorkers } from '../helpers/containers.js';
import t from 'tap';
import { LABELS } from '../../src/runtime/index.js';

t.test('FLASHBOOT: the key of a kept (stopped) worker is refused as a stopped worker\'s is, until its restart; and after a flashd restart', async (t) => {
  const a = await start(t);
  const kept = await endpoint(a, { flashboot: 'FLASHBOOT', workers: { min: 0, max: 1, idleTimeout: 1 } });
  const off = await endpoint(a, { workers: { min: 0, max: 1, idleTimeout: 1 } });
  const [first, other] = await Promise.all([runsync(a, kept, { n: 1 }), runsync(a, off, { n: 1 })]);
  t.equal(first.status, 'COMPLETED', JSON.stringify(first));
  t.equal(other.status, 'COMPLETED', JSON.stringify(other));
  // The keys as anyone who can read the engine's container config finds them.
  const keyOf = async (ep: string): Promise<string> => {
    const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
    const env = (await docker.inspectContainer(c?.Id as string)).Config.Env ?? [];
    return (env.find((e) => e.startsWith('RUNPOD_AI_API_KEY=')) as string).slice('RUNPOD_AI_API_KEY='.length);
  };
  const keptKey = await keyOf(kept);
  const offKey = await keyOf(off);
  const ping = (ep: string, w: string, key: string) => a.req('GET', `/v2/${ep}/ping/${w}?gpu=cpu`, { key });

  await until('both scaled to zero', async () => noWorkers(await health(a, kept)) && noWorkers(await health(a, off)));
  // flashd's line, not the engine's state: the exit reaches flashd a moment after the engine shows it.
  const keptTimes = () => a.logs.filter((l) => /container kept for FlashBoot/.test(l)).length;
  await until('the FLASHBOOT container kept stopped', async () => keptTimes() === 1 && (await containersOf([`${LABELS.endpoint}=${kept}`]))[0]?.State === 'exited');
  await until('the OFF container removed', async () => (await containersOf([`${LABELS.endpoint}=${off}`])).length === 0);
  const problem = (r: { status: number; headers: Headers; json: any }) => ({
    status: r.status, type: r.headers.get('content-type'), auth: r.headers.get('www-authenticate'),
    body: { type: r.json?.type, title: r.json?.title, status: r.json?.status, detail: r.json?.detail },
  });
  const stopped = problem(await ping(off, other.workerId, offKey));
  t.equal(stopped.status, 401, `what a worker flashd stopped without FlashBoot gets: ${JSON.stringify(stopped)}`);
  t.same(problem(await ping(kept, first.workerId, keptKey)), stopped, 'a ping with the kept worker\'s key gets the same');
  t.same(problem(await a.req('GET', `/v2/${kept}/job-take/${first.workerId}?gpu=cpu`, { key: keptKey })), stopped, 'so does a job-take');
  t.same(problem(await a.req('POST', `/v2/${kept}/job-done/${first.workerId}/${first.id}?gpu=cpu`, { key: keptKey, body: { output: 1 } })), stopped, 'and a job-done');
  const h = await health(a, kept);
  t.same(h.workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 }, `the kept worker counts nowhere in /health: ${JSON.stringify(h)}`);

  const again = await runsync(a, kept, { n: 2 });
  t.equal(again.status, 'COMPLETED', JSON.stringify(again));
  t.equal(again.workerId, first.workerId, 'the kept worker restarted and took the job with its key');
  t.equal(await keyOf(kept), keptKey, 'the same key in its env: suspended, not rotated');
  t.equal((await ping(kept, first.workerId, keptKey)).status, 200, 'its key pings again once it runs');

  // A flashd restart on the same data directory: the kept worker's key stays refused.
  await until('scale to zero again', async () => noWorkers(await health(a, kept)));
  await until('kept again', async () => keptTimes() === 2 && (await containersOf([`${LABELS.endpoint}=${kept}`]))[0]?.State === 'exited');
  t.same(problem(await ping(kept, first.workerId, keptKey)), stopped, 'refused while kept again');
  await a.agent.close();
  const b = await start(t, {}, a.dir);
  t.same(problem(await b.req('GET', `/v2/${kept}/ping/${first.workerId}?gpu=cpu`, { key: keptKey })), stopped, 'refused after a restart of flashd');
  const hb = (await b.req('GET', `/v2/${kept}/health`)).json;
  t.same(hb.workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 }, `nothing in /health after the restart: ${JSON.stringify(hb)}`);
});

t.test('deleting a FLASHBOOT endpoint just before flashd stops: the kept container is removed after the store closed, and nothing throws', async (t) => {
  const a = await start(t);
  const kept = await endpoint(a, { flashboot: 'FLASHBOOT', workers: { min: 0, max: 1, idleTimeout: 1 } });
  const first = await runsync(a, kept, { n: 1 });
  t.equal(first.status, 'COMPLETED', JSON.stringify(first));
  await until('the FLASHBOOT container kept stopped', async () => a.logs.some((l) => /container kept for FlashBoot/.test(l)) && (await containersOf([`${LABELS.endpoint}=${kept}`]))[0]?.State === 'exited');
  // The delete removes the kept container through the engine, in the background; flashd closes
  // (and its store with it) before the engine has answered. That removal then revoked the kept
  // worker's key in a closed database: an unhandled rejection, which ends a Node process.
  const rejections: unknown[] = [];
  const onRejection = (err: unknown) => void rejections.push(err);
  process.on('unhandledRejection', onRejection);
  t.teardown(() => void process.off('unhandledRejection', onRejection));
  t.equal((await a.req('DELETE', `/v2/serverless/${kept}`)).status, 204);
  await a.agent.close();
  await until('the kept container removed', async () => (await containersOf([`${LABELS.endpoint}=${kept}`])).length === 0);
  await new Promise((r) => setTimeout(r, 500));
  t.same(rejections.map((e) => String(e)), [], 'no unhandled rejection');
  // Its key is revoked all the same: by the delete (every key of the endpoint).
  const b = await start(t, {}, a.dir);
  const keys = (await b.req('GET', '/v2/api-keys?kind=worker')).json as { endpointId?: string }[];
  t.same(keys.filter((k) => k.endpointId === kept), [], 'no unrevoked worker key of the endpoint is left');
});
