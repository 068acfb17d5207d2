/**
 * Seals small secrets (registry passwords, jobs' s3Config) at rest with AES-256-GCM. The key lives in
 * `<data-dir>/secret.key` (mode 0600), outside the database, so a copied database file alone
 * does not reveal them.
 */
import { createCipheriv, createDecipheriv, createHmac, randomBytes } from 'node:crypto';

export interface SecretBox {
  seal(plain: string): string;
  open(sealed: string): string;
}

export function createSecretBox(key: Buffer): SecretBox {
  if (key.length !== 32) throw new Error('secret key must be 32 bytes');
  return {
    seal(plain) {
      const iv = randomBytes(12);
      const cipher = createCipheriv('aes-256-gcm', key, iv);
      const data = Buffer.concat([cipher.update(plain, 'utf8'), cipher.final()]);
      return `v1.${Buffer.concat([iv, cipher.getAuthTag(), data]).toString('base64url')}`;
    },
    open(sealed) {
      if (!sealed.startsWith('v1.')) throw new Error('unknown sealed secret format');
      const raw = Buffer.from(sealed.slice(3), 'base64url');
      const decipher = createDecipheriv('aes-256-gcm', key, raw.subarray(0, 12));
      decipher.setAuthTag(raw.subarray(12, 28));
      return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString('utf8');
    },
  };
}

/**
 * A value that tells whether `key` is the key a database was used with, stored in it (settings
 * `secret_key.check`): an HMAC of a constant, from which the key cannot be found.
 */
export function secretKeyCheck(key: Buffer): string {
  return createHmac('sha256', key).update('flashd secret.key check v1').digest('base64url');
}
