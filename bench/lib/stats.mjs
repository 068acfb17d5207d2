/** Latency samples and run summaries. */

/** Growable Float64 sample buffer (µs). */
export class Samples {
  constructor(cap = 1 << 16) {
    this.a = new Float64Array(cap);
    this.n = 0;
  }
  push(v) {
    if (this.n === this.a.length) {
      const b = new Float64Array(this.a.length * 2);
      b.set(this.a);
      this.a = b;
    }
    this.a[this.n++] = v;
  }
  /** {p50, p99, p999, max} in µs, or nulls when empty. */
  summary() {
    if (this.n === 0) return { n: 0, p50: null, p99: null, p999: null, max: null };
    const s = this.a.slice(0, this.n).sort();
    const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
    return { n: this.n, p50: q(0.5), p99: q(0.99), p999: q(0.999), max: s[s.length - 1] };
  }
}

/** Median, min and max of numbers (nulls ignored). */
export function spread(values) {
  const v = values.filter((x) => x !== null && x !== undefined && Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return { median: null, min: null, max: null, runs: 0 };
  const mid = v.length >> 1;
  const median = v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  return { median, min: v[0], max: v[v.length - 1], runs: v.length };
}

/** Summarises several runs: each run is {rate, p50, p99, ...}. */
export function combine(runs, keys = ['rate', 'p50', 'p99', 'p999']) {
  const out = { runs: runs.length };
  for (const k of keys) out[k] = spread(runs.map((r) => r[k]));
  return out;
}

export const fmtRate = (x) => (x === null || x === undefined ? '-' : x >= 10_000 ? `${(x / 1000).toFixed(1)}k` : x >= 1000 ? `${(x / 1000).toFixed(2)}k` : x.toFixed(0));
export const fmtUs = (x) => (x === null || x === undefined ? '-' : x >= 10_000 ? `${(x / 1000).toFixed(1)} ms` : x >= 1000 ? `${(x / 1000).toFixed(2)} ms` : `${x.toFixed(0)} µs`);

/** "median (min–max)" */
export function fmtSpread(s, f) {
  if (!s || s.median === null) return '-';
  if (s.runs <= 1 || s.min === s.max) return f(s.median);
  return `${f(s.median)} (${f(s.min)}–${f(s.max)})`;
}

export const nowUs = () => performance.now() * 1000;
