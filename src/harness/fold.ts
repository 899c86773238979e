/**
 * Folding into the owner's projection each batch this owner commits, from its receipt (read back from
 * storage when the receipt is not contiguous with what was folded: the truth is read, never guessed).
 * Opening loads the latest snapshot plus the tail instead (loadProjection, src/storage/snapshots.ts).
 */
import type { LogEvent, NewEvent } from "../state/events.js";
import { parseLogEvent } from "../state/events.js";
import type { Reducer } from "../state/reducer.js";
import type { CommitReceipt, Database } from "../storage/contract.js";

/** Folds a batch this owner committed (`receipt`), and returns what was logged. */
export async function foldCommitted(db: Database, reducer: Reducer, events: readonly NewEvent[], receipt: CommitReceipt): Promise<LogEvent[]> {
  let logged: LogEvent[];
  if (receipt.firstSeq === reducer.headSeq + 1 && receipt.lastSeq === receipt.firstSeq + events.length - 1) {
    logged = events.map((e, i) => ({ ...structuredClone(e), seq: receipt.firstSeq + i }) as LogEvent);
  } else {
    logged = (await db.read(reducer.headSeq)).map((e) => parseLogEvent(e));
  }
  reducer.apply(logged);
  return logged;
}
