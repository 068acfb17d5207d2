import { randomFillSync } from 'node:crypto';

/**
 * Random bytes come from a pool refilled 8 KiB at a time: one `randomBytes(16)` call costs
 * about 3 µs (the cost is the call, not the bytes), which is a tenth of a /run's budget.
 * Same CSPRNG, consumed once each.
 */
const pool = Buffer.alloc(8192);
let poolOffset = pool.length;

function randomSlice(n: number): Buffer {
  if (n > pool.length) return randomFillSync(Buffer.alloc(n));
  if (poolOffset + n > pool.length) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  const out = pool.subarray(poolOffset, poolOffset + n);
  poolOffset += n;
  return out;
}

const BASE36 = 'abcdefghijklmnopqrstuvwxyz0123456789';
const BASE62 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

/** Uniform random string over `alphabet` (rejection sampling, no modulo bias). */
export function randomString(length: number, alphabet: string = BASE62): string {
  const limit = 256 - (256 % alphabet.length);
  let out = '';
  while (out.length < length) {
    for (const byte of randomSlice(length * 2)) {
      if (byte < limit) out += alphabet[byte % alphabet.length];
      if (out.length === length) break;
    }
  }
  return out;
}

/**
 * Endpoint ids are 14 lowercase base36 characters, like RunPod's (`uhbbfre73gqjwh`), and carry
 * no `ep_` prefix: they are the first DNS label of a load-balancing endpoint's host
 * (`{endpoint_id}.{endpoint_host}`), where `_` is not allowed.
 */
export function newEndpointId(): string {
  return randomString(1, 'abcdefghijklmnopqrstuvwxyz') + randomString(13, BASE36);
}

/** Prefixed ids for everything else, so logs read on their own. */
export function newId(prefix: string): string {
  return `${prefix}_${randomString(20, BASE36)}`;
}

/**
 * Job ids keep RunPod's UUID shape with a site suffix (`…-f1`), as UUID version 7: a 48-bit
 * millisecond timestamp first, so new rows land at the end of the primary-key index instead of
 * dirtying a random page of it on every insert.
 */
export function newJobId(): string {
  const b = randomSlice(16);
  const ms = Date.now();
  b.writeUIntBE(ms, 0, 6);
  b[6] = 0x70 | ((b[6] as number) & 0x0f);
  b[8] = 0x80 | ((b[8] as number) & 0x3f);
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}-f1`;
}
