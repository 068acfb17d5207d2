import { chmodSync, mkdirSync, readFileSync, statfsSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
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
  const umask = process.umask(0o077);
  try {
    const db = new Database(file, withBinding({}));
    try {
      first?.(db);
    } catch (err) {
      closeWithoutCheckpoint(db);
      throw err;
    }
    return db;
  } finally {
    process.umask(umask);
  }
}

/** better-sqlite3's options with the addon of core/native.ts, when there is one. */
function withBinding(options: Database.Options): Database.Options {
  const nativeBinding = sqliteNativeBinding();
  return nativeBinding ? ({ ...options, nativeBinding } as unknown as Database.Options) : options;
}

/** Connections closeWithoutCheckpoint could not close safely: held, so no finalizer closes them. */
const heldOpen: Db[] = [];

/**
 * Closes `db` without the checkpoint SQLite runs when the last connection to a database closes
 * (and a handle better-sqlite3 finalizes, or closes as Node exits, is closed the same way): it
 * copies the WAL into flashd.db and deletes it. For a start that failed while opening or checking
 * the database: a flashd.db restored from a backup beside the WAL a crash left, which SQLite
 * reads as part of the file, had both destroyed by that checkpoint (the WAL's pages written into
 * the restored file, the crashed run's last writes deleted with the WAL). Both stay as they were.
 * A read-only connection, reading, holds flashd.db's shared lock: `db` then cannot take the
 * exclusive lock its checkpoint needs, and the read-only one, closed last, cannot checkpoint.
 * When that one cannot be had, `db` is held open until the process exits (flashd exits with
 * process.exit, which closes nothing).
 */
export function closeWithoutCheckpoint(db: Db): void {
  if (!db.open) return;
  let reader: Db | undefined;
  try {
    reader = new Database(db.name, withBinding({ readonly: true, fileMustExist: true }));
    reader.pragma('schema_version');
  } catch {
    reader?.close();
    heldOpen.push(db);
    return;
  }
  db.close();
  reader.close();
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

/**
 * Opens `<dataDir>/flashd.db` in WAL mode and applies pending migrations. On a failure the
 * database is closed without a checkpoint (closeWithoutCheckpoint), the WAL left as it was.
 */
export function openDb(options: OpenDbOptions): Db {
  mkdirSync(options.dataDir, { recursive: true });
  // SQLite gives the -wal and -shm files it creates later the database file's mode; an existing
  // database made with a looser one is tightened below.
  const file = join(options.dataDir, 'flashd.db');
  // auto_vacuum first: a new file takes it only before its first page is written, which
  // journal_mode=WAL already does. On an existing file it is what the next VACUUM converts to.
  // Set only when the file does not have it: on one that has, the pragma rewrites page 1, a
  // commit at every start, before anything is checked (into a WAL that is not this file's, too).
  const db = openOwnerOnly(file, (d) => {
    if (d.pragma('auto_vacuum', { simple: true }) !== AUTO_VACUUM_INCREMENTAL) d.pragma('auto_vacuum = INCREMENTAL');
    d.pragma('journal_mode = WAL');
  });
  try {
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
    // The WAL keeps the size of the largest transaction it ever held (a group commit of big
    // inputs: hundreds of MB) unless SQLite truncates it when it starts over: to 16 MB, four
    // times what the checkpoint above lets it reach, so steady traffic never truncates it.
    db.pragma(`journal_size_limit = ${WAL_SIZE_LIMIT}`);
    migrate(db, options.log);
    if (db.pragma('auto_vacuum', { simple: true }) !== AUTO_VACUUM_INCREMENTAL) convertToIncremental(db, options.dataDir, options.log);
  } catch (err) {
    closeWithoutCheckpoint(db);
    throw err;
  }
  return db;
}

/** Bytes the WAL file is cut back to when SQLite starts it over (`journal_size_limit`). */
export const WAL_SIZE_LIMIT = 16 * 1024 * 1024;

/** `PRAGMA auto_vacuum`'s value for INCREMENTAL (0 is NONE, 1 FULL). */
const AUTO_VACUUM_INCREMENTAL = 2;

/**
 * Makes a database an older flashd created (auto_vacuum NONE: its file never shrinks) give
 * space back from now on: once, at start, a VACUUM with auto_vacuum=INCREMENTAL pending
 * (openDb sets it), which also drops the free pages it has now. It rewrites the live pages
 * only, so it takes time in proportion to the rows kept, not to the file's size, and it needs
 * room for them twice over (SQLite's temporary copy, made in the data directory, and the WAL):
 * with less free space on the data directory's filesystem, or when it fails (a full disk:
 * SQLite rolls it back), the database stays as it was and the next start tries again. Rowids
 * are kept (jobs' recovery floor relies on them; SQLite copies each table's rows with their
 * rowids).
 */
function convertToIncremental(db: Db, dataDir: string, log: Logger): void {
  const pageSize = db.pragma('page_size', { simple: true }) as number;
  const pages = db.pragma('page_count', { simple: true }) as number;
  const free = db.pragma('freelist_count', { simple: true }) as number;
  const file = join(dataDir, 'flashd.db');
  const mb = (bytes: number): number => Math.round(bytes / 104857.6) / 10;
  const live = (pages - free) * pageSize;
  const sizes = { fileMb: mb(statSync(file).size), liveMb: mb(live), freeMb: mb(free * pageSize) };
  let diskFree = Infinity;
  try {
    const fs = statfsSync(dataDir);
    diskFree = fs.bavail * fs.bsize;
  } catch {
    // Not known here: let SQLite find out.
  }
  if (diskFree < 2 * live) {
    log.warn('store not converted to give space back (auto_vacuum=INCREMENTAL): too little free disk for a copy of its live pages; tried again at the next start',
      { ...sizes, diskFreeMb: mb(diskFree) });
    return;
  }
  log.info('store converting to give space back (auto_vacuum=INCREMENTAL), once: a VACUUM of its live pages', sizes);
  const started = Date.now();
  try {
    vacuumInDataDir(db);
  } catch (err) {
    log.warn('store conversion to auto_vacuum=INCREMENTAL failed, the database is as it was; tried again at the next start', { ...sizes, err });
    return;
  }
  // The file is cut, and the WAL the VACUUM filled emptied, once the checkpoint copied it in.
  db.pragma('wal_checkpoint(TRUNCATE)');
  log.info('store converted to auto_vacuum=INCREMENTAL', { ms: Date.now() - started, fileMb: mb(statSync(file).size) });
}

/**
 * VACUUM, with its temporary copy of the live pages in the database's own directory. SQLite
 * writes that copy to its temporary directory (SQLITE_TMPDIR, TMPDIR or /var/tmp: often another
 * filesystem, the root one or a tmpfs in RAM), where nothing checked the room; the data
 * directory is where the file already lives. A process-wide setting, set back after.
 */
export function vacuumInDataDir(db: Db): void {
  try {
    db.pragma(`temp_store_directory = '${dirname(db.name).replaceAll("'", "''")}'`);
    db.exec('VACUUM');
  } finally {
    db.pragma("temp_store_directory = ''");
  }
}

export function migrate(db: Db, log: Logger): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > MIGRATIONS.length) {
    throw new Error(`database schema version ${current} is newer than this flashd (${MIGRATIONS.length}); upgrade flashd`);
  }
  // A new database is one line (the schema it got); an older one, a line per migration it ran.
  const created = current === 0;
  for (let version = current; version < MIGRATIONS.length; version++) {
    const sql = MIGRATIONS[version] as string;
    db.transaction(() => {
      db.exec(sql);
      db.pragma(`user_version = ${version + 1}`);
    })();
    if (!created) log.info('store migrated', { version: version + 1 });
  }
  if (created) log.info('store created', { version: MIGRATIONS.length });
}
