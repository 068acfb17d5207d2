export type { ExitInfo, Flashboot, LaunchResult, LaunchSpec, WorkerEvents, WorkerRuntime } from './types.js';
export { ProcessRuntime, reapOrphanProcessWorkers } from './process.js';
export { lineSplitter } from './line-splitter.js';
export * from './docker/index.js';
