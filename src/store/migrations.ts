/**
 * Versioned schema migrations, applied in order inside one transaction each and tracked with
 * `PRAGMA user_version`. Never edit a shipped migration: add the next one.
 * Columns are snake_case; only `store/` maps them to camelCase records.
 */
export const MIGRATIONS: readonly string[] = [
  // 1: identities, keys, endpoint configuration and the resources endpoints reference.
  `
  CREATE TABLE users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    is_admin INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
  );
  CREATE TABLE teams (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    owner_user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at INTEGER NOT NULL
  );
  CREATE TABLE team_members (
    team_id TEXT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('owner', 'member')),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (team_id, user_id)
  );
  CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('user', 'worker')),
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    team_id TEXT REFERENCES teams(id) ON DELETE CASCADE,
    endpoint_id TEXT,
    scopes TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    exempt INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER
  );
  CREATE INDEX api_keys_user ON api_keys(user_id);
  CREATE TABLE endpoints (
    id TEXT PRIMARY KEY,
    owner_id TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
  );
  CREATE INDEX endpoints_owner ON endpoints(owner_id, created_at);
  CREATE TABLE templates (
    id TEXT PRIMARY KEY,
    owner_id TEXT NOT NULL,
    is_public INTEGER NOT NULL DEFAULT 0,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
  );
  CREATE INDEX templates_owner ON templates(owner_id, created_at);
  CREATE TABLE network_volumes (
    id TEXT PRIMARY KEY,
    owner_id TEXT NOT NULL,
    is_public INTEGER NOT NULL DEFAULT 0,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
  );
  CREATE TABLE global_volumes (
    id TEXT PRIMARY KEY,
    owner_id TEXT NOT NULL,
    is_public INTEGER NOT NULL DEFAULT 0,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
  );
  CREATE TABLE registry_credentials (
    id TEXT PRIMARY KEY,
    owner_id TEXT NOT NULL,
    is_public INTEGER NOT NULL DEFAULT 0,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
  );
  CREATE TABLE endpoint_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    worker_id TEXT,
    stream TEXT NOT NULL,
    line TEXT NOT NULL,
    at INTEGER NOT NULL
  );
  CREATE INDEX endpoint_logs_endpoint ON endpoint_logs(endpoint_id, seq);
  CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
  );
  `,
  // 2: jobs and their lifecycle. Terminal rows stay until their result expires.
  `
  CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    endpoint_id TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    status TEXT NOT NULL CHECK (status IN ('IN_QUEUE', 'IN_PROGRESS', 'COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT')),
    input TEXT NOT NULL,
    extra TEXT,
    webhook TEXT,
    low_priority INTEGER NOT NULL DEFAULT 0,
    execution_timeout_ms INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL,
    retention_ms INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    retries INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    output TEXT,
    error TEXT,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    completed_at INTEGER,
    expires_at INTEGER
  );
  CREATE INDEX jobs_active ON jobs(status, created_at) WHERE status IN ('IN_QUEUE', 'IN_PROGRESS');
  CREATE INDEX jobs_endpoint ON jobs(endpoint_id, status);
  CREATE INDEX jobs_expiry ON jobs(expires_at) WHERE expires_at IS NOT NULL;
  `,
  // 3: a leaner jobs table for the hot path. Every index costs each insert and each status
  // change (BENCHMARKS.md: dropping jobs_endpoint took /run from ~26k to ~31k jobs/s), so the
  // per-endpoint index and the foreign key go. /health counts of finished jobs move to
  // job_counts, kept by the queue in the same commits; deleting an endpoint deletes its rows
  // itself (queue.dropEndpoint), in rowid slices.
  `
  CREATE TABLE jobs_v3 (
    id TEXT PRIMARY KEY,
    endpoint_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('IN_QUEUE', 'IN_PROGRESS', 'COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT')),
    input TEXT NOT NULL,
    extra TEXT,
    webhook TEXT,
    low_priority INTEGER NOT NULL DEFAULT 0,
    execution_timeout_ms INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL,
    retention_ms INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    retries INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    output TEXT,
    error TEXT,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    completed_at INTEGER,
    expires_at INTEGER
  );
  INSERT INTO jobs_v3 (rowid, id, endpoint_id, status, input, extra, webhook, low_priority, execution_timeout_ms, ttl_ms,
    retention_ms, attempt, retries, worker_id, output, error, created_at, started_at, completed_at, expires_at)
    SELECT rowid, id, endpoint_id, status, input, extra, webhook, low_priority, execution_timeout_ms, ttl_ms,
    retention_ms, attempt, retries, worker_id, output, error, created_at, started_at, completed_at, expires_at FROM jobs;
  DROP TABLE jobs;
  ALTER TABLE jobs_v3 RENAME TO jobs;
  CREATE INDEX jobs_active ON jobs(status, created_at) WHERE status IN ('IN_QUEUE', 'IN_PROGRESS');
  CREATE INDEX jobs_expiry ON jobs(expires_at) WHERE expires_at IS NOT NULL;
  CREATE TABLE job_counts (
    endpoint_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT')),
    jobs INTEGER NOT NULL,
    retries INTEGER NOT NULL,
    PRIMARY KEY (endpoint_id, status)
  ) WITHOUT ROWID;
  INSERT INTO job_counts (endpoint_id, status, jobs, retries)
    SELECT endpoint_id, status, count(*), coalesce(sum(retries), 0) FROM jobs
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT') GROUP BY endpoint_id, status;
  `,
  // 4: no index of active jobs. Its entries were written by every insert, claim and finish
  // (BENCHMARKS.md: /run user CPU per job about 11 % lower without it). Restart recovery reads
  // the rowid range from a recovery floor instead: every queued or running job has a rowid at
  // or above the floor the queue keeps in settings (store/jobs.ts, queue/job-queue.ts). The
  // first floor is the oldest active row, found here while the index still exists.
  `
  INSERT OR REPLACE INTO settings (key, value) VALUES ('jobs.recovery_floor', CAST(coalesce(
    (SELECT min(rowid) FROM jobs WHERE status IN ('IN_QUEUE', 'IN_PROGRESS')),
    (SELECT coalesce(max(rowid), 0) + 1 FROM jobs)) AS TEXT));
  DROP INDEX jobs_active;
  `,
  // 5: when a job's current run was queued, if not at its creation: a /retry queues it again
  // with a fresh TTL, and a restart must not time it out against the first submit.
  `
  ALTER TABLE jobs ADD COLUMN queued_at INTEGER;
  `,
  // 6: webhooks not yet delivered. A row is written in the commit that finishes a job with a
  // webhook and deleted once the POST got a 2xx or its tries ran out; a start sends again the
  // ones a stop or a crash left (queue/webhook.ts).
  `
  CREATE TABLE webhook_outbox (job_id TEXT PRIMARY KEY) WITHOUT ROWID;
  `,
  // 7: /stream chunks not yet read, out of the heap and across restarts. `chunk` is the JSON
  // text of one /stream element ({"output":…} or with "metrics"), already split to the chunk
  // limit; `seq` orders a job's chunks. A /stream poll reads and deletes them; the rest go
  // with their job's row (result expiry, endpoint deletion: both delete jobs rows) or a /retry.
  // A trigger rather than a foreign key: jobs has none (migration 3), and the expiry sweep and
  // endpoint deletion delete its rows in slices without knowing which jobs streamed.
  `
  CREATE TABLE job_chunks (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    chunk TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
  ) WITHOUT ROWID;
  CREATE TRIGGER jobs_delete_chunks AFTER DELETE ON jobs BEGIN
    DELETE FROM job_chunks WHERE job_id = OLD.id;
  END;
  `,
  // 8: a FAILED row that flashd itself ended (attempts used up), not its worker's result. Read
  // from the row alone both looked alike, so a late result of the worker that held the job was
  // answered as a re-post of its own recorded result (`duplicate`) instead of `discarded`.
  // Set only on that rare path; a requeue clears it.
  `
  ALTER TABLE jobs ADD COLUMN ended_by_flashd INTEGER NOT NULL DEFAULT 0;
  `,
  // 9: how long the lost attempts of a job's current run held it (a lapsed lease, a dead worker:
  // from their claim to the requeue). delayTime is the time the job waited in the queue, so it
  // leaves this out; TTL still counts from `queued_at`. A /retry starts it at 0 again.
  `
  ALTER TABLE jobs ADD COLUMN lost_ms INTEGER NOT NULL DEFAULT 0;
  `,
  // 10: the worker a queued job is fenced from (Job.fences: it may still run an old attempt,
  // and a result post carries no attempt number). Written by the requeue or /retry that fences
  // it, in the same statement, and cleared when the worker lets go; a restart restores the fence
  // for a lease from the start, so that worker's first job-take does not get the job back. Only
  // queued rows read it; an insert leaves it NULL. Fenced from more than one worker (each still
  // running an old attempt), it holds a JSON array of their ids (store/jobs.ts encodeFences).
  `
  ALTER TABLE jobs ADD COLUMN fenced_from TEXT;
  `,
  // 11: a job that ended COMPLETED or CANCELLED can never be retried, so its extra keys
  // (s3Config, with its accessSecret) are dropped in the write that ends it (store/jobs.ts
  // finish); rows an older flashd ended still held them until their result expired. Cleared
  // here, their plain text stays in the free space of the pages: the mark (see migration 14) has
  // the start erase it (JobsRepo.sealPlainExtras).
  `
  INSERT OR REPLACE INTO settings (key, value) SELECT 'jobs.unsealed_extra', '1'
    WHERE EXISTS (SELECT 1 FROM jobs WHERE extra IS NOT NULL AND status IN ('COMPLETED', 'CANCELLED'));
  UPDATE jobs SET extra = NULL WHERE extra IS NOT NULL AND status IN ('COMPLETED', 'CANCELLED');
  `,
  // 12: a key whose value was chosen (FLASHD_ADMIN_API_KEY) was listed with its first 4
  // characters as its prefix, a meaningful part of a chosen secret; it now shows `chosen_` and
  // random characters (auth/tokens.ts keyPrefix). Generated keys keep theirs (`fd_usr_`, `fd_wkr_`).
  `
  UPDATE api_keys SET prefix = 'chosen_' || lower(hex(randomblob(2)))
    WHERE prefix NOT GLOB 'fd_usr_*' AND prefix NOT GLOB 'fd_wkr_*';
  `,
  // 13: which keys were registered from FLASHD_ADMIN_API_KEY, so that a start with another
  // value revokes them (auth/service.ts bootstrap): a rotated admin key stayed valid. Existing
  // ones are the chosen keys (prefix `chosen_`, migration 12: only the variable registers a value
  // flashd did not generate) and those under the name the variable's key is given (a generated
  // key's value chosen through it). The first generated key and keys made through the API are not.
  `
  ALTER TABLE api_keys ADD COLUMN from_env INTEGER NOT NULL DEFAULT 0;
  UPDATE api_keys SET from_env = 1 WHERE kind = 'user'
    AND (prefix GLOB 'chosen_*' OR (name = 'admin (FLASHD_ADMIN_API_KEY)' AND user_id = 'usr_admin'));
  `,
  // 14: a job's extra keys (s3Config, its accessSecret a credential) are sealed in the row with
  // `<data-dir>/secret.key` (store/jobs.ts), which SQL cannot do: this marks that rows an older
  // flashd wrote hold plain ones (a JSON object, where sealed ones start `v1.`), and the start
  // seals them before recovery and drops the mark in the same transaction (sealPlainExtras).
  `
  INSERT OR REPLACE INTO settings (key, value) SELECT 'jobs.unsealed_extra', '1'
    WHERE EXISTS (SELECT 1 FROM jobs WHERE extra GLOB '{*');
  `,
  // 15: a job's input over 2,048 characters (store/jobs.ts INPUT_INLINE_MAX) is written here,
  // once, in the transaction of the job's insert, and its row's `input` is '' (no JSON text
  // is empty). In the row, SQLite rewrote it with every later change of the row (a claim, each
  // progress update, the final state, a requeue): a change of a record's size rewrites the
  // whole record, overflow pages included (a 9 MB input: 9 MB of WAL per progress update). The
  // trigger deletes it with the job's row, as jobs_delete_chunks its chunks (the expiry sweep
  // and endpoint deletion delete rows in slices); the WHEN spares other rows the lookup. Rows
  // written before keep their input inline. IF NOT EXISTS: a replay on a database whose
  // user_version was set back (test/queue/s3-config-sealed.test.ts) finds them there.
  `
  CREATE TABLE IF NOT EXISTS job_inputs (
    job_id TEXT PRIMARY KEY,
    input TEXT NOT NULL
  ) WITHOUT ROWID;
  CREATE TRIGGER IF NOT EXISTS jobs_delete_input AFTER DELETE ON jobs WHEN OLD.input = '' BEGIN
    DELETE FROM job_inputs WHERE job_id = OLD.id;
  END;
  `,
  // 16: the tries an owed webhook has made, written when a try fails and another follows
  // (queue/webhook.ts), so that a start goes on at its next try: a restart between tries sent it
  // the full three again. The table is rebuilt rather than altered, so that a replay on a
  // database whose user_version was set back (test/queue/s3-config-sealed.test.ts) runs too.
  `
  CREATE TABLE webhook_outbox_v16 (job_id TEXT PRIMARY KEY, tries INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
  INSERT INTO webhook_outbox_v16 (job_id) SELECT job_id FROM webhook_outbox;
  DROP TABLE webhook_outbox;
  ALTER TABLE webhook_outbox_v16 RENAME TO webhook_outbox;
  `,
  // 17: the key that made a key, when that key was not an admin's (auth/service.ts createKey):
  // such a key is refused once any key it descends from is revoked or expired, so revoking a
  // leaked key also ends the keys made with it. NULL for keys an admin made, flashd's own (the
  // first admin key, worker keys) and every key made before. Rebuilt rather than altered, as
  // webhook_outbox in 16, so that a replay on a database whose user_version was set back
  // (test/queue/s3-config-sealed.test.ts) runs too.
  `
  CREATE TABLE api_keys_v17 (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('user', 'worker')),
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    team_id TEXT REFERENCES teams(id) ON DELETE CASCADE,
    endpoint_id TEXT,
    scopes TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    exempt INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER,
    from_env INTEGER NOT NULL DEFAULT 0,
    created_by TEXT
  );
  INSERT INTO api_keys_v17 (id, name, kind, user_id, team_id, endpoint_id, scopes, hash, prefix, exempt, created_at, expires_at, revoked_at, from_env)
    SELECT id, name, kind, user_id, team_id, endpoint_id, scopes, hash, prefix, exempt, created_at, expires_at, revoked_at, from_env FROM api_keys;
  DROP TABLE api_keys;
  ALTER TABLE api_keys_v17 RENAME TO api_keys;
  CREATE INDEX api_keys_user ON api_keys(user_id);
  `,
  // 18: the newest line of an endpoint's log that trimming deleted (store/logs.ts prune), so that
  // a read with ?since below it can say lines after it are gone: seq is shared by every endpoint,
  // so the lines kept alone cannot tell a gap from deleted lines. Lines deleted before this
  // version are not known. IF NOT EXISTS: replayed on a database whose user_version was set back.
  `
  CREATE TABLE IF NOT EXISTS endpoint_logs_pruned (
    endpoint_id TEXT PRIMARY KEY REFERENCES endpoints(id) ON DELETE CASCADE,
    through INTEGER NOT NULL
  ) WITHOUT ROWID;
  `,
  // 19: network and global volumes deleted through the API whose engine volume is not removed
  // yet (store/resources.ts DeletedVolumes). A start used to remove every engine volume of its
  // instance that the database did not know, which a restored backup or a copy of the data
  // directory does not know either: now only these. Volumes deleted before this version are
  // not known. IF NOT EXISTS: replayed on a database whose user_version was set back.
  `
  CREATE TABLE IF NOT EXISTS deleted_volumes (
    id TEXT PRIMARY KEY,
    deleted_at INTEGER NOT NULL
  ) WITHOUT ROWID;
  `,
];
