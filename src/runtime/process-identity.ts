/**
 * Which process is which, across pid reuse and reboots (Linux /proc): the process runtime's pid
 * file (process.ts) and the container runtime's owner labels (docker/container-runtime.ts).
 */
import { readFileSync, readlinkSync } from 'node:fs';
import { hostname } from 'node:os';

/**
 * When a process started, in clock ticks after boot (field 22 of /proc/<pid>/stat); undefined
 * when there is no such process. With the boot id, it tells a process from a later one that
 * got the same pid.
 */
export function startTicks(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Field 2, the command name, may hold spaces and parentheses: count from its closing one.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

export function bootId(): string {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return '';
  }
}

/** A process on a host: what the container runtime labels its containers with (`dev.flashd.owner-*`). */
export interface ProcessIdentity {
  /** `/etc/machine-id` (else the host name) and the pid namespace: where `pid` means this process. */
  host: string;
  pid: number;
  /** `<boot id>/<start ticks>`: changes when the pid is reused, in this boot or a later one. */
  start: string;
}

let self: ProcessIdentity | null | undefined;

/** This process's identity; null where /proc cannot tell (not Linux). */
export function thisProcess(): ProcessIdentity | null {
  if (self !== undefined) return self;
  const ticks = startTicks(process.pid);
  if (ticks === undefined || !/^\d+$/.test(ticks)) return (self = null);
  let machine = '';
  try {
    machine = readFileSync('/etc/machine-id', 'utf8').trim();
  } catch {
    // not readable: the host name instead
  }
  let pidNamespace = '';
  try {
    pidNamespace = readlinkSync('/proc/self/ns/pid');
  } catch {
    // an old kernel: the machine alone
  }
  return (self = { host: `${machine || hostname()}${pidNamespace ? `/${pidNamespace}` : ''}`, pid: process.pid, start: `${bootId()}/${ticks}` });
}

/**
 * Whether `other` is a live process of this host other than this one: same host, a pid that is
 * not this process's, held by a process with the recorded start (not one that got the pid since).
 * False for another host's (it cannot be checked from here) and where /proc cannot tell.
 */
export function isOtherLiveProcess(other: ProcessIdentity): boolean {
  const me = thisProcess();
  if (!me || other.host !== me.host || other.pid === me.pid) return false;
  const ticks = startTicks(other.pid);
  return ticks !== undefined && `${bootId()}/${ticks}` === other.start;
}
