/**
 * A database file as an older flashd left it: the first `version` migrations applied, in WAL
 * mode, with the `secret.key` every flashd made beside it (a start refuses a database with data
 * but no key).
 */
import Database from 'better-sqlite3';
import { randomBytes } from 'node:crypto';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { MIGRATIONS } from '../../src/store/migrations.js';

export function databaseAtVersion(dir: string, version: number): Database.Database {
  const key = join(dir, 'secret.key');
  if (!existsSync(key)) writeFileSync(key, randomBytes(32).toString('base64'), { mode: 0o600 });
  const old = new Database(join(dir, 'flashd.db'));
  old.pragma('journal_mode = WAL');
  for (let v = 0; v < version; v++) {
    old.exec(MIGRATIONS[v] as string);
    old.pragma(`user_version = ${v + 1}`);
  }
  return old;
}
