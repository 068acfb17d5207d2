/**
 * A real flashd gives the space of a burst of big jobs back once their results expire:
 * flashd.db and its WAL shrink to a fraction of their peak, with no restart. Before, the
 * expired rows' pages stayed on SQLite's freelist and the file kept its peak size for ever.
 */
import t from 'tap';
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody } from '../helpers/agent.js';

const MB = 1024 * 1024;
const JOBS = 40;

t.test('the file shrinks after a burst of 2 MB jobs expires', async (t) => {
  const clock = new ManualClock(Date.now());
  const a = await startAgent(t, {}, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const blob = 'x'.repeat(2 * MB);
  const sizes = (): { db: number; wal: number } => ({
    db: statSync(join(a.dir, 'flashd.db')).size,
    wal: existsSync(join(a.dir, 'flashd.db-wal')) ? statSync(join(a.dir, 'flashd.db-wal')).size : 0,
  });
  // Eight at a time: one group commit of 16 MB, as concurrent clients make them.
  for (let i = 0; i < JOBS; i += 8) {
    const replies = await Promise.all(Array.from({ length: 8 }, (_, j) =>
      a.req('POST', `/v2/${ep}/run`, { body: { input: { i: i + j, blob }, policy: { ttl: 10_000 } } })));
    for (const r of replies) t.equal(r.status, 200);
  }
  const small = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { small: true } } })).json.id as string;
  a.agent.db.pragma('wal_checkpoint(PASSIVE)');
  const peak = sizes();
  t.ok(peak.db > JOBS * 2 * MB, `the burst grew flashd.db to ${peak.db} bytes (WAL ${peak.wal})`);

  // Their TTL runs out (TIMED_OUT), then their results' retention.
  clock.advance(10_001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  clock.advance(a.agent.queue.settings.runRetentionMs + 1);
  a.agent.queue.expire();
  await a.agent.queue.durable();
  t.equal(a.agent.db.prepare('SELECT count(*) FROM jobs').pluck().get(), 1, 'only the small job is left');

  // The reclaimer's timer finds the freelist and cuts it off, a slice per commit.
  let now = sizes();
  for (let i = 0; i < 300 && now.db > peak.db / 10; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    now = sizes();
  }
  t.ok(now.db < peak.db / 10, `flashd.db went from ${peak.db} to ${now.db} bytes`);
  t.ok(now.wal <= 16 * MB, `its WAL is ${now.wal} bytes`);
  t.match(a.logs.join(''), /gave free space back/, 'logged');
  t.equal((await a.req('GET', `/v2/${ep}/status/${small}`)).json.status, 'IN_QUEUE', 'the live job is still there');
  t.equal(a.agent.db.pragma('integrity_check', { simple: true }), 'ok');
});
