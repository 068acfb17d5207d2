/**
 * The container runtime's owner labels tell a live flashd from a previous run's by pid, start
 * time and host (runtime/process-identity.ts): checked against real processes of this host.
 */
import { spawn } from 'node:child_process';
import t from 'tap';
import { isOtherLiveProcess, startTicks, thisProcess } from '../../src/runtime/process-identity.js';

t.test('a live process of this host other than this one, told by pid, start time and host', { skip: process.platform === 'linux' ? false : 'needs /proc' }, async (t) => {
  const me = thisProcess();
  if (!me) throw new Error('no identity on Linux');
  t.match(me.start, /^[0-9a-f-]*\/\d+$/, 'boot id and start ticks');
  t.equal(isOtherLiveProcess(me), false, 'not this process');
  const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], { stdio: 'ignore' });
  t.teardown(() => void child.kill('SIGKILL'));
  const pid = child.pid as number;
  const other = { host: me.host, pid, start: `${me.start.split('/')[0]}/${startTicks(pid)}` };
  t.equal(isOtherLiveProcess(other), true, 'another live process with its start time');
  t.equal(isOtherLiveProcess({ ...other, start: `${me.start.split('/')[0]}/1` }), false, 'its pid with another start time: reused, the owner is gone');
  t.equal(isOtherLiveProcess({ ...other, host: 'another-machine' }), false, 'on another host: cannot be checked');
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  t.equal(isOtherLiveProcess(other), false, 'once it is dead');
});
