/**
 * The data directory's own permissions, checked at start as OpenSSH's StrictModes checks
 * `~/.ssh`: the directory must be flashd's user's or closed to writers but its owner, the
 * secrets in it (`secret.key`, `admin-api-key`) regular files of flashd's user closed to group
 * and others. What flashd owns and can fix it tightens,
 * with one warning naming the old and new mode; what another user owns it refuses to use,
 * since that user could replace it. Not on platforms without uids (process.getuid).
 */
import { accessSync, chmodSync, closeSync, constants, fchmodSync, fstatSync, fsyncSync, ftruncateSync, mkdirSync, openSync, readFileSync, statSync, writeSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type { Logger } from './logger.js';

/** The errno code of a failed fs call (`EACCES`), for a message. */
function errnoCode(err: unknown): string {
  return (err as NodeJS.ErrnoException).code ?? 'error';
}

/** A failed fs call's message without Node's `ENOENT: ` prefix, for a message that names the code already. */
function errnoText(err: unknown): string {
  const { code, message } = err as NodeJS.ErrnoException;
  return code !== undefined && message.startsWith(`${code}: `) ? message.slice(code.length + 2) : message;
}

/**
 * `mkdir -p dir`, one component at a time: up from `dir` while mkdir answers ENOENT, then down,
 * each step once. Node 20's `mkdirSync(dir, { recursive: true })` loops for ever, on a blocked
 * event loop that no signal reaches, where mkdir answers ENOENT below a parent that exists
 * (`/proc/x`: ENOENT, `/proc`: EEXIST, and again); here that ENOENT is thrown.
 */
export function mkdirs(dir: string, mode: number): void {
  const missing: string[] = [];
  for (let at = resolve(dir); ; at = dirname(at)) {
    try {
      mkdirSync(at, { mode });
      break;
    } catch (err) {
      const code = errnoCode(err);
      // EEXIST: there already, unless it is a file (`dir` itself; a file above it gives ENOTDIR).
      if (code === 'EEXIST' && (at !== resolve(dir) || statSync(at, { throwIfNoEntry: false })?.isDirectory() !== false)) break;
      if (code !== 'ENOENT' || dirname(at) === at) throw err;
      missing.push(at);
    }
  }
  for (const at of missing.reverse()) {
    try {
      mkdirSync(at, { mode });
    } catch (err) {
      // Made meanwhile by another process: fine (a file there fails the checks that follow).
      if (errnoCode(err) !== 'EEXIST') throw err;
    }
  }
}

function octal(mode: number): string {
  return '0' + (mode & 0o7777).toString(8).padStart(3, '0');
}

/**
 * Makes `dir` (0700) if missing. One that exists and is group- or world-writable (any other
 * local user could swap `secret.key` or `flashd.db` in it) is set to 0700 when flashd owns it;
 * one that another user owns is refused (thrown): flashd does not change another user's directory.
 */
export function secureDataDir(dir: string, log: Logger, files: readonly string[] = []): void {
  const me = process.getuid?.();
  const who = me === undefined ? "flashd's user" : `uid ${me}`;
  try {
    mkdirs(dir, 0o700);
  } catch (err) {
    // A file of that name: mkdir says EEXIST ("file already exists"), which reads as if the directory were there.
    if (errnoCode(err) === 'EEXIST' && !statSync(dir, { throwIfNoEntry: false })?.isDirectory()) {
      throw new Error(`data directory ${dir} is not a directory (a file of that name exists): choose another --data-dir`);
    }
    throw new Error(`cannot create data directory ${dir} as ${who} (${errnoCode(err)}): ${errnoText(err)}. Create it for flashd's user (or choose another --data-dir)`);
  }
  const st = statSync(dir);
  if (!st.isDirectory()) throw new Error(`data directory ${dir} is not a directory`);
  const mode = st.mode & 0o7777;
  checkWritable(dir, st.uid, mode, who, files);
  if (me === undefined || (mode & 0o022) === 0) return;
  if (st.uid !== me) {
    throw new Error(`data directory ${dir} is writable by group or others (mode ${octal(mode)}) and owned by uid ${st.uid}, not by flashd's user (uid ${me}): `
      + `other local users could replace secret.key or flashd.db in it. Give flashd a directory of its own (chown it to flashd's user, chmod 700)`);
  }
  chmodSync(dir, 0o700);
  log.warn('data directory was writable by group or others: made owner-only', { dataDir: dir, oldMode: octal(mode), newMode: '0700' });
}

/**
 * What to do about `path` that flashd may not write, when the cause is not its owner or mode:
 * a filesystem mounted read-only (EROFS), or an immutable or append-only file or directory
 * (EPERM: chattr +i or +a; the only EPERM of access(2) and of an open for writing). Null for
 * EACCES and the rest: the caller names the owner and mode. `lsattrFlag`: `-d ` for a directory.
 */
function whyNotWritable(code: string, path: string, lsattrFlag: string): string | null {
  if (code === 'EROFS') return 'the filesystem holding it is mounted read-only. Remount it read-write, or choose another --data-dir';
  if (code === 'EPERM') {
    return `it is immutable or append-only (\`lsattr ${lsattrFlag}${path}\` shows i or a), which stops writes by any user, root included. `
      + `Clear it with \`chattr -i -a ${path}\`, or choose another --data-dir`;
  }
  return null;
}

/**
 * Throws, naming the path, its owner and mode, when flashd cannot write the directory or one
 * of `files` in it that exists: SQLite said only "unable to open database file" or "attempt to
 * write a readonly database". As root this passes (root may write them), unless read-only
 * mounted or made immutable.
 */
function checkWritable(dir: string, owner: number, mode: number, who: string, files: readonly string[]): void {
  try {
    accessSync(dir, constants.W_OK | constants.X_OK);
  } catch (err) {
    const code = errnoCode(err);
    throw new Error(`data directory ${dir} is not writable by ${who} (${code}); `
      + (whyNotWritable(code, dir, '-d ') ?? `it is owned by uid ${owner} with mode ${octal(mode)}. Give flashd's user a directory it can write (chown it to that user, chmod 700), or choose another --data-dir`));
  }
  for (const name of files) {
    const file = join(dir, name);
    let st;
    try {
      st = statSync(file);
    } catch {
      continue;
    }
    try {
      // A regular file is opened for writing, as SQLite will: access(2) passes an append-only
      // one (chattr +a), which refuses only an open for writing without O_APPEND.
      if (st.isFile()) closeSync(openSync(file, constants.O_RDWR | constants.O_NONBLOCK));
      else accessSync(file, constants.R_OK | constants.W_OK);
    } catch (err) {
      const code = errnoCode(err);
      throw new Error(`${file} in the data directory is not writable by ${who} (${code}); `
        + (whyNotWritable(code, file, '') ?? `it is owned by uid ${st.uid} with mode ${octal(st.mode)}. Was flashd run as another user on this directory? chown the directory and its files to flashd's user`));
    }
  }
}

/**
 * Checks the open file `fd` (`file`) is a regular file of flashd's user, and sets it to 0600
 * (one warning) when group or others may read or write it. Throws otherwise.
 */
function checkOwnerOnly(fd: number, file: string, log: Logger): void {
  const st = fstatSync(fd);
  if (!st.isFile()) throw new Error(`${file} is not a regular file`);
  const me = process.getuid?.();
  if (me === undefined) return;
  if (st.uid !== me) {
    throw new Error(`${file} is owned by uid ${st.uid}, not by flashd's user (uid ${me}): whoever owns it can read or replace it. `
      + `Check where it came from, then chown it to flashd's user (or remove it)`);
  }
  const mode = st.mode & 0o7777;
  if ((mode & 0o077) === 0) return;
  fchmodSync(fd, 0o600);
  log.warn('secret file was readable or writable by group or others: made owner-only', { file, oldMode: octal(mode), newMode: '0600' });
}

function openNoFollow(file: string, flags: number, mode?: number): number | null {
  try {
    return openSync(file, flags | constants.O_NOFOLLOW, mode);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return null;
    if (code === 'ELOOP') throw new Error(`${file} is a symbolic link; flashd reads and writes its secrets only as regular files of its own`);
    throw err;
  }
}

/**
 * The text of the owner-only file `file` (checked as above, without following a symbolic
 * link), or null when there is none.
 */
export function readOwnerOnlyFile(file: string, log: Logger): string | null {
  // O_NONBLOCK: a FIFO planted under the name must not hang the start (it fails the check).
  const fd = openNoFollow(file, constants.O_RDONLY | constants.O_NONBLOCK);
  if (fd === null) return null;
  try {
    checkOwnerOnly(fd, file, log);
    return readFileSync(fd, 'utf8');
  } finally {
    closeSync(fd);
  }
}

/**
 * Creates `file` with mode 0600 and `text`, exclusively (O_EXCL: never through a link or over
 * a file already there) and synced. False when it already exists: whoever made it won.
 */
export function createOwnerOnlyFile(file: string, text: string): boolean {
  let fd: number;
  try {
    fd = openSync(file, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  }
  try {
    writeSync(fd, text);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  return true;
}

/**
 * Writes `text` to the owner-only file `file`: created 0600, or an existing one (checked as
 * above, never through a symbolic link) truncated and rewritten. True when it was created.
 */
export function writeOwnerOnlyFile(file: string, text: string, log: Logger): boolean {
  if (createOwnerOnlyFile(file, text)) return true;
  const fd = openNoFollow(file, constants.O_WRONLY | constants.O_NONBLOCK);
  if (fd === null) throw new Error(`${file} went away while it was written`);
  try {
    checkOwnerOnly(fd, file, log);
    // Through the fd: the file just checked, not whatever the name points at by now.
    ftruncateSync(fd, 0);
    writeSync(fd, text, 0);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  return false;
}
