/** The results table (Markdown), from the JSON that bench/run.mjs writes. `node bench/lib/report.mjs <json>` prints it. */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { fmtRate, fmtSpread, fmtUs } from './stats.mjs';

const pct = (x) => (x === null || x === undefined || !Number.isFinite(x) ? '-' : `${(x * 100).toFixed(0)} %`);
/** Server cores busy: CPU ms per 1k jobs x jobs/s. */
const busy = (l) => (l.serverCpuMsPer1k?.median ?? NaN) * (l.rate?.median ?? NaN) / 1e6;

export function renderTable(results) {
  const rows = [];
  const row = (...cells) => rows.push(`| ${cells.join(' | ')} |`);
  row('Scenario', ...results.systems.map((s) => s.system));
  row('---', ...results.systems.map(() => '---'));
  const get = (s, f) => {
    try {
      return f(s) ?? '-';
    } catch {
      return '-';
    }
  };
  const ck = (ok) => (ok === false ? ' ✗' : '');
  for (const c of results.cfg.s1Clients) {
    row(`S1 /run (add) c=${c}: jobs/s`, ...results.systems.map((s) => get(s, (x) => fmtSpread(x.s1[c].rate, fmtRate) + ck(x.s1[c].check))));
    row(`S1 c=${c}: p50 / p99`, ...results.systems.map((s) => get(s, (x) => `${fmtUs(x.s1[c].p50.median)} / ${fmtUs(x.s1[c].p99.median)}`)));
  }
  for (const W of results.cfg.s2Workers) {
    row(`S2 /runsync W=c=${W}: jobs/s`, ...results.systems.map((s) => get(s, (x) => fmtSpread(x.s2[W].rate, fmtRate) + ck(x.s2[W].check))));
    row(`S2 W=${W}: p50 / p99`, ...results.systems.map((s) => get(s, (x) => `${fmtUs(x.s2[W].p50.median)} / ${fmtUs(x.s2[W].p99.median)}`)));
  }
  row('S2 W=64: server CPU ms per 1k jobs', ...results.systems.map((s) => get(s, (x) => x.s2[64].serverCpuMsPer1k.median?.toFixed(0))));
  for (const [name, pick] of [['S1 c=64', (x) => x.s1[64]], ['S2 W=64', (x) => x.s2[64]]]) {
    row(`${name}: server core / load-generator core busy`, ...results.systems.map((s) => get(s, (x) => `${pct(busy(pick(x)))} / ${pct(pick(x).loadCpu.median)}`)));
  }
  row('other processes on the box during S1/S2 (cores, max)', ...results.systems.map((s) => get(s, (x) => Math.max(...[...Object.values(x.s1), ...Object.values(x.s2)].map((l) => l.foreignCpu.max ?? 0)).toFixed(2))));
  row('S3 idle pickup p50 / p99', ...results.systems.map((s) => get(s, (x) => `${fmtUs(x.s3.pickup.p50)} / ${fmtUs(x.s3.pickup.p99)}` + ck(x.s3.check))));
  row('S3 submit→done p50 / p99', ...results.systems.map((s) => get(s, (x) => `${fmtUs(x.s3.e2e.p50)} / ${fmtUs(x.s3.e2e.p99)}`)));
  row(`S4 drain ${results.cfg.s4Jobs} (64 workers): jobs/s`, ...results.systems.map((s) => get(s, (x) => fmtSpread(x.s4.rate, fmtRate) + ck(x.s4.check))));
  row('S4 enqueue (64 clients / addBulk): jobs/s', ...results.systems.map((s) => get(s, (x) => fmtSpread(x.s4.enqueueRate, fmtRate))));
  row('S5 S2 W=64 under /status storm: jobs/s (polls/s)', ...results.systems.map((s) => get(s, (x) => x.s5 && `${fmtRate(x.s5.storm.rate.median)} (${fmtRate(x.s5.storm.pollRate.median)} polls/s), ${x.s5.degradationPct.toFixed(1)} % below ${fmtRate(x.s5.base.rate.median)}` + ck(x.s5.check))));
  row('S7 kill -9 mid-traffic: lost / duplicated of acked', ...results.systems.map((s) => get(s, (x) => x.s7 && `${x.s7.lost} / ${x.s7.duplicated} of ${x.s7.acked}` + ck(x.s7.check))));
  row('S7 restart to listening / kill to first ack', ...results.systems.map((s) => get(s, (x) => x.s7 && `${x.s7.restartListenMs.toFixed(0)} ms (${x.s7.recoveredQueued + x.s7.recoveredRunning} active rows) / ${x.s7.killToFirstAckMs.toFixed(0)} ms`)));
  return rows.join('\n');
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  process.stdout.write(renderTable(JSON.parse(readFileSync(process.argv[2], 'utf8'))) + '\n');
}
