import type { RunResult, Statement } from 'better-sqlite3';
import type { Db } from './db.js';

export interface UserRow {
  id: string;
  name: string;
  isAdmin: boolean;
  createdAt: number;
}

export interface TeamRow {
  id: string;
  name: string;
  ownerUserId: string;
  createdAt: number;
}

export interface TeamMemberRow {
  teamId: string;
  userId: string;
  role: 'owner' | 'member';
}

export interface ApiKeyRow {
  id: string;
  name: string;
  kind: 'user' | 'worker';
  userId: string;
  teamId: string | null;
  endpointId: string | null;
  scopes: string[];
  hash: string;
  prefix: string;
  exempt: boolean;
  createdAt: number;
  expiresAt: number | null;
  revokedAt: number | null;
  /**
   * The key that made this one, when it was not an admin's (migration 17): this key is valid
   * only while that one is (AuthService). Null for keys an admin or flashd made.
   */
  createdBy: string | null;
}

interface RawKey {
  id: string; name: string; kind: 'user' | 'worker'; user_id: string; team_id: string | null; endpoint_id: string | null;
  scopes: string; hash: string; prefix: string; exempt: number; created_at: number; expires_at: number | null; revoked_at: number | null;
  created_by: string | null;
}

const mapKey = (r: RawKey): ApiKeyRow => ({
  id: r.id, name: r.name, kind: r.kind, userId: r.user_id, teamId: r.team_id, endpointId: r.endpoint_id,
  scopes: JSON.parse(r.scopes) as string[], hash: r.hash, prefix: r.prefix, exempt: r.exempt === 1,
  createdAt: r.created_at, expiresAt: r.expires_at, revokedAt: r.revoked_at, createdBy: r.created_by,
});

/** Users, teams, memberships, API keys and small settings. */
export class IdentityRepo {
  readonly #db: Db;
  readonly #s: Record<string, Statement>;
  #generation = 0;

  constructor(db: Db) {
    this.#db = db;
    this.#s = {
      insertUser: db.prepare('INSERT INTO users (id, name, is_admin, created_at) VALUES (?, ?, ?, ?)'),
      getUser: db.prepare('SELECT id, name, is_admin, created_at FROM users WHERE id = ?'),
      listUsers: db.prepare('SELECT id, name, is_admin, created_at FROM users ORDER BY created_at, id'),
      insertTeam: db.prepare('INSERT INTO teams (id, name, owner_user_id, created_at) VALUES (?, ?, ?, ?)'),
      getTeam: db.prepare('SELECT id, name, owner_user_id, created_at FROM teams WHERE id = ?'),
      teamsOf: db.prepare(`SELECT t.id, t.name, t.owner_user_id, t.created_at FROM teams t
        JOIN team_members m ON m.team_id = t.id WHERE m.user_id = ? ORDER BY t.created_at, t.id`),
      insertMember: db.prepare('INSERT OR REPLACE INTO team_members (team_id, user_id, role, created_at) VALUES (?, ?, ?, ?)'),
      deleteMember: db.prepare("DELETE FROM team_members WHERE team_id = ? AND user_id = ? AND role <> 'owner'"),
      getMember: db.prepare('SELECT team_id, user_id, role FROM team_members WHERE team_id = ? AND user_id = ?'),
      listMembers: db.prepare('SELECT team_id, user_id, role FROM team_members WHERE team_id = ? ORDER BY created_at, user_id'),
      insertKey: db.prepare(`INSERT INTO api_keys (id, name, kind, user_id, team_id, endpoint_id, scopes, hash, prefix, exempt, created_at, expires_at, from_env, created_by)
        VALUES (@id, @name, @kind, @userId, @teamId, @endpointId, @scopes, @hash, @prefix, @exempt, @createdAt, @expiresAt, @fromEnv, @createdBy)`),
      liveEnvKeys: db.prepare('SELECT id, prefix FROM api_keys WHERE from_env = 1 AND revoked_at IS NULL ORDER BY created_at, id'),
      keyByHash: db.prepare('SELECT * FROM api_keys WHERE hash = ?'),
      keyById: db.prepare('SELECT * FROM api_keys WHERE id = ?'),
      keysOfUser: db.prepare("SELECT * FROM api_keys WHERE user_id = ? AND kind = 'user' ORDER BY created_at, id"),
      allUserKeys: db.prepare("SELECT * FROM api_keys WHERE kind = 'user' ORDER BY created_at, id"),
      workerKeysOfUser: db.prepare("SELECT * FROM api_keys WHERE user_id = ? AND kind = 'worker' AND revoked_at IS NULL ORDER BY created_at, id"),
      allWorkerKeys: db.prepare("SELECT * FROM api_keys WHERE kind = 'worker' AND revoked_at IS NULL ORDER BY created_at, id"),
      revokeKey: db.prepare('UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL'),
      setExempt: db.prepare('UPDATE api_keys SET exempt = ? WHERE id = ?'),
      revokeEndpointKeys: db.prepare('UPDATE api_keys SET revoked_at = ? WHERE endpoint_id = ? AND revoked_at IS NULL'),
      endpointExists: db.prepare('SELECT EXISTS (SELECT 1 FROM endpoints WHERE id = ?) AS present'),
      deleteRevokedWorkerKeys: db.prepare("DELETE FROM api_keys WHERE kind = 'worker' AND revoked_at IS NOT NULL AND revoked_at <= ?"),
      liveWorkerKeysNamed: db.prepare("SELECT id, endpoint_id, name FROM api_keys WHERE kind = 'worker' AND revoked_at IS NULL AND substr(name, 1, length(?)) = ?"),
      renameKey: db.prepare('UPDATE api_keys SET name = ? WHERE id = ?'),
      getSetting: db.prepare('SELECT value FROM settings WHERE key = ?'),
      putSetting: db.prepare('INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)'),
      deleteSetting: db.prepare('DELETE FROM settings WHERE key = ?'),
      holdsData: db.prepare(`SELECT EXISTS (SELECT 1 FROM users) OR EXISTS (SELECT 1 FROM api_keys) OR EXISTS (SELECT 1 FROM endpoints)
        OR EXISTS (SELECT 1 FROM registry_credentials) OR EXISTS (SELECT 1 FROM jobs) AS held`),
    };
  }

  /**
   * Changes with every write to these tables, so a reader may cache what it derives from them
   * (AuthService's key cache) and recompute when this moves. In memory only: this repository is
   * the one writer of its tables, in one process.
   */
  get generation(): number {
    return this.#generation;
  }

  /** Every write goes through here, so none can leave the generation unchanged. */
  #write(statement: string, ...params: unknown[]): RunResult {
    this.#generation++;
    return this.#s[statement]!.run(...params);
  }

  #user(r: { id: string; name: string; is_admin: number; created_at: number } | undefined): UserRow | undefined {
    return r && { id: r.id, name: r.name, isAdmin: r.is_admin === 1, createdAt: r.created_at };
  }

  #team(r: { id: string; name: string; owner_user_id: string; created_at: number } | undefined): TeamRow | undefined {
    return r && { id: r.id, name: r.name, ownerUserId: r.owner_user_id, createdAt: r.created_at };
  }

  insertUser(user: UserRow): void {
    this.#write('insertUser', user.id, user.name, user.isAdmin ? 1 : 0, user.createdAt);
  }
  getUser(id: string): UserRow | undefined {
    return this.#user(this.#s['getUser']!.get(id) as never);
  }
  listUsers(): UserRow[] {
    return (this.#s['listUsers']!.all() as never[]).map((r) => this.#user(r) as UserRow);
  }
  insertTeam(team: TeamRow): void {
    this.#write('insertTeam', team.id, team.name, team.ownerUserId, team.createdAt);
  }
  getTeam(id: string): TeamRow | undefined {
    return this.#team(this.#s['getTeam']!.get(id) as never);
  }
  teamsOf(userId: string): TeamRow[] {
    return (this.#s['teamsOf']!.all(userId) as never[]).map((r) => this.#team(r) as TeamRow);
  }
  putMember(teamId: string, userId: string, role: 'owner' | 'member', now: number): void {
    this.#write('insertMember', teamId, userId, role, now);
  }
  removeMember(teamId: string, userId: string): boolean {
    return this.#write('deleteMember', teamId, userId).changes > 0;
  }
  member(teamId: string, userId: string): TeamMemberRow | undefined {
    const r = this.#s['getMember']!.get(teamId, userId) as { team_id: string; user_id: string; role: 'owner' | 'member' } | undefined;
    return r && { teamId: r.team_id, userId: r.user_id, role: r.role };
  }
  members(teamId: string): TeamMemberRow[] {
    return (this.#s['listMembers']!.all(teamId) as { team_id: string; user_id: string; role: 'owner' | 'member' }[]).map((r) => ({
      teamId: r.team_id, userId: r.user_id, role: r.role,
    }));
  }
  /** `fromEnv`: the key was registered from FLASHD_ADMIN_API_KEY (migration 13; see liveEnvKeys). */
  insertKey(key: ApiKeyRow, fromEnv = false): void {
    this.#write('insertKey', { ...key, scopes: JSON.stringify(key.scopes), exempt: key.exempt ? 1 : 0, fromEnv: fromEnv ? 1 : 0 });
  }
  /** Unrevoked keys registered from FLASHD_ADMIN_API_KEY, oldest first (one, unless it just changed). */
  liveEnvKeys(): { id: string; prefix: string }[] {
    return this.#s['liveEnvKeys']!.all() as { id: string; prefix: string }[];
  }
  /** Runs `fn` in one transaction: every write in it commits, or none does. */
  transaction<T>(fn: () => T): T {
    return this.#db.transaction(fn)();
  }
  keyByHash(hash: string): ApiKeyRow | undefined {
    const r = this.#s['keyByHash']!.get(hash) as RawKey | undefined;
    return r && mapKey(r);
  }
  keyById(id: string): ApiKeyRow | undefined {
    const r = this.#s['keyById']!.get(id) as RawKey | undefined;
    return r && mapKey(r);
  }
  userKeys(userId: string | null): ApiKeyRow[] {
    const rows = (userId === null ? this.#s['allUserKeys']!.all() : this.#s['keysOfUser']!.all(userId)) as RawKey[];
    return rows.map(mapKey);
  }
  /**
   * Unrevoked worker keys (worker-env's and managed workers'), of one user or (null) of everyone.
   * Revoked ones are left out: flashd makes a key per worker it launches (their rows are deleted
   * a day after they were revoked, AuthService.createWorkerKey).
   */
  workerKeys(userId: string | null): ApiKeyRow[] {
    const rows = (userId === null ? this.#s['allWorkerKeys']!.all() : this.#s['workerKeysOfUser']!.all(userId)) as RawKey[];
    return rows.map(mapKey);
  }
  revokeKey(id: string, now: number): boolean {
    return this.#write('revokeKey', now, id).changes > 0;
  }
  /** Unrevoked worker keys whose name starts with `prefix`. */
  liveWorkerKeysNamed(prefix: string): { id: string; endpointId: string | null; name: string }[] {
    const rows = this.#s['liveWorkerKeysNamed']!.all(prefix, prefix) as { id: string; endpoint_id: string | null; name: string }[];
    return rows.map((r) => ({ id: r.id, endpointId: r.endpoint_id, name: r.name }));
  }
  /** Deletes worker keys revoked at or before `before`; returns how many. */
  deleteRevokedWorkerKeys(before: number): number {
    return this.#write('deleteRevokedWorkerKeys', before).changes;
  }
  revokeEndpointKeys(endpointId: string, now: number): number {
    return this.#write('revokeEndpointKeys', now, endpointId).changes;
  }
  /** Whether the endpoint a worker key was bound to still exists (a revoked key's 401 says when not). */
  endpointExists(endpointId: string): boolean {
    return (this.#s['endpointExists']!.get(endpointId) as { present: number }).present === 1;
  }
  setKeyExempt(id: string, exempt: boolean): void {
    this.#write('setExempt', exempt ? 1 : 0, id);
  }
  renameKey(id: string, name: string): void {
    this.#write('renameKey', name, id);
  }
  getSetting(key: string): string | undefined {
    return (this.#s['getSetting']!.get(key) as { value: string } | undefined)?.value;
  }
  putSetting(key: string, value: string): void {
    this.#write('putSetting', key, value);
  }
  deleteSetting(key: string): void {
    this.#write('deleteSetting', key);
  }
  /**
   * Whether a start or its users wrote anything here (a user, a key, an endpoint, a registry
   * credential, a job), as against the bare schema of a first start that failed before that.
   */
  holdsData(): boolean {
    return (this.#s['holdsData']!.get() as { held: number }).held === 1;
  }
}
