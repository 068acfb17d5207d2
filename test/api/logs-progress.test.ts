/**
 * A worker's progress bar (tqdm, pip, curl, a model download: each redraw after a `\r`) shows in
 * the endpoint log as it goes, not only at its `\n`, and thinned to about one line a second.
 * Real flashd with the process runtime, a real worker process, real HTTP, real SQLite.
 */
import t from 'tap';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { mustCreate } from '../helpers/expect.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

t.test('a \\r progress bar shows in /logs before its \\n, about one line a second', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  const ep = await mustCreate(t, a, cpuBody({ name: 'progress', image: 'none', args: 'python3 -u test/fixtures/workers/progress.py', workers: { min: 1, max: 1, idleTimeout: 30 } }));
  const bar = async () => ((await a.req('GET', `/v2/serverless/${ep.id}/logs`)).json as { stream: string; line: string }[])
    .filter((l) => l.stream === 'stderr');
  const seen = await until('a line of the bar in the log', async () => {
    const lines = await bar();
    return lines.some((l) => /100%/.test(l.line)) ? lines : undefined;
  }, 20_000).catch(() => undefined);
  const lines = seen ?? (await bar());
  t.ok(seen, `the bar, to its last redraw, shows before its \\n: ${JSON.stringify(lines.map((l) => l.line))}`);
  t.ok(lines.every((l) => /^loading model: +\d+%$/.test(l.line)), 'each line one redraw of the bar');
  t.ok(lines.length >= 3 && lines.length <= 12, `thinned: ${lines.length} lines for 100 redraws over 5 s`);
});
