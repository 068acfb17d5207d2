export { openDb, lockDataDir, migrate, walPathOf, closeWithoutCheckpoint, type Db, type DataDirLock, type OpenDbOptions } from './db.js';
export { DeletedVolumes, ResourceRepo, type ResourceRow, type ResourceTable } from './resources.js';
export { IdentityRepo, type ApiKeyRow, type UserRow, type TeamRow, type TeamMemberRow } from './identity.js';
export { WriteBatch } from './write-batch.js';
export { SpaceReclaimer } from './vacuum.js';
export { JobsRepo, encodeFences, decodeFences, type ActiveJobRow, type JobRow, type JobStatus } from './jobs.js';
export { LogsRepo, type LogLine } from './logs.js';
