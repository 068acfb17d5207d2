/**
 * FailureStreak: a failure that repeats (a full disk) is logged in full once, then as a count at
 * most once per `everyMs` (or not at all without it), and its end once; an error reported by
 * several callers (every request of one failed commit) counts once.
 */
import t from 'tap';
import { FailureStreak } from '../../src/core/failure-streak.js';
import { createLogger } from '../../src/core/logger.js';

function scene(everyMs?: number) {
  const lines: Record<string, unknown>[] = [];
  let now = 0;
  const log = createLogger({ format: 'json', sink: { write: (l) => void lines.push(JSON.parse(l) as Record<string, unknown>) } });
  const streak = new FailureStreak(log, 'store write failed', {
    level: 'error', recovered: 'store writes work again', now: () => now, ...(everyMs === undefined ? {} : { everyMs }),
  });
  const full = () => Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
  return { lines, streak, full, advance: (ms: number) => void (now += ms) };
}

t.test('with everyMs: the first in full, then at most one count per interval, and the end', async (t) => {
  const s = scene(60_000);
  s.streak.fail(s.full(), { dataDir: '/d' });
  t.match(s.lines, [{ level: 'error', msg: 'store write failed', dataDir: '/d', err: { message: 'database or disk is full', code: 'SQLITE_FULL', stack: /SQLITE_FULL|Error/ } }]);
  for (let i = 0; i < 100; i++) {
    s.advance(500);
    s.streak.fail(s.full());
  }
  t.equal(s.lines.length, 1, '100 more failures within 50 s: no line');
  s.advance(10_000);
  s.streak.fail(s.full());
  t.equal(s.lines.length, 2);
  t.match(s.lines[1], { level: 'error', msg: 'store write failed', failures: 101, sinceSeconds: 60, code: 'SQLITE_FULL', error: 'database or disk is full' });
  t.notOk('err' in (s.lines[1] as object), 'no stack again');
  t.ok(s.streak.failing);
  s.streak.ok();
  t.match(s.lines[2], { level: 'info', msg: 'store writes work again', failures: 102 });
  s.streak.ok();
  t.equal(s.lines.length, 3, 'ok() outside a streak logs nothing');
});

t.test('one error reported by many callers counts once', async (t) => {
  const s = scene(60_000);
  const err = s.full();
  for (let i = 0; i < 10; i++) s.streak.fail(err, { requestId: String(i) });
  s.advance(60_000);
  s.streak.fail(s.full());
  t.match(s.lines[1], { failures: 1 }, 'the ten reports of one failure were one');
});

t.test('a failure that comes and goes still logs at most one failure line per interval', async (t) => {
  const s = scene(60_000);
  for (let i = 0; i < 50; i++) {
    s.streak.fail(s.full());
    s.advance(1000);
    s.streak.ok();
  }
  t.same(s.lines.map((l) => l['msg']), ['store write failed', 'store writes work again'], 'later streaks within the minute are counted, not logged');
  s.advance(20_000);
  s.streak.fail(s.full());
  t.match(s.lines[2], { msg: 'store write failed', failures: 50 }, 'the next line, a minute on, counts them (its own first, so in full)');
  t.ok('err' in (s.lines[2] as object));
});

t.test('a second outage that starts after writes worked for a while is logged at once, within the minute, and so is its end', async (t) => {
  const s = scene(60_000);
  s.streak.fail(s.full(), { dataDir: '/d' });
  s.advance(15_000);
  s.streak.ok();
  s.advance(25_000);
  s.streak.fail(s.full(), { dataDir: '/d' });
  t.same(s.lines.map((l) => l['msg']), ['store write failed', 'store writes work again', 'store write failed'],
    'the log does not end on "work again" while writes fail');
  t.match(s.lines[2], { level: 'error', dataDir: '/d', err: { code: 'SQLITE_FULL' } }, 'its first failure in full');
  for (let i = 0; i < 20; i++) {
    s.advance(500);
    s.streak.fail(s.full());
  }
  t.equal(s.lines.length, 3, 'its repeats within the minute are counted, not logged');
  s.streak.ok();
  t.match(s.lines[3], { msg: 'store writes work again', failures: 21 });
});

t.test('without everyMs: once per streak, and once more for the next streak', async (t) => {
  const s = scene();
  for (let i = 0; i < 30; i++) {
    s.advance(10_000);
    s.streak.fail(s.full());
  }
  t.equal(s.lines.length, 1, 'a checkpoint failing every 10 s for 5 minutes: one warning');
  s.streak.ok();
  s.streak.fail(s.full());
  t.same(s.lines.map((l) => l['msg']), ['store write failed', 'store writes work again', 'store write failed']);
});
