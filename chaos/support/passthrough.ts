/**
 * Storage and Database wrappers for tests that watch what the harness does: every member is
 * forwarded to the real one, the optional ones too (`lease`, `leases`), and only the methods named
 * in `over` are replaced. The completeness is checked at compile time: a member added to the
 * contract and not forwarded here fails the build (a wrapper that dropped the owner's lease would
 * hide every lease fault from the nemesis).
 */
import type { Database, Storage } from "../../src/storage/contract.js";

/** `db` with `over`'s methods in place of its own. */
export function passThrough(db: Database, over: Partial<Pick<Database, "commit" | "watch" | "writeSnapshot">> = {}): Database {
  const wrapped = {
    get name() {
      return db.name;
    },
    get epoch() {
      return db.epoch;
    },
    get groupsCommits() {
      return db.groupsCommits;
    },
    read: (afterSeq, limit) => db.read(afterSeq, limit),
    commit: over.commit ?? ((events) => db.commit(events)),
    head: () => db.head(),
    writeSnapshot: over.writeSnapshot ?? ((seq, data) => db.writeSnapshot(seq, data)),
    latestSnapshot: () => db.latestSnapshot(),
    drain: () => db.drain(),
    ack: (upTo) => db.ack(upTo),
    watch: over.watch ?? ((listener) => db.watch(listener)),
    stats: () => db.stats(),
    get lease() {
      return db.lease;
    },
    close: () => db.close(),
  } satisfies Database;
  const complete: Record<keyof Database, unknown> = wrapped;
  return complete as Database;
}

/** `storage` whose opened databases go through `wrap` first. */
export function passThroughStorage(storage: Storage, wrap: (db: Database) => Database | Promise<Database>): Storage {
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
