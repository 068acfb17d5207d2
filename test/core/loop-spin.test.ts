/**
 * The adaptive polling window (core/loop-spin.ts): KVM halt-polling's grow and shrink rules as
 * a table, then the spinner itself on a clock the test moves, through real setImmediate turns.
 */
import t from 'tap';
import { LoopSpinner, nextSpinWindow, SPIN_GROW_START_US } from '../../src/core/loop-spin.js';

const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

t.test('nextSpinWindow: grow when a little more polling would have caught it, shrink when nothing would', async (t) => {
  const cases: [window: number, idle: number, max: number, next: number, why: string][] = [
    [0, 100, 500, SPIN_GROW_START_US, 'asleep, woken within max: start polling'],
    [10, 100, 500, 20, 'doubles'],
    [320, 400, 500, 500, 'capped at max'],
    [500, 400, 500, 500, 'caught while polling: unchanged'],
    [80, 80, 500, 80, 'caught right at the end of the window'],
    [0, 5000, 500, 0, 'sparse traffic: stays off'],
    [500, 5000, 500, 250, 'halves after a gap over max'],
    [16, 5000, 500, 0, 'below the first step: off'],
    [0, 1, 2, 2, 'a max under the first step is the window'],
    [100, 100, 0, 0, 'max 0: off'],
    [0, Number.POSITIVE_INFINITY, 500, 0, 'the first request ever'],
  ];
  for (const [w, idle, max, next, why] of cases) t.equal(nextSpinWindow(w, idle, max), next, why);
});

t.test('LoopSpinner grows under dense traffic, keeps the loop turning inside the window, and stops after it', async (t) => {
  let now = 1000; // ms
  const s = new LoopSpinner(500, () => now);
  s.activity();
  t.equal(s.windowUs, 0, 'first request: no window yet');
  await turn();
  await turn();
  t.equal(s.polling, false, 'window 0: the loop is left to sleep');

  // Requests 100 µs apart, each after the loop went to sleep: the window doubles each time.
  const seen: number[] = [];
  for (let i = 0; i < 7; i++) {
    now += 0.1; // 100 µs after the window ran out
    s.activity();
    seen.push(s.windowUs);
    await turn();
    now += s.windowUs / 1000 + 0.001; // the window runs out
    await turn();
    await turn();
    t.equal(s.polling, false, `window ${s.windowUs} µs ran out: polling stopped`);
  }
  t.same(seen, [10, 20, 40, 80, 160, 320, 500]);

  // Inside the window the loop keeps turning, and a request caught there leaves it alone.
  now += 1;
  s.activity(); // 1 ms idle: over max, halves
  t.equal(s.windowUs, 250);
  await turn();
  for (let i = 0; i < 5; i++) {
    await turn();
    t.equal(s.polling, true, 'still polling inside the window');
  }
  now += 0.2;
  s.activity();
  t.equal(s.windowUs, 250, 'caught while polling: unchanged');
  await turn();
  now += 0.249;
  await turn();
  t.equal(s.polling, true, 'the window counts from the last busy turn');
  now += 0.002;
  await turn();
  await turn();
  t.equal(s.polling, false);
});

t.test('LoopSpinner falls back to sleeping under sparse traffic and never polls with max 0', async (t) => {
  let now = 0;
  const s = new LoopSpinner(500, () => now);
  for (let i = 0; i < 9; i++) {
    now += 0.05;
    s.activity();
    await turn();
    now += 1;
    await turn();
    await turn();
  }
  t.equal(s.windowUs, 0, 'requests 1 ms apart: polling would never catch one');
  const off = new LoopSpinner(0, () => now);
  for (let i = 0; i < 3; i++) {
    now += 0.05;
    off.activity();
    t.equal(off.polling, false);
    t.equal(off.windowUs, 0);
    await turn();
  }
});
