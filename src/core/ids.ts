import { randomBytes, randomUUID } from 'node:crypto';

const BASE36 = 'abcdefghijklmnopqrstuvwxyz0123456789';
const BASE62 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

/** Uniform random string over `alphabet` (rejection sampling, no modulo bias). */
export function randomString(length: number, alphabet: string = BASE62): string {
  const limit = 256 - (256 % alphabet.length);
  let out = '';
  while (out.length < length) {
    for (const byte of randomBytes(length * 2)) {
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

/** Job ids keep RunPod's UUID shape with a site suffix, e.g. `…-f1`. */
export function newJobId(): string {
  return `${randomUUID()}-f1`;
}
