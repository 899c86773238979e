/**
 * The one place that picks a concrete Storage adapter from flags and the environment.
 */
import { existsSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { ensurePrivateDir } from "../exec/private.js";
import type { AdapterName, Storage } from "../storage/contract.js";
import { isValidDatabaseName } from "../storage/semantics.js";
import { storageFaultsFromEnv } from "../storage/chaos-fault.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import type { Logger } from "pino";
import { type Parsed, str, flag, UsageError, durationSeconds } from "./args.js";

/** Flags every command that touches a database takes. */
export const STORAGE_FLAGS = {
  db: { type: "string" },
  storage: { type: "string" },
  "data-dir": { type: "string" },
  etcd: { type: "string" },
  url: { type: "string" },
  "on-outage": { type: "string" },
  "outage-timeout": { type: "string" },
  lease: { type: "string" },
  liveness: { type: "string" },
  "allow-small-cluster": { type: "boolean" },
} as const;

export const STORAGE_HELP = `  --db NAME               the database (one per harness), e.g. harness-1
  --storage KIND          memory | sqlite | replicated | durable-streams (default sqlite)
  --data-dir DIR          where local files live, made private (0700) (CAIRN_DATA_DIR; default
                          $XDG_STATE_HOME/cairn, i.e. ~/.local/state/cairn: outside every
                          workspace; a ./.cairn made by an older version is still used)
  --etcd URLS             replicated: comma-separated etcd endpoints (or CAIRN_ETCD_ENDPOINTS);
                          credentials from CAIRN_ETCD_USER / CAIRN_ETCD_PASSWORD, TLS from
                          CAIRN_ETCD_CA / CAIRN_ETCD_CERT / CAIRN_ETCD_KEY
  --url URL               durable-streams: the base URL the database's streams live under (or
                          CAIRN_DS_URL), e.g. http://127.0.0.1:4437/v1/stream
  --on-outage MODE        replicated: wait (default) or reject while the quorum is lost
  --outage-timeout SECS   replicated, with --on-outage reject: refuse commits once the quorum has
                          been lost for longer than this (default 10)
  --liveness SECS         sqlite, replicated: the owner's liveness lease (default 3, at least 2). An owner that cannot
                          renew it (cut off, or the quorum lost that long) kills its cells and exits
                          4; a new owner launches nothing until it has run out. Longer: outages are
                          ridden out, and a silent zone's failover takes longer
  --allow-small-cluster   replicated: accept fewer than 3 voting members (development only)`;

export interface StorageChoice {
  readonly storage: Storage;
  readonly adapter: AdapterName;
  readonly dataDir: string;
  readonly describe: string;
}

/**
 * Where local files live when no --data-dir is given: CAIRN_DATA_DIR, else a ./.cairn an older
 * version made here (its databases stay where they are), else the user's state dir, outside any
 * workspace a cell could write.
 */
export function defaultDataDir(env: NodeJS.ProcessEnv, cwd: string = process.cwd()): string {
  if (env.CAIRN_DATA_DIR !== undefined && env.CAIRN_DATA_DIR !== "") return resolve(env.CAIRN_DATA_DIR);
  const legacy = join(cwd, ".cairn");
  if (statSync(legacy, { throwIfNoEntry: false })?.isDirectory() === true) return legacy;
  const state = env.XDG_STATE_HOME !== undefined && env.XDG_STATE_HOME !== "" ? env.XDG_STATE_HOME : join(env.HOME ?? homedir(), ".local", "state");
  return join(state, "cairn");
}

export function dbName(p: Parsed, command: string): string {
  const db = str(p, "db");
  if (db === undefined || db === "") throw new UsageError(`cairn ${command}: --db is required (the database name, e.g. --db harness-1).`);
  if (!isValidDatabaseName(db)) throw new UsageError(`cairn ${command}: --db "${db}" is not a valid name; use letters, digits, ".", "_" and "-" (at most 128, starting with a letter or digit).`);
  return db;
}

/** Picks the adapter. The replicated one (and its gRPC client) is loaded only when chosen. */
export async function chooseStorage(p: Parsed, command: string, env: NodeJS.ProcessEnv, logger?: Logger): Promise<StorageChoice> {
  const kind = str(p, "storage") ?? "sqlite";
  const dataDir = resolve(str(p, "data-dir") ?? defaultDataDir(env));
  const leaseText = str(p, "lease") ?? env.CAIRN_LEASE;
  const leaseMs = leaseText === undefined || leaseText === "" ? undefined : Math.round(durationSeconds(command, "lease", leaseText) * 1000);
  if (leaseMs !== undefined && leaseMs < 1000) throw new UsageError(`cairn ${command}: --lease (CAIRN_LEASE) must be at least 1s, got "${leaseText}".`);
  const livenessRaw = str(p, "liveness");
  let livenessMs: number | undefined;
  if (livenessRaw !== undefined) {
    const secs = Number(livenessRaw);
    if (livenessRaw.trim() === "" || !Number.isFinite(secs) || secs < 2) throw new UsageError(`cairn ${command}: --liveness expects a number of seconds, at least 2 (etcd's shortest lease), got "${livenessRaw}".`);
    livenessMs = Math.round(secs * 1000);
  }
  // Test-only (CAIRN_CHAOS_STORAGE_FAULT, see storage/chaos-fault.ts); undefined in production.
  const faultHook = storageFaultsFromEnv(env);
  const faults = faultHook ? { faults: faultHook } : {};
  if (existsSync(dataDir) && !statSync(dataDir).isDirectory()) throw new UsageError(`cairn ${command}: --data-dir ${dataDir} is a file, not a directory; name a directory (it is created when missing).`);
  // Only this user may enter it: the databases, the local copy, leases and snapshots are inside.
  if (kind !== "memory") {
    try {
      ensurePrivateDir(dataDir);
    } catch (err) {
      throw new UsageError(`cairn ${command}: the data dir ${dataDir} cannot be used: ${(err as Error).message}`);
    }
  }
  if (kind === "memory") {
    const storage = createMemoryStorage(faults);
    return { storage, adapter: storage.adapter, dataDir, describe: "memory (nothing survives this process)" };
  }
  if (kind === "sqlite") {
    const storage = createSqliteStorage({ dataDir, ...faults, ...(leaseMs !== undefined ? { leaseMs } : {}), ...(livenessMs !== undefined ? { livenessMs } : {}) });
    return { storage, adapter: storage.adapter, dataDir, describe: `sqlite in ${dataDir}` };
  }
  if (kind === "replicated") {
    const endpoints = (str(p, "etcd") ?? env.CAIRN_ETCD_ENDPOINTS ?? "").split(",").map((s) => s.trim()).filter((s) => s !== "");
    if (endpoints.length === 0) throw new UsageError(`cairn ${command}: --storage replicated needs etcd endpoints: pass --etcd http://HOST:2379,... or set CAIRN_ETCD_ENDPOINTS.`);
    const onOutage = str(p, "on-outage") ?? "wait";
    if (onOutage !== "wait" && onOutage !== "reject") throw new UsageError(`cairn ${command}: --on-outage expects wait or reject, got "${onOutage}".`);
    const outageRaw = str(p, "outage-timeout");
    let outageTimeoutMs: number | undefined;
    if (outageRaw !== undefined) {
      const secs = Number(outageRaw);
      if (outageRaw.trim() === "" || !Number.isFinite(secs) || secs < 0) throw new UsageError(`cairn ${command}: --outage-timeout expects a number of seconds (0 or more), got "${outageRaw}".`);
      if (onOutage !== "reject") throw new UsageError(`cairn ${command}: --outage-timeout only applies with --on-outage reject (with wait, commits wait for the quorum without limit).`);
      outageTimeoutMs = Math.round(secs * 1000);
    }
    const { createReplicatedStorage } = await import("../../storage-adapters/replicated/index.js");
    // Credentials and TLS files come from CAIRN_ETCD_USER / _PASSWORD / _CA / _CERT / _KEY, read by the adapter.
    const storage = createReplicatedStorage({
      endpoints,
      dataDir,
      onOutage,
      ...(outageTimeoutMs !== undefined ? { outageTimeoutMs } : {}),
      ...(leaseMs !== undefined ? { leaseMs } : {}),
      allowSmallCluster: flag(p, "allow-small-cluster"),
      ...(livenessMs !== undefined ? { livenessMs } : {}),
      ...faults,
      ...(logger ? { logger } : {}),
    });
    return { storage, adapter: storage.adapter, dataDir, describe: `replicated on etcd ${endpoints.join(",")} (cache in ${dataDir})` };
  }
  if (kind === "durable-streams") {
    const url = (str(p, "url") ?? env.CAIRN_DS_URL ?? "").trim();
    if (url === "") throw new UsageError(`cairn ${command}: --storage durable-streams needs the base URL of its streams: pass --url http://HOST:PORT/v1/stream or set CAIRN_DS_URL.`);
    const { createDurableStreamsStorage } = await import("../../storage-adapters/durable-streams/index.js");
    // A malformed URL is a ConfigError naming the option (exit 2).
    const storage = createDurableStreamsStorage({ url, ...faults, ...(leaseMs !== undefined ? { leaseMs } : {}) });
    return { storage, adapter: storage.adapter, dataDir, describe: `durable-streams at ${url}` };
  }
  throw new UsageError(`cairn ${command}: --storage expects memory, sqlite, replicated or durable-streams, got "${kind}".`);
}
