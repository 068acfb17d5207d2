/** Stored shapes of endpoints and the resources they reference (the JSON in each row's `data`). */
export type EndpointType = 'QUEUE' | 'LOAD_BALANCER';
export type Flashboot = 'OFF' | 'FLASHBOOT' | 'PRIORITY_FLASHBOOT';
export type Scaling = { type: 'QUEUE_DELAY'; queueDelay: number } | { type: 'REQUEST_COUNT'; requestCount: number };

export interface GpuSpec {
  pools: string[];
  excludedTypes: string[];
  count: number;
  allowedCudaVersions: string[];
  minCudaVersion: string | null;
}

export interface CpuSpec {
  id: string;
  vcpuCount: number;
}

export interface WorkersSpec {
  min: number;
  max: number;
  /** Kept even where it does not apply (QUEUE + REQUEST_COUNT), and hidden from responses there. */
  idleTimeout: number;
}

export interface EndpointSpec {
  name: string;
  type: EndpointType;
  image: string;
  args: string;
  entrypoint: string[];
  cmd: string[];
  disk: number | null;
  ports: string[];
  env: Record<string, string>;
  registry: string | null;
  gpu: GpuSpec | null;
  cpu: CpuSpec[] | null;
  workers: WorkersSpec;
  scaling: Scaling;
  dataCenterIds: string[];
  mounts: { network: string[]; global: string[] };
  timeout: number;
  flashboot: Flashboot;
  templateId: string | null;
  /** GPU types in the order placement should try them (older REST `gpuTypeIds`); empty: any order. */
  gpuTypePriority?: string[];
  /**
   * Whether a key with the admin scope set what the endpoint runs (its image, command and env):
   * at its create, or by a PATCH naming one of them. False once a key without admin sets them
   * (possible under a container runtime), and the process runtime then starts no worker for it,
   * since there the command runs on the host as flashd's user. Absent in rows written before
   * flashd recorded it, which are taken as set by an admin. Never shown in responses.
   */
  commandByAdmin?: boolean;
}

export interface TemplateSpec {
  name: string;
  image: string;
  args: string;
  disk: number | null;
  ports: string[];
  env: Record<string, string>;
  registry: string | null;
  isServerless: boolean;
  allowedCudaVersions: string[];
  startSsh: boolean;
  startJupyter: boolean;
  readme: string;
}

export interface NetworkVolumeSpec {
  name: string;
  size: number;
  dataCenterId: string;
}

export interface GlobalVolumeSpec {
  name: string;
  size: number;
}

export interface RegistryCredentialSpec {
  name: string;
  username: string;
  /** AES-256-GCM sealed password (core/secret-box.ts); never leaves the server in a response. */
  sealedPassword: string;
}

export const DEFAULT_WORKERS: Readonly<WorkersSpec> = { min: 0, max: 3, idleTimeout: 10 };
export const DEFAULT_TIMEOUT_MS = 300_000;
export const DEFAULT_HEALTH_CHECK_PATH = '/ping';

/** `idleTimeout` does not apply to queue endpoints that scale on REQUEST_COUNT. */
export function idleTimeoutApplies(type: EndpointType, scaling: Scaling): boolean {
  return !(type === 'QUEUE' && scaling.type === 'REQUEST_COUNT');
}

/**
 * The image an endpoint made for `--runtime process` names (README "3. Workers that flashd
 * starts": image is required, that runtime ignores it): `none`, in any letter case. A container
 * runtime starts no worker for it (Docker would pull `docker.io/library/none`, fail, and crash-loop).
 */
export function hasNoImage(image: string): boolean {
  return image.trim().toLowerCase() === 'none';
}

/**
 * Why the container runtime `runtime` (its name, e.g. `docker`) starts no worker for an endpoint
 * with no image (`hasNoImage`): the endpoint log's `no worker can start: …` and the endpoint
 * view's `startBlocked`.
 */
/**
 * Why the process runtime starts no worker for an endpoint that names no command (no args,
 * entrypoint or cmd, as one made for `worker-env` workers with image `none`): a host process has
 * no image to take a command from, so each start failed at once, in a crash loop. The endpoint
 * log's `no worker can start: …` and the endpoint view's `startBlocked`.
 */
export const NO_COMMAND_REASON = 'the endpoint has no command for the process runtime (no args, entrypoint or cmd: a host process takes none from an image); '
  + 'set args (or entrypoint/cmd) with a PATCH, or run flashd with a container runtime, which runs the image\'s own command';

/** An endpoint whose command is empty (`NO_COMMAND_REASON`). */
export function hasNoCommand(spec: { entrypoint: readonly string[]; cmd: readonly string[] }): boolean {
  return spec.entrypoint.length + spec.cmd.length === 0;
}

export function noImageReason(runtime: string): string {
  return `the endpoint has no image for the ${runtime} runtime (image "none", as for --runtime process); `
    + 'set one with a PATCH of image, or start flashd with --runtime process';
}
