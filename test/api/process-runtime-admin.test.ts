/**
 * With `--runtime process` an endpoint's command runs on the host as flashd's user, able to read
 * the data directory (admin-api-key, secret.key, flashd.db): creating an endpoint or changing
 * what it runs (image, entrypoint, cmd/args, env) needs the admin scope there. Reads, deletes,
 * scaling changes and the job routes stay with their usual scopes; other runtimes are unchanged.
 * Real flashd, real HTTP, real SQLite, real worker processes.
 */
import t, { type Test } from 'tap';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { assertProblem, cpuBody, startAgent, type Reply } from '../helpers/agent.js';
import { makeUser, mustCreate, mustPost } from '../helpers/expect.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { until } from '../helpers/wait.js';

const ALL_USER_SCOPES = ['endpoints:read', 'endpoints:write', 'jobs:run', 'jobs:read'];

function assertNeedsAdmin(t: Test, r: Reply, label: string): void {
  assertProblem(t, r, 403, label);
  t.equal(r.json?.code, 'FORBIDDEN', `${label}: code`);
  t.match(r.json?.detail, /process runtime/, `${label}: the detail names the process runtime`);
  t.match(r.json?.detail, /on the host as flashd's user/, `${label}: and why it matters`);
  t.match(r.json?.detail, /"admin" scope/, `${label}: and the scope it needs`);
  t.match(r.json?.detail, /ask an admin, or run flashd with a container runtime/, `${label}: and what to do`);
}

t.test('process runtime: a non-admin key cannot create an endpoint, so runs nothing on the host', async (t) => {
  const workdir = mkdtempSync(join(tmpdir(), 'flashd-procadmin-'));
  t.teardown(() => rmSync(workdir, { recursive: true, force: true }));
  const a = await startAgent(t, { runtime: 'process', processWorkdir: workdir });
  const bob = await makeUser(t, a, 'bob', ALL_USER_SCOPES);

  // min 1: the worker would start at once, and its command leaves a file behind.
  const body = cpuBody({ name: 'pwn', args: 'touch bob-ran', workers: { min: 1, max: 1, idleTimeout: 5 } });
  assertNeedsAdmin(t, await a.req('POST', '/v2/serverless', { body, key: bob.key }), 'v2 create');
  // Templates are inert (an endpoint copies one at its create), so bob may still make one...
  const tpl = await mustPost(t, a, '/v2/templates', { name: 'bob-tpl', image: 'x', args: 'touch bob-ran', isServerless: true }, bob.key);
  // ...but not an endpoint from it, through the older REST create either.
  assertNeedsAdmin(t, await a.req('POST', '/v1/endpoints', {
    body: { name: 'legacy-pwn', templateId: tpl.id, computeType: 'CPU', workersMin: 1, workersMax: 1 }, key: bob.key,
  }), 'v1 create');
  await sleep(1500);
  t.notOk(existsSync(join(workdir, 'bob-ran')), 'no command of bob ran on the host');
  t.same((await a.req('GET', '/v2/serverless', { key: bob.key })).json, [], 'and bob has no endpoint');

  // A key without endpoints:write still gets the usual scope 403 first.
  const reader = await makeUser(t, a, 'reader', ['endpoints:read']);
  const r = await a.req('POST', '/v2/serverless', { body, key: reader.key });
  assertProblem(t, r, 403);
  t.match(r.json.detail, /needs the "endpoints:write" scope/);
});

t.test('process runtime: a non-admin key may scale, rename, delete and run jobs, not change what runs', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  // A key of the admin's own account without the admin scope (a CI or dashboard key).
  const ops = await mustPost(t, a, '/v2/api-keys', { name: 'ops', scopes: ALL_USER_SCOPES });

  // The admin still creates and runs endpoints as before.
  const ep = await mustCreate(t, a, cpuBody({
    name: 'echo', args: 'python3 -u test/fixtures/workers/echo.py', env: { GREETING: 'hi' },
    workers: { min: 0, max: 1, idleTimeout: 2 },
  }));
  const done = await a.req('POST', `/v2/${ep.id}/runsync`, { body: { input: { n: 1 } }, key: ops.key });
  t.equal(done.json?.status, 'COMPLETED', `a job of a non-admin key runs on the admin's endpoint: ${done.text}`);
  t.equal(done.json?.output?.env, 'hi');
  t.equal((await a.req('GET', `/v2/${ep.id}/health`, { key: ops.key })).status, 200, 'job reads unchanged');
  t.equal((await a.req('GET', `/v2/serverless/${ep.id}`, { key: ops.key })).status, 200, 'endpoint reads unchanged');

  const patch = (body: unknown, key: string = ops.key) => a.req('PATCH', `/v2/serverless/${ep.id}`, { body, key });
  const scaled = await patch({ workers: { min: 0, max: 3, idleTimeout: 7 }, scaling: { type: 'QUEUE_DELAY', queueDelay: 2 }, name: 'echo-2', timeout: 60_000 });
  t.equal(scaled.status, 200, `scaling, name and timeout need no admin: ${scaled.text}`);
  t.same(scaled.json.workers, { min: 0, max: 3, idleTimeout: 7 });
  t.equal((await patch({ cpu: [{ id: 'cpu3c', vcpuCount: 4 }] })).status, 200, 'nor hardware');
  const same = await patch({ env: { GREETING: 'hi' }, args: 'python3 -u test/fixtures/workers/echo.py', image: ep.image });
  t.equal(same.status, 200, `sending the same command and env again changes nothing, so needs no admin: ${same.text}`);

  for (const [label, body] of [
    ['args', { args: 'touch /tmp/pwned' }],
    ['cmd', { cmd: ['touch', '/tmp/pwned'] }],
    ['entrypoint', { entrypoint: ['sh', '-c'] }],
    ['env', { env: { GREETING: 'hi', LD_PRELOAD: '/tmp/evil.so' } }],
    ['image', { image: 'registry.local/other:2' }],
    ['env with a scaling change', { env: {}, workers: { max: 1 } }],
  ] as const) {
    assertNeedsAdmin(t, await patch(body), `PATCH ${label}`);
  }
  const after = (await a.req('GET', `/v2/serverless/${ep.id}`)).json;
  t.same(
    { args: after.args, cmd: after.cmd, entrypoint: after.entrypoint, env: after.env, image: after.image, workers: after.workers },
    { args: 'python3 -u test/fixtures/workers/echo.py', cmd: ['python3', '-u', 'test/fixtures/workers/echo.py'], entrypoint: [], env: { GREETING: 'hi' }, image: ep.image, workers: { min: 0, max: 3, idleTimeout: 7 } },
    'a refused PATCH changes nothing, not even its allowed part',
  );

  const byAdmin = await a.req('PATCH', `/v2/serverless/${ep.id}`, { body: { env: { GREETING: 'hello' } } });
  t.equal(byAdmin.status, 200, `the admin changes the env: ${byAdmin.text}`);
  const again = await a.req('POST', `/v2/${ep.id}/runsync`, { body: { input: { n: 2 } }, key: ops.key });
  t.equal(again.json?.output?.env, 'hello', 'and the new env runs');

  t.equal((await a.req('DELETE', `/v2/serverless/${ep.id}`, { key: ops.key })).status, 204, 'a non-admin key may still delete');
});

t.test('runtime none: endpoints:write creates and changes commands as before', async (t) => {
  const a = await startAgent(t, { runtime: 'none' });
  const bob = await makeUser(t, a, 'bob', ALL_USER_SCOPES);
  const ep = await mustCreate(t, a, cpuBody({ args: 'python3 handler.py' }), bob.key);
  const r = await a.req('PATCH', `/v2/serverless/${ep.id}`, { body: { args: 'python3 other.py', env: { A: '1' } }, key: bob.key });
  t.equal(r.status, 200, r.text);
});

t.test('process runtime: an endpoint whose command a non-admin key set under another runtime does not start until an admin approves it', async (t) => {
  const workdir = mkdtempSync(join(tmpdir(), 'flashd-procapprove-'));
  t.teardown(() => rmSync(workdir, { recursive: true, force: true }));
  const ran = (name: string) => existsSync(join(workdir, name));
  const logText = async (a: Awaited<ReturnType<typeof startAgent>>, ep: string) =>
    ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line).join('\n');
  const warm = { min: 1, max: 1, idleTimeout: 5 };

  // Under runtime none (a container runtime alike) endpoints:write sets commands freely.
  const first = await startAgent(t, { runtime: 'none' });
  const ops = await mustPost(t, first, '/v2/api-keys', { name: 'ops', scopes: ALL_USER_SCOPES });
  const byAdmin = await mustCreate(t, first, cpuBody({ name: 'admin-made', args: 'touch admin-ran', workers: { min: 0, max: 1, idleTimeout: 5 } }));
  const byOps = await mustCreate(t, first, cpuBody({ name: 'ops-made', args: 'touch ops-ran', workers: warm }), ops.key);
  const changed = await mustCreate(t, first, cpuBody({ name: 'ops-changed', args: 'touch admin-set', workers: warm }));
  const patch = (a: Awaited<ReturnType<typeof startAgent>>, ep: string, body: unknown, key?: string) =>
    a.req('PATCH', `/v2/serverless/${ep}`, { body, ...(key ? { key } : {}) });
  t.equal((await patch(first, changed.id, { args: 'touch ops-changed-ran' }, ops.key)).status, 200, 'a non-admin changes an admin endpoint\'s command');
  t.equal((await patch(first, byAdmin.id, { workers: warm }, ops.key)).status, 200, 'and scales the other one, which changes nothing it runs');
  await first.agent.close();

  // The same data dir under the process runtime.
  const a = await startAgent(t, { runtime: 'process', processWorkdir: workdir }, { dir: first.dir });
  await until('the admin-made endpoint to start its worker', async () => ran('admin-ran'));
  await until('the held-back line', async () => /no worker can start: its image, command or env was last set by a key without the "admin" scope/.test(await logText(a, byOps.id)));
  t.match(await logText(a, byOps.id), /a PATCH from an admin key that names image, args, entrypoint, cmd or env \(the same values will do\) lets it start/, 'the line says what to do');
  await sleep(1000);
  t.notOk(ran('ops-ran'), 'the non-admin\'s endpoint ran nothing on the host');
  t.notOk(ran('ops-changed-ran'), 'nor the admin endpoint whose command a non-admin changed');
  t.notOk(ran('admin-set'), 'nor its earlier command');

  const approve = await patch(a, byOps.id, { args: 'touch ops-ran' });
  t.equal(approve.status, 200, `an admin sends the same args again: ${approve.text}`);
  t.same(approve.json.restartReasons, [], 'which changes nothing');
  t.notOk('commandByAdmin' in approve.json, 'the flag is not shown');
  await until('the approved endpoint to start', async () => ran('ops-ran'));
  t.notOk(ran('ops-changed-ran'), 'the other stays held back');
});
