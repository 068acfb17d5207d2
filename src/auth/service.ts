import { createHmac, randomBytes } from 'node:crypto';
import type { Clock } from '../core/clock.js';
import { AgentError } from '../core/errors.js';
import { newId } from '../core/ids.js';
import type { Logger } from '../core/logger.js';
import type { ApiKeyRow, IdentityRepo, TeamRow, UserRow } from '../store/index.js';
import { isUserScope, type Scope } from './scopes.js';
import { checkKeyFormat, generateApiKey, hashKey, keyPrefix, signSession, verifySession } from './tokens.js';

/** Who is calling, and for which account. */
export interface Principal {
  readonly via: 'key' | 'session';
  readonly userId: string;
  /** The account the request acts for: a team id or the user's own id. */
  readonly ownerId: string;
  readonly teamId: string | null;
  /**
   * The credential is confined to `teamId`: a key created inside a team, or a session opened
   * with one. False for a personal key, and for a session acting for a team through X-Team-Id.
   */
  readonly teamBound: boolean;
  readonly scopes: ReadonlySet<Scope>;
  readonly keyId: string;
  /** Worker keys are bound to one endpoint. */
  readonly endpointId: string | null;
  /**
   * Worker keys are bound to one worker id too, the one their worker's URLs name: null for any
   * other credential (an admin acts as any worker).
   */
  readonly workerId: string | null;
  readonly exempt: boolean;
}

export interface NewKeyInput {
  name: string;
  scopes: string[];
  /** Defaults to the caller. Only admins may name another user. */
  userId?: string;
  teamId?: string | null;
  exempt?: boolean;
  expiresAt?: number | null;
}

export interface IssuedKey {
  row: ApiKeyRow;
  /** The secret, returned once and never stored. */
  key: string;
}

/** `key`: the stored key it was, when known (revoked, expired): its public id and prefix for the debug log. */
const unauthenticated = (detail: string, key?: { id: string; prefix?: string }): AgentError =>
  new AgentError('UNAUTHENTICATED', detail, {
    headers: { 'www-authenticate': 'Bearer realm="flashd"' },
    ...(key ? { logFields: key.prefix === undefined ? { keyId: key.id } : { keyId: key.id, keyPrefix: key.prefix } } : {}),
  });

/** A key that authenticated, as of `generation` of the identity tables. */
interface CachedKey {
  readonly principal: Principal;
  readonly expiresAt: number | null;
  readonly generation: number;
}

const KEY_CACHE_MAX = 10_000;
/** The 401 detail of a revoked key, also given for a suspended one (suspendKey). */
const REVOKED = 'The API key has been revoked.';
/**
 * How long a revoked worker key's row stays (readable by id, and a request with it is told it
 * was revoked) before the next worker key made deletes it. flashd makes a key per worker it
 * launches and revokes it when the worker exits, so without this api_keys grew by a row per
 * launch for as long as flashd ran.
 */
export const REVOKED_WORKER_KEY_KEEP_MS = 86_400_000;
/** The user flashd makes on its first start, whose admin keys administer it (bootstrap). */
const ADMIN_USER = 'usr_admin';

/**
 * A key that administers flashd: the admin user's own key (not a team's) with the `admin`
 * scope, neither revoked nor expired at `now`. flashd keeps at least one (bootstrap makes one
 * when none is left; revokeKey refuses to revoke the last).
 */
function isValidAdminKey(row: ApiKeyRow, now: number): boolean {
  return row.kind === 'user' && row.userId === ADMIN_USER && row.teamId === null && row.scopes.includes('admin')
    && row.revokedAt === null && (row.expiresAt === null || row.expiresAt > now);
}

/** Names the keys of workers flashd launches: `managed worker <worker id>`. */
const MANAGED_KEY_PREFIX = 'managed worker ';
/** The settings row of noteManagedKeysStoppedBySignal: a JSON array of key ids. */
const STOPPED_BY_SIGNAL_SETTING = 'managed_keys_stopped_by_signal';
/** Names the keys worker-env hands out: `worker <worker id>`. */
const WORKER_KEY_PREFIX = 'worker ';

/**
 * The worker a worker key may act as, from its name (`managed worker <id>` or `worker <id>`,
 * set when the key is made and never changed: updateKey refuses worker keys). Null for a name
 * of neither form, which then acts as no worker at all.
 */
function workerIdOfKey(row: ApiKeyRow): string | null {
  if (row.kind !== 'worker') return null;
  for (const prefix of [MANAGED_KEY_PREFIX, WORKER_KEY_PREFIX]) {
    if (row.name.startsWith(prefix) && row.name.length > prefix.length) return row.name.slice(prefix.length);
  }
  return null;
}

/**
 * The token in an Authorization value, without the regexes of the full parse: what follows a
 * leading `Bearer ` (any case), else the whole value, trimmed. Only a cache key: for any value
 * whose result is a cached key (no whitespace inside), the full parse finds the same token.
 */
function cacheToken(value: string): string {
  const bearer = value.startsWith('Bearer ') || (value.length > 7 && value.slice(0, 7).toLowerCase() === 'bearer ');
  return (bearer ? value.slice(7) : value).trim();
}

export class AuthService {
  readonly #repo: IdentityRepo;
  readonly #clock: Clock;
  readonly #log: Logger;
  readonly #sessionSecret: string;
  readonly #sessionTtlMs: number;
  /**
   * Principals of keys that authenticated, by the raw key, so a repeated request costs one Map
   * lookup and the expiry check instead of the format check, SHA-256, SQLite reads and a new
   * principal. Keeping raw keys as Map keys adds no exposure: each one already sits in process
   * memory in the headers of every request that carries it, the cache lives only in this process
   * (never logged, never written), and at rest keys stay hashed in SQLite as before. An entry is
   * trusted only while the identity tables are at the generation it was computed at, so any
   * write (a key created, revoked or changed, a user, team or membership changed) makes every
   * entry recompute on its next use. Session tokens are not cached.
   */
  readonly #keys = new Map<string, CachedKey>();
  /**
   * Called after revokeKey (DELETE /v2/api-keys/{id}) revoked a key: the queue answers the polls
   * of the workers using it and stops counting them (JobQueue.keyRevoked). `named`: the worker a
   * worker key was made for. Not called by revokeKeyById (a stopped managed worker's key) nor
   * by the revocations at start or of a deleted endpoint's keys.
   */
  onRevoked: ((keyId: string, named?: { endpointId: string; workerId: string }) => void) | null = null;
  /**
   * Keys of workers flashd holds stopped and kept for a FlashBoot restart (suspendKey): refused
   * as if revoked until resumeKey. Only in memory: a new process revokes every managed worker
   * key left valid before it serves (revokeLeftoverManagedKeys), the suspended ones included.
   */
  readonly #suspended = new Set<string>();

  /**
   * `fileKey`: the 32 bytes of `<data-dir>/secret.key`. Sessions are signed with a key derived
   * from it and the random `session_secret` setting, so neither the database nor the key file
   * alone can mint a session: with the setting alone, a copy of flashd.db (a backup) would let
   * anyone sign a token for any key id, the admin key's included, with any expiry.
   */
  constructor(repo: IdentityRepo, clock: Clock, log: Logger, sessionTtlSeconds: number, fileKey: Buffer) {
    this.#repo = repo;
    this.#clock = clock;
    this.#log = log;
    this.#sessionTtlMs = sessionTtlSeconds * 1000;
    let secret = repo.getSetting('session_secret');
    if (!secret) {
      secret = randomBytes(32).toString('base64url');
      repo.putSetting('session_secret', secret);
    }
    this.#sessionSecret = createHmac('sha256', fileKey).update(`flashd session v1\0${secret}`).digest('base64url');
  }

  /**
   * Each start: make sure an admin user exists, and an admin key. With `envKey` (from
   * FLASHD_ADMIN_API_KEY) a key with exactly that value exists afterwards, and it is the only
   * key registered from the variable that is still valid: when the value changed, the key an
   * earlier start registered from it is revoked in the same transaction as the new one's
   * registration (rotating a leaked key must end it). The first generated key and keys made
   * through the API are never revoked here, also when the variable names one of them. Without
   * `envKey` nothing is revoked, and a key is generated when the admin user has no valid admin
   * key left (isValidAdminKey: every one revoked or expired; other keys, read-only or worker keys,
   * and admin-scope keys of other users or of teams, do not count); it is returned so the caller
   * can print and save it once. `first`: the admin user had
   * no key before (a first start), rather than none left valid.
   */
  bootstrap(envKey: string | null): { generated: string | null; first: boolean } {
    const now = this.#clock.now();
    let admin = this.#repo.getUser(ADMIN_USER);
    if (!admin) {
      admin = { id: ADMIN_USER, name: 'admin', isAdmin: true, createdAt: now };
      this.#repo.insertUser(admin);
    }
    if (envKey !== null) {
      // authenticate() refuses a malformed fd_ key before any lookup: registered, it could never be used.
      // loadConfig refuses it first (exit 2, before the data directory is made); this guards other callers.
      if (checkKeyFormat(envKey) === 'malformed') {
        throw new AgentError('VALIDATION_FAILED', 'FLASHD_ADMIN_API_KEY starts with fd_ but is not a key flashd generated (bad format or checksum), '
          + 'so every request with it would be refused as malformed; choose a value that does not start with fd_');
      }
      const existing = this.#repo.keyByHash(hashKey(envKey));
      if (existing && existing.revokedAt !== null) throw new AgentError('CONFLICT', 'FLASHD_ADMIN_API_KEY names a key that was revoked; choose a new value');
      // A key of less (a read-only key, a worker key, another user's or an expired one) would be
      // taken as the admin key while the earlier one from the variable was revoked: nothing
      // could administer this flashd any more.
      if (existing && !isValidAdminKey(existing, now)) {
        throw new AgentError('CONFLICT', `FLASHD_ADMIN_API_KEY names an existing key that is not a valid admin key (${existing.kind === 'worker' ? 'a worker key' : existing.id}); `
          + 'choose a new value, or the value of an admin key');
      }
      const adminId = admin.id;
      const { registered, revoked } = this.#repo.transaction(() => {
        const row = existing ?? this.#insertKey(envKey, { name: 'admin (FLASHD_ADMIN_API_KEY)', scopes: ['admin'] }, adminId, 'user', null, true);
        const old = this.#repo.liveEnvKeys().filter((k) => k.id !== row.id);
        for (const k of old) this.#repo.revokeKey(k.id, now);
        return { registered: existing ? null : row, revoked: old };
      });
      // Its listed prefix shows nothing of the value (keyPrefix): the id tells the operator which row it is.
      if (registered) this.#log.info('admin key from environment registered', { keyId: registered.id, prefix: registered.prefix });
      for (const k of revoked) this.#log.info('admin key from environment revoked: FLASHD_ADMIN_API_KEY changed', { keyId: k.id, prefix: k.prefix });
      return { generated: null, first: false };
    }
    const adminKeys = this.#repo.userKeys(admin.id);
    if (adminKeys.some((k) => isValidAdminKey(k, now))) return { generated: null, first: false };
    const first = adminKeys.length === 0;
    const key = generateApiKey('usr');
    const row = this.#insertKey(key, { name: first ? 'first admin key' : 'admin key (none was left valid)', scopes: ['admin'] }, admin.id, 'user', null);
    if (!first) {
      this.#log.warn('the admin user had no valid admin API key left: created one (every one was revoked or expired; admin-scope keys of other users or of teams do not count)', { keyId: row.id });
    }
    return { generated: key, first };
  }

  #insertKey(
    key: string, input: NewKeyInput, userId: string, kind: 'user' | 'worker', endpointId: string | null, fromEnv = false, createdBy: string | null = null,
  ): ApiKeyRow {
    const row: ApiKeyRow = {
      id: newId('key'),
      name: input.name,
      kind,
      userId,
      teamId: input.teamId ?? null,
      endpointId,
      scopes: [...new Set(input.scopes)],
      hash: hashKey(key),
      prefix: keyPrefix(key),
      exempt: input.exempt ?? false,
      createdAt: this.#clock.now(),
      expiresAt: input.expiresAt ?? null,
      revokedAt: null,
      createdBy,
    };
    this.#repo.insertKey(row, fromEnv);
    return row;
  }

  /**
   * Resolves the Authorization header (with or without `Bearer `) to a principal, or throws 401.
   * Key principals are cached and shared between requests; they are frozen.
   */
  authenticate(headers: Readonly<Record<string, string>>): Principal {
    const raw = headers['authorization'];
    if (raw !== undefined) {
      const hit = this.#keys.get(cacheToken(raw));
      if (hit !== undefined && hit.generation === this.#repo.generation) {
        if (this.#suspended.size > 0 && this.#suspended.has(hit.principal.keyId)) throw unauthenticated(REVOKED, { id: hit.principal.keyId });
        if (hit.expiresAt !== null && hit.expiresAt <= this.#clock.now()) throw unauthenticated('The API key has expired.', { id: hit.principal.keyId });
        return hit.principal;
      }
    }
    if (raw === undefined) throw unauthenticated('Missing Authorization header. Send "Authorization: Bearer <API key>".');
    // Sent, but empty: a key read from an unset variable, or runpod-python with a config.toml
    // whose [default] has no api_key (it sends that file's key, "" there, instead of its env's).
    if (raw.trim() === '') throw unauthenticated('The Authorization header is empty: the key it should carry was empty where it was read from (an unset variable, or a ~/.runpod/config.toml without api_key). Send "Authorization: Bearer <API key>".');
    const m = /^\s*(?:Bearer\s+)?(\S+)\s*$/i.exec(raw);
    if (!m) throw unauthenticated('Malformed Authorization header. Send "Authorization: Bearer <API key>".');
    const token = m[1] as string;
    if (/^Bearer$/i.test(token)) throw unauthenticated('The Authorization header has no token after "Bearer".');
    if (token.startsWith('fds_')) return this.#fromSession(token, headers['x-team-id']);
    if (checkKeyFormat(token) === 'malformed') throw unauthenticated('The API key is malformed (bad format or checksum).');
    const row = this.#repo.keyByHash(hashKey(token));
    if (!row) {
      // Two shell slips that no key explains: curl -H 'Authorization: Bearer $KEY' (single
      // quotes send the name), and a key quoted inside the variable. Neither echoes the key.
      if (/^\$(?:[A-Za-z_]\w*|\{[A-Za-z_]\w*\})$/.test(token)) {
        throw unauthenticated(`The Authorization header holds ${token} literally, not a key: the shell did not expand it (a variable inside single quotes is not); write -H "Authorization: Bearer $KEY" in double quotes.`);
      }
      if (/^(['"]).+\1$/.test(token)) throw unauthenticated('The API key is not valid: it is wrapped in quotes; send the key without them.');
      throw unauthenticated('The API key is not valid.');
    }
    const expiresAt = this.#checkUsable(row);
    // A team key acts for the team only while its user belongs to it (spec, Authentication 3).
    if (row.teamId !== null && row.kind === 'user' && !this.#repo.member(row.teamId, row.userId)) {
      throw unauthenticated('The API key belongs to a team its user is no longer a member of.', row);
    }
    const principal: Principal = Object.freeze({
      via: 'key',
      userId: row.userId,
      ownerId: row.teamId ?? row.userId,
      teamId: row.teamId,
      teamBound: row.teamId !== null,
      scopes: new Set(row.scopes as Scope[]),
      keyId: row.id,
      endpointId: row.endpointId,
      workerId: workerIdOfKey(row),
      exempt: row.exempt,
    });
    if (this.#keys.size >= KEY_CACHE_MAX) this.#keys.clear();
    this.#keys.set(token, { principal, expiresAt, generation: this.#repo.generation });
    return principal;
  }

  /**
   * Throws the 401 of a key that is revoked or expired, or one made by a key without `admin`
   * (`createdBy`) whose creator, or any key above that, is: revoking a leaked key ends the keys
   * made with it. Returns when the key stops working (the earliest expiry of it and the keys
   * above it; null: never), which the key cache checks on every hit. A revocation changes the
   * identity tables' generation, so cached keys below it are checked again here at their next
   * request. Keys an admin made have no creator and cost no further read.
   */
  #checkUsable(row: ApiKeyRow): number | null {
    const now = this.#clock.now();
    if (row.revokedAt !== null && row.kind === 'worker' && row.endpointId !== null && !this.#repo.endpointExists(row.endpointId)) {
      // Deleting an endpoint revokes its worker keys: a worker run by hand keeps calling, and its
      // log should say why, not send the operator looking for who revoked a key.
      throw unauthenticated(`The API key has been revoked: it is a worker key of endpoint ${row.endpointId}, which was deleted.`, row);
    }
    if (row.revokedAt !== null || this.#suspended.has(row.id)) throw unauthenticated(REVOKED, row);
    if (row.expiresAt !== null && row.expiresAt <= now) throw unauthenticated('The API key has expired.', row);
    let expiresAt = row.expiresAt;
    for (let id = row.createdBy; id !== null;) {
      const creator = this.#repo.keyById(id);
      // Keys are never deleted but revoked worker keys, and those make no keys: a missing one is taken as revoked.
      if (!creator || creator.revokedAt !== null) throw unauthenticated(`The API key's creating key (${id}) has been revoked, and with it the keys it made.`, row);
      if (creator.expiresAt !== null && creator.expiresAt <= now) throw unauthenticated(`The API key's creating key (${id}) has expired, and with it the keys it made.`, row);
      if (creator.expiresAt !== null && (expiresAt === null || creator.expiresAt < expiresAt)) expiresAt = creator.expiresAt;
      id = creator.createdBy;
    }
    return expiresAt;
  }

  #fromSession(token: string, teamHeader: string | undefined): Principal {
    const claims = verifySession(token, this.#sessionSecret);
    if (!claims) throw unauthenticated('The session token is not valid.');
    if (claims.e <= this.#clock.now()) throw unauthenticated('The session token has expired. Sign in again.');
    const key = this.#repo.keyById(claims.k);
    // openSession signs the key's own user: any other pairing was not made here.
    if (!key || key.userId !== claims.u || key.kind !== 'user') throw unauthenticated('The session token is not valid.');
    this.#checkUsable(key);
    let teamId: string | null = null;
    if (key.teamId !== null) {
      // A session opened with a team key acts for that team only, as the key does (spec,
      // Authentication 3: keys created inside a team act for that team), and only while its user
      // belongs to it: otherwise a key meant for the team (one handed to CI) would open the user's
      // own account, and keep acting after the user left the team.
      if (!this.#repo.member(key.teamId, claims.u)) throw unauthenticated('The API key belongs to a team its user is no longer a member of.');
      teamId = key.teamId;
    } else if (teamHeader && this.#repo.member(teamHeader.trim(), claims.u)) {
      // Spec, Authentication 3: X-Team-Id applies only when the user owns or belongs to the team;
      // otherwise the request runs against the user's own account.
      teamId = teamHeader.trim();
    }
    return {
      via: 'session',
      userId: claims.u,
      ownerId: teamId ?? claims.u,
      teamId,
      teamBound: key.teamId !== null,
      scopes: new Set(key.scopes as Scope[]),
      keyId: key.id,
      endpointId: null,
      workerId: null,
      exempt: key.exempt,
    };
  }

  /** Opens a console session for the user behind `principal` (which must be a key). */
  openSession(principal: Principal): { token: string; expiresAt: number } {
    const expiresAt = this.#clock.now() + this.#sessionTtlMs;
    return { token: signSession({ u: principal.userId, k: principal.keyId, e: expiresAt }, this.#sessionSecret), expiresAt };
  }

  /**
   * Creates a user key. Non-admins may only create keys for themselves with scopes they hold,
   * and such a key is bound to the caller's key (or the key that opened the caller's session):
   * it records it as `createdBy`, works only while that key does (#checkUsable), and expires no
   * later than it (a later or absent `expiresAt` is set to the creator's).
   */
  createKey(caller: Principal, input: NewKeyInput): IssuedKey {
    const isAdmin = caller.scopes.has('admin');
    const userId = input.userId ?? caller.userId;
    const errors: string[] = [];
    for (const s of input.scopes) if (!isUserScope(s)) errors.push(`/scopes: unknown scope "${s}"`);
    if (errors.length) throw new AgentError('VALIDATION_FAILED', errors.join('; '), { errors });
    if (!isAdmin) {
      if (userId !== caller.userId) throw new AgentError('FORBIDDEN', 'Only admins can create keys for another user.');
      const missing = input.scopes.filter((s) => !caller.scopes.has(s as Scope));
      if (missing.length) throw new AgentError('FORBIDDEN', `A key cannot grant scopes its creator lacks: ${missing.join(', ')}.`);
      if (input.exempt) throw new AgentError('FORBIDDEN', 'Only admins can make a key exempt from rate limits.');
    }
    if (input.expiresAt !== undefined && input.expiresAt !== null && input.expiresAt <= this.#clock.now()) {
      throw new AgentError('VALIDATION_FAILED', 'expiresAt must be in the future.', { errors: ['/expiresAt: must be in the future'] });
    }
    if (!this.#repo.getUser(userId)) throw new AgentError('NOT_FOUND', `User ${userId} does not exist.`);
    const teamId = input.teamId ?? null;
    // A team key acts for its team only: a key it made for the user's own account or another of
    // the user's teams would take it out of the team.
    if (!isAdmin && caller.teamBound && teamId !== caller.teamId) {
      throw new AgentError('FORBIDDEN', `A key of team ${caller.teamId} can only create keys for that team (set teamId to ${caller.teamId}).`);
    }
    if (teamId !== null && !this.#repo.member(teamId, userId)) {
      throw new AgentError('NOT_FOUND', `Team ${teamId} does not exist or the user is not a member.`);
    }
    let expiresAt = input.expiresAt ?? null;
    let createdBy: string | null = null;
    if (!isAdmin) {
      createdBy = caller.keyId;
      const creator = this.#repo.keyById(createdBy);
      if (!creator) throw unauthenticated('The API key is not valid.');
      const until = this.#checkUsable(creator);
      if (until !== null && (expiresAt === null || expiresAt > until)) expiresAt = until;
    }
    const key = generateApiKey('usr');
    const row = this.#insertKey(key, { ...input, teamId, expiresAt }, userId, 'user', null, false, createdBy);
    this.#log.info('api key created', { keyId: row.id, userId, teamId, scopes: row.scopes.join(','), ...(createdBy === null ? {} : { createdBy }) });
    return { row, key };
  }

  /**
   * The keys of workers flashd launched, named `managed worker <id>` (createManagedWorkerKey),
   * that are still valid at start: their workers belonged to a previous run that did not stop
   * cleanly. They are revoked; the workers they named are returned, `bySignal` for those that
   * run's second signal killed on purpose (noteManagedKeysStoppedBySignal), not a crash.
   */
  revokeLeftoverManagedKeys(): { endpointId: string; workerId: string; bySignal: boolean }[] {
    const now = this.#clock.now();
    const noted = this.#repo.getSetting(STOPPED_BY_SIGNAL_SETTING);
    let bySignal = new Set<string>();
    try {
      if (noted !== undefined) bySignal = new Set(JSON.parse(noted) as string[]);
    } catch {
      // unreadable: counted as a crash, as before the note
    }
    const out: { endpointId: string; workerId: string; bySignal: boolean }[] = [];
    for (const k of this.#repo.liveWorkerKeysNamed(MANAGED_KEY_PREFIX)) {
      this.#repo.revokeKey(k.id, now);
      if (k.endpointId) out.push({ endpointId: k.endpointId, workerId: k.name.slice(MANAGED_KEY_PREFIX.length), bySignal: bySignal.has(k.id) });
    }
    // Read once: a later crash's leftovers are not this stop's.
    if (noted !== undefined) this.#repo.deleteSetting(STOPPED_BY_SIGNAL_SETTING);
    return out;
  }

  /**
   * A second signal (flashd stops now, killing its workers rather than waiting for them): notes
   * the keys of its workers still valid, the ones it kills, so the next start tells them from
   * the workers of a run that crashed and gives their jobs' attempts back
   * (revokeLeftoverManagedKeys). One synchronous write, before the kill. Returns how many.
   */
  noteManagedKeysStoppedBySignal(): number {
    const ids = this.#repo.liveWorkerKeysNamed(MANAGED_KEY_PREFIX).map((k) => k.id);
    this.#repo.putSetting(STOPPED_BY_SIGNAL_SETTING, JSON.stringify(ids));
    return ids.length;
  }

  /** The key of a worker flashd launches (see revokeLeftoverManagedKeys). */
  createManagedWorkerKey(endpointId: string, workerId: string): IssuedKey {
    return this.#createWorkerKey('usr_admin', null, endpointId, `${MANAGED_KEY_PREFIX}${workerId}`);
  }

  /**
   * The key of a worker given out by worker-env (see workerIdOfKey). Logged, as every key made
   * through the API is: it stays valid until revoked or the endpoint is deleted, so an operator
   * needs to know who was given it (`by`: the caller's key id; never the key itself).
   */
  createEnvWorkerKey(userId: string, teamId: string | null, endpointId: string, workerId: string, by?: string): IssuedKey {
    const issued = this.#createWorkerKey(userId, teamId, endpointId, `${WORKER_KEY_PREFIX}${workerId}`);
    this.#log.info('worker key issued', { keyId: issued.row.id, endpointId, workerId, userId, ...(by === undefined ? {} : { by }) });
    return issued;
  }

  /**
   * A worker key: scope `worker`, bound to one endpoint and to the worker id its name ends with
   * (workerIdOfKey), acting for the endpoint's owner. Worker
   * keys revoked more than REVOKED_WORKER_KEY_KEEP_MS ago go first: rows are added here, so
   * the table holds the live keys plus a day of revoked ones however many workers ran.
   */
  #createWorkerKey(userId: string, teamId: string | null, endpointId: string, name: string): IssuedKey {
    this.#repo.deleteRevokedWorkerKeys(this.#clock.now() - REVOKED_WORKER_KEY_KEEP_MS);
    const key = generateApiKey('wkr');
    const row = this.#insertKey(key, { name, scopes: ['worker'], teamId }, userId, 'worker', endpointId);
    return { row, key };
  }

  /** Revokes every worker key bound to an endpoint (it is being deleted). */
  revokeEndpointKeys(endpointId: string): void {
    this.#repo.revokeEndpointKeys(endpointId, this.#clock.now());
  }

  /** Revokes a key by id without a caller (worker keys of stopped workers). */
  revokeKeyById(id: string): void {
    this.#suspended.delete(id);
    this.#repo.revokeKey(id, this.#clock.now());
  }

  /**
   * A managed worker's key while flashd holds the worker stopped and kept (FlashBoot): every
   * request with it gets the 401 of a revoked key, as for a worker stopped for good, until
   * resumeKey. Not a revocation: the kept container holds the key in its env, which a restart
   * cannot change, so the same key must work again once flashd restarts it.
   */
  suspendKey(id: string): void {
    this.#suspended.add(id);
  }

  /** The kept worker is being restarted: its key works again (unless it was revoked meanwhile). */
  resumeKey(id: string): void {
    this.#suspended.delete(id);
  }

  /**
   * Keys visible to the caller: admins see every key of the kind, others their own (a team key
   * or its session: those of its team). Worker keys
   * (`kind` 'worker') are listed only while unrevoked.
   */
  listKeys(caller: Principal, kind: 'user' | 'worker' = 'user'): ApiKeyRow[] {
    const userId = caller.scopes.has('admin') ? null : caller.userId;
    const rows = kind === 'worker' ? this.#repo.workerKeys(userId) : this.#repo.userKeys(userId);
    return userId !== null && caller.teamBound ? rows.filter((k) => k.teamId === caller.teamId) : rows;
  }

  /** Whether a caller without `admin` confined to a team (Principal.teamBound) stays out of `teamId`. */
  #outsideTeam(caller: Principal, teamId: string | null): boolean {
    return caller.teamBound && !caller.scopes.has('admin') && teamId !== caller.teamId;
  }

  /**
   * A key the caller may see or revoke, or a 404 (never a leak of another user's key): their own,
   * or any for admins. Worker keys are included, so one handed out by worker-env can be revoked.
   */
  keyFor(caller: Principal, id: string): ApiKeyRow {
    const row = this.#repo.keyById(id);
    if (!row || (row.userId !== caller.userId && !caller.scopes.has('admin')) || this.#outsideTeam(caller, row.teamId)) {
      throw new AgentError('NOT_FOUND', `API key ${id} not found.`);
    }
    return row;
  }

  /**
   * A key the caller may revoke or change: keyFor's, and, for a caller without `admin`, one
   * whose every scope the caller holds (as createKey grants none it lacks). Otherwise any key of
   * a user, a read-only one on a dashboard included, could revoke that user's admin key (a
   * FLASHD_ADMIN_API_KEY revoked so keeps flashd from starting) or the keys of running workers.
   */
  #keyToManage(caller: Principal, id: string): ApiKeyRow {
    const row = this.keyFor(caller, id);
    if (!caller.scopes.has('admin')) {
      const missing = row.scopes.filter((s) => !caller.scopes.has(s as Scope));
      if (missing.length) throw new AgentError('FORBIDDEN', `A key cannot revoke or change a key with scopes it lacks: ${missing.join(', ')}.`);
    }
    return row;
  }

  updateKey(caller: Principal, id: string, patch: { name?: string; exempt?: boolean }): ApiKeyRow {
    const row = this.#keyToManage(caller, id);
    // A managed worker's key is found by its name after a crash (revokeLeftoverManagedKeys), and
    // worker routes are never rate limited: neither field means anything for a worker key.
    if (row.kind === 'worker') throw new AgentError('CONFLICT', `API key ${id} is a worker key: it can be read and revoked, not changed.`);
    if (patch.exempt !== undefined) {
      if (!caller.scopes.has('admin')) throw new AgentError('FORBIDDEN', 'Only admins can change rate-limit exemption.');
      this.#repo.setKeyExempt(id, patch.exempt);
    }
    if (patch.name !== undefined) this.#repo.renameKey(id, patch.name);
    return this.#repo.keyById(id) as ApiKeyRow;
  }

  revokeKey(caller: Principal, id: string): void {
    const row = this.#keyToManage(caller, id);
    const now = this.#clock.now();
    // One admin key of the admin user always stays valid, the way to administer flashd that no
    // other change can end (a team key stops working when its user leaves the team, which
    // nothing checks against this), as bootstrap counts: a rotation makes the new key before it
    // revokes the old one.
    if (isValidAdminKey(row, now) && !this.#repo.userKeys(ADMIN_USER).some((k) => k.id !== id && isValidAdminKey(k, now))) {
      throw new AgentError('CONFLICT', `API key ${id} is the admin user's last valid admin key, and flashd always keeps one `
        + '(admin-scope keys of other users or of teams do not count, even while valid: a team key stops working when its user leaves the team). '
        + 'To rotate it, create another admin key first (POST /v2/api-keys with "scopes": ["admin"]), then revoke this one; '
        + 'or restart flashd with a new FLASHD_ADMIN_API_KEY value, which revokes the key an earlier value registered.');
    }
    this.#suspended.delete(id);
    const revoked = this.#repo.revokeKey(id, now);
    // A repeated DELETE is answered the same (204) but changes nothing: no second line.
    if (!revoked) return;
    this.#log.info('api key revoked', { keyId: id, kind: row.kind, endpointId: row.endpointId });
    const workerId = workerIdOfKey(row);
    this.onRevoked?.(id, row.endpointId !== null && workerId !== null ? { endpointId: row.endpointId, workerId } : undefined);
  }

  // Users and teams -------------------------------------------------------------------------

  createUser(caller: Principal, name: string): UserRow {
    if (!caller.scopes.has('admin')) throw new AgentError('FORBIDDEN', 'Only admins can create users.');
    const user: UserRow = { id: newId('usr'), name, isAdmin: false, createdAt: this.#clock.now() };
    this.#repo.insertUser(user);
    return user;
  }

  listUsers(caller: Principal): UserRow[] {
    if (caller.scopes.has('admin')) return this.#repo.listUsers();
    const me = this.#repo.getUser(caller.userId);
    return me ? [me] : [];
  }

  createTeam(caller: Principal, name: string): TeamRow {
    const now = this.#clock.now();
    const team: TeamRow = { id: newId('team'), name, ownerUserId: caller.userId, createdAt: now };
    this.#repo.insertTeam(team);
    this.#repo.putMember(team.id, caller.userId, 'owner', now);
    return team;
  }

  teamsOf(caller: Principal): TeamRow[] {
    const teams = this.#repo.teamsOf(caller.userId);
    return caller.teamBound ? teams.filter((t) => t.id === caller.teamId) : teams;
  }

  /** A team the caller belongs to (or any team, for admins), else 404. */
  team(caller: Principal, teamId: string): { team: TeamRow; members: ReturnType<IdentityRepo['members']> } {
    const team = this.#repo.getTeam(teamId);
    if (!team || (!this.#repo.member(teamId, caller.userId) && !caller.scopes.has('admin')) || this.#outsideTeam(caller, teamId)) {
      throw new AgentError('NOT_FOUND', `Team ${teamId} not found.`);
    }
    return { team, members: this.#repo.members(teamId) };
  }

  addMember(caller: Principal, teamId: string, userId: string): void {
    const { team } = this.team(caller, teamId);
    if (team.ownerUserId !== caller.userId && !caller.scopes.has('admin')) {
      throw new AgentError('FORBIDDEN', 'Only the team owner can add members.');
    }
    if (!this.#repo.getUser(userId)) throw new AgentError('NOT_FOUND', `User ${userId} does not exist.`);
    if (this.#repo.member(teamId, userId)?.role === 'owner') return;
    this.#repo.putMember(teamId, userId, 'member', this.#clock.now());
  }

  removeMember(caller: Principal, teamId: string, userId: string): void {
    const { team } = this.team(caller, teamId);
    if (team.ownerUserId !== caller.userId && !caller.scopes.has('admin') && caller.userId !== userId) {
      throw new AgentError('FORBIDDEN', 'Only the team owner can remove other members.');
    }
    if (!this.#repo.removeMember(teamId, userId)) throw new AgentError('NOT_FOUND', `User ${userId} is not a removable member of ${teamId}.`);
  }
}

/** Throws 403 unless the principal holds `scope` (admin holds all). */
export function requireScope(principal: Principal, scope: Scope): void {
  if (principal.scopes.has(scope)) return;
  if (scope !== 'worker' && principal.scopes.has('admin')) return;
  throw new AgentError('FORBIDDEN', `This action needs the "${scope}" scope, which the credential lacks.`);
}
