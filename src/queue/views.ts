/**
 * Client-facing job bodies, built as text: inputs and outputs stay raw JSON end to end, so a
 * 10 MB output is never parsed and re-serialised on the way out (perf-anchors §3, §6).
 */
import type { Job } from './types.js';

export interface JobSnapshot {
  id: string;
  status: Job['status'];
  workerId: string | null;
  output: string | null;
  error: string | null;
  progress: string | null;
  retries: number;
  createdAt: number;
  queuedAt: number;
  lostMs: number;
  startedAt: number | null;
  completedAt: number | null;
}

/**
 * `{id, status, delayTime, executionTime, workerId, output?|error?, retries?}` as in RunPod's
 * /status; `workerId` is `""` while no worker has run the job (queued, or ended before one took it). delayTime is the time the current run (a /retry starts a new one) waited in the queue
 * for a worker: from when it was queued, less the time lost attempts held it, so a job requeued
 * after its worker lost it counts both waits; executionTime is the time of its last attempt.
 */
export function statusBody(j: JobSnapshot, now: number): string {
  return statusFields(j, now) + '}';
}

/** statusBody without its closing brace. */
function statusFields(j: JobSnapshot, now: number): string {
  const delay = Math.max(0, (j.startedAt ?? (j.status === 'IN_QUEUE' ? now : j.completedAt ?? now)) - j.queuedAt - j.lostMs);
  const exec = j.startedAt === null ? 0 : Math.max(0, (j.completedAt ?? now) - j.startedAt);
  let s = `{"id":${JSON.stringify(j.id)},"status":"${j.status}","delayTime":${delay},"executionTime":${exec}`;
  // Always present, "" before any worker ran the job: runpod/flash reads every /runsync reply
  // and final /status into a model whose workerId is a required string.
  s += j.workerId === null ? ',"workerId":""' : `,"workerId":${JSON.stringify(j.workerId)}`;
  if (j.status === 'IN_PROGRESS') {
    if (j.progress !== null) s += `,"output":${j.progress}`;
  } else if (j.output !== null) {
    s += `,"output":${j.output}`;
  }
  if (j.error !== null) s += `,"error":${JSON.stringify(j.error)}`;
  if (j.retries > 0) s += `,"retries":${j.retries}`;
  return s;
}

/**
 * What a final job's webhook POSTs: its status body, then `input` (raw, as submitted; omitted
 * only when its row is gone) and the `webhook` URL, as RunPod's hosted service sends them
 * (runpod-python#409: receivers read `input` to tie a result to their request). Never `extra`
 * (s3Config). The same text live and when a restart sends it again (JobQueue.webhooksOwed).
 */
export function webhookBody(j: JobSnapshot, input: string | undefined, url: string, now: number): string {
  let s = statusFields(j, now);
  if (input !== undefined) s += `,"input":${input}`;
  return `${s},"webhook":${JSON.stringify(url)}}`;
}

/** The job object a worker receives from job-take: always `id` and `input`, plus extra keys. */
export function workerJobBody(j: Pick<Job, 'id' | 'input' | 'extra'>): string {
  let s = `{"id":${JSON.stringify(j.id)},"input":${j.input}`;
  if (j.extra !== null && j.extra.length > 2) s += `,${j.extra.slice(1, -1)}`;
  return s + '}';
}
