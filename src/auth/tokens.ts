/**
 * Key and session token formats.
 *
 * API keys: `fd_<kind>_<30 base62 random><6 base62 CRC-32>` (GitHub's 2021 token design: a
 * prefix that names the kind, `_` separators that double-click selects whole, and a checksum so
 * typos and random strings are refused without a database lookup). ~178 bits of entropy, so a
 * plain SHA-256 in an indexed column is the stored form; the key itself is shown once.
 *
 * Session tokens (console): `fds_<base64url claims>.<base64url HMAC-SHA256>`, signed with a
 * secret kept in the database's settings table.
 */
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { checkKeyFormat } from '../core/key-format.js';
import { randomString } from '../core/ids.js';

export { checkKeyFormat, generateApiKey, type KeyKind } from '../core/key-format.js';

export function hashKey(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/** What a listing shows of a key whose value was chosen rather than generated (FLASHD_ADMIN_API_KEY). */
export const CHOSEN_KEY_PREFIX = 'chosen_';

/**
 * The visible part of a key for listings: enough to tell keys apart, useless to an attacker.
 * A generated key shows its first 11 characters: the kind and 4 of its 36 random ones (about
 * 24 of its 178 bits). A chosen key shows none of its characters, nor anything computed from
 * them (a short hash would let whoever lists it test guesses at a weak passphrase offline):
 * `chosen_` and 4 random characters, stored with the key.
 */
export function keyPrefix(token: string): string {
  return checkKeyFormat(token) === 'valid' ? token.slice(0, 11) : `${CHOSEN_KEY_PREFIX}${randomString(4)}`;
}

export interface SessionClaims {
  /** user id */
  u: string;
  /** id of the key that opened the session: revoking it ends the session */
  k: string;
  /** expiry, ms since epoch */
  e: number;
}

export function signSession(claims: SessionClaims, secret: string): string {
  const payload = Buffer.from(JSON.stringify(claims)).toString('base64url');
  const sig = createHmac('sha256', secret).update(payload).digest('base64url');
  return `fds_${payload}.${sig}`;
}

/** The claims of a correctly signed session token, or undefined. Expiry is checked by the caller. */
export function verifySession(token: string, secret: string): SessionClaims | undefined {
  if (!token.startsWith('fds_')) return undefined;
  const dot = token.indexOf('.');
  if (dot < 0) return undefined;
  const payload = token.slice(4, dot);
  const given = Buffer.from(token.slice(dot + 1), 'base64url');
  const expected = createHmac('sha256', secret).update(payload).digest();
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined;
  try {
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString()) as Partial<SessionClaims>;
    if (typeof claims.u !== 'string' || typeof claims.k !== 'string' || typeof claims.e !== 'number') return undefined;
    return claims as SessionClaims;
  } catch {
    return undefined;
  }
}
