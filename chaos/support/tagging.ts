/**
 * A Storage wrapper that lets a fault hook know which batch is being committed. The sqlite adapter's
 * FaultHook receives only the point, so the wrapper shows each batch to `onBatch` just before handing
 * it to the real `commit` (on sqlite the harness sends one commit at a time, so the hook that runs
 * inside that commit belongs to that batch; on the replicated adapter, which groups concurrent
 * commits, it may not). Everything else is passed through unchanged (passthrough.ts).
 */
import type { NewEvent } from "../../src/state/events.js";
import type { Storage } from "../../src/storage/contract.js";
import { passThrough, passThroughStorage } from "./passthrough.js";

/** Wraps `storage` so that `onBatch` sees every batch an opened database commits. */
export function tagBatches(storage: Storage, onBatch: (events: readonly NewEvent[]) => void): Storage {
  return passThroughStorage(storage, (db) =>
    passThrough(db, {
      commit: (events) => {
        onBatch(events);
        return db.commit(events);
      },
    }),
  );
}
