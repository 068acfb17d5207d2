export * from './gpu-types.js';
export * from './cpu-flavors.js';
