/**
 * The one place SQLite's errors become Storage errors (src/storage/errors.ts).
 */
import { CairnError } from "../../src/errors.js";
import { StorageFailure, StorageRejected, StorageUnavailable } from "../../src/storage/errors.js";
import { unusable } from "./connection.js";

/**
 * Where the error happened:
 * - `open`: opening the file or claiming ownership; nothing of the caller's was written.
 * - `write`: inside a write transaction before COMMIT ran (SQLite rolls it back).
 * - `commit`: while COMMIT ran: the outcome is unknown.
 * - `read`: inside a read transaction.
 */
export type SqlitePhase = "open" | "write" | "commit" | "read";

/** A mapped error, and whether the handle must be poisoned (every later call throws StorageFailure). */
export interface MappedError {
  readonly error: CairnError;
  readonly poison: boolean;
}

/** The SQLite result code of `err` ("SQLITE_BUSY", "SQLITE_IOERR_FSYNC", ...), or "" for other errors. */
export function sqliteCode(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" && code.startsWith("SQLITE_") ? code : "";
}

/**
 * Maps any error thrown while using SQLite. CairnErrors pass through unchanged. Busy/locked (the
 * busy_timeout already retried) is StorageUnavailable (retryable, nothing written) unless COMMIT was
 * running; a unique constraint is `duplicate_identity` (normally found earlier, by checking inside the
 * transaction); I/O errors, a full disk and corruption are StorageFailure and poison (at open: a
 * non-retryable "unusable" error naming the file); any other error during a write or COMMIT is an
 * unknown outcome: StorageFailure, poisoned; any other error at open is StorageUnavailable.
 */
export function mapSqliteError(err: unknown, phase: SqlitePhase, what: string): MappedError {
  if (err instanceof CairnError) return { error: err, poison: false };
  const code = sqliteCode(err);
  const detail = `${what}: ${code || (err instanceof Error ? err.name : "error")}: ${err instanceof Error ? err.message : String(err)}`;
  const uncertain = (): MappedError => ({
    error: new StorageFailure(`${detail}. The outcome is unknown; this handle is unusable: reopen the database and read the log.`, { cause: err }),
    poison: true,
  });
  if (phase === "commit") return uncertain();

  if (code.startsWith("SQLITE_BUSY") || code.startsWith("SQLITE_LOCKED")) {
    return {
      error: new StorageUnavailable(`${detail}. Another process held the database lock for too long; nothing was written, retry later.`, { cause: err }),
      poison: false,
    };
  }
  if (code === "SQLITE_CONSTRAINT_UNIQUE" || code === "SQLITE_CONSTRAINT_PRIMARYKEY") {
    return { error: new StorageRejected("duplicate_identity", `${detail}. Nothing was written.`, { cause: err }), poison: false };
  }
  if (phase === "open" && (code === "SQLITE_FULL" || code === "SQLITE_IOERR_SHMSIZE")) {
    return {
      error: new StorageUnavailable(`${detail}. The disk holding the data directory is full; nothing was written: free some space and retry.`, { cause: err }),
      poison: false,
    };
  }
  const broken = code.startsWith("SQLITE_IOERR") || code === "SQLITE_FULL" || code.startsWith("SQLITE_CORRUPT") || code === "SQLITE_NOTADB";
  if (phase === "open" && broken) {
    return { error: unusable(`${detail}. The file is damaged or is not a Cairn database: restore it from a backup or a replica, or move it aside.`, err), poison: false };
  }
  if (phase === "open") {
    return { error: new StorageUnavailable(`${detail}. Check that the data directory exists, is writable and is on a local disk.`, { cause: err }), poison: false };
  }
  if (phase === "write" || broken) return uncertain();
  return { error: new StorageFailure(`${detail}.`, { cause: err }), poison: false };
}
