/**
 * Deque against an array model: push, shift, take (which moves the skipped items one slot
 * back instead of splicing the tail) and retain keep FIFO order through the head compaction.
 */
import t from 'tap';
import fc from 'fast-check';
import { Deque } from '../../src/queue/deque.js';

const SEED = process.env['FUZZ_SEED'] === undefined ? undefined : Number(process.env['FUZZ_SEED']);

type Op = { kind: 'push'; n: number } | { kind: 'shift'; n: number } | { kind: 'take'; mod: number } | { kind: 'retain'; mod: number };

t.test('behaves like an array under any mix of operations, across the head compaction', async (t) => {
  const op = fc.oneof(
    fc.record({ kind: fc.constant('push' as const), n: fc.integer({ min: 1, max: 1500 }) }),
    fc.record({ kind: fc.constant('shift' as const), n: fc.integer({ min: 1, max: 1500 }) }),
    fc.record({ kind: fc.constant('take' as const), mod: fc.integer({ min: 1, max: 2000 }) }),
    fc.record({ kind: fc.constant('retain' as const), mod: fc.integer({ min: 2, max: 7 }) }),
  );
  fc.assert(
    fc.property(fc.array(op, { maxLength: 40 }), (ops: Op[]) => {
      const d = new Deque<number>();
      let model: number[] = [];
      let next = 0;
      for (const o of ops) {
        if (o.kind === 'push') {
          for (let i = 0; i < o.n; i++) {
            d.push(next);
            model.push(next++);
          }
        } else if (o.kind === 'shift') {
          for (let i = 0; i < o.n; i++) if (d.shift() !== model.shift()) return false;
        } else if (o.kind === 'take') {
          // The first item divisible by mod (often deep in the deque, often absent).
          const pick = (x: number) => x % o.mod === o.mod - 1;
          const i = model.findIndex(pick);
          const got = d.take(pick);
          if (i < 0) {
            if (got !== undefined) return false;
          } else {
            if (got !== model[i]) return false;
            model.splice(i, 1);
          }
        } else {
          d.retain((x) => x % o.mod !== 0);
          model = model.filter((x) => x % o.mod !== 0);
        }
        if (d.size !== model.length || d.peek() !== model[0]) return false;
      }
      return [...d].join() === model.join();
    }),
    { numRuns: 300, ...(SEED === undefined ? {} : { seed: SEED }) },
  );
});

t.test('take of an item deep in a long deque leaves the rest in order', async (t) => {
  const d = new Deque<number>();
  for (let i = 0; i < 100_000; i++) d.push(i);
  t.equal(d.take((x) => x === 0), 0, 'the head: a shift');
  t.equal(d.take((x) => x === 3), 3);
  t.equal(d.take((x) => x === 99_999), 99_999, 'the tail');
  t.same([d.shift(), d.shift(), d.shift()], [1, 2, 4]);
  t.equal(d.size, 99_994);
  t.equal(d.take((x) => x === -1), undefined);
});
