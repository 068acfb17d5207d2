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
import { randomString } from '../core/ids.js';

const BASE62 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
export type KeyKind = 'usr' | 'wkr';

let crcTable: Uint32Array | undefined;
function crc32(text: string): number {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let crc = 0xffffffff;
  for (const byte of Buffer.from(text)) crc = (crcTable[(crc ^ byte) & 0xff] as number) ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

function base62(n: number, width: number): string {
  let out = '';
  for (let i = 0; i < width; i++) {
    out = BASE62[n % 62] + out;
    n = Math.floor(n / 62);
  }
  return out;
}

export function generateApiKey(kind: KeyKind): string {
  const body = randomString(30);
  return `fd_${kind}_${body}${base62(crc32(body), 6)}`;
}

const KEY_RE = /^fd_(usr|wkr)_([A-Za-z0-9]{30})([A-Za-z0-9]{6})$/;

/**
 * `valid`: well formed with a good checksum; `malformed`: claims our format but is broken;
 * `foreign`: not our format (an operator-chosen FLASHD_ADMIN_API_KEY), looked up by hash only.
 */
export function checkKeyFormat(token: string): 'valid' | 'malformed' | 'foreign' {
  if (!token.startsWith('fd_')) return 'foreign';
  const m = KEY_RE.exec(token);
  if (!m) return 'malformed';
  return base62(crc32(m[2] as string), 6) === m[3] ? 'valid' : 'malformed';
}

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
