/**
 * Reading a database's event log the way `cairn status` does (a read-only reader: never takes
 * ownership), and small typed filters over it.
 */
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import type { EventKind, LogEvent } from "../../src/state/events.js";
import type { Storage } from "../../src/storage/contract.js";

/** Every committed event of database `db` in `dataDir`, in seq order. */
export async function readLog(dataDir: string, db: string): Promise<LogEvent[]> {
  return readAll(createSqliteStorage({ dataDir }), db);
}

/** Every committed event of `db` through a read-only reader of `storage` (any adapter), which it closes. */
export async function readAll(storage: Storage, db: string): Promise<LogEvent[]> {
  try {
    const reader = await storage.reader(db);
    try {
      return await reader.read(0);
    } finally {
      await reader.close();
    }
  } finally {
    await storage.close();
  }
}

/** The events of one kind, typed. */
export function ofKind<K extends EventKind>(log: readonly LogEvent[], kind: K): LogEvent<K>[] {
  return log.filter((e) => e.kind === kind) as unknown as LogEvent<K>[];
}

/** `execution_started` events of `cell`. */
export function startsOf(log: readonly LogEvent[], cell: number): LogEvent<"execution_started">[] {
  return ofKind(log, "execution_started").filter((e) => e.body.cell_id === cell);
}

/** `execution_finished` events of `cell`. */
export function finishesOf(log: readonly LogEvent[], cell: number): LogEvent<"execution_finished">[] {
  return ofKind(log, "execution_finished").filter((e) => e.body.cell_id === cell);
}

/** A compact listing of the log for assertion messages. */
export function brief(log: readonly LogEvent[]): string {
  return log.map((e) => `${e.seq} ${e.kind} ${e.identity}`).join("\n");
}
