/**
 * Permission scopes. `admin` implies every other scope and adds user, team and key
 * administration. Worker keys carry only `worker` and are bound to one endpoint and one worker id.
 */
export const USER_SCOPES = ['admin', 'endpoints:read', 'endpoints:write', 'jobs:run', 'jobs:read'] as const;
export type UserScope = (typeof USER_SCOPES)[number];
export type Scope = UserScope | 'worker';

export const SCOPE_DESCRIPTIONS: Record<Scope, string> = {
  admin: 'Everything, plus users, teams, keys of any user and rate-limit exemption.',
  'endpoints:read': 'Read endpoints, templates, volumes, registry credentials (never passwords), catalogs and logs.',
  'endpoints:write': 'Create, update and delete endpoints, templates, volumes and registry credentials (with the process runtime, creating an endpoint or changing what it runs needs admin).',
  'jobs:run': 'Submit, cancel and retry jobs; purge queues.',
  'jobs:read': 'Read job status, streams and endpoint health.',
  worker: 'Take jobs and post results as one worker of one endpoint (worker keys only).',
};

export function isUserScope(value: string): value is UserScope {
  return (USER_SCOPES as readonly string[]).includes(value);
}
