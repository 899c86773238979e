/**
 * A Storage wrapper that lets a fault hook know which batch is being committed. The sqlite adapter's
 * FaultHook receives only the point, so the wrapper shows each batch to `onBatch` just before handing
 * it to the real `commit` (the harness serializes its commits, so the hook that runs inside that
 * commit belongs to that batch). Everything else is passed through unchanged.
 */
import type { NewEvent } from "../../src/state/events.js";
import type { Database, Storage } from "../../src/storage/contract.js";

/** Wraps `storage` so that `onBatch` sees every batch an opened database commits. */
export function tagBatches(storage: Storage, onBatch: (events: readonly NewEvent[]) => void): Storage {
  const wrap = (db: Database): Database => {
    const wrapped = {
      get name() {
        return db.name;
      },
      get epoch() {
        return db.epoch;
      },
      read: (afterSeq, limit) => db.read(afterSeq, limit),
      commit: (events) => {
        onBatch(events);
        return db.commit(events);
      },
      head: () => db.head(),
      writeSnapshot: (seq, data) => db.writeSnapshot(seq, data),
      latestSnapshot: () => db.latestSnapshot(),
      drain: () => db.drain(),
      ack: (upTo) => db.ack(upTo),
      watch: (listener) => db.watch(listener),
      stats: () => db.stats(),
      get lease() {
        return db.lease;
      },
      close: () => db.close(),
    } satisfies Database;
    // Every member, the optional ones too (the owner's lease must reach the harness).
    const complete: Record<keyof Database, unknown> = wrapped;
    return complete as Database;
  };
  const wrapped = {
    adapter: storage.adapter,
    open: async (name, options) => wrap(await storage.open(name, options)),
    reader: (name) => storage.reader(name),
    post: (name, message) => storage.post(name, message),
    list: () => storage.list(),
    get leases() {
      return storage.leases;
    },
    close: () => storage.close(),
  } satisfies Storage;
  const complete: Record<keyof Storage, unknown> = wrapped;
  return complete as Storage;
}
