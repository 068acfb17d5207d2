export type { LaunchSpec, WorkerEvents, WorkerRuntime } from './types.js';
export { ProcessRuntime } from './process.js';
export { lineSplitter } from './line-splitter.js';
