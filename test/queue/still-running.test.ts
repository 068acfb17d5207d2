/**
 * WorkerRegistry.stillRunning: the workers of an endpoint whose stop for a job is pending, in
 * the registry or retired (not yet forgotten), which a requeue or /retry fences the new attempt
 * from. It used to scan every worker of the endpoint per call, so a mass requeue (a reap after a
 * restart with thousands of jobs running) cost requeues × workers; it now looks only at the
 * records with a stop for the job, and must answer exactly as the scan did.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { WorkerRegistry, type WorkerInfo } from '../../src/queue/workers.js';

const LEASE = 3000;
const stop = (since = 0) => ({ keepUntil: 0, offered: -1, since, why: 'taken back and queued again' });
const ids = (ws: WorkerInfo[]) => ws.map((w) => w.id).sort();

t.test('stillRunning finds the workers with a stop for the job, in the registry or retired, and no one else', async (t) => {
  const clock = new ManualClock();
  const reg = new WorkerRegistry(clock, 2 * LEASE);
  const a = reg.seen('ep', 'a');
  const b = reg.seen('ep', 'b');
  const c = reg.seen('ep', 'c');
  const other = reg.seen('ep2', 'a');
  reg.addStop(a, 'j1', stop());
  reg.addStop(b, 'j1', stop());
  reg.addStop(c, 'j2', stop());
  reg.addStop(other, 'j1', stop());
  t.same(ids(reg.stillRunning('ep', 'j1')), ['a', 'b'], 'the two workers of this endpoint with a stop for j1');
  t.same(ids(reg.stillRunning('ep2', 'j1')), ['a'], "another endpoint's worker of the same id is its own");
  t.same(reg.stillRunning('ep', 'j3'), [], 'no stop for the job: no one');

  t.equal(reg.dropStop(b, 'j1'), true, 'a stop that was there ends');
  t.equal(reg.dropStop(b, 'j1'), false, 'and only once');
  t.same(ids(reg.stillRunning('ep', 'j1')), ['a'], 'b no longer runs it');

  reg.retire('ep', 'a');
  t.equal(reg.get('ep', 'a'), undefined, 'a retired: out of the registry');
  t.same(ids(reg.stillRunning('ep', 'j1')), ['a'], 'its retired record, whose last calls still get the stop, still counts');
  t.equal(reg.seen('ep', 'a'), a, 'a ping of it gets the retired record');
  t.same(ids(reg.stillRunning('ep', 'j1')), ['a'], 'still counted once');
  clock.advance(2 * LEASE);
  t.same(reg.stillRunning('ep', 'j1'), [], 'forgotten with its retired record');
  const a2 = reg.seen('ep', 'a');
  t.not(a2, a, 'a call after that gets a new record');
  t.same(reg.stillRunning('ep', 'j1'), [], 'without the old stop');
  reg.addStop(a2, 'j1', stop(clock.monotonic()));
  t.same(ids(reg.stillRunning('ep', 'j1')), ['a'], 'a stop on the new record counts');

  reg.remove('ep', 'c');
  t.same(reg.stillRunning('ep', 'j2'), [], 'a removed worker (its process gone) runs nothing');
  reg.retire('ep', 'a');
  t.equal(reg.seen('ep', 'a', true), a2, 'a retired worker asking for work gets its record back');
  t.same(ids(reg.stillRunning('ep', 'j1')), ['a'], 'with its stop');
  reg.dropEndpoint('ep2');
  t.same(reg.stillRunning('ep2', 'j1'), [], 'a deleted endpoint has no workers left');
});

