import type { Db } from './db.js';
import type { Statement } from 'better-sqlite3';

/** Tables that hold one JSON document per row with the same columns. */
export type ResourceTable = 'endpoints' | 'templates' | 'network_volumes' | 'global_volumes' | 'registry_credentials';

export interface ResourceRow<T> {
  id: string;
  ownerId: string;
  isPublic: boolean;
  data: T;
  createdAt: number;
  updatedAt: number;
}

interface RawRow {
  id: string;
  owner_id: string;
  is_public?: number;
  data: string;
  created_at: number;
  updated_at: number;
}

/**
 * A repository over one document table. Statements are prepared once (undici's
 * SqliteCacheStore pattern). Every lookup is scoped by owner, so another team's id reads as
 * "not found" and never leaks.
 */
export class ResourceRepo<T> {
  readonly table: ResourceTable;
  readonly #insert: Statement;
  readonly #update: Statement;
  readonly #get: Statement;
  readonly #getVisible: Statement | undefined;
  readonly #list: Statement;
  readonly #listPublic: Statement | undefined;
  readonly #delete: Statement;
  readonly #getAny: Statement;
  readonly #listAll: Statement;
  readonly #hasPublic: boolean;

  constructor(db: Db, table: ResourceTable) {
    this.table = table;
    this.#hasPublic = table !== 'endpoints';
    const cols = this.#hasPublic ? 'id, owner_id, is_public, data, created_at, updated_at' : 'id, owner_id, data, created_at, updated_at';
    this.#insert = this.#hasPublic
      ? db.prepare(`INSERT INTO ${table} (id, owner_id, is_public, data, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)`)
      : db.prepare(`INSERT INTO ${table} (id, owner_id, data, created_at, updated_at) VALUES (?, ?, ?, ?, ?)`);
    this.#update = this.#hasPublic
      ? db.prepare(`UPDATE ${table} SET data = ?, is_public = ?, updated_at = ? WHERE id = ? AND owner_id = ?`)
      : db.prepare(`UPDATE ${table} SET data = ?, updated_at = ? WHERE id = ? AND owner_id = ?`);
    this.#get = db.prepare(`SELECT ${cols} FROM ${table} WHERE id = ? AND owner_id = ?`);
    this.#getVisible = this.#hasPublic ? db.prepare(`SELECT ${cols} FROM ${table} WHERE id = ? AND (owner_id = ? OR is_public = 1)`) : undefined;
    this.#list = db.prepare(`SELECT ${cols} FROM ${table} WHERE owner_id = ? ORDER BY created_at, id`);
    this.#listPublic = this.#hasPublic ? db.prepare(`SELECT ${cols} FROM ${table} WHERE is_public = 1 ORDER BY created_at, id`) : undefined;
    this.#delete = db.prepare(`DELETE FROM ${table} WHERE id = ? AND owner_id = ?`);
    this.#getAny = db.prepare(`SELECT ${cols} FROM ${table} WHERE id = ?`);
    this.#listAll = db.prepare(`SELECT ${cols} FROM ${table} ORDER BY created_at, id`);
  }

  #map(raw: RawRow | undefined): ResourceRow<T> | undefined {
    if (!raw) return undefined;
    return {
      id: raw.id,
      ownerId: raw.owner_id,
      isPublic: raw.is_public === 1,
      data: JSON.parse(raw.data) as T,
      createdAt: raw.created_at,
      updatedAt: raw.updated_at,
    };
  }

  insert(id: string, ownerId: string, data: T, now: number, isPublic = false): ResourceRow<T> {
    const json = JSON.stringify(data);
    if (this.#hasPublic) this.#insert.run(id, ownerId, isPublic ? 1 : 0, json, now, now);
    else this.#insert.run(id, ownerId, json, now, now);
    return { id, ownerId, isPublic, data, createdAt: now, updatedAt: now };
  }

  update(row: ResourceRow<T>, data: T, now: number, isPublic = row.isPublic): ResourceRow<T> {
    const json = JSON.stringify(data);
    if (this.#hasPublic) this.#update.run(json, isPublic ? 1 : 0, now, row.id, row.ownerId);
    else this.#update.run(json, now, row.id, row.ownerId);
    return { ...row, data, isPublic, updatedAt: now };
  }

  /** The owner's row, or undefined. */
  get(id: string, ownerId: string): ResourceRow<T> | undefined {
    return this.#map(this.#get.get(id, ownerId) as RawRow | undefined);
  }

  /** The owner's row or a public one. */
  getVisible(id: string, ownerId: string): ResourceRow<T> | undefined {
    const stmt = this.#getVisible ?? this.#get;
    return this.#map(stmt.get(id, ownerId) as RawRow | undefined);
  }

  /** Unscoped lookup for internal paths (workers, the scheduler); never for API callers. */
  getUnscoped(id: string): ResourceRow<T> | undefined {
    return this.#map(this.#getAny.get(id) as RawRow | undefined);
  }

  list(ownerId: string): ResourceRow<T>[] {
    return (this.#list.all(ownerId) as RawRow[]).map((r) => this.#map(r) as ResourceRow<T>);
  }

  /** Every row of every owner, for internal loops (the autoscaler); never for API callers. */
  listAll(): ResourceRow<T>[] {
    return (this.#listAll.all() as RawRow[]).map((r) => this.#map(r) as ResourceRow<T>);
  }

  listPublic(): ResourceRow<T>[] {
    if (!this.#listPublic) return [];
    return (this.#listPublic.all() as RawRow[]).map((r) => this.#map(r) as ResourceRow<T>);
  }

  delete(id: string, ownerId: string): boolean {
    return this.#delete.run(id, ownerId).changes > 0;
  }
}

/**
 * Network and global volumes deleted through the API whose engine volume the container runtime
 * has not removed yet (`deleted_volumes`): the only engine volumes a start removes. One whose
 * volume this database never knew (a restored backup older than it, a copy of the data
 * directory) is left in place.
 */
export class DeletedVolumes {
  readonly #add: Statement;
  readonly #has: Statement;
  readonly #remove: Statement;

  constructor(db: Db) {
    this.#add = db.prepare('INSERT OR REPLACE INTO deleted_volumes (id, deleted_at) VALUES (?, ?)');
    this.#has = db.prepare('SELECT 1 FROM deleted_volumes WHERE id = ?').pluck();
    this.#remove = db.prepare('DELETE FROM deleted_volumes WHERE id = ?');
  }

  add(id: string, now: number): void {
    this.#add.run(id, now);
  }

  has(id: string): boolean {
    return this.#has.get(id) !== undefined;
  }

  remove(id: string): void {
    this.#remove.run(id);
  }
}
