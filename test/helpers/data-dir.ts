/**
 * Directories for a test's flashd data, removed after the test's teardowns: after the flashd
 * that a teardown closes. tap's own t.testdir() is removed before the teardowns when the test
 * calls it before its first t.teardown (its removal then runs first in tap's end-of-test chain),
 * so a flashd closed on teardown ran on a deleted data directory; a file it wrote while the
 * directory was being removed (its worker pid file, when a worker exited) failed the removal
 * with ENOTEMPTY, and tap then skipped the teardowns: flashd was never closed, and its listener
 * held the file open until tap's timeout.
 */
import type { Test } from 'tap';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

/**
 * A new, empty directory under .tap/fixtures (each call its own: a second t.testdir() in a test
 * emptied the first, under a flashd still running on it). Removed by a teardown registered now,
 * so it runs after the teardowns of whatever is started on it later (they run last first).
 */
export function testDataDir(t: Test): string {
  const name = t.testdirName;
  mkdirSync(dirname(name), { recursive: true });
  const dir = mkdtempSync(join(dirname(name), `${basename(name).slice(0, 120)}-`));
  t.teardown(() => rmSync(dir, { recursive: true, force: true, maxRetries: 3 }));
  return dir;
}
