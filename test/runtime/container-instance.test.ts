/**
 * A copy of a data directory on the engine of its original (README "Backups"): both have the
 * same container instance id. Real flashd processes with `--runtime docker` on the Docker Engine
 * API served by podman (see test/helpers/containers.ts). Deadlines are generous and every wait
 * polls: CI has 2 loaded cores, where the engine may not answer a start in time.
 */
import { SOCKET, IMAGE, until, docker, instanceOf, containersOf } from '../helpers/containers.js';
import { spawn, spawnSync } from 'node:child_process';
import { cpSync } from 'node:fs';
import { join } from 'node:path';
import { testDataDir } from '../helpers/data-dir.js';
import t from 'tap';
import { ADMIN_KEY, cpuBody } from '../helpers/agent.js';
import { REPO_ROOT, cleanEnv, startFlashd } from '../helpers/spawn-flashd.js';
import { LABELS } from '../../src/runtime/index.js';

const args = (dir: string) => ['dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'docker', '--container-socket', SOCKET];
const env = cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY });

t.test('a copy of a data directory beside its original: refused while the original runs, removes its leftovers once it is gone', async (t) => {
  // The copy, taken with flashd stopped as README says.
  const dir = testDataDir(t);
  const first = await startFlashd(t, process.execPath, args(dir), env, 120_000);
  t.equal(await first.stop(), 0);
  const copy = join(testDataDir(t), 'copy');
  cpSync(dir, copy, { recursive: true });
  const instance = instanceOf(dir);
  t.equal(instanceOf(copy), instance, 'the copy has the original\'s instance id');
  t.teardown(async () => {
    for (const c of await containersOf([`${LABELS.instance}=${instance}`])) await docker.removeContainer(c.Id, { force: true }).catch(() => undefined);
  });
  // The original back in service, with a worker container.
  const original = await startFlashd(t, process.execPath, args(dir), env, 120_000);
  const r = await fetch(`${original.url}/v2/serverless`, {
    method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify(cpuBody({ image: IMAGE, workers: { min: 1, max: 1, idleTimeout: 30 } })),
  });
  t.equal(r.status, 201);
  const container = (await until('the original\'s worker container running', async () => {
    const [c] = await containersOf([`${LABELS.instance}=${instance}`]);
    return c?.State === 'running' && c;
  }, 120_000)).Id;

  // The copy started beside it.
  const child = spawn(process.execPath, args(copy), { cwd: REPO_ROOT, env, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  t.teardown(() => void (child.exitCode === null && child.kill('SIGKILL')));
  const exited = new Promise<number | null>((r) => child.once('exit', r));
  // Exited, found the original at its first connection, or (what it must not) removed its container.
  const found = /another flashd on this host runs with this instance id|removed containers left by a previous run/;
  await until('the copy to exit, or to connect to the engine', async () => child.exitCode !== null || found.test(stderr), 120_000);
  if (child.exitCode !== null) {
    t.equal(await exited, 1, 'the copy exits 1');
    t.match(stderr, new RegExp(`flashd: cannot start: another flashd on this host, pid ${original.child.pid} \\(1 container\\)`), 'naming the original\'s pid');
    t.match(stderr, /delete container-instance-id in its data directory/, 'and what to do');
  } else {
    // The engine did not answer the copy's start in time: it finds the original at its first
    // connection, when it already serves, and can only say so.
    t.comment('the engine was unreachable at the copy\'s start');
    t.match(stderr, new RegExp(`error .*another flashd on this host runs with this instance id .*owners="pid ${original.child.pid} \\(1 container\\)"`), 'the copy names the original');
    child.kill('SIGTERM');
    t.equal(await exited, 0);
  }
  t.notMatch(stderr, /removed containers left by a previous run/, 'the copy removed nothing');
  // The original would have seen its container go within a second or two.
  await new Promise((r) => setTimeout(r, 3000));
  t.equal((await docker.inspectContainer(container)).State.Running, true, 'the original\'s container is still running');
  t.notMatch(original.stderr(), /removed outside flashd|exited unexpectedly/, 'and the original lost no worker');

  // A copy taken while the original runs: its database holds the running worker's key. It is
  // refused before it recovers jobs or releases that worker in its database, so no line before
  // the refusal reads as though something was done to the original's workers.
  const live = join(testDataDir(t), 'live-copy');
  cpSync(dir, live, { recursive: true });
  const liveRun = spawnSync(process.execPath, args(live), { cwd: REPO_ROOT, env, encoding: 'utf8', timeout: 120_000 });
  if (liveRun.status === null) t.comment('the engine was unreachable at the live copy\'s start');
  else {
    t.equal(liveRun.status, 1, 'the live copy exits 1');
    t.match(liveRun.stderr, /flashd: cannot start: another flashd on this host/, 'refused');
    t.notMatch(liveRun.stderr, /workers of the previous run released|jobs recovered/, 'before releasing or recovering anything');
  }
  t.equal((await docker.inspectContainer(container)).State.Running, true, 'the original\'s container is still running');

  // The original gone for good (kill -9): its container is a leftover, which the copy removes.
  t.equal(await original.stop('SIGKILL'), null);
  t.equal((await docker.inspectContainer(container)).State.Running, true, 'the killed original left its container running');
  const restored = await startFlashd(t, process.execPath, args(copy), env, 120_000);
  // At its start, or at its first connection when the engine was slow to answer the start.
  await until('the copy to remove it', async () => /removed containers left by a previous run count=1/.test(restored.stderr()), 120_000);
  t.pass('the copy removed it');
  await t.rejects(docker.inspectContainer(container), { code: 'DOCKER_NOT_FOUND' }, 'the leftover container is gone');
  t.equal(await restored.stop(), 0);
});
