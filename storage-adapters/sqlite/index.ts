/**
 * The sqlite adapter: one SQLite file per database, `<dataDir>/<name>.db`. A commit resolves after
 * its fsynced COMMIT returns (WAL, synchronous=FULL, verified at open). The last opener wins across
 * processes: opening bumps the owner epoch, and every call of an older handle, in any process, finds
 * the higher epoch inside its own transaction and throws ResetError fenced, writing nothing.
 */
import { existsSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { ConfigError } from "../../src/errors.js";
import type { LogEvent } from "../../src/state/events.js";
import {
  MAILBOX_LIMIT,
  type Database,
  type FaultHook,
  type MailboxMessage,
  type OpenOptions,
  type PostedMessage,
  type Reader,
  type Storage,
  type StoredSnapshot,
} from "../../src/storage/contract.js";
import { DatabaseNotFound } from "../../src/storage/errors.js";
import { closedHandle } from "../../src/storage/handle.js";
import { checkDatabaseName, isValidDatabaseName, mailboxFull, messageConflict, prepareMessage, sameMessage } from "../../src/storage/semantics.js";
import { claimOwnership, createDatabaseFile, openReadOnly, openWritable, SCHEMA_VERSION, type Connection } from "./connection.js";
import { assertCairnFile } from "./format.js";
import { SqliteDatabase, Statements, type ReadValidation } from "./database.js";
import { mapSqliteError, sqliteCode } from "./errors.js";
import { sqliteLeases } from "./lease.js";
import { DEFAULT_LEASE_MS as DEFAULT_LIVENESS_MS, SqliteLease, endFrozenOwner } from "./liveness.js";

/** Options of the sqlite adapter. */
export interface SqliteStorageOptions {
  /** The directory holding `<name>.db` files; created when missing. */
  readonly dataDir: string;
  /** Fault points called by every commit (tests only). */
  readonly faults?: FaultHook;
  /** How often `watch` polls for a fence or new mail, in ms (default 500). */
  readonly fencePollMs?: number;
  /** Length of an owner lease (lease.ts), in ms (default DEFAULT_LEASE_MS). */
  readonly leaseMs?: number;
  /** The owner's liveness heartbeat (liveness.ts: self-fencing, and ending an owner frozen inside its lock), in ms (default 3000). */
  readonly livenessMs?: number;
  /**
   * How reads decode stored events: "integrity" (default: each row's CRC is checked, no zod parse;
   * the adapter validated every event before writing it) or "full" (zod on every row, for audits).
   */
  readonly readValidation?: ReadValidation;
}

/** The default owner lease length: a standby takes over at most this long after its owner froze. */
export const DEFAULT_LEASE_MS = 10_000;

/** The default `watch` poll interval. */
export const DEFAULT_FENCE_POLL_MS = 500;

/**
 * Creates a Storage over SQLite files in `dataDir`. `open` claims ownership (fencing every earlier
 * opener in any process), `reader` opens read-only, `post` writes one mailbox row in its own short
 * transaction without touching ownership. Names must match DATABASE_NAME (a ConfigError otherwise).
 */
export function createSqliteStorage(options: SqliteStorageOptions): Storage {
  const { dataDir, faults } = options;
  const pollMs = options.fencePollMs ?? DEFAULT_FENCE_POLL_MS;
  const validation = options.readValidation ?? "integrity";
  if (validation !== "integrity" && validation !== "full") throw new ConfigError(`sqlite storage: readValidation must be "integrity" or "full", got ${JSON.stringify(validation)}.`);
  if (typeof dataDir !== "string" || dataDir === "") throw new ConfigError("sqlite storage: dataDir is required (--data-dir).");
  if (!Number.isFinite(pollMs) || pollMs <= 0) throw new ConfigError(`sqlite storage: fencePollMs must be a positive number of ms, got ${String(pollMs)}.`);
  const leaseMs = options.leaseMs ?? DEFAULT_LEASE_MS;
  const livenessMs = options.livenessMs ?? DEFAULT_LIVENESS_MS;
  if (!Number.isFinite(leaseMs) || leaseMs < 100) throw new ConfigError(`sqlite storage: leaseMs must be at least 100 ms, got ${String(leaseMs)}.`);
  const open = new Set<{ close(): Promise<void> }>();
  const pathOf = (name: string) => join(dataDir, `${name}.db`);
  /** The file of an existing database, or DatabaseNotFound. */
  const existing = (name: string): string => {
    const path = pathOf(name);
    if (!isValidDatabaseName(name) || !existsSync(path)) throw new DatabaseNotFound(name);
    try {
      assertCairnFile(path, SCHEMA_VERSION);
    } catch (err) {
      throw mapSqliteError(err, "open", `checking database "${name}" at ${path}`).error;
    }
    return path;
  };

  return {
    adapter: "sqlite",
    leases: sqliteLeases(dataDir, leaseMs),

    async open(name: string, openOptions: OpenOptions = {}): Promise<Database> {
      checkDatabaseName(name);
      const path = pathOf(name);
      if (openOptions.create === false && !existsSync(path)) throw new DatabaseNotFound(name);
      let conn: Connection | undefined;
      try {
        // Before anything writes to it (WAL, tables): an existing file must be a Cairn database.
        assertCairnFile(path, SCHEMA_VERSION);
        mkdirSync(dataDir, { recursive: true });
        // A new database appears whole (schema and marker) or not at all: never as an empty file.
        if (openOptions.create !== false && !existsSync(path)) createDatabaseFile(path);
        conn = openWritable(path, true);
        let claimed;
        try {
          claimed = claimOwnership(conn, path, livenessMs);
        } catch (err) {
          // Last opener wins also over an owner frozen inside its write transaction (lease.ts).
          if (!sqliteCode(err).startsWith("SQLITE_BUSY") || (await endFrozenOwner(path, (msg) => process.emitWarning(msg, "CairnFrozenOwner"))) === null) throw err;
          claimed = claimOwnership(conn, path, livenessMs);
        }
        const lease = new SqliteLease(path, claimed.epoch, livenessMs, claimed.earlier);
        const db: SqliteDatabase = new SqliteDatabase(name, conn, claimed.epoch, faults, pollMs, () => open.delete(db), lease, validation);
        open.add(db);
        return db;
      } catch (err) {
        conn?.close();
        throw mapSqliteError(err, "open", `opening database "${name}" at ${path}`).error;
      }
    },

    async reader(name: string): Promise<Reader> {
      const path = existing(name);
      let conn: Connection | undefined;
      try {
        conn = openReadOnly(path);
        const reader: SqliteReader = new SqliteReader(name, conn, () => open.delete(reader), validation);
        open.add(reader);
        return reader;
      } catch (err) {
        conn?.close();
        throw mapSqliteError(err, "open", `opening a reader of "${name}" at ${path}`).error;
      }
    },

    async post(name: string, message: MailboxMessage): Promise<void> {
      const copy = prepareMessage(message);
      const path = existing(name);
      let conn: Connection | undefined;
      let phase: "open" | "write" | "commit" = "open";
      try {
        conn = openWritable(path, true);
        phase = "write";
        conn.exec("BEGIN IMMEDIATE");
        const row = conn.prepare<[string], MailboxRow>("SELECT id, session, kind, payload, at FROM mailbox WHERE id = ?").get(copy.id);
        if (row !== undefined) {
          conn.exec("ROLLBACK");
          if (sameMessage({ ...row, payload: JSON.parse(row.payload) as unknown }, copy)) return;
          throw messageConflict(name, copy.id);
        }
        const count = conn.prepare<[], number>("SELECT COUNT(*) FROM mailbox").pluck().get() ?? 0;
        if (count >= MAILBOX_LIMIT) {
          conn.exec("ROLLBACK");
          throw mailboxFull(name);
        }
        conn.prepare("INSERT INTO mailbox (id, session, kind, payload, at) VALUES (?, ?, ?, ?, ?)").run(copy.id, copy.session, copy.kind, JSON.stringify(copy.payload), copy.at);
        phase = "commit";
        conn.exec("COMMIT");
      } catch (err) {
        if (conn?.inTransaction) conn.exec("ROLLBACK");
        if (/no such table/.test(String((err as Error).message))) throw new DatabaseNotFound(name);
        throw mapSqliteError(err, phase, `posting "${copy.id}" to database "${name}"`).error;
      } finally {
        conn?.close();
      }
    },

    async list(): Promise<string[]> {
      if (!existsSync(dataDir)) return [];
      return readdirSync(dataDir)
        .filter((f) => f.endsWith(".db"))
        .map((f) => f.slice(0, -3))
        .filter(isValidDatabaseName)
        .sort();
    },

    async close(): Promise<void> {
      for (const handle of [...open]) await handle.close();
    },
  };
}

interface MailboxRow {
  id: string;
  session: string;
  kind: string;
  payload: string;
  at: string;
}


/** A read-only handle: never changes the owner epoch, so it never fences the owner. */
class SqliteReader implements Reader {
  private readonly s: Statements;
  private closed = false;

  constructor(
    readonly name: string,
    private readonly conn: Connection,
    private readonly onClose: () => void,
    validation: ReadValidation,
  ) {
    this.s = new Statements(conn, validation);
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    return this.run("read", () => this.s.readEvents(this.name, afterSeq, limit));
  }

  async head(): Promise<number> {
    return this.run("head", () => this.s.head.get() ?? 0);
  }

  async pending(): Promise<PostedMessage[]> {
    return this.run("pending", () =>
      this.conn
        .prepare<[], MailboxRow & { mseq: number }>("SELECT mseq, id, session, kind, payload, at FROM mailbox ORDER BY mseq")
        .all()
        .map((r) => ({ mseq: r.mseq, id: r.id, session: r.session, kind: r.kind, payload: JSON.parse(r.payload) as unknown, at: r.at })),
    );
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    return this.run("latestSnapshot", () => this.s.latestSnapshot(this.name));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.conn.close();
    this.onClose();
  }

  private run<T>(op: string, body: () => T): T {
    if (this.closed) throw closedHandle(this.name, "reader");
    try {
      return body();
    } catch (err) {
      throw mapSqliteError(err, "read", `${op} on database "${this.name}" (reader)`).error;
    }
  }
}
