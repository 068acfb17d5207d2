export { Autoscaler, type AutoscalerOptions } from './autoscaler.js';
export { decideScale, type ScaleDecision, type ScaleInput, type WorkerSnapshot } from './decide.js';
export { LogHub } from './log-hub.js';
export { CPU_ONLY_PLACEMENT, type Placement, type Reservation } from './placement.js';
