/**
 * --log-level debug: what an operator chasing a problem reads (refused requests with their
 * reason and the key's public id, each job's submit, take and end, worker protocol refusals),
 * none of it at info, and never a key.
 */
import t from 'tap';
import { startAgent, cpuBody, ADMIN_KEY, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

async function scenario(a: TestAgent): Promise<{ keys: string[]; ep: string; jobId: string; w: TestWorker; readerId: string; revokedId: string }> {
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const reader = await a.req('POST', '/v2/api-keys', { body: { name: 'reader', scopes: ['jobs:read'] } });
  const revoked = await a.req('POST', '/v2/api-keys', { body: { name: 'gone', scopes: ['jobs:read'] } });
  t.equal((await a.req('DELETE', `/v2/api-keys/${revoked.json.id}`)).status, 204);
  t.equal((await a.req('GET', '/v2/serverless', { key: null })).status, 401, 'no key');
  t.equal((await a.req('GET', '/v2/serverless', { key: 'not-a-key-but-a-long-secret' })).status, 401, 'an unknown key');
  t.equal((await a.req('GET', `/v2/${ep}/health`, { key: revoked.json.key })).status, 401, 'a revoked key');
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: {} }, key: reader.json.key })).status, 403, 'a read-only key runs a job');
  const jobId = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, jobId);
  t.equal((await w.done(jobId, { output: { ok: true } })).status, 200);
  t.equal((await w.done(jobId, { output: { again: true } })).status, 200, 'a repeated result');
  // Another worker's job: a stale attempt (409).
  const other = await TestWorker.create(a, ep);
  t.equal((await other.done(jobId, { output: 1 })).status, 409, "a result for a job the worker does not hold");
  // A worker key on another endpoint's route.
  const ep2 = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const res = await fetch(`${a.url}/v2/${ep2}/job-done/${w.workerId}/${jobId}?gpu=cpu&isStream=false`, { method: 'POST', headers: { authorization: w.key }, body: '{"output": 1}' });
  t.equal(res.status, 403, "a worker key on another endpoint's route");
  return { keys: [ADMIN_KEY, reader.json.key, revoked.json.key, w.key, other.key, 'not-a-key-but-a-long-secret'], ep, jobId, w, readerId: reader.json.id, revokedId: revoked.json.id };
}

t.test('--log-level debug logs refusals, job lifecycle and worker refusals, without keys', async (t) => {
  const a = await startAgent(t, { logLevel: 'debug', takeHoldMs: 500 });
  const { keys, ep, jobId, w, readerId, revokedId } = await scenario(a);
  const log = a.logs.join('');
  const debug = log.split('\n').filter((l) => / debug /.test(l));
  const line = (re: RegExp) => debug.find((l) => re.test(l));
  t.ok(line(/request refused .*status=401 code=UNAUTHENTICATED method=GET path=\/v2\/serverless reason="Missing Authorization header/), 'a missing key');
  t.ok(line(/request refused .*status=401 .*reason="The API key is not valid\."/), 'an unknown key, with no id to give');
  t.ok(line(new RegExp(`request refused .*status=401 .*keyId=${revokedId} keyPrefix=\\S+ reason="The API key has been revoked\\."`)), "a revoked key, with its id and public prefix");
  t.ok(line(new RegExp(`request refused .*status=403 code=FORBIDDEN method=POST path=/v2/${ep}/run keyId=${readerId} reason=`)), 'a scope refusal with the key id');
  t.ok(line(new RegExp(`job submitted jobId=${jobId} endpointId=${ep}`)), 'submitted');
  t.ok(line(new RegExp(`job taken by worker jobId=${jobId} endpointId=${ep} workerId=${w.workerId} attempt=1`)), 'taken');
  t.ok(line(new RegExp(`job ended jobId=${jobId} endpointId=${ep} status=COMPLETED workerId=${w.workerId} attempt=1 by=worker ms=\\d+`)), 'ended, with its status');
  t.ok(line(new RegExp(`worker result repeated: already recorded jobId=${jobId}`)), 'a repeated result');
  t.ok(line(new RegExp(`worker request refused .*status=409 code=STALE_ATTEMPT method=POST path=/v2/${ep}/job-done/`)), 'a stale attempt');
  t.ok(line(/worker request refused .*status=403 .*path=\/v2\/\S+\/job-done\//), "another endpoint's route");
  for (const key of keys) t.notOk(log.includes(key), `no key in the log (${key.slice(0, 6)}…)`);
});

t.test('at info (the default) none of those lines is written', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 500 });
  t.equal(a.agent.log.debugEnabled, false);
  await scenario(a);
  t.notMatch(a.logs.join(''), / debug |request refused|job submitted|job taken|job ended|worker result/);
});
