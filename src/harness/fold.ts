/**
 * Folding the log into the owner's projection: all of it at open, page by page, and each batch this
 * owner commits, from its receipt (read back from storage when the receipt is not contiguous with what
 * was folded: the truth is read, never guessed).
 */
import type { LogEvent, NewEvent } from "../state/events.js";
import { parseLogEvent } from "../state/events.js";
import type { Reducer } from "../state/reducer.js";
import type { CommitReceipt, Database } from "../storage/contract.js";

const PAGE = 5000;

/** Folds every event of `db` after the reducer's head. */
export async function foldLog(db: Database, reducer: Reducer): Promise<void> {
  for (;;) {
    const batch = await db.read(reducer.headSeq, PAGE);
    if (batch.length === 0) return;
    reducer.apply(batch.map((e) => parseLogEvent(e)));
    if (batch.length < PAGE) return;
  }
}

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
