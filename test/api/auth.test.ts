/**
 * Authentication and access (spec, "Authentication", statuses 401/403/404): API keys, scopes,
 * users, teams and console sessions. Another account's resource is a 404, never a leak.
 */
import t, { type Test } from 'tap';
import Database from 'better-sqlite3';
import { createHmac } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { generateApiKey } from '../../src/auth/index.js';
import { ManualClock } from '../../src/core/clock.js';
import { ADMIN_KEY, assertProblem, cpuBody, queueBody, startAgent, type Reply, type TestAgent } from '../helpers/agent.js';
import { assertErrorAt, createEndpoint, makeGlobalVolume, makeNetworkVolume, makeRegistry, makeTemplate, makeUser, mustCreate, mustPost } from '../helpers/expect.js';
import { testDataDir } from '../helpers/data-dir.js';

function assert401(t: Test, r: Reply, detail?: RegExp, label?: string): void {
  assertProblem(t, r, 401, label);
  t.match(r.headers.get('www-authenticate') ?? '', /^Bearer\b/, `WWW-Authenticate: Bearer (${label ?? ''})`);
  t.equal(r.json?.code, 'UNAUTHENTICATED');
  t.equal(r.headers.get('ratelimit'), null, 'a 401 carries no rate-limit state');
  if (detail) t.match(r.json?.detail, detail, label ?? 'detail');
}

const withAuth = (value: string) => ({ key: null, headers: { authorization: value } });

t.test('401 for a missing, malformed, unknown, revoked or expired token', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, {}, { clock });
  assert401(t, await a.req('GET', '/v2/serverless', { key: null }), /Missing/, 'no Authorization header');
  assert401(t, await a.req('GET', '/v2/serverless', withAuth('')), undefined, 'empty header');
  assert401(t, await a.req('GET', '/v2/serverless', withAuth('Bearer')), /no token/, '"Bearer" alone');
  assert401(t, await a.req('GET', '/v2/serverless', withAuth('Bearer two tokens')), /Malformed/, 'two tokens');
  assert401(t, await a.req('GET', '/v2/serverless', withAuth('Basic dXNlcjpwYXNz')), undefined, 'Basic scheme');

  const issued = await mustPost(t, a, '/v2/api-keys', { name: 'to-break', scopes: ['endpoints:read'] });
  const key: string = issued.key;
  t.match(key, /^fd_usr_[A-Za-z0-9]{36}$/, 'fd_usr_ + 36 base62 characters');
  const last = key.at(-1) === 'A' ? 'B' : 'A';
  assert401(t, await a.req('GET', '/v2/serverless', { key: key.slice(0, -1) + last }), /malformed/, 'bad checksum');
  assert401(t, await a.req('GET', '/v2/serverless', { key: key.slice(0, -2) }), /malformed/, 'truncated key');
  assert401(t, await a.req('GET', '/v2/serverless', { key: `${key}x` }), /malformed/, 'key with a trailing character');
  assert401(t, await a.req('GET', '/v2/serverless', { key: generateApiKey('usr') }), /not valid/, 'well formed but never issued');
  assert401(t, await a.req('GET', '/v2/serverless', { key: 'some-random-token-0123456789' }), /not valid/, 'a foreign token');
  t.equal((await a.req('GET', '/v2/serverless', { key })).status, 200, 'the key itself works');

  t.equal((await a.req('DELETE', `/v2/api-keys/${issued.id}`)).status, 204);
  assert401(t, await a.req('GET', '/v2/serverless', { key }), /revoked/, 'revoked key');
  t.notOk((await a.req('GET', `/v2/api-keys/${issued.id}`)).json.revokedAt === null, 'revokedAt is set');

  const expiring = await mustPost(t, a, '/v2/api-keys', { name: 'short-lived', scopes: ['endpoints:read'], expiresAt: new Date(clock.now() + 3_600_000).toISOString() });
  t.equal((await a.req('GET', '/v2/serverless', { key: expiring.key })).status, 200, 'works before expiry');
  clock.advance(3_600_000);
  assert401(t, await a.req('GET', '/v2/serverless', { key: expiring.key }), /expired/, 'expired key');
  const past = await a.req('POST', '/v2/api-keys', { body: { name: 'born-dead', scopes: ['endpoints:read'], expiresAt: new Date(clock.now() - 1000).toISOString() } });
  assertErrorAt(t, past, 400, '/expiresAt', 'a key cannot be created already expired');
  assertErrorAt(t, await a.req('POST', '/v2/api-keys', { body: { name: 'bad-date', scopes: ['endpoints:read'], expiresAt: 'tomorrow' } }), 400, '/expiresAt');
});

t.test('every authenticated route answers 401 without a token', async (t) => {
  const a = await startAgent(t);
  const routes = a.agent.api.routes.filter((r) => r.auth !== 'none');
  t.ok(routes.length > 30, `${routes.length} authenticated routes`);
  for (const r of routes) {
    const path = r.path.replace(/\{\w+\}/g, 'abcdefghijklmn');
    const res = await a.req(r.method, path, { key: null, ...(r.body ? { body: {} } : {}) });
    assert401(t, res, undefined, `${r.method} ${r.path}`);
  }
  for (const r of a.agent.api.routes.filter((x) => x.auth === 'none')) {
    t.not((await a.req(r.method, r.path, { key: null })).status, 401, `${r.method} ${r.path} is public`);
  }
});

t.test('keys: shown once, listed without secrets, stored hashed', async (t) => {
  const a = await startAgent(t);
  const created = await a.req('POST', '/v2/api-keys', { body: { name: 'ci', scopes: ['endpoints:read', 'jobs:run'] } });
  t.equal(created.status, 201);
  const k = created.json;
  t.match(k, { id: String, key: String, name: 'ci', scopes: ['endpoints:read', 'jobs:run'], exempt: false, teamId: null, revokedAt: null, expiresAt: null });
  t.equal(k.prefix, k.key.slice(0, 11), 'a recognisable prefix');
  const list = await a.req('GET', '/v2/api-keys');
  t.equal(list.status, 200);
  t.ok(Array.isArray(list.json), 'a bare array');
  const listed = list.json.find((x: { id: string }) => x.id === k.id);
  t.ok(listed, 'the new key is listed');
  t.notOk('key' in listed, 'without the secret');
  t.notOk(list.text.includes(k.key), 'the secret appears nowhere in the list');
  const one = await a.req('GET', `/v2/api-keys/${k.id}`);
  t.notOk('key' in one.json || one.text.includes(k.key), 'GET one has no secret');
  const renamed = await a.req('PATCH', `/v2/api-keys/${k.id}`, { body: { name: 'ci-renamed' } });
  t.same([renamed.status, renamed.json.name], [200, 'ci-renamed']);
  t.notOk('key' in renamed.json);
  assertErrorAt(t, await a.req('PATCH', `/v2/api-keys/${k.id}`, { body: { scopes: ['admin'] } }), 400, '/scopes', 'scopes cannot be widened later');
  assertErrorAt(t, await a.req('POST', '/v2/api-keys', { body: { name: 'x', scopes: ['root'] } }), 400, '/scopes/0', 'unknown scope');
  assertErrorAt(t, await a.req('POST', '/v2/api-keys', { body: { name: 'x', scopes: [] } }), 400, '/scopes', 'at least one scope');
  assertErrorAt(t, await a.req('POST', '/v2/api-keys', { body: { scopes: ['admin'] } }), 400, '/name');
  for (const file of readdirSync(a.dir).filter((f) => f.startsWith('flashd.db'))) {
    t.equal(readFileSync(join(a.dir, file)).indexOf(Buffer.from(k.key.slice(7))), -1, `the secret is not stored in ${file}`);
  }
});

t.test('403: a valid token without the scope or the right', async (t) => {
  const a = await startAgent(t);
  const reader = await makeUser(t, a, 'reader', ['endpoints:read']);
  const writer = await makeUser(t, a, 'writer', ['endpoints:write']);
  const runner = await makeUser(t, a, 'runner', ['jobs:run', 'jobs:read']);
  const forbidden = (r: Reply, label: string) => {
    assertProblem(t, r, 403, label);
    t.equal(r.json.code, 'FORBIDDEN');
    t.ok(r.headers.get('ratelimit'), 'a 403 is an authenticated response with rate-limit headers');
  };
  t.equal((await a.req('GET', '/v2/serverless', { key: reader.key })).status, 200, 'endpoints:read can list');
  forbidden(await createEndpoint(a, queueBody(), reader.key), 'endpoints:read cannot create');
  forbidden(await a.req('POST', '/v2/templates', { body: { name: 'x', image: 'y' }, key: reader.key }), 'endpoints:read cannot create templates');
  forbidden(await a.req('DELETE', '/v2/serverless/abcdefghijklmn', { key: reader.key }), 'the scope is checked before the lookup');
  t.equal((await createEndpoint(a, queueBody(), writer.key)).status, 201, 'endpoints:write can create');
  forbidden(await a.req('GET', '/v2/serverless', { key: writer.key }), 'endpoints:write alone cannot read');
  forbidden(await a.req('GET', '/v2/serverless', { key: runner.key }), 'jobs scopes cannot read endpoints');
  forbidden(await a.req('GET', '/v2/catalog/gpus', { key: runner.key }), 'nor catalogs');
  forbidden(await a.req('POST', '/v1/endpoints', { body: { name: 'x', templateId: 'y' }, key: reader.key }), 'older REST create needs endpoints:write');

  const ep = await mustCreate(t, a, queueBody({ name: 'jobs-scope' }), writer.key);
  const jobsOnly = await mustPost(t, a, '/v2/api-keys', { name: 'jobs-only', scopes: ['jobs:run'], userId: writer.id });
  const readOnly = await mustPost(t, a, '/v2/api-keys', { name: 'read-only', scopes: ['endpoints:read'], userId: writer.id });
  t.equal((await a.req('POST', `/v2/${ep.id}/run`, { body: { input: {} }, key: jobsOnly.key })).status, 200, 'jobs:run submits jobs');
  forbidden(await a.req('POST', `/v2/${ep.id}/run`, { body: { input: {} }, key: readOnly.key }), 'endpoints:read cannot submit jobs');
  forbidden(await a.req('GET', `/v2/serverless/${ep.id}`, { key: jobsOnly.key }), 'jobs:run cannot read the endpoint');
  t.equal((await a.req('GET', `/v2/serverless/${ep.id}`, { key: readOnly.key })).status, 200, 'a second key of the same user sees its endpoints');

  forbidden(await a.req('POST', '/v2/users', { body: { name: 'mallory' }, key: writer.key }), 'only admins create users');
  forbidden(await a.req('POST', '/v2/api-keys', { body: { name: 'up', scopes: ['endpoints:write'] }, key: reader.key }), 'a key cannot grant scopes its creator lacks');
  forbidden(await a.req('POST', '/v2/api-keys', { body: { name: 'up', scopes: ['admin'] }, key: reader.key }), 'nor admin');
  forbidden(await a.req('POST', '/v2/api-keys', { body: { name: 'for-other', scopes: ['endpoints:read'], userId: writer.id }, key: reader.key }), 'only admins create keys for another user');
  forbidden(await a.req('POST', '/v2/api-keys', { body: { name: 'exempt', scopes: ['endpoints:read'], exempt: true }, key: reader.key }), 'only admins make exempt keys');
  forbidden(await a.req('PATCH', `/v2/api-keys/${reader.keyId}`, { body: { exempt: true }, key: reader.key }), 'only admins change exemption');
  const own = await a.req('POST', '/v2/api-keys', { body: { name: 'own', scopes: ['endpoints:read'] }, key: reader.key });
  t.equal(own.status, 201, 'a non-admin may create a key for itself with scopes it holds');
  t.equal(own.json.userId, reader.id);
  t.same((await a.req('GET', '/v2/users', { key: reader.key })).json.map((u: { id: string }) => u.id), [reader.id], 'non-admins see only themselves');
});

t.test("another account's resources are 404 on every verb", async (t) => {
  const a = await startAgent(t);
  const alice = await makeUser(t, a, 'alice');
  const bob = await makeUser(t, a, 'bob');
  const ep = await mustCreate(t, a, queueBody({ name: 'alice-ep' }), alice.key);
  const tpl = await makeTemplate(t, a, { name: 'alice-tpl' }, alice.key);
  const nv = await makeNetworkVolume(t, a, {}, alice.key);
  const gv = await makeGlobalVolume(t, a, {}, alice.key);
  const reg = await makeRegistry(t, a, {}, alice.key);
  const resources: [string, string, unknown][] = [
    ['/v2/serverless', ep.id, { name: 'stolen' }],
    ['/v2/templates', tpl.id, { name: 'stolen' }],
    ['/v2/network-volumes', nv.id, { name: 'stolen' }],
    ['/v2/global-volumes', gv.id, { name: 'stolen' }],
    ['/v2/registry-credentials', reg.id, { name: 'stolen' }],
    ['/v2/api-keys', alice.keyId, { name: 'stolen' }],
  ];
  for (const [base, id, body] of resources) {
    assertProblem(t, await a.req('GET', `${base}/${id}`, { key: bob.key }), 404, `GET ${base}/{id}`);
    assertProblem(t, await a.req('PATCH', `${base}/${id}`, { body, key: bob.key }), 404, `PATCH ${base}/{id}`);
    assertProblem(t, await a.req('DELETE', `${base}/${id}`, { key: bob.key }), 404, `DELETE ${base}/{id}`);
    const list = await a.req('GET', base, { key: bob.key });
    t.notOk(list.text.includes(id), `${base} list does not show it`);
    t.equal((await a.req('GET', `${base}/${id}`, { key: alice.key })).status, 200, `still there for its owner (${base})`);
  }
  assertProblem(t, await a.req('GET', `/v1/endpoints/${ep.id}`, { key: bob.key }), 404, 'older REST get');
  const missing = await a.req('GET', '/v2/serverless/abcdefghijklmn', { key: bob.key });
  const foreign = await a.req('GET', `/v2/serverless/${ep.id}`, { key: bob.key });
  t.same([foreign.json.title, foreign.json.code], [missing.json.title, missing.json.code], 'indistinguishable from a missing id');
  t.equal(foreign.json.detail.replace(ep.id, 'X'), missing.json.detail.replace('abcdefghijklmn', 'X'));
  assertErrorAt(t, await createEndpoint(a, queueBody({ registry: reg.id }), bob.key), 404, '/registry', "another account's registry credential");
  t.equal((await a.req('GET', `/v2/serverless/${ep.id}`)).status, 404, 'even the admin user has its own account');
});

t.test('users and teams; a team key acts for the team', async (t) => {
  const a = await startAgent(t);
  const owner = await makeUser(t, a, 'team-owner');
  const member = await makeUser(t, a, 'team-member');
  const outsider = await makeUser(t, a, 'outsider');
  const user = await a.req('POST', '/v2/users', { body: { name: 'plain' } });
  t.equal(user.status, 201);
  t.match(user.json, { id: String, name: 'plain', isAdmin: false });
  t.ok((await a.req('GET', '/v2/users')).json.some((u: { id: string }) => u.id === user.json.id), 'admins list every user');

  const team = await mustPost(t, a, '/v2/teams', { name: 'ml' }, owner.key);
  t.equal(team.ownerUserId, owner.id);
  const add = await a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: member.id }, key: owner.key });
  t.equal(add.status, 204, 'the owner adds a member');
  const got = await a.req('GET', `/v2/teams/${team.id}`, { key: member.key });
  t.equal(got.status, 200);
  t.same(got.json.members, [{ userId: owner.id, role: 'owner' }, { userId: member.id, role: 'member' }]);
  assertProblem(t, await a.req('GET', `/v2/teams/${team.id}`, { key: outsider.key }), 404, 'a non-member cannot see the team');
  assertProblem(t, await a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: outsider.id }, key: member.key }), 403, 'only the owner adds members');
  assertProblem(t, await a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: outsider.id }, key: outsider.key }), 404);
  assertProblem(t, await a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: 'usr_nobody' }, key: owner.key }), 404, 'unknown user');
  t.same((await a.req('GET', '/v2/teams', { key: member.key })).json.map((x: { id: string }) => x.id), [team.id]);

  const ownerTeamKey = await mustPost(t, a, '/v2/api-keys', { name: 'team', scopes: ['endpoints:read', 'endpoints:write'], teamId: team.id }, owner.key);
  const memberTeamKey = await mustPost(t, a, '/v2/api-keys', { name: 'team', scopes: ['endpoints:read', 'endpoints:write'], teamId: team.id }, member.key);
  t.equal(ownerTeamKey.teamId, team.id);
  assertProblem(t, await a.req('POST', '/v2/api-keys', { body: { name: 'sneak', scopes: ['endpoints:read'], teamId: team.id }, key: outsider.key }), 404, 'no key for a team one is not in');
  const teamEp = await mustCreate(t, a, queueBody({ name: 'team-ep' }), ownerTeamKey.key);
  const personal = await mustCreate(t, a, queueBody({ name: 'personal' }), owner.key);
  t.equal((await a.req('GET', `/v2/serverless/${teamEp.id}`, { key: memberTeamKey.key })).status, 200, "another member's team key sees the team's endpoint");
  t.equal((await a.req('PATCH', `/v2/serverless/${teamEp.id}`, { body: { name: 'team-ep-2' }, key: memberTeamKey.key })).status, 200);
  assertProblem(t, await a.req('GET', `/v2/serverless/${teamEp.id}`, { key: owner.key }), 404, "the team's endpoint is not in the owner's personal account");
  assertProblem(t, await a.req('GET', `/v2/serverless/${personal.id}`, { key: memberTeamKey.key }), 404, 'nor the other way round');
  t.same((await a.req('GET', '/v2/serverless', { key: ownerTeamKey.key })).json.map((e: { id: string }) => e.id), [teamEp.id]);
  const tv = await makeNetworkVolume(t, a, { name: 'team-volume' }, memberTeamKey.key);
  t.equal((await createEndpoint(a, cpuBody({ mounts: { network: [{ volumeId: tv.id }] } }), ownerTeamKey.key)).status, 201, 'team resources are shared by team keys');
  assertProblem(t, await a.req('POST', '/v2/teams', { body: { name: 'nested' }, key: ownerTeamKey.key }), 403, 'team keys cannot create teams');

  const third = await makeUser(t, a, 'team-third');
  t.equal((await a.req('POST', `/v2/teams/${team.id}/members`, { body: { userId: third.id }, key: owner.key })).status, 204);
  assertProblem(t, await a.req('DELETE', `/v2/teams/${team.id}/members/${third.id}`, { key: member.key }), 403, 'a member cannot remove another member');
  t.equal((await a.req('DELETE', `/v2/teams/${team.id}/members/${third.id}`, { key: third.key })).status, 204, 'a member may leave');
  assertProblem(t, await a.req('DELETE', `/v2/teams/${team.id}/members/${owner.id}`, { key: owner.key }), 404, 'the owner cannot be removed');
  assertProblem(t, await a.req('DELETE', `/v2/teams/${team.id}/members/${outsider.id}`, { key: owner.key }), 404, 'not a member');
  const removed = await a.req('DELETE', `/v2/teams/${team.id}/members/${member.id}`, { key: owner.key });
  t.equal(removed.status, 204);
  assert401(t, await a.req('GET', '/v2/serverless', { key: memberTeamKey.key }), /no longer a member/, 'a team key stops working when its user leaves the team');
  t.equal((await a.req('GET', '/v2/serverless', { key: member.key })).status, 200, 'the personal key still works');
  t.equal((await a.req('GET', `/v2/teams/${team.id}`)).status, 200, 'admins can read any team');
});

t.test('console sessions: act for the user, X-Team-Id only for own teams', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { sessionTtlSeconds: 600 }, { clock });
  const user = await makeUser(t, a, 'console-user');
  const other = await makeUser(t, a, 'console-other');
  const team = await mustPost(t, a, '/v2/teams', { name: 'console-team' }, user.key);
  const foreignTeam = await mustPost(t, a, '/v2/teams', { name: 'not-mine' }, other.key);
  const mine = await mustCreate(t, a, queueBody({ name: 'mine' }), user.key);
  const theirs = await mustCreate(t, a, queueBody({ name: 'theirs' }), other.key);

  const opened = await a.req('POST', '/v2/sessions', { key: user.key });
  t.equal(opened.status, 201);
  t.match(opened.json, { token: /^fds_/, userId: user.id });
  t.equal(Date.parse(opened.json.expiresAt), clock.now() + 600_000, 'expires after the session TTL');
  const token: string = opened.json.token;
  const ids = async (headers: Record<string, string> = {}) => (await a.req('GET', '/v2/serverless', { key: token, headers })).json.map((e: { id: string }) => e.id);

  t.same(await ids(), [mine.id], "a session acts for the user's own account");
  const created = await a.req('POST', '/v2/serverless', { key: token, headers: { 'x-team-id': team.id }, body: queueBody({ name: 'team-by-session' }) });
  t.equal(created.status, 201);
  t.same(await ids({ 'x-team-id': team.id }), [created.json.id], 'with X-Team-Id of an own team it acts for the team');
  t.same(await ids(), [mine.id], 'without the header, the own account again');
  t.same(await ids({ 'x-team-id': foreignTeam.id }), [mine.id], 'X-Team-Id of a team the user is not in: the own account');
  t.notOk((await ids({ 'x-team-id': foreignTeam.id })).includes(theirs.id), "never another account's resources");
  t.same(await ids({ 'x-team-id': 'team_doesnotexist' }), [mine.id], 'an unknown team id: the own account');
  const keyWithHeader = await a.req('GET', '/v2/serverless', { key: other.key, headers: { 'x-team-id': team.id } });
  t.same(keyWithHeader.json.map((e: { id: string }) => e.id), [theirs.id], 'X-Team-Id never opens a team to a non-member');

  assertProblem(t, await a.req('POST', '/v2/sessions', { key: token }), 403, 'a session cannot open another session');
  const tampered = token.slice(0, -2) + (token.endsWith('AA') ? 'BB' : 'AA');
  assert401(t, await a.req('GET', '/v2/serverless', { key: tampered }), undefined, 'a tampered session token');
  assert401(t, await a.req('GET', '/v2/serverless', { key: 'fds_notatoken' }), undefined, 'a malformed session token');

  const reader = await makeUser(t, a, 'console-reader', ['endpoints:read']);
  const readerSession = (await a.req('POST', '/v2/sessions', { key: reader.key })).json.token;
  assertProblem(t, await createEndpoint(a, queueBody(), readerSession), 403, 'a session has the scopes of the key that opened it');

  clock.advance(600_000);
  assert401(t, await a.req('GET', '/v2/serverless', { key: token }), /expired/, 'an expired session');
  const fresh = (await a.req('POST', '/v2/sessions', { key: user.key })).json.token;
  t.equal((await a.req('GET', '/v2/serverless', { key: fresh })).status, 200);
  t.equal((await a.req('DELETE', `/v2/api-keys/${user.keyId}`, { key: user.key })).status, 204, 'a user may revoke its own key');
  assert401(t, await a.req('GET', '/v2/serverless', { key: fresh }), /revoked/, 'revoking the key ends its sessions');
});

t.test('a session opened with a team key acts for that team only, while its user is a member', async (t) => {
  const a = await startAgent(t);
  const owner = await makeUser(t, a, 'team-owner');
  const user = await makeUser(t, a, 'team-key-user');
  const team = await mustPost(t, a, '/v2/teams', { name: 'ci-team' }, owner.key);
  t.equal((await a.req('POST', `/v2/teams/${team.id}/members`, { key: owner.key, body: { userId: user.id } })).status, 204);
  const ownTeam = await mustPost(t, a, '/v2/teams', { name: 'own-team' }, user.key);
  const personal = await mustCreate(t, a, queueBody({ name: 'personal' }), user.key);
  const teamKey = await mustPost(t, a, '/v2/api-keys', { name: 'ci', scopes: ['endpoints:read', 'endpoints:write'], teamId: team.id }, user.key);
  const teamEp = await mustCreate(t, a, queueBody({ name: 'team-ep' }), teamKey.key);
  const ids = async (key: string, headers: Record<string, string> = {}) => (await a.req('GET', '/v2/serverless', { key, headers })).json.map((e: { id: string }) => e.id);
  t.same(await ids(teamKey.key), [teamEp.id], 'the team key sees the team');

  const opened = await a.req('POST', '/v2/sessions', { key: teamKey.key });
  t.equal(opened.status, 201);
  const token: string = opened.json.token;
  t.same(await ids(token), [teamEp.id], "its session acts for the team, not for the user's own account");
  t.same(await ids(token, { 'x-team-id': ownTeam.id }), [teamEp.id], 'X-Team-Id of another team of the user changes nothing');
  assertProblem(t, await a.req('GET', `/v2/serverless/${personal.id}`, { key: token }), 404, 'a personal endpoint is a 404 to it');

  t.equal((await a.req('DELETE', `/v2/teams/${team.id}/members/${user.id}`, { key: owner.key })).status, 204, 'the owner removes the user');
  assert401(t, await a.req('GET', '/v2/serverless', { key: teamKey.key }), /no longer a member/, 'the team key after its user left');
  assert401(t, await a.req('GET', '/v2/serverless', { key: token }), /no longer a member/, 'its session after its user left');
  const personalSession = (await a.req('POST', '/v2/sessions', { key: user.key })).json.token;
  t.same(await ids(personalSession), [personal.id], "a session of the user's own key still acts for the own account");
});

t.test('a team key (or its session) creates keys and teams for its team only', async (t) => {
  const a = await startAgent(t);
  const user = await makeUser(t, a, 'team-key-minter');
  const team = await mustPost(t, a, '/v2/teams', { name: 'minter-team' }, user.key);
  const ownTeam = await mustPost(t, a, '/v2/teams', { name: 'minter-other-team' }, user.key);
  const personal = await mustCreate(t, a, queueBody({ name: 'minter-personal' }), user.key);
  const teamKey = await mustPost(t, a, '/v2/api-keys', { name: 'ci', scopes: ['endpoints:read'], teamId: team.id }, user.key);
  const session: string = (await a.req('POST', '/v2/sessions', { key: teamKey.key })).json.token;
  for (const [label, key] of [['team key', teamKey.key], ['its session', session]] as const) {
    const escaped = await a.req('POST', '/v2/api-keys', { key, body: { name: 'escape', scopes: ['endpoints:read'] } });
    assertProblem(t, escaped, 403, `${label}: no key for the user's own account`);
    if (escaped.status === 201) t.notOk((await a.req('GET', '/v2/serverless', { key: escaped.json.key })).json.some((e: { id: string }) => e.id === personal.id), 'the minted key reaches the personal endpoint');
    assertProblem(t, await a.req('POST', '/v2/api-keys', { key, body: { name: 'other', scopes: ['endpoints:read'], teamId: ownTeam.id } }), 403, `${label}: no key for another team of the user`);
    const same = await a.req('POST', '/v2/api-keys', { key, body: { name: 'same-team', scopes: ['endpoints:read'], teamId: team.id } });
    t.equal(same.status, 201, `${label}: a key of its own team`);
    t.equal(same.json.teamId, team.id);
    assertProblem(t, await a.req('POST', '/v2/teams', { key, body: { name: 'new' } }), 403, `${label}: no new team`);
  }
  t.equal((await a.req('POST', '/v2/api-keys', { key: user.key, body: { name: 'personal-2', scopes: ['endpoints:read'] } })).status, 201, 'a personal key still creates personal keys');
  const personalSession: string = (await a.req('POST', '/v2/sessions', { key: user.key })).json.token;
  t.equal((await a.req('POST', '/v2/api-keys', { key: personalSession, headers: { 'x-team-id': team.id }, body: { name: 'via-console', scopes: ['endpoints:read'], teamId: ownTeam.id } })).status, 201,
    'a session of a personal key acting for a team through X-Team-Id is not confined to it');
});

t.test("a team key (or its session) sees and manages its team's keys and membership only", async (t) => {
  const a = await startAgent(t);
  const user = await makeUser(t, a, 'confined-user');
  const outsider = await makeUser(t, a, 'outsider');
  const team = await mustPost(t, a, '/v2/teams', { name: 'confined-team' }, user.key);
  const other = await mustPost(t, a, '/v2/teams', { name: 'users-other-team' }, user.key);
  const teamKey = await mustPost(t, a, '/v2/api-keys', { name: 'ci', scopes: ['endpoints:read', 'endpoints:write'], teamId: team.id }, user.key);
  const session: string = (await a.req('POST', '/v2/sessions', { key: teamKey.key })).json.token;
  for (const [label, key] of [['team key', teamKey.key], ['its session', session]] as const) {
    t.same((await a.req('GET', '/v2/teams', { key })).json.map((x: { id: string }) => x.id), [team.id], `${label}: lists its team only`);
    t.equal((await a.req('GET', `/v2/teams/${team.id}`, { key })).status, 200, `${label}: reads its team`);
    assertProblem(t, await a.req('GET', `/v2/teams/${other.id}`, { key }), 404, `${label}: another team of the user is a 404`);
    assertProblem(t, await a.req('POST', `/v2/teams/${other.id}/members`, { key, body: { userId: outsider.id } }), 404, `${label}: cannot add a member to another team of the user`);
    assertProblem(t, await a.req('DELETE', `/v2/teams/${other.id}/members/${user.id}`, { key }), 404, `${label}: cannot remove a member there`);
    t.same((await a.req('GET', '/v2/api-keys', { key })).json.map((k: { id: string }) => k.id), [teamKey.id], `${label}: lists its team's keys, not the user's own`);
    assertProblem(t, await a.req('GET', `/v2/api-keys/${user.keyId}`, { key }), 404, `${label}: the user's personal key is a 404`);
    assertProblem(t, await a.req('DELETE', `/v2/api-keys/${user.keyId}`, { key }), 404, `${label}: and cannot be revoked`);
  }
  t.equal((await a.req('GET', '/v2/serverless', { key: user.key })).status, 200, 'the personal key still works');
  t.same((await a.req('GET', `/v2/teams/${other.id}`, { key: user.key })).json.members.map((m: { userId: string }) => m.userId), [user.id], 'no outsider was added');
  t.equal((await a.req('GET', '/v2/teams', { key: user.key })).json.length, 2, 'the personal key lists both teams');
});

t.test('a copy of flashd.db alone cannot mint a session; a token pairs a key with its own user only', async (t) => {
  const a = await startAgent(t);
  const user = await makeUser(t, a, 'forge-target');
  const adminKeyId: string = (await a.req('GET', '/v2/api-keys')).json.find((k: { name: string }) => k.name.startsWith('admin')).id;
  const db = new Database(join(a.dir, 'flashd.db'), { readonly: true });
  const setting = (db.prepare("SELECT value FROM settings WHERE key = 'session_secret'").get() as { value: string }).value;
  db.close();
  const sign = (claims: object, secret: string) => {
    const payload = Buffer.from(JSON.stringify(claims)).toString('base64url');
    return `fds_${payload}.${createHmac('sha256', secret).update(payload).digest('base64url')}`;
  };
  const forever = Date.now() + 10 * 365 * 86_400_000;
  const fromDbOnly = sign({ u: 'usr_admin', k: adminKeyId, e: forever }, setting);
  assert401(t, await a.req('GET', '/v2/api-keys', { key: fromDbOnly }), /not valid/, 'a token signed with the setting read from flashd.db');

  // With secret.key as well (the whole data directory) tokens verify, but only for the key's own user.
  const fileKey = Buffer.from(readFileSync(join(a.dir, 'secret.key'), 'utf8').trim(), 'base64');
  const derived = createHmac('sha256', fileKey).update(`flashd session v1\0${setting}`).digest('base64url');
  t.equal((await a.req('GET', '/v2/api-keys', { key: sign({ u: 'usr_admin', k: adminKeyId, e: forever }, derived) })).status, 200, 'the derived key signs valid tokens');
  assert401(t, await a.req('GET', '/v2/serverless', { key: sign({ u: user.id, k: adminKeyId, e: forever }, derived) }), /not valid/, "the admin key's id with another user");
  const opened = await a.req('POST', '/v2/sessions', { key: user.key });
  t.equal((await a.req('GET', '/v2/serverless', { key: opened.json.token })).status, 200, 'a session opened through the API works');
});

t.test('admins manage every user key; others only their own', async (t) => {
  const a = await startAgent(t);
  const u1 = await makeUser(t, a, 'keys-u1');
  const u2 = await makeUser(t, a, 'keys-u2');
  const all = (await a.req('GET', '/v2/api-keys')).json.map((k: { id: string }) => k.id);
  t.ok(all.includes(u1.keyId) && all.includes(u2.keyId), 'admins list every user key');
  t.same((await a.req('GET', '/v2/api-keys', { key: u1.key })).json.map((k: { id: string }) => k.id), [u1.keyId], 'a user lists its own');
  assertProblem(t, await a.req('DELETE', `/v2/api-keys/${u2.keyId}`, { key: u1.key }), 404, "another user's key is a 404");
  t.equal((await a.req('GET', '/v2/serverless', { key: u2.key })).status, 200, 'and stays valid');
  t.equal((await a.req('DELETE', `/v2/api-keys/${u2.keyId}`)).status, 204, 'an admin revokes any user key');
  t.equal((await a.req('GET', '/v2/serverless', { key: u2.key })).status, 401);
  assertProblem(t, await a.req('GET', '/v2/api-keys/key_unknown'), 404);
});

t.test('a key cannot revoke or change a key of its user that holds scopes it lacks', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const reader = await a.req('POST', '/v2/api-keys', { body: { name: 'dashboard', scopes: ['jobs:read'] } });
  const ro = reader.json.key as string;
  const mine = (await a.req('GET', '/v2/api-keys', { key: ro })).json as { id: string; scopes: string[] }[];
  const adminKey = mine.find((k) => k.scopes.includes('admin'));
  t.ok(adminKey, "a key of the admin user lists the user's admin key");
  const adminId = (adminKey as { id: string }).id;
  assertProblem(t, await a.req('DELETE', `/v2/api-keys/${adminId}`, { key: ro }), 403, 'a jobs:read key cannot revoke the admin key');
  assertProblem(t, await a.req('PATCH', `/v2/api-keys/${adminId}`, { key: ro, body: { name: 'x' } }), 403, 'nor rename it');
  const worker = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json as { keyId: string; env: Record<string, string> };
  assertProblem(t, await a.req('DELETE', `/v2/api-keys/${worker.keyId}`, { key: ro }), 403, 'nor revoke a worker key');
  t.equal((await a.req('GET', '/v2/serverless')).status, 200, 'the admin key still works');
  t.equal((await a.req('GET', `/v2/api-keys/${worker.keyId}`)).json.revokedAt, null, 'the worker key too');
  const narrower = await a.req('POST', '/v2/api-keys', { key: ro, body: { name: 'narrower', scopes: ['jobs:read'] } });
  t.equal((await a.req('PATCH', `/v2/api-keys/${narrower.json.id}`, { key: ro, body: { name: 'renamed' } })).status, 200, 'a key with its scopes can be renamed');
  t.equal((await a.req('DELETE', `/v2/api-keys/${narrower.json.id}`, { key: ro })).status, 204, 'and revoked');
  t.equal((await a.req('DELETE', `/v2/api-keys/${reader.json.id}`, { key: ro })).status, 204, 'a key may revoke itself');
});

t.test('a revoked FLASHD_ADMIN_API_KEY is not revived by a restart', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, { adminApiKey: 'automation-key-to-revoke-0001' }, { dir });
  const keys = (await first.req('GET', '/v2/api-keys', { key: 'automation-key-to-revoke-0001' })).json;
  t.equal(keys.length, 1);
  // The last admin key cannot be revoked (test/auth/last-admin-key.test.ts): another one first.
  t.equal((await first.req('POST', '/v2/api-keys', { key: 'automation-key-to-revoke-0001', body: { name: 'next', scopes: ['admin'] } })).status, 201);
  t.equal((await first.req('DELETE', `/v2/api-keys/${keys[0].id}`, { key: 'automation-key-to-revoke-0001' })).status, 204);
  assert401(t, await first.req('GET', '/v2/serverless', { key: 'automation-key-to-revoke-0001' }), /revoked/);
  await first.agent.close();
  await t.rejects(startAgent(t, { adminApiKey: 'automation-key-to-revoke-0001' }, { dir }), /revoked/, 'start refuses the revoked value');
  const next = await startAgent(t, { adminApiKey: 'automation-key-new-value-0002' }, { dir });
  t.equal((await next.req('GET', '/v2/serverless', { key: 'automation-key-new-value-0002' })).status, 200, 'a new value works');
});

t.test('a header holding an unexpanded shell variable or a quoted key says so, without echoing the key', async (t) => {
  const a = await startAgent(t);
  const send = (authorization: string) => fetch(`${a.url}/v2/serverless`, { headers: { authorization } }).then(async (r) => ({ status: r.status, json: await r.json() as { detail: string } }));
  // curl -H 'Authorization: Bearer $KEY' (single quotes) sends the variable's name, not its value.
  for (const v of ['$KEY', '${KEY}', '$FLASHD_API_KEY']) {
    const r = await send(`Bearer ${v}`);
    t.equal(r.status, 401);
    t.equal(r.json.detail, `The Authorization header holds ${v} literally, not a key: the shell did not expand it (a variable inside single quotes is not); write -H "Authorization: Bearer $KEY" in double quotes.`, `${v}: says the variable was not expanded`);
  }
  for (const q of [`'${ADMIN_KEY}'`, `"${ADMIN_KEY}"`]) {
    const r = await send(`Bearer ${q}`);
    t.equal(r.status, 401);
    t.equal(r.json.detail, 'The API key is not valid: it is wrapped in quotes; send the key without them.', 'a quoted key: says so');
    t.notMatch(r.json.detail, ADMIN_KEY.slice(7), 'the key is not echoed');
  }
  t.equal((await send('Bearer fd_usr_nonsense')).json.detail, 'The API key is malformed (bad format or checksum).', 'others as before');
});
