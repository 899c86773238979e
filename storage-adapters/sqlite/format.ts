/**
 * Is this file a Cairn database? Checked before anything writes to an existing file: opening for
 * write switches a file to WAL and creates tables, so a file that is not Cairn's (empty, another
 * program's SQLite database, not SQLite at all, a newer Cairn format) is refused first, read-only,
 * with one sentence, and left byte-for-byte as it was.
 *
 * The marker: the `meta` table holds `format = cairn` and `schema_version`. Files written before the
 * marker existed (a `meta` table with `schema_version` 1 beside Cairn's `events`, `owner` and `mailbox`
 * tables) are Cairn's too; opening them for write adds the marker. A later format version migrates
 * through `schema_version`.
 */
import BetterSqlite3 from "better-sqlite3";
import { closeSync, openSync, readSync, statSync } from "node:fs";
import { ConfigError } from "../../src/errors.js";

/** The `meta.format` value every Cairn database carries. */
export const FORMAT_MARKER = "cairn";

const SQLITE_HEADER = "SQLite format 3\u0000";
const CAIRN_TABLES = ["events", "owner", "mailbox"];

function notCairn(path: string, why: string): ConfigError {
  return new ConfigError(`${path} is not a Cairn database (${why}); Cairn left it untouched: choose another --db name or --data-dir, or move the file aside.`);
}

/**
 * Throws a ConfigError (exit 2) unless the existing file at `path` is a Cairn database of format
 * version `version`. Opens nothing for writing. A file that does not exist passes (it will be created).
 */
export function assertCairnFile(path: string, version: string): void {
  let size: number;
  try {
    const st = statSync(path);
    if (!st.isFile()) throw notCairn(path, "it is not a regular file");
    size = st.size;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
    throw err;
  }
  if (size === 0) throw notCairn(path, "the file is empty");
  const head = Buffer.alloc(16);
  const fd = openSync(path, "r");
  try {
    readSync(fd, head, 0, 16, 0);
  } finally {
    closeSync(fd);
  }
  if (head.toString("latin1") !== SQLITE_HEADER) throw notCairn(path, "it is not an SQLite file");

  let conn: BetterSqlite3.Database | undefined;
  let tables: Set<string>;
  let meta: Map<string, string>;
  try {
    try {
      conn = new BetterSqlite3(path, { readonly: true, fileMustExist: true });
      conn.prepare("SELECT 1 FROM sqlite_master LIMIT 1").get();
    } catch (err) {
      // A hot rollback journal (a writer killed mid-transaction) cannot be rolled back read-only. Any
      // SQLite client rolls it back at its next open; this one does too, and only that, then reads.
      if (String((err as { code?: unknown }).code ?? "") !== "SQLITE_READONLY_ROLLBACK") throw err;
      conn?.close();
      conn = new BetterSqlite3(path, { fileMustExist: true });
    }
    tables = new Set(conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").pluck().all() as string[]);
    meta = new Map();
    if (tables.has("meta")) {
      for (const row of conn.prepare("SELECT key, value FROM meta").all() as { key: unknown; value: unknown }[]) meta.set(String(row.key), String(row.value));
    }
  } catch (err) {
    const code = String((err as { code?: unknown }).code ?? "");
    if (code === "SQLITE_NOTADB" || code.startsWith("SQLITE_CORRUPT")) throw notCairn(path, "it is damaged or not a database");
    throw err;
  } finally {
    conn?.close();
  }
  const format = meta.get("format");
  const found = meta.get("schema_version");
  if (format === undefined) {
    const legacy = found === "1" && CAIRN_TABLES.every((t) => tables.has(t));
    if (!legacy) throw notCairn(path, tables.size === 0 ? "it is an empty SQLite database" : `it is another program's SQLite database, without Cairn's format marker`);
    return;
  }
  if (format !== FORMAT_MARKER) throw notCairn(path, `its format marker is "${format.slice(0, 40)}"`);
  if (found !== version) {
    throw new ConfigError(`${path} is a Cairn database of format version ${String(found).slice(0, 20)}, and this release reads version ${version}; use a matching Cairn release (Cairn left the file untouched).`);
  }
}
