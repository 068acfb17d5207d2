/**
 * The format of the API keys flashd generates: `fd_<kind>_<30 base62 random><6 base62 CRC-32>`
 * (see auth/tokens.ts). In core, with no database, so config validation can refuse a
 * FLASHD_ADMIN_API_KEY that claims the format but breaks it before the data directory is
 * touched, and auth/ checks every presented key with the same function.
 */
import { randomString } from './ids.js';

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
