/**
 * The parts of the Docker Engine API (v1.41 to v1.47) that flashd uses, as the engine sends
 * and takes them (PascalCase). Podman's compatible service speaks the same shapes; where it
 * differs, the field's comment says so. https://docs.docker.com/reference/api/engine/
 */

export interface EngineVersion {
  Version: string;
  ApiVersion: string;
  MinAPIVersion?: string;
  Os?: string;
  Arch?: string;
  KernelVersion?: string;
  /** Podman lists "Podman Engine" here; Docker lists "Engine". */
  Components?: { Name: string; Version: string }[];
}

/** Credentials sent only to the engine, as the `X-Registry-Auth` header of a pull. */
export interface RegistryAuth {
  username: string;
  password: string;
  serveraddress: string;
}

export interface ImageInspect {
  Id: string;
  RepoTags?: string[] | null;
  Size?: number;
  Config?: { Entrypoint?: string[] | null; Cmd?: string[] | null; Env?: string[] | null; User?: string } | null;
}

/** `HostConfig.Mounts[]`: flashd only ever creates `volume` mounts of volumes it made. */
export interface VolumeMount {
  Type: 'volume';
  Source: string;
  Target: string;
  ReadOnly?: boolean;
}

export interface DeviceRequest {
  Driver: string;
  Count?: number;
  DeviceIDs?: string[];
  Capabilities?: string[][];
  Options?: Record<string, string>;
}

export interface HostConfig {
  Privileged?: boolean;
  CapAdd?: string[];
  CapDrop?: string[];
  SecurityOpt?: string[];
  PidsLimit?: number;
  NetworkMode?: string;
  IpcMode?: string;
  PidMode?: string;
  ReadonlyRootfs?: boolean;
  PublishAllPorts?: boolean;
  RestartPolicy?: { Name: 'no' | 'always' | 'unless-stopped' | 'on-failure'; MaximumRetryCount?: number };
  LogConfig?: { Type: string; Config?: Record<string, string> | null };
  Mounts?: VolumeMount[];
  /** Never set by flashd. Podman's inspect lists named volumes here too (`name:/path:opts`). */
  Binds?: string[] | null;
  Devices?: unknown[] | null;
  DeviceRequests?: DeviceRequest[] | null;
  NanoCpus?: number;
  Memory?: number;
  MemorySwap?: number;
  ShmSize?: number;
  StorageOpt?: Record<string, string> | null;
  Ulimits?: { Name: string; Soft: number; Hard: number }[] | null;
  Init?: boolean | null;
}

export interface ContainerCreateBody {
  Image: string;
  /** The container's host name (the engine's default: the first 12 characters of its id). */
  Hostname?: string;
  Entrypoint?: string[];
  Cmd?: string[];
  Env: string[];
  ExposedPorts?: Record<string, Record<string, never>>;
  Labels: Record<string, string>;
  Tty: false;
  OpenStdin: false;
  AttachStdin: false;
  AttachStdout: true;
  AttachStderr: true;
  StopSignal?: string;
  HostConfig: HostConfig;
}

export interface ContainerState {
  Status: string;
  Running: boolean;
  ExitCode: number;
  OOMKilled: boolean;
  Pid?: number;
  StartedAt?: string;
  FinishedAt?: string;
  Error?: string;
}

export interface ContainerInspect {
  Id: string;
  Name: string;
  Created?: string;
  Config: {
    Image: string;
    Env: string[] | null;
    Cmd: string[] | null;
    Entrypoint: string[] | string | null;
    Labels: Record<string, string> | null;
    Hostname?: string;
    ExposedPorts?: Record<string, unknown> | null;
    User?: string;
  };
  State: ContainerState;
  HostConfig: HostConfig;
  Mounts?: { Type: string; Name?: string; Source?: string; Destination: string; RW?: boolean }[] | null;
}

export interface ContainerSummary {
  Id: string;
  Names?: string[];
  Image?: string;
  Labels?: Record<string, string> | null;
  State?: string;
  Status?: string;
}

export interface WaitResult {
  StatusCode: number;
  Error?: { Message?: string } | null;
}

export interface VolumeInspect {
  Name: string;
  Driver?: string;
  Mountpoint?: string;
  Labels?: Record<string, string> | null;
}

export interface NetworkInspect {
  Name: string;
  Id?: string;
  Driver?: string;
  IPAM?: { Config?: { Subnet?: string; Gateway?: string }[] | null } | null;
}

/** One line of the JSON progress stream of `POST /images/create`. */
export interface PullProgress {
  status?: string;
  id?: string;
  /** Bytes of the layer `id` so far, on `Downloading` (and Docker's `Extracting`) lines. */
  progressDetail?: { current?: number; total?: number };
  progress?: string;
  error?: string;
  errorDetail?: { message?: string };
}
