export { ContainerRuntime, type ContainerRuntimeOptions, type LaunchTiming, type ListenAddress, type VolumeRecords } from './container-runtime.js';
export { DockerClient, MAX_API_VERSION, MIN_API_VERSION, compareApiVersions, registryAuthHeader, splitImageRef, type DockerClientOptions } from './client.js';
export { DockerError, isDockerError, type DockerErrorCode } from './errors.js';
export { LABELS, SAFE_LIMITS, VOLUME_PATH, containerEnv, containerName, createBody, exposedPorts, gpuAttachFor, hostConfig, ownerLabels, ownerOf, volumeName } from './container-spec.js';
export type { GpuAttach } from './container-spec.js';
export { DEFAULT_KEPT_POOL, KeptPool, type FlashbootPolicy, type KeepMode, type KeptEntry, type KeptPoolOptions } from './kept-pool.js';
export { demultiplexer, type StreamName } from './multiplex.js';
export { findEngineSocket } from './socket.js';
export type * from './api-types.js';
