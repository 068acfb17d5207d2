export { Autoscaler, type AutoscalerOptions } from './autoscaler.js';
export { afterCrash, decideScale, type CrashState, type ExitingSnapshot, type ScaleDecision, type ScaleInput, type WorkerSnapshot } from './decide.js';
export { LogHub } from './log-hub.js';
export { CPU_ONLY_PLACEMENT, unreservedCpu, type Placement, type Reservation } from './placement.js';
