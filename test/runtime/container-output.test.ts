/**
 * Where a container's output resumes from the engine's log after a broken connection
 * (container-output.ts): the timestamps the engines write, the `since` value they read, and
 * the place in this run's log that continues what was delivered. The whole path against a real
 * engine is in container-runtime.test.ts (a relay to the engine, cut mid-job).
 */
import t from 'tap';
import { resumeOffset, sinceParam, timestampNs } from '../../src/runtime/docker/container-output.js';

t.test('timestampNs reads Docker\'s and Podman\'s log timestamps', async (t) => {
  const base = BigInt(Date.UTC(2026, 10, 21, 20, 28, 30)) * 1_000_000n;
  t.equal(timestampNs('2026-11-21T20:28:30Z'), base, 'Podman: whole seconds');
  t.equal(timestampNs('2026-11-21T20:28:30.000000001Z'), base + 1n, 'Docker: nanoseconds');
  t.equal(timestampNs('2026-11-21T20:28:30.5Z'), base + 500_000_000n, 'a short fraction');
  t.equal(timestampNs('2026-11-21T22:28:30.25+02:00'), base + 250_000_000n, 'an offset');
  t.equal(timestampNs('0001-01-01T00:00:00Z')! < 0n, true, 'the zero time (never finished) is before the epoch');
  t.equal(timestampNs(''), null);
  t.equal(timestampNs(undefined), null);
  t.equal(timestampNs('hello world'), null);
  t.equal(timestampNs('2026-11-21 20:28:30Z'), null);
});

t.test('sinceParam writes seconds with nine decimals', async (t) => {
  t.equal(sinceParam(1_795_293_005_000_000_001n), '1795293005.000000001');
  t.equal(sinceParam(1_795_293_005_140_290_805n), '1795293005.140290805');
  t.equal(sinceParam(timestampNs('2026-11-21T20:28:30Z')!), `${Date.UTC(2026, 10, 21, 20, 28, 30) / 1000}.000000000`);
});

t.test('resumeOffset', async (t) => {
  const log = Buffer.from('line 1\nline 2\npartial line 3, then the rest\nline 4\n');
  t.same(resumeOffset(log, 0, Buffer.alloc(0)), { skip: 0, exact: true }, 'nothing delivered: all of it');
  const cut = 'line 1\nline 2\npartial'.length;
  t.same(resumeOffset(log, cut, log.subarray(0, cut)), { skip: cut, exact: true }, 'delivered bytes found where they end, mid-line');
  t.same(resumeOffset(log, cut, log.subarray(cut - 4, cut)), { skip: cut, exact: true }, 'only the tail of what was delivered is compared');
  t.same(resumeOffset(log, log.length, log.subarray(log.length - 7)), { skip: log.length, exact: true }, 'all delivered: nothing more');

  // The engine rotated the start of this run out of its log: the delivered count runs past it.
  const rotated = log.subarray(14);
  const tail = log.subarray(0, cut).subarray(-7);
  t.same(resumeOffset(rotated, cut, tail), { skip: cut - 14, exact: false }, 'after the last copy of the delivered tail');
  t.same(resumeOffset(Buffer.from('line 9\n'), cut, tail), { skip: 0, exact: false }, 'the tail is not in the log at all: from its start');
  t.same(resumeOffset(Buffer.from('tick\ntick\n'), 15, Buffer.from('tick\n')), { skip: 10, exact: false }, 'the last copy of a repeated tail: nothing repeats, a line may be lost');
  t.same(resumeOffset(log, log.length + 5, Buffer.from('4\nmore')), { skip: 0, exact: false }, 'more delivered than the log holds, tail not in it');
});
