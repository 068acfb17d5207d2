export { JobQueue, DEFAULT_QUEUE_SETTINGS, jobNotFound, type QueueSettings, type SubmitInput, type QueueListener, type DoneOutcome, type DoneBody, type UnhealthyReport } from './job-queue.js';
export { PAUSED_MS, WorkerRegistry, type WorkerInfo, type WorkerState } from './workers.js';
export { statusBody, workerJobBody, type JobSnapshot } from './views.js';
export { TERMINAL, type Job, type JobStatus, type WorkerCounts } from './types.js';
export { WebhookSender, checkWebhookUrl, isPrivateAddress } from './webhook.js';
export { SDK_DEFAULT_ENV, workerEnv, type WorkerEnvInput } from './worker-env.js';
