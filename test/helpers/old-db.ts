/** A database file as an older flashd left it: the first `version` migrations applied, in WAL mode. */
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { MIGRATIONS } from '../../src/store/migrations.js';

export function databaseAtVersion(dir: string, version: number): Database.Database {
  const old = new Database(join(dir, 'flashd.db'));
  old.pragma('journal_mode = WAL');
  for (let v = 0; v < version; v++) {
    old.exec(MIGRATIONS[v] as string);
    old.pragma(`user_version = ${v + 1}`);
  }
  return old;
}
