import type { Clock } from '../core/clock.js';
import { AgentError } from '../core/errors.js';
import { sortedJson } from '../core/json-raw.js';
import { newEndpointId, newId } from '../core/ids.js';
import type { Logger } from '../core/logger.js';
import { assertSchema } from '../core/schemas.js';
import type { SecretBox } from '../core/secret-box.js';
import type { Db, ResourceRepo, ResourceRow } from '../store/index.js';
import { DeletedVolumes, ResourceRepo as Repo } from '../store/index.js';
import { parseArgs, CommandError, findLocalTestFlag, localTestFlagMessage } from './command.js';
import type { EndpointSpec, GlobalVolumeSpec, NetworkVolumeSpec, RegistryCredentialSpec, TemplateSpec } from './types.js';
import { assertTemplateBody, buildEndpoint, CONTAINER_ONLY_REASONS, LAUNCH_REASONS, namesLaunchField, updateEndpoint, type UpdateOutcome, type ValidationContext } from './validate.js';

export interface EndpointEvents {
  /**
   * After a create or update commits. `restartReasons`: what of the change running workers
   * cannot pick up (the PATCH reply's `restartReasons`; empty on create).
   */
  changed?(endpointId: string, spec: EndpointSpec, restartReasons: readonly string[]): void;
  /** Before the row is removed (runtime state can still be looked up). */
  deleting?(endpointId: string): void;
  /** After a network or global volume's row is removed (and recorded in `deletedVolumes`): its data can go too. */
  volumeDeleted?(volumeId: string): void;
}

export interface EndpointServiceOptions {
  db: Db;
  clock: Clock;
  log: Logger;
  secrets: SecretBox;
  dataCenterIds(): readonly string[];
  /**
   * Workers run as host processes (`--runtime process`): a change of container-only fields
   * (CONTAINER_ONLY_REASONS) is no restart reason there.
   */
  workersRunOnHost?: boolean;
}

/**
 * Endpoints and the resources they reference, always scoped to an owner account: another
 * account's id is indistinguishable from one that does not exist (404).
 */
export class EndpointService {
  readonly endpoints: ResourceRepo<EndpointSpec>;
  readonly templates: ResourceRepo<TemplateSpec>;
  readonly networkVolumes: ResourceRepo<NetworkVolumeSpec>;
  readonly globalVolumes: ResourceRepo<GlobalVolumeSpec>;
  readonly registries: ResourceRepo<RegistryCredentialSpec>;
  /** Volumes deleted whose engine volume is still to be removed (the container runtime's). */
  readonly deletedVolumes: DeletedVolumes;
  readonly #db: Db;
  readonly #clock: Clock;
  readonly #log: Logger;
  readonly #secrets: SecretBox;
  readonly #dataCenters: () => readonly string[];
  readonly #runOnHost: boolean;
  /**
   * How many workers of an endpoint a lower `workers.max` would stop or retire now
   * (Autoscaler.workersAboveMax): a lower max is a restart reason (`workers`) only when some.
   * Unset, every lower max is one.
   */
  workersAboveMax: ((endpointId: string, max: number) => number) | null = null;
  /**
   * The nvidia-smi names of this host's GPU models the catalog does not know (the ledger's, set
   * once it exists): an exclusion of pool OTHER that differs from one only in case is refused.
   */
  hostGpuModels: (() => readonly string[]) | null = null;
  readonly #listeners: EndpointEvents[] = [];
  /** byId() results for the job path; every write through this class keeps it exact. */
  readonly #byId = new Map<string, ResourceRow<EndpointSpec>>();

  constructor(options: EndpointServiceOptions) {
    this.#clock = options.clock;
    this.#log = options.log;
    this.#secrets = options.secrets;
    this.#dataCenters = options.dataCenterIds;
    this.#runOnHost = options.workersRunOnHost ?? false;
    this.endpoints = new Repo(options.db, 'endpoints');
    this.templates = new Repo(options.db, 'templates');
    this.networkVolumes = new Repo(options.db, 'network_volumes');
    this.globalVolumes = new Repo(options.db, 'global_volumes');
    this.registries = new Repo(options.db, 'registry_credentials');
    this.deletedVolumes = new DeletedVolumes(options.db);
    this.#db = options.db;
  }

  on(listener: EndpointEvents): void {
    this.#listeners.push(listener);
  }

  #context(ownerId: string): ValidationContext {
    return {
      knownDataCenters: this.#dataCenters(),
      hostGpuModels: this.hostGpuModels?.() ?? [],
      template: (id) => this.templates.getVisible(id, ownerId)?.data,
      networkVolume: (id) => this.networkVolumes.get(id, ownerId)?.data,
      globalVolumeExists: (id) => this.globalVolumes.get(id, ownerId) !== undefined,
      registryExists: (id) => this.registries.get(id, ownerId) !== undefined,
    };
  }

  // Endpoints ---------------------------------------------------------------------------------

  /**
   * `extra` carries internal fields a body cannot express: the older REST priority, and whether
   * an admin key made it (`commandByAdmin`, which the process runtime needs to start it).
   */
  create(ownerId: string, body: unknown, extra: Pick<EndpointSpec, 'gpuTypePriority' | 'commandByAdmin'> = {}): ResourceRow<EndpointSpec> {
    const spec = { ...buildEndpoint(body, this.#context(ownerId)), ...extra };
    const row = this.endpoints.insert(newEndpointId(), ownerId, spec, this.#clock.now());
    this.#log.info('endpoint created', { endpointId: row.id, type: spec.type, hardware: spec.gpu ? 'gpu' : 'cpu' });
    for (const l of this.#listeners) l.changed?.(row.id, spec, []);
    return row;
  }

  get(ownerId: string, id: string): ResourceRow<EndpointSpec> {
    const row = this.endpoints.get(id, ownerId);
    if (!row) throw new AgentError('NOT_FOUND', `Endpoint ${id} not found.`);
    return row;
  }

  list(ownerId: string): ResourceRow<EndpointSpec>[] {
    return this.endpoints.list(ownerId);
  }

  /**
   * `authorize` sees the validated change's restart reasons (the fields that differ, as the
   * reply names them) before it is stored and may refuse it by throwing (the process runtime's
   * admin rule for what an endpoint runs). `byAdmin` says whether the caller holds the admin
   * scope: a change to what the endpoint runs by a key without it clears `commandByAdmin`, and a
   * body from an admin that names any of those fields sets it, the same values sent again too.
   */
  update(
    ownerId: string, id: string, body: unknown, byAdmin: boolean, authorize?: (restartReasons: readonly string[]) => void,
  ): { row: ResourceRow<EndpointSpec> } & Omit<UpdateOutcome, 'spec'> {
    const current = this.get(ownerId, id);
    const outcome = updateEndpoint(current.data, body, this.#context(ownerId));
    const spec = outcome.spec;
    // What a running worker of this runtime cannot pick up: a host process has no disk limit,
    // ports, pull credential, volume or FlashBoot to change. A lower max reaches only the workers
    // above it (they stop), so with none there it is no reason.
    const restartReasons = outcome.restartReasons.filter((r) => !(this.#runOnHost && CONTAINER_ONLY_REASONS.has(r))
      && !(r === 'workers' && this.workersAboveMax !== null && this.workersAboveMax(id, spec.workers.max) === 0));
    authorize?.(restartReasons);
    if (byAdmin ? namesLaunchField(body) : restartReasons.some((r) => LAUNCH_REASONS.has(r))) spec.commandByAdmin = byAdmin;
    // Nothing changed (`{}`, or the same fields again): no write, so updatedAt stays, no log
    // line and no listener. An absent gpuTypePriority and an empty one mean the same.
    const comparable = (s: EndpointSpec) => sortedJson({ ...s, gpuTypePriority: s.gpuTypePriority ?? [] });
    if (comparable(spec) === comparable(current.data)) return { row: current, restartReasons: [] };
    const row = this.endpoints.update(current, spec, this.#clock.now());
    this.#byId.delete(id);
    this.#log.info('endpoint updated', { endpointId: id, restartReasons: restartReasons.join(',') || undefined });
    for (const l of this.#listeners) l.changed?.(id, spec, restartReasons);
    return { row, restartReasons };
  }

  /** Removes the configuration, logs, jobs and worker keys of an endpoint for good. */
  delete(ownerId: string, id: string): void {
    this.get(ownerId, id);
    for (const l of this.#listeners) l.deleting?.(id);
    this.endpoints.delete(id, ownerId);
    this.#byId.delete(id);
    this.#log.info('endpoint deleted', { endpointId: id });
  }

  /** Internal lookup without owner scoping, for the job path and workers. */
  byId(id: string): ResourceRow<EndpointSpec> | undefined {
    let row = this.#byId.get(id);
    if (!row) {
      row = this.endpoints.getUnscoped(id);
      if (row) {
        if (this.#byId.size > 10_000) this.#byId.clear();
        this.#byId.set(id, row);
      }
    }
    return row;
  }

  // Templates ---------------------------------------------------------------------------------

  createTemplate(ownerId: string, raw: unknown): ResourceRow<TemplateSpec> {
    const body = assertTemplateBody<Partial<TemplateSpec> & { name: string; image: string; isPublic?: boolean }>('TemplateCreate', raw);
    checkTemplateArgs(body.args, body.isServerless ?? false);
    if (body.registry) this.#requireRegistry(ownerId, body.registry);
    const spec: TemplateSpec = {
      name: body.name,
      image: body.image,
      args: body.args ?? '',
      disk: body.disk ?? null,
      ports: body.ports ?? [],
      env: body.env ?? {},
      registry: body.registry ?? null,
      isServerless: body.isServerless ?? false,
      allowedCudaVersions: body.allowedCudaVersions ?? [],
      startSsh: body.startSsh ?? false,
      startJupyter: body.startJupyter ?? false,
      readme: body.readme ?? '',
    };
    return this.templates.insert(newId('tpl'), ownerId, spec, this.#clock.now(), body.isPublic ?? false);
  }

  updateTemplate(ownerId: string, id: string, raw: unknown): ResourceRow<TemplateSpec> {
    const current = this.getOwned(this.templates, ownerId, id, 'Template');
    const body = assertTemplateBody<Partial<TemplateSpec> & { isPublic?: boolean }>('TemplateUpdate', raw);
    checkTemplateArgs(body.args, body.isServerless ?? current.data.isServerless);
    if (body.registry) this.#requireRegistry(ownerId, body.registry);
    const { isPublic, ...fields } = body;
    return this.templates.update(current, { ...current.data, ...fields }, this.#clock.now(), isPublic ?? current.isPublic);
  }

  // Volumes and registry credentials ------------------------------------------------------

  createNetworkVolume(ownerId: string, raw: unknown): ResourceRow<NetworkVolumeSpec> {
    const body = assertSchema<{ name: string; size: number; dataCenterId?: string }>('NetworkVolumeCreate', raw);
    const dataCenterId = body.dataCenterId ?? (this.#dataCenters()[0] as string);
    if (!this.#dataCenters().includes(dataCenterId)) {
      throw new AgentError('VALIDATION_FAILED', `Unknown data center "${dataCenterId}".`, { errors: [`/dataCenterId: unknown data center "${dataCenterId}"`] });
    }
    return this.networkVolumes.insert(newId('nv'), ownerId, { name: body.name, size: body.size, dataCenterId }, this.#clock.now());
  }

  updateNetworkVolume(ownerId: string, id: string, raw: unknown): ResourceRow<NetworkVolumeSpec> {
    const current = this.getOwned(this.networkVolumes, ownerId, id, 'Network volume');
    const body = assertSchema<{ name?: string; size?: number }>('NetworkVolumeUpdate', raw);
    if (body.size !== undefined && body.size < current.data.size) {
      throw new AgentError('VALIDATION_FAILED', 'Volumes can grow but not shrink.', { errors: [`/size: must be at least the current ${current.data.size} GB`] });
    }
    return this.networkVolumes.update(current, { ...current.data, ...body }, this.#clock.now());
  }

  createGlobalVolume(ownerId: string, raw: unknown): ResourceRow<GlobalVolumeSpec> {
    const body = assertSchema<GlobalVolumeSpec>('GlobalVolumeCreate', raw);
    return this.globalVolumes.insert(newId('gv'), ownerId, { name: body.name, size: body.size }, this.#clock.now());
  }

  updateGlobalVolume(ownerId: string, id: string, raw: unknown): ResourceRow<GlobalVolumeSpec> {
    const current = this.getOwned(this.globalVolumes, ownerId, id, 'Global volume');
    const body = assertSchema<Partial<GlobalVolumeSpec>>('GlobalVolumeUpdate', raw);
    if (body.size !== undefined && body.size < current.data.size) {
      throw new AgentError('VALIDATION_FAILED', 'Volumes can grow but not shrink.', { errors: [`/size: must be at least the current ${current.data.size} GB`] });
    }
    return this.globalVolumes.update(current, { ...current.data, ...body }, this.#clock.now());
  }

  createRegistry(ownerId: string, raw: unknown): ResourceRow<RegistryCredentialSpec> {
    const body = assertSchema<{ name: string; username: string; password: string }>('RegistryCredentialCreate', raw);
    const spec = { name: body.name, username: body.username, sealedPassword: this.#secrets.seal(body.password) };
    return this.registries.insert(newId('reg'), ownerId, spec, this.#clock.now());
  }

  updateRegistry(ownerId: string, id: string, raw: unknown): ResourceRow<RegistryCredentialSpec> {
    const current = this.getOwned(this.registries, ownerId, id, 'Registry credential');
    const body = assertSchema<{ name?: string; username?: string; password?: string }>('RegistryCredentialUpdate', raw);
    const spec: RegistryCredentialSpec = {
      name: body.name ?? current.data.name,
      username: body.username ?? current.data.username,
      sealedPassword: body.password === undefined ? current.data.sealedPassword : this.#secrets.seal(body.password),
    };
    return this.registries.update(current, spec, this.#clock.now());
  }

  /** The plain credential, for the container runtime's X-Registry-Auth only. */
  registryAuth(ownerId: string, id: string): { username: string; password: string } | undefined {
    const row = this.registries.get(id, ownerId);
    return row && { username: row.data.username, password: this.#secrets.open(row.data.sealedPassword) };
  }

  /** `what` names the kind in a detail (`template`, `Network volume`): the detail starts with a capital either way. */
  getOwned<T>(repo: ResourceRepo<T>, ownerId: string, id: string, what: string): ResourceRow<T> {
    const row = repo.get(id, ownerId);
    if (!row) throw new AgentError('NOT_FOUND', `${capitalised(what)} ${id} not found.`);
    return row;
  }

  /** Deletes a template, volume or credential; refuses while an endpoint still uses it. */
  deleteResource<T>(repo: ResourceRepo<T>, ownerId: string, id: string, what: string): void {
    this.getOwned(repo, ownerId, id, what);
    const users = this.endpoints.list(ownerId).filter((e) => {
      const s = e.data;
      switch (repo.table) {
        case 'network_volumes': return s.mounts.network.includes(id);
        case 'global_volumes': return s.mounts.global.includes(id);
        case 'registry_credentials': return s.registry === id;
        default: return false;
      }
    });
    if (users.length) {
      throw new AgentError('CONFLICT', `${capitalised(what)} ${id} is used by endpoint${users.length > 1 ? 's' : ''} ${users.map((u) => u.id).join(', ')}; detach it first.`);
    }
    if (repo.table !== 'network_volumes' && repo.table !== 'global_volumes') {
      repo.delete(id, ownerId);
      return;
    }
    // Recorded with the delete: a removal of its engine volume still pending at a crash is done
    // at the next start, and only such volumes are (not those a restored backup never knew).
    this.#db.transaction(() => {
      repo.delete(id, ownerId);
      this.deletedVolumes.add(id, this.#clock.now());
    })();
    for (const l of this.#listeners) l.volumeDeleted?.(id);
  }

  #requireRegistry(ownerId: string, id: string): void {
    if (!this.registries.get(id, ownerId)) throw new AgentError('NOT_FOUND', `Registry credential ${id} not found.`);
  }
}

/** A problem detail starts with a capital; the API's nouns are lowercase (`network volume`). */
function capitalised(what: string): string {
  return what.charAt(0).toUpperCase() + what.slice(1);
}

/**
 * A template's `args` must parse; a serverless one's must not hold `--test_input`, with which
 * runpod-python runs one input and exits on any endpoint. (`--rp_serve_api` is refused only when
 * a QUEUE endpoint is created from the template: see checkLocalTestFlags.)
 */
function checkTemplateArgs(args: string | undefined, isServerless: boolean): void {
  if (args === undefined) return;
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs(args);
  } catch (err) {
    if (err instanceof CommandError) throw new AgentError('VALIDATION_FAILED', err.message, { errors: [`/args: ${err.message}`] });
    throw err;
  }
  const hit = isServerless ? findLocalTestFlag([...parsed.entrypoint ?? [], ...parsed.cmd ?? []]) : undefined;
  if (hit?.flag === '--test_input') {
    const message = localTestFlagMessage(hit.flag);
    throw new AgentError('VALIDATION_FAILED', message, { errors: [`/args: ${message}`] });
  }
}
