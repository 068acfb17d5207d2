/**
 * A SpaceReclaimer slice shares its group commit with job writes. When the slice fails in a way
 * that makes SQLite roll the whole transaction back (a full disk or an I/O error while its pages
 * spill to the WAL), the writes after it in the batch must not run outside the transaction: they
 * were committed one by one while the batch reported the commit as rolled back, so a job whose
 * caller got a 500 and that the queue forgot was in flashd.db, and ran after a restart.
 * The full disk is RLIMIT_FSIZE in a child process (`ulimit -f`): writes past it fail with EFBIG.
 */
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createLogger } from '../../src/core/logger.js';
import { openDb } from '../../src/store/index.js';
import { testDataDir } from '../helpers/data-dir.js';

const MB = 1024 * 1024;
const quiet = createLogger({ level: 'error', sink: { write: () => undefined } });
const child = fileURLToPath(new URL('../fixtures/store/slice-disk-full.ts', import.meta.url));
/** The WAL may grow to about this many bytes in the child (`ulimit -f` counts 1 KiB or 512 B blocks: the child reads it back). */
const LIMIT = 2 * MB;

t.test('a slice whose failure rolled the transaction back fails its whole commit: no write after it is stored', { skip: process.platform !== 'linux' && 'the child reads its limit from /proc/self/limits' }, async (t) => {
  const dir = testDataDir(t);
  const db = openDb({ dataDir: dir, synchronous: 'normal', log: quiet });
  const insert = db.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, created_at)
    VALUES (?, 'ep', 'IN_QUEUE', ?, 600000, 86400000, 1800000, 0)`);
  // Big rows between small ones: once the big ones go, the slice has live pages to move.
  for (let i = 0; i < 24; i++) {
    db.transaction(() => {
      insert.run(`big${i}`, JSON.stringify({ blob: 'x'.repeat(MB) }));
      for (let j = 0; j < 20; j++) insert.run(`small${i}-${j}`, JSON.stringify({ text: 's'.repeat(300) }));
    })();
  }
  db.prepare("DELETE FROM jobs WHERE id GLOB 'big*'").run();
  db.pragma('wal_checkpoint(TRUNCATE)');
  db.close();

  // Only the TypeScript loader of tap's arguments: its coverage hooks re-raise SIGXFSZ. The
  // compile cache is off: its file would be written past the limit too.
  const loader = process.execArgv.filter((a) => a.includes('@tapjs/typescript'));
  const r = spawnSync('sh', ['-c', `ulimit -f ${LIMIT / 1024} && exec "$0" "$@"`, process.execPath, ...loader, child, dir], {
    encoding: 'utf8', env: { ...process.env, DISABLE_V8_COMPILE_CACHE: '1' }, timeout: 60_000,
  });
  t.equal(r.status, 0, `the child ran (${r.signal ?? ''} ${r.stderr.slice(-2000)})`);
  const out = JSON.parse(r.stdout) as { error: string | null; rolledBack: boolean; a: boolean; b: boolean; slicesStarted: boolean };
  t.ok(out.slicesStarted, 'a slice was in the commit');
  t.ok(out.error, `the commit failed (${out.error})`);
  t.ok(out.rolledBack, 'and the batch says it was rolled back');
  t.notOk(out.a, 'the write before the slice is not stored');
  t.notOk(out.b, 'nor the write after it (before: committed on its own, outside the failed transaction)');
});
