import { chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import type { Logger } from '../core/logger.js';
import { sqliteNativeBinding } from '../core/native.js';
import { MIGRATIONS } from './migrations.js';

export type Db = Database.Database;

export interface OpenDbOptions {
  dataDir: string;
  /**
   * `full` (default): a commit is synced before anyone is told, so it survives power loss.
   * Direct writes get SQLite's own FULL; the job path's group commit (write-batch.ts) commits
   * at NORMAL and syncs the WAL itself, off the event loop, before answering.
   * `normal`: synced only at checkpoints; survives a crash of flashd, not of the machine.
   */
  synchronous: 'full' | 'normal';
  log: Logger;
}

/** The WAL file of the database `openDb` opens in `dataDir`. */
export function walPathOf(dataDir: string): string {
  return join(dataDir, 'flashd.db-wal');
}

/**
 * `new Database(file)`, with `first` run before the umask is restored. The files hold the
 * session secret, key hashes and every job's input and output: owner-only, also in a data
 * directory made beforehand with a looser mode (under umask 022 SQLite creates its files 0644).
 * In the single binary the addon comes from core/native.ts; better-sqlite3 takes the loaded
 * addon object (its #972), the typings only admit a path string.
 */
function openOwnerOnly(file: string, first?: (db: Db) => void): Db {
  const nativeBinding = sqliteNativeBinding();
  const umask = process.umask(0o077);
  try {
    const db = new Database(file, nativeBinding ? ({ nativeBinding } as unknown as Database.Options) : {});
    first?.(db);
    return db;
  } finally {
    process.umask(umask);
  }
}

/** The lock `lockDataDir` holds: one flashd per data directory. */
export interface DataDirLock {
  release(): void;
}

/**
 * Takes the data directory for this process, or throws when another flashd holds it. Before
 * this, a second flashd started on a live data dir (a typo in a port, a unit started twice)
 * ran its crash recovery against the first one: it killed that one's process workers, revoked
 * their keys and requeued their running jobs, and with another port it then served the same
 * database alongside it.
 *
 * The lock is an exclusive SQLite transaction held open on `<dataDir>/flashd.lock` (a POSIX
 * record lock underneath): the kernel drops it when the process dies, even on kill -9, so there
 * is no stale lock to clean up, and SQLite makes it exclusive within one process too. The
 * holder's pid goes to `flashd.pid` for the message a second start prints.
 */
export function lockDataDir(dataDir: string): DataDirLock {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const lock = openOwnerOnly(join(dataDir, 'flashd.lock'));
  const pidFile = join(dataDir, 'flashd.pid');
  try {
    lock.pragma('busy_timeout = 0');
    lock.exec('BEGIN EXCLUSIVE');
  } catch (err) {
    lock.close();
    if ((err as { code?: string }).code !== 'SQLITE_BUSY') throw err;
    let holder = '';
    try {
      const pid = readFileSync(pidFile, 'utf8').trim();
      if (/^\d+$/.test(pid)) holder = ` (pid ${pid})`;
    } catch {
      // No pid file (yet): the holder is starting.
    }
    throw new Error(`data directory ${dataDir} is in use by another flashd${holder}; stop it first, or give this one another --data-dir`);
  }
  try {
    writeFileSync(pidFile, `${process.pid}\n`, { mode: 0o600 });
  } catch (err) {
    lock.close();
    throw err;
  }
  return {
    release: () => {
      if (lock.open) lock.close();
    },
  };
}

/** Opens `<dataDir>/flashd.db` in WAL mode and applies pending migrations. */
export function openDb(options: OpenDbOptions): Db {
  mkdirSync(options.dataDir, { recursive: true });
  // SQLite gives the -wal and -shm files it creates later the database file's mode; an existing
  // database made with a looser one is tightened below.
  const file = join(options.dataDir, 'flashd.db');
  const db = openOwnerOnly(file, (d) => d.pragma('journal_mode = WAL'));
  for (const f of [file, `${file}-wal`, `${file}-shm`]) {
    try {
      chmodSync(f, 0o600);
    } catch {
      // Not there (no WAL yet), or not ours to change: SQLite already opened it.
    }
  }
  db.pragma(`synchronous = ${options.synchronous === 'full' ? 'FULL' : 'NORMAL'}`);
  db.pragma('foreign_keys = ON');
  db.pragma('busy_timeout = 5000');
  // SQLite's own checkpoint after 1000 pages (4 MB) of WAL, inside the commit that crosses it.
  // Measured under load (npm run bench:profile): small frequent checkpoints beat rare large
  // ones (64 MB) on throughput and on p99; the WAL stays small, in place and in the page
  // cache, and each stall is a few ms instead of tens. app.ts adds a PASSIVE one every 10 s.
  db.pragma('wal_autocheckpoint = 1000');
  migrate(db, options.log);
  return db;
}

export function migrate(db: Db, log: Logger): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > MIGRATIONS.length) {
    throw new Error(`database schema version ${current} is newer than this flashd (${MIGRATIONS.length}); upgrade flashd`);
  }
  for (let version = current; version < MIGRATIONS.length; version++) {
    const sql = MIGRATIONS[version] as string;
    db.transaction(() => {
      db.exec(sql);
      db.pragma(`user_version = ${version + 1}`);
    })();
    log.info('store migrated', { version: version + 1 });
  }
}
