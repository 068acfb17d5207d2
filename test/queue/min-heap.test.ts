/**
 * MinHeap against a sorted-array model: pushes (in key order, the usual case, and not), pops
 * and a reset from a list give the items back smallest key first, equal keys included.
 */
import t from 'tap';
import fc from 'fast-check';
import { MinHeap } from '../../src/queue/min-heap.js';

const SEED = process.env['FUZZ_SEED'] === undefined ? undefined : Number(process.env['FUZZ_SEED']);

type Op = { kind: 'push'; keys: number[] } | { kind: 'pop'; n: number } | { kind: 'reset'; keep: number };

t.test('pops smallest key first under any mix of pushes, pops and resets', async (t) => {
  const op = fc.oneof(
    fc.record({ kind: fc.constant('push' as const), keys: fc.array(fc.integer({ min: 0, max: 50 }), { maxLength: 300 }) }),
    fc.record({ kind: fc.constant('pop' as const), n: fc.integer({ min: 1, max: 300 }) }),
    fc.record({ kind: fc.constant('reset' as const), keep: fc.integer({ min: 1, max: 4 }) }),
  );
  fc.assert(
    fc.property(fc.array(op, { maxLength: 30 }), fc.boolean(), (ops: Op[], sorted: boolean) => {
      const heap = new MinHeap<{ key: number; n: number }>();
      let model: { key: number; n: number }[] = [];
      let next = 0;
      for (const o of ops) {
        if (o.kind === 'push') {
          const keys = sorted ? [...o.keys].sort((a, b) => a - b) : o.keys;
          for (const key of keys) {
            const item = { key, n: next++ };
            heap.push(item, key);
            model.push(item);
          }
        } else if (o.kind === 'pop') {
          for (let i = 0; i < o.n; i++) {
            const min = model.reduce((m, x) => Math.min(m, x.key), Infinity);
            if (heap.peekKey() !== min) return false;
            const got = heap.pop();
            if (model.length === 0) {
              if (got !== undefined) return false;
              continue;
            }
            if (got === undefined || got.key !== min) return false;
            model.splice(model.indexOf(got), 1);
          }
        } else {
          model = model.filter((x) => x.n % o.keep === 0);
          const items = [...model].reverse();
          heap.reset(items, items.map((x) => x.key));
        }
        if (heap.size !== model.length) return false;
      }
      return true;
    }),
    { numRuns: 300, ...(SEED === undefined ? {} : { seed: SEED }) },
  );
  t.pass('matches the model');
});

t.test('an empty heap', async (t) => {
  const heap = new MinHeap<string>();
  t.equal(heap.peekKey(), Infinity);
  t.equal(heap.peek(), undefined);
  t.equal(heap.pop(), undefined);
  heap.push('a', 5);
  heap.push('b', 1);
  heap.push('c', 1);
  t.equal(heap.pop(), 'b');
  t.equal(heap.pop(), 'c');
  t.equal(heap.pop(), 'a');
  t.equal(heap.size, 0);
});
