/** /v2/api-keys, /v2/users, /v2/teams and /v2/sessions. */
import type { ApiKeyRow, TeamRow, UserRow } from '../store/index.js';
import { AgentError } from '../core/errors.js';
import { assertSchema } from '../core/schemas.js';
import { NO_STORE, type RouteDef } from './route.js';
import type { ApiServices } from './services.js';

const iso = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString());

export function keyView(k: ApiKeyRow): Record<string, unknown> {
  return {
    id: k.id, name: k.name, kind: k.kind, endpointId: k.endpointId, prefix: k.prefix, scopes: k.scopes, userId: k.userId, teamId: k.teamId, exempt: k.exempt,
    createdAt: iso(k.createdAt), expiresAt: iso(k.expiresAt), revokedAt: iso(k.revokedAt), createdBy: k.createdBy,
  };
}

const userView = (u: UserRow) => ({ id: u.id, name: u.name, isAdmin: u.isAdmin, createdAt: iso(u.createdAt) });
const teamView = (t: TeamRow) => ({ id: t.id, name: t.name, ownerUserId: t.ownerUserId, createdAt: iso(t.createdAt) });
const AUTHN = [401, 403, 429];

export function identityRoutes(s: ApiServices): RouteDef[] {
  return [
    {
      method: 'POST', path: '/v2/api-keys', operationId: 'createApiKey', summary: 'Create an API key (the key is shown only in this response)',
      tag: 'Access', auth: 'user', body: 'json', requestSchema: 'ApiKeyCreate', successStatus: 201, responseSchema: 'ApiKeyCreated',
      problems: [400, 401, 403, 404, 413, 415, 429],
      handle: ({ principal, body }) => {
        const b = assertSchema<{ name: string; scopes: string[]; teamId?: string | null; userId?: string; exempt?: boolean; expiresAt?: string | null }>('ApiKeyCreate', body);
        const expiresAt = b.expiresAt ? Date.parse(b.expiresAt) : null;
        const input = { name: b.name, scopes: b.scopes, teamId: b.teamId ?? null, exempt: b.exempt ?? false, expiresAt };
        const { row, key } = s.auth.createKey(principal, b.userId === undefined ? input : { ...input, userId: b.userId });
        return { status: 201, headers: { ...NO_STORE }, body: { ...keyView(row), key } };
      },
    },
    {
      method: 'GET', path: '/v2/api-keys', operationId: 'listApiKeys', summary: 'List API keys (never their secrets)', tag: 'Access',
      auth: 'user', successStatus: 200, responseSchema: 'ApiKey', responseIsArray: true, problems: [400, ...AUTHN],
      query: [{ name: 'kind', description: 'user (default): API keys. worker: unrevoked worker keys, from worker-env and of the workers flashd runs.', schema: { type: 'string', enum: ['user', 'worker'] } }],
      handle: ({ principal, req }) => {
        const kind = req.query.get('kind') ?? 'user';
        if (kind !== 'user' && kind !== 'worker') {
          throw new AgentError('VALIDATION_FAILED', `Unknown kind ${JSON.stringify(kind)}; allowed: user, worker.`, { errors: [`?kind: unknown value "${kind}"`] });
        }
        return { status: 200, body: s.auth.listKeys(principal, kind).map(keyView) };
      },
    },
    {
      method: 'GET', path: '/v2/api-keys/{keyId}', operationId: 'getApiKey', summary: 'Get an API key (never its secret)', tag: 'Access',
      auth: 'user', successStatus: 200, responseSchema: 'ApiKey', problems: [...AUTHN, 404],
      handle: ({ principal, params }) => ({ status: 200, body: keyView(s.auth.keyFor(principal, params['keyId'] as string)) }),
    },
    {
      method: 'PATCH', path: '/v2/api-keys/{keyId}', operationId: 'updateApiKey', summary: 'Rename a key, or (admins) set its rate-limit exemption; worker keys cannot be changed (409)',
      tag: 'Access', auth: 'user', body: 'json', requestSchema: 'ApiKeyUpdate', successStatus: 200, responseSchema: 'ApiKey',
      problems: [400, ...AUTHN, 404, 409, 413, 415],
      handle: ({ principal, params, body }) => {
        const b = assertSchema<{ name?: string; exempt?: boolean }>('ApiKeyUpdate', body);
        return { status: 200, body: keyView(s.auth.updateKey(principal, params['keyId'] as string, b)) };
      },
    },
    {
      method: 'DELETE', path: '/v2/api-keys/{keyId}', operationId: 'revokeApiKey',
      summary: "Revoke an API key; the admin user's last valid admin key cannot be revoked (409): create another admin key first", tag: 'Access',
      auth: 'user', successStatus: 204, responseSchema: null, problems: [...AUTHN, 404, 409],
      handle: ({ principal, params }) => {
        s.auth.revokeKey(principal, params['keyId'] as string);
        return { status: 204 };
      },
    },
    {
      method: 'POST', path: '/v2/users', operationId: 'createUser', summary: 'Create a user (admins)', tag: 'Access', auth: 'user',
      scope: 'admin', body: 'json', requestSchema: 'UserCreate', successStatus: 201, responseSchema: 'User', problems: [400, ...AUTHN, 413, 415],
      handle: ({ principal, body }) => {
        const b = assertSchema<{ name: string }>('UserCreate', body);
        return { status: 201, body: userView(s.auth.createUser(principal, b.name)) };
      },
    },
    {
      method: 'GET', path: '/v2/users', operationId: 'listUsers', summary: 'List users (admins see all, others themselves)', tag: 'Access',
      auth: 'user', successStatus: 200, responseSchema: 'User', responseIsArray: true, problems: AUTHN,
      handle: ({ principal }) => ({ status: 200, body: s.auth.listUsers(principal).map(userView) }),
    },
    {
      method: 'POST', path: '/v2/teams', operationId: 'createTeam', summary: 'Create a team owned by the caller', tag: 'Access', auth: 'user',
      body: 'json', requestSchema: 'TeamCreate', successStatus: 201, responseSchema: 'Team', problems: [400, ...AUTHN, 413, 415],
      handle: ({ principal, body }) => {
        const b = assertSchema<{ name: string }>('TeamCreate', body);
        if (principal.teamBound) throw new AgentError('FORBIDDEN', 'Team keys cannot create teams.');
        return { status: 201, body: teamView(s.auth.createTeam(principal, b.name)) };
      },
    },
    {
      method: 'GET', path: '/v2/teams', operationId: 'listTeams', summary: "List the caller's teams", tag: 'Access', auth: 'user',
      successStatus: 200, responseSchema: 'Team', responseIsArray: true, problems: AUTHN,
      handle: ({ principal }) => ({ status: 200, body: s.auth.teamsOf(principal).map(teamView) }),
    },
    {
      method: 'GET', path: '/v2/teams/{teamId}', operationId: 'getTeam', summary: 'Get a team and its members', tag: 'Access', auth: 'user',
      successStatus: 200, responseSchema: 'Team', problems: [...AUTHN, 404],
      handle: ({ principal, params }) => {
        const { team, members } = s.auth.team(principal, params['teamId'] as string);
        return { status: 200, body: { ...teamView(team), members: members.map((m) => ({ userId: m.userId, role: m.role })) } };
      },
    },
    {
      method: 'POST', path: '/v2/teams/{teamId}/members', operationId: 'addTeamMember', summary: 'Add a member (team owner or admin)', tag: 'Access',
      auth: 'user', body: 'json', requestSchema: 'TeamMemberAdd', successStatus: 204, responseSchema: null, problems: [400, ...AUTHN, 404, 413, 415],
      handle: ({ principal, params, body }) => {
        const b = assertSchema<{ userId: string }>('TeamMemberAdd', body);
        s.auth.addMember(principal, params['teamId'] as string, b.userId);
        return { status: 204 };
      },
    },
    {
      method: 'DELETE', path: '/v2/teams/{teamId}/members/{userId}', operationId: 'removeTeamMember', summary: 'Remove a member', tag: 'Access',
      auth: 'user', successStatus: 204, responseSchema: null, problems: [...AUTHN, 404],
      handle: ({ principal, params }) => {
        s.auth.removeMember(principal, params['teamId'] as string, params['userId'] as string);
        return { status: 204 };
      },
    },
    {
      method: 'POST', path: '/v2/sessions', operationId: 'createSession',
      summary: 'Open a console session: a signed token acting for the user behind the API key', tag: 'Access', auth: 'user',
      successStatus: 201, responseSchema: 'Session', problems: AUTHN,
      handle: ({ principal }) => {
        if (principal.via !== 'key') throw new AgentError('FORBIDDEN', 'Open a session with an API key, not with another session.');
        const { token, expiresAt } = s.auth.openSession(principal);
        return { status: 201, headers: { ...NO_STORE }, body: { token, expiresAt: iso(expiresAt), userId: principal.userId } };
      },
    },
  ];
}
