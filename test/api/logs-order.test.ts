/**
 * The order of a worker's stdout and stderr lines in `/logs`: each stream's lines in the order
 * the worker wrote them, many in the same millisecond, and `seq` (the store's order key, the
 * order flashd read them in) ascending, not re-sorted by time or stream. Between the two streams,
 * two pipes (or the engine's attach stream), flashd keeps the order it read them in; which the
 * worker wrote first cannot be known. Real flashd, real worker processes and containers.
 */
import t, { type Test } from 'tap';
import { cpuBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { mustCreate } from '../helpers/expect.js';
import { until } from '../helpers/wait.js';
import { ManualClock } from '../../src/core/clock.js';

const N = 400;
// Alternating lines, each flushed at once, in bursts of 20 (so flashd reads both pipes between
// bursts, and a reply sorted by stream would show).
const ARGS = `python3 -u -c 'import sys,time
for i in range(${N}):
    sys.stdout.write("out %d\\n" % i); sys.stdout.flush(); sys.stderr.write("err %d\\n" % i); sys.stderr.flush()
    if i % 20 == 19: time.sleep(0.01)
time.sleep(60)'`;

interface Line { seq: number; at: number; stream: string; line: string }

async function check(t: Test, a: TestAgent, image: string): Promise<Line[]> {
  const ep = await mustCreate(t, a, cpuBody({ name: 'order', image, args: ARGS, workers: { min: 1, max: 1, idleTimeout: 30 } }));
  const read = async () => ((await a.req('GET', `/v2/serverless/${ep.id}/logs?limit=10000`)).json as Line[]);
  const lines = await until('every line in the log', async () => {
    const l = await read();
    return l.filter((x) => x.stream !== 'system').length >= 2 * N ? l : undefined;
  }, 90_000);
  for (const stream of ['stdout', 'stderr']) {
    const mine = lines.filter((l) => l.stream === stream).map((l) => l.line);
    t.same(mine, Array.from({ length: N }, (_, i) => `${stream === 'stdout' ? 'out' : 'err'} ${i}`), `${stream}: every line, in the order written`);
  }
  t.ok(lines.every((l, i) => i === 0 || l.seq > (lines[i - 1] as Line).seq), 'the reply in seq order');
  return lines;
}

t.test('process runtime: each stream in the order written, every line in the same millisecond', async (t) => {
  // A clock that stands still: every line has the same `at`, so only `seq` can order them.
  const a = await startAgent(t, { runtime: 'process' }, { clock: new ManualClock() });
  const lines = await check(t, a, 'none');
  t.equal(new Set(lines.map((l) => l.at)).size, 1, 'one `at` for all');
  t.ok(lines.some((l, i) => i > 0 && l.stream === 'stderr' && (lines[i - 1] as Line).stream === 'stdout')
    && lines.some((l, i) => i > 0 && l.stream === 'stdout' && (lines[i - 1] as Line).stream === 'stderr'), 'the two streams as read, not sorted by stream');
});

t.test('container runtime: each stream in the order written', { skip: !process.env['FLASHD_TEST_CONTAINER_SOCKET'] && 'needs FLASHD_TEST_CONTAINER_SOCKET' }, async (t) => {
  const { start, IMAGE } = await import('../helpers/containers.js');
  const a = await start(t);
  await check(t, a, IMAGE);
});
