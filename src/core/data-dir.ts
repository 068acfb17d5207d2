/**
 * The data directory's own permissions, checked at start as OpenSSH's StrictModes checks
 * `~/.ssh`: the directory must be flashd's user's and closed to group and others for writing.
 * What flashd owns and can fix it tightens, with one warning naming the old and new mode;
 * what another user owns it refuses to use. Not on platforms without uids (process.getuid).
 */
import { chmodSync, mkdirSync, statSync } from 'node:fs';
import type { Logger } from './logger.js';

function octal(mode: number): string {
  return '0' + (mode & 0o7777).toString(8).padStart(3, '0');
}

/**
 * Makes `dir` (0700) if missing. One that exists and is group- or world-writable (any other
 * local user could swap `secret.key` or `flashd.db` in it) is set to 0700 when flashd owns it;
 * one that another user owns is refused (thrown): flashd does not change another user's directory.
 */
export function secureDataDir(dir: string, log: Logger): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const me = process.getuid?.();
  const st = statSync(dir);
  if (!st.isDirectory()) throw new Error(`data directory ${dir} is not a directory`);
  const mode = st.mode & 0o7777;
  if (me === undefined || (mode & 0o022) === 0) return;
  if (st.uid !== me) {
    throw new Error(`data directory ${dir} is writable by group or others (mode ${octal(mode)}) and owned by uid ${st.uid}, not by flashd's user (uid ${me}): `
      + `other local users could replace secret.key or flashd.db in it. Give flashd a directory of its own (chown it to flashd's user, chmod 700)`);
  }
  chmodSync(dir, 0o700);
  log.warn('data directory was writable by group or others: made owner-only', { dataDir: dir, oldMode: octal(mode), newMode: '0700' });
}
