/**
 * runpod-python reads RUNPOD_PING_INTERVAL in whole seconds (`int(v) // 1000`) and flashd hands
 * out at least 1000, so its heartbeat comes once a second (plus the request's own time) at the
 * most, whatever --lease-ms asks (workers are told a third of it). Under 3 s a runpod worker's
 * running job can lose its lease between two pings, go back to the queue and run twice: the
 * start says so, once.
 */
import t from 'tap';
import { startAgent } from '../helpers/agent.js';

const warned = (logs: string[]) => logs.filter((l) => / warn .*lease-ms.*runpod-python/.test(l));

t.test('a --lease-ms under 3 s is warned about at start: runpod-python pings once a second at most', async (t) => {
  const short = await startAgent(t, { leaseMs: 1500 });
  t.equal(warned(short.logs).length, 1, short.logs.join('\n'));
  t.match(warned(short.logs)[0], /leaseMs=1500/);
  const enough = await startAgent(t, { leaseMs: 3000 });
  t.same(warned(enough.logs), [], 'three pings a lease: no warning');
});
