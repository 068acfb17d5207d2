/**
 * flashd's shutdown steps (createAgent's closers): every step runs even when one fails, so a
 * failed step cannot leave the listener, the database or the data-dir lock open.
 */
import t from 'tap';
import { runClosers } from '../../src/app.js';
import { createLogger } from '../../src/core/logger.js';

t.test('a failing step does not skip the ones after it; its error is thrown at the end', async (t) => {
  const ran: string[] = [];
  const lines: string[] = [];
  const log = createLogger({ format: 'json', sink: { write: (l: string) => void lines.push(l) } });
  const closers = [
    () => void ran.push('lock'),
    async () => {
      ran.push('db');
      throw new Error('db close failed');
    },
    () => void ran.push('batch'),
    () => {
      ran.push('listener');
      throw new Error('listener close failed');
    },
  ];
  await t.rejects(runClosers(closers, log), { message: 'listener close failed (and 1 more: db close failed)' });
  t.same(ran, ['listener', 'batch', 'db', 'lock'], 'last registered first, and every one ran');
  t.equal(lines.length, 2, 'each failure is logged');
  t.match(lines[0], /a step of the shutdown failed.*listener close failed/);
});

t.test('no failure: resolves, logs nothing', async (t) => {
  const ran: number[] = [];
  const lines: string[] = [];
  const log = createLogger({ sink: { write: (l: string) => void lines.push(l) } });
  await runClosers([() => void ran.push(1), async () => void ran.push(2)], log);
  t.same(ran, [2, 1]);
  t.same(lines, []);
});
