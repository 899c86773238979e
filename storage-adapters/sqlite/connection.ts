/**
 * Opening one SQLite database file the way the sqlite adapter promises: WAL journal and
 * synchronous=FULL, both read back and verified, a busy timeout, a passing quick_check, and the
 * adapter's tables (schema version 1).
 */
import BetterSqlite3 from "better-sqlite3";
import { closeSync, fsyncSync, linkSync, openSync, unlinkSync } from "node:fs";
import { hostname } from "node:os";
import { basename, dirname, join } from "node:path";
import { CairnError } from "../../src/errors.js";
import { recordLease } from "./liveness.js";

/** A better-sqlite3 connection. */
export type Connection = BetterSqlite3.Database;

/** How long a writer waits for another process's write lock before SQLITE_BUSY (SQLite retries inside). */
export const BUSY_TIMEOUT_MS = 5000;

/** The schema version this adapter writes and reads. */
export const SCHEMA_VERSION = "1";

const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY,
  identity TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  session TEXT NOT NULL,
  at TEXT NOT NULL,
  body TEXT NOT NULL,
  crc INTEGER
);
CREATE TABLE IF NOT EXISTS snapshots (
  seq INTEGER PRIMARY KEY,
  digest TEXT NOT NULL,
  data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS owner (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  epoch INTEGER NOT NULL,
  opened_at TEXT,
  host TEXT,
  pid INTEGER
);
CREATE TABLE IF NOT EXISTS mailbox (
  mseq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  session TEXT NOT NULL,
  kind TEXT NOT NULL,
  payload TEXT NOT NULL,
  at TEXT NOT NULL
);
INSERT OR IGNORE INTO owner (id, epoch) VALUES (1, 0);
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '${SCHEMA_VERSION}');
INSERT OR IGNORE INTO meta (key, value) VALUES ('format', 'cairn');
`;

/** The database cannot be used as the adapter promises (no WAL, no FULL sync, failed check): not retryable. */
export function unusable(message: string, cause?: unknown): CairnError {
  const err = new CairnError("unavailable", message, { retryable: false, cause });
  err.name = "StorageUnusable";
  return err;
}

/**
 * Creates the database file at `path` whole, or not at all: the schema and the format marker are
 * written to a temporary file beside it, fsynced, and hard-linked into place. SQLite itself creates a
 * 0-byte file on open and writes the schema only at the first commit, so a process killed in between,
 * or a disk that fills there, would leave an empty `<name>.db` that every later open refuses as "not
 * a Cairn database". A file that already exists (another opener won the race) is left as it is.
 * Returns false when the file existed.
 */
export function createDatabaseFile(path: string): boolean {
  const tmp = join(dirname(path), `.${basename(path)}.creating-${process.pid}-${Math.random().toString(36).slice(2, 10)}`);
  try {
    const conn = new BetterSqlite3(tmp, { timeout: BUSY_TIMEOUT_MS });
    try {
      // WAL already: switching the journal mode later is itself a write that a kill can interrupt,
      // leaving a hot rollback journal beside the new file. Closing the last connection checkpoints
      // the WAL into the file and removes it.
      conn.pragma("journal_mode = WAL");
      conn.pragma("synchronous = FULL");
      conn.exec(`BEGIN IMMEDIATE; ${SCHEMA} COMMIT;`);
    } finally {
      conn.close();
    }
    const fd = openSync(tmp, "r+");
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    try {
      linkSync(tmp, path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "EEXIST") return false;
      throw err;
    }
    const dir = openSync(dirname(path), "r");
    try {
      fsyncSync(dir);
    } finally {
      closeSync(dir);
    }
    return true;
  } finally {
    try {
      unlinkSync(tmp);
    } catch {
      // never created, or already gone
    }
    for (const extra of ["-journal", "-wal", "-shm"]) {
      try {
        unlinkSync(`${tmp}${extra}`);
      } catch {
        // none left
      }
    }
  }
}

/**
 * Opens a read-write connection and verifies the durability settings. With `mustExist` a missing
 * file is an error (SQLITE_CANTOPEN) instead of a new empty file. Throws `unusable` when the
 * filesystem refuses WAL or synchronous=FULL does not stick. The caller closes the connection.
 */
export function openWritable(path: string, mustExist: boolean): Connection {
  const conn = new BetterSqlite3(path, { fileMustExist: mustExist, timeout: BUSY_TIMEOUT_MS });
  try {
    const mode = String(conn.pragma("journal_mode = WAL", { simple: true })).toLowerCase();
    if (mode !== "wal") {
      throw unusable(`${path}: the filesystem refused WAL journaling (journal_mode is "${mode}"); put --data-dir on a local disk (not a network or FUSE filesystem).`);
    }
    conn.pragma("synchronous = FULL");
    const sync = Number(conn.pragma("synchronous", { simple: true }));
    if (sync !== 2) throw unusable(`${path}: synchronous=FULL did not take effect (read back ${sync}); commits would not be fsynced.`);
    conn.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    return conn;
  } catch (err) {
    conn.close();
    throw err;
  }
}

/** Opens a read-only connection to an existing file (no write, no ownership change). */
export function openReadOnly(path: string): Connection {
  const conn = new BetterSqlite3(path, { readonly: true, fileMustExist: true, timeout: BUSY_TIMEOUT_MS });
  conn.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
  return conn;
}

/**
 * Runs `PRAGMA quick_check`, creates the tables when missing, checks the schema version and claims
 * ownership: `epoch = epoch + 1` in one BEGIN IMMEDIATE transaction. Returns the claimed epoch; every
 * earlier opener, in any process, now sees a higher epoch than its own and is fenced.
 */
export function claimOwnership(conn: Connection, path: string, leaseMs: number): { epoch: number; earlier: ReturnType<typeof recordLease> } {
  const check = conn.pragma("quick_check", { simple: true });
  if (check !== "ok") {
    throw unusable(`${path}: PRAGMA quick_check failed (${String(check)}); the file is damaged. Restore it from a backup or a replica.`);
  }
  conn.exec("BEGIN IMMEDIATE");
  try {
    conn.exec(SCHEMA);
    // Files written before per-row CRCs: add the column (old rows keep NULL and are validated fully).
    if (!hasCrcColumn(conn)) conn.exec("ALTER TABLE events ADD COLUMN crc INTEGER");
    const version = conn.prepare("SELECT value FROM meta WHERE key = 'schema_version'").pluck().get();
    if (version !== SCHEMA_VERSION) {
      throw unusable(`${path}: schema version ${String(version)} is not the supported version ${SCHEMA_VERSION}; use a matching Cairn release.`);
    }
    conn.prepare("UPDATE owner SET epoch = epoch + 1, opened_at = ?, host = ?, pid = ? WHERE id = 1").run(new Date().toISOString(), hostname(), process.pid);
    const epoch = conn.prepare("SELECT epoch FROM owner WHERE id = 1").pluck().get() as number;
    const earlier = recordLease(conn, epoch, leaseMs);
    conn.exec("COMMIT");
    return { epoch, earlier };
  } catch (err) {
    if (conn.inTransaction) conn.exec("ROLLBACK");
    throw err;
  }
}

/** True when the events table has the `crc` column (files created or opened by this release). */
export function hasCrcColumn(conn: Connection): boolean {
  return (conn.prepare("PRAGMA table_info(events)").all() as { name: string }[]).some((c) => c.name === "crc");
}

/** True when the file has the snapshots table (created by the first owner open of this release). */
export function hasSnapshotTable(conn: Connection): boolean {
  return conn.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'").get() !== undefined;
}
