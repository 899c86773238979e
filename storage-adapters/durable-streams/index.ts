/**
 * The Durable Streams adapter: the Storage contract on any server that speaks the Durable Streams
 * protocol (the reference server `@durable-streams/server`; Ursula, the three-zone Raft server of the
 * "Pi Durable on Tonbo" design). A commit resolves once the server acknowledged the append, i.e. as
 * durably as that server promises (the reference server: fsynced on its one disk; Ursula: held by a
 * majority of its three nodes).
 *
 * Ownership is the protocol's idempotent producer: every owner of a database appends to its log as
 * the same producer id, each at its own epoch, claimed at open (open.ts); the server refuses a
 * superseded owner's appends (403), which is the fence. The records, the streams and their layout:
 * records.ts. Which records count, also after a server that forgot producer state: fold.ts. What the
 * adapter relies on from the server, and what happens on one that does not provide it:
 * docs/durable-streams.md.
 *
 * Owner leases (`Storage.leases`, for standby workers: lease.ts) are liveness only; safety is the
 * producer epoch alone. There is no `Database.lease` (the self-fencing liveness lease of the sqlite and
 * replicated adapters): an owner that loses its owner lease is stopped by the CLI (src/cli/owner.ts).
 */
import { ConfigError } from "../../src/errors.js";
import type { LogEvent } from "../../src/state/events.js";
import type { Database, MailboxMessage, OpenOptions, PostedMessage, Reader, Storage, StoredSnapshot } from "../../src/storage/contract.js";
import { DatabaseNotFound, StorageUnavailable } from "../../src/storage/errors.js";
import { closedHandle } from "../../src/storage/handle.js";
import { checkDatabaseName, checkRange, isValidDatabaseName, prepareMessage } from "../../src/storage/semantics.js";
import { DsTransportError, START } from "./http.js";
import { LogView, readFailure } from "./log-view.js";
import { MailView } from "./mailbox.js";
import { pendingMessages } from "./mail-fold.js";
import { contextOf, type DsContext, type DurableStreamsOptions } from "./options.js";
import { openDatabase } from "./open.js";
import { durableStreamsLeases } from "./lease.js";
import { CATALOG, catalogName, streamsOf } from "./records.js";
import { cutOf, SnapshotIndex, startBoundary, storedOf } from "./snapshots.js";

export type { DurableStreamsOptions } from "./options.js";
export type { DurableStreamsStats } from "./database.js";

/** The adapter's name (metrics, logs, `--storage`). */
export const ADAPTER = "durable-streams";

/**
 * Creates a Storage on the Durable Streams server under `options.url`. Options are validated now
 * (ConfigError naming the option); the server is first contacted by `open`, `reader`, `post` or
 * `list`. Names must match DATABASE_NAME.
 */
export function createDurableStreamsStorage(options: DurableStreamsOptions): Storage {
  const ctx = contextOf(options);
  const handles = new Set<{ close(): Promise<void> }>();
  const mailViews = new Map<string, MailView>();
  const known = new Set<string>();

  /** Throws DatabaseNotFound unless the database's log exists (remembered once seen). */
  const mustExist = async (name: string): Promise<void> => {
    if (!isValidDatabaseName(name)) throw new DatabaseNotFound(name);
    if (known.has(name)) return;
    let exists: boolean;
    try {
      exists = await ctx.wire.exists(streamsOf(name).log);
    } catch (err) {
      throw unreachable(ctx, name, err);
    }
    if (!exists) throw new DatabaseNotFound(name);
    known.add(name);
  };

  return {
    adapter: ADAPTER,
    leases: durableStreamsLeases(ctx.wire, ctx.leaseMs, ctx.leaseRollRecords),

    async open(name: string, openOptions: OpenOptions = {}): Promise<Database> {
      checkDatabaseName(name);
      const db = await openDatabase(ctx, name, openOptions.create !== false, (closed) => handles.delete(closed));
      handles.add(db);
      known.add(name);
      return db;
    },

    async reader(name: string): Promise<Reader> {
      await mustExist(name);
      const reader: DsReader = new DsReader(ctx, name, () => handles.delete(reader));
      handles.add(reader);
      return reader;
    },

    async post(name: string, message: MailboxMessage): Promise<void> {
      await mustExist(name);
      const copy = prepareMessage(message);
      let view = mailViews.get(name);
      if (view === undefined) {
        view = new MailView(ctx.wire, name);
        mailViews.set(name, view);
      }
      try {
        await view.post(copy, ctx.outageMs);
      } catch (err) {
        throw readFailure(name, `posting "${copy.id}"`, err);
      }
    },

    async list(): Promise<string[]> {
      const names = new Set<string>();
      try {
        let offset = START;
        for (;;) {
          const res = await ctx.wire.read(CATALOG, offset);
          if (res.kind !== "data") break;
          for (const m of res.messages) {
            const name = catalogName(m);
            if (name !== null && isValidDatabaseName(name)) names.add(name);
          }
          offset = res.next;
          if (res.upToDate || res.messages.length === 0) break;
        }
        const present = await Promise.all([...names].map(async (name) => ((await ctx.wire.exists(streamsOf(name).log)) ? name : null)));
        return present.filter((n): n is string => n !== null).sort();
      } catch (err) {
        throw unreachable(ctx, "(all)", err);
      }
    },

    async close(): Promise<void> {
      for (const handle of [...handles]) await handle.close();
    },
  };
}

function unreachable(ctx: DsContext, name: string, err: unknown): Error {
  if (err instanceof DsTransportError) return new StorageUnavailable(`database "${name}": the Durable Streams server at ${ctx.url} did not answer (${err.message}).`, { cause: err });
  return readFailure(name, "reaching the server", err);
}

/**
 * A read-only view: never appends to the log, so it never fences the owner. Its view of the log
 * starts at the latest snapshot's cut when its first read asks for events after it (loading a
 * projection), else at the beginning.
 */
class DsReader implements Reader {
  private view: LogView | null = null;
  private readonly index: SnapshotIndex;
  private readonly mail: MailView;
  private closed = false;

  constructor(
    private readonly ctx: DsContext,
    readonly name: string,
    private readonly onClose: () => void,
  ) {
    this.index = new SnapshotIndex(ctx.wire, name);
    this.mail = new MailView(ctx.wire, name);
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    this.guard();
    checkRange(afterSeq, limit);
    return this.run("reading its log", async () => {
      const view = await this.caughtUp(afterSeq);
      if (afterSeq >= view.cacheHead) return view.cachedEvents(afterSeq, limit);
      return view.eventsFromStart(afterSeq, limit);
    });
  }

  async head(): Promise<number> {
    this.guard();
    return this.run("reading its head", async () => (await this.caughtUp(Number.MAX_SAFE_INTEGER)).state.head);
  }

  async pending(): Promise<PostedMessage[]> {
    this.guard();
    return this.run("reading its mailbox", async () => {
      await this.mail.catchUp();
      return pendingMessages(this.mail.state);
    });
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    this.guard();
    return this.run("reading its latest snapshot", async () => {
      const latest = await this.index.latest();
      if (latest === "missing") throw new DatabaseNotFound(this.name);
      return storedOf(this.name, latest);
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.onClose();
  }

  /** The view, created on first use at the best start for `afterSeq`, then caught up. */
  private async caughtUp(afterSeq: number): Promise<LogView> {
    if (this.view === null) {
      let start = startBoundary();
      if (afterSeq > 0) {
        const latest = await this.index.latest();
        if (latest === "missing") throw new DatabaseNotFound(this.name);
        const cut = cutOf(latest);
        if (cut.state.head <= afterSeq) start = cut;
      }
      this.view = new LogView(this.ctx.wire, this.name, streamsOf(this.name).log, start);
    }
    await this.view.catchUp();
    return this.view;
  }

  private async run<T>(what: string, body: () => Promise<T>): Promise<T> {
    try {
      return await body();
    } catch (err) {
      if (err instanceof ConfigError) throw err;
      throw readFailure(this.name, what, err);
    }
  }

  private guard(): void {
    if (this.closed) throw closedHandle(this.name, "reader");
  }
}
