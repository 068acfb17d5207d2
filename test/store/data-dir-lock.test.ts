/**
 * lockDataDir: one holder per data directory (also within one process), released by release()
 * and when taking it fails half way.
 */
import t from 'tap';
import { mkdirSync, readFileSync, rmdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { lockDataDir } from '../../src/store/index.js';

t.test('one holder at a time; the second is told who holds it', async (t) => {
  const dir = t.testdir();
  const first = lockDataDir(dir);
  t.equal(readFileSync(join(dir, 'flashd.pid'), 'utf8'), `${process.pid}\n`);
  t.equal(statSync(join(dir, 'flashd.pid')).mode & 0o777, 0o600);
  t.throws(() => lockDataDir(dir), new RegExp(`in use by another flashd \\(pid ${process.pid}\\)`));
  first.release();
  first.release();
  const again = lockDataDir(dir);
  t.pass('released: taken again');
  again.release();
});

t.test('a failed pid-file write lets the lock go', async (t) => {
  const dir = t.testdir();
  mkdirSync(join(dir, 'flashd.pid'));
  t.throws(() => lockDataDir(dir), { code: 'EISDIR' });
  t.throws(() => lockDataDir(dir), { code: 'EISDIR' }, 'the same error again, not "in use"');
  rmdirSync(join(dir, 'flashd.pid'));
  lockDataDir(dir).release();
  t.pass('and the directory can be taken once the cause is gone');
});
