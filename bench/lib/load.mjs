/** Closed-loop load helpers shared by the flashd and BullMQ suites. */
import { Samples, nowUs } from './stats.mjs';

/** A ~1 KB job input (the JSON body of /run is exactly 1024 bytes). */
export function input1k(extra = '') {
  const base = `{"input":{"prompt":"","n":0${extra}}}`;
  const pad = 'x'.repeat(1024 - base.length);
  return `{"input":{"prompt":"${pad}","n":0${extra}}}`;
}
export const BODY_1K = input1k();
/** The same input as an object (BullMQ job data). */
export const DATA_1K = JSON.parse(BODY_1K).input;

/**
 * Runs `clients` loops for `seconds`; each loop calls `fn(i)` back to back and the latency of
 * each call is recorded (µs). `fn` returns false for a failed call. Every loop stops after
 * its current call, so nothing is left in flight when this resolves.
 */
export async function closedLoop(clients, seconds, fn) {
  const lat = new Samples();
  let ok = 0;
  let failed = 0;
  const t0 = performance.now();
  const end = t0 + seconds * 1000;
  let last = t0;
  const cpu0 = process.cpuUsage();
  await Promise.all(
    Array.from({ length: clients }, async (_, i) => {
      while (performance.now() < end) {
        const s = nowUs();
        let good;
        try {
          good = await fn(i);
        } catch {
          good = false;
        }
        const e = nowUs();
        if (good === false) failed++;
        else {
          ok++;
          lat.push(e - s);
        }
        last = e / 1000;
      }
    }),
  );
  const elapsed = (last - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  return { ok, failed, elapsed, rate: ok / elapsed, lat: lat.summary(), loadCpu: (cpu.user + cpu.system) / 1e6 / elapsed };
}

/** Runs `clients` loops until `total` calls have been made (by count, not time); fn(k, loopIndex). */
export async function countedLoop(clients, total, fn) {
  const lat = new Samples(total);
  let next = 0;
  let ok = 0;
  let failed = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async (_, i) => {
      while (next < total) {
        const k = next++;
        const s = nowUs();
        let good;
        try {
          good = await fn(k, i);
        } catch {
          good = false;
        }
        if (good === false) failed++;
        else {
          ok++;
          lat.push(nowUs() - s);
        }
      }
    }),
  );
  const elapsed = (performance.now() - t0) / 1000;
  return { ok, failed, elapsed, rate: ok / elapsed, lat: lat.summary() };
}

/** Resolves when `pred()` is true (checked every `everyMs`), or rejects after `ms`. */
export async function until(pred, ms, what, everyMs = 5) {
  const deadline = performance.now() + ms;
  while (!pred()) {
    if (performance.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
