/**
 * The memory adapter: the reference semantics of the Storage contract (src/storage/contract.ts), in
 * one process. Databases live in the Storage object; a commit "resolves in memory" and the run is gone
 * with the process. Every other adapter must behave like this one (src/storage/conformance/). The
 * rules every adapter shares live in src/storage/semantics.ts and src/storage/handle.ts.
 */
import type { LogEvent, NewEvent } from "../../src/state/events.js";
import {
  MAILBOX_LIMIT,
  type CommitReceipt,
  type Database,
  type DatabaseSignal,
  type DatabaseStats,
  type FaultHook,
  type MailboxMessage,
  type OpenOptions,
  type PostedMessage,
  type Reader,
  type Storage,
  type StoredSnapshot,
} from "../../src/storage/contract.js";
import { checkSnapshotWrite, snapshotDigest, verifiedSnapshot } from "../../src/storage/snapshots.js";
import { DatabaseNotFound } from "../../src/storage/errors.js";
import { closedHandle, guardHandle, Watchers } from "../../src/storage/handle.js";
import {
  checkAckBound,
  checkRange,
  checkDatabaseName,
  duplicateIdentity,
  isValidDatabaseName,
  mailboxFull,
  messageConflict,
  prepareBatch,
  prepareMessage,
  sameMessage,
  lostAcknowledgement,
} from "../../src/storage/semantics.js";

/** Options of the memory adapter. */
export interface MemoryStorageOptions {
  /** Fault points called by every commit (tests only). */
  readonly faults?: FaultHook;
}

interface Stored {
  readonly name: string;
  epoch: number;
  /** Each committed event as JSON text (seq = index + 1), so no caller reference is ever kept. */
  readonly events: string[];
  readonly identities: Set<string>;
  /** Unacknowledged mail, in post order. */
  mailbox: { mseq: number; message: MailboxMessage }[];
  nextMseq: number;
  readonly handles: Set<MemoryDatabase>;
  /** The latest snapshot with the digest taken when it was written. */
  snapshot: { seq: number; data: string; digest: string } | null;
}

function latestOf(stored: Stored): StoredSnapshot | null {
  const s = stored.snapshot;
  return s === null ? null : verifiedSnapshot(stored.name, s.seq, s.data, s.digest);
}

/**
 * Creates an in-memory Storage. Opening a name again fences the earlier handle (its next call throws
 * `ResetError` fenced, its watchers get `{type: "fenced"}`). A throw from the `commit:after-durable`
 * fault leaves the batch in the log, rejects the commit with StorageFailure and poisons the handle.
 */
export function createMemoryStorage(options: MemoryStorageOptions = {}): Storage {
  const databases = new Map<string, Stored>();
  const faults = options.faults;

  return {
    adapter: "memory",

    async open(name: string, openOptions: OpenOptions = {}): Promise<Database> {
      checkDatabaseName(name);
      let stored = databases.get(name);
      if (stored === undefined) {
        if (openOptions.create === false) throw new DatabaseNotFound(name);
        stored = { name, epoch: 0, events: [], identities: new Set(), mailbox: [], nextMseq: 1, handles: new Set(), snapshot: null };
        databases.set(name, stored);
      }
      stored.epoch += 1;
      for (const earlier of stored.handles) earlier.fence(stored.epoch);
      stored.handles.clear();
      const db = new MemoryDatabase(stored, stored.epoch, faults);
      stored.handles.add(db);
      return db;
    },

    async reader(name: string): Promise<Reader> {
      const stored = isValidDatabaseName(name) ? databases.get(name) : undefined;
      if (stored === undefined) throw new DatabaseNotFound(name);
      return new MemoryReader(stored);
    },

    async post(name: string, message: MailboxMessage): Promise<void> {
      const stored = isValidDatabaseName(name) ? databases.get(name) : undefined;
      if (stored === undefined) throw new DatabaseNotFound(name);
      const copy = prepareMessage(message);
      const existing = stored.mailbox.find((m) => m.message.id === copy.id);
      if (existing !== undefined) {
        if (sameMessage(existing.message, copy)) return;
        throw messageConflict(name, copy.id);
      }
      if (stored.mailbox.length >= MAILBOX_LIMIT) throw mailboxFull(name);
      stored.mailbox.push({ mseq: stored.nextMseq++, message: copy });
      for (const db of stored.handles) db.notify({ type: "mailbox" });
    },

    async list(): Promise<string[]> {
      return [...databases.keys()].sort();
    },

    async close(): Promise<void> {
      // Nothing shared to release: the data lives as long as this object, like a process's memory.
    },
  };
}


function readEvents(stored: Stored, afterSeq: number, limit: number | undefined): LogEvent[] {
  checkRange(afterSeq, limit);
  const end = limit === undefined ? undefined : afterSeq + limit;
  return stored.events.slice(afterSeq, end).map((text) => JSON.parse(text) as LogEvent);
}

class MemoryDatabase implements Database {
  readonly name: string;
  readonly epoch: number;
  private poisoned = false;
  private closed = false;
  private readonly watchers = new Watchers();

  constructor(
    private readonly stored: Stored,
    epoch: number,
    private readonly faults: FaultHook | undefined,
  ) {
    this.name = stored.name;
    this.epoch = epoch;
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    this.guard();
    return readEvents(this.stored, afterSeq, limit);
  }

  async commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    this.guard();
    const batch = prepareBatch(events);
    if (this.faults !== undefined) {
      await this.faults("commit:before");
      this.guard();
    }
    const present = batch.map((e) => e.identity).filter((id) => this.stored.identities.has(id));
    if (present.length > 0) throw duplicateIdentity(present, "in the log");
    const firstSeq = this.stored.events.length + 1;
    for (const e of batch) {
      const seq = this.stored.events.length + 1;
      this.stored.events.push(JSON.stringify({ ...e, seq }));
      this.stored.identities.add(e.identity);
    }
    const receipt = { firstSeq, lastSeq: this.stored.events.length };
    if (this.faults !== undefined) {
      try {
        await this.faults("commit:after-durable");
      } catch (cause) {
        this.poisoned = true;
        throw lostAcknowledgement(this.name, cause);
      }
    }
    return receipt;
  }

  async head(): Promise<number> {
    this.guard();
    return this.stored.events.length;
  }

  async writeSnapshot(seq: number, data: string): Promise<void> {
    this.guard();
    checkSnapshotWrite(this.name, seq, data, this.stored.events.length, this.stored.snapshot?.seq ?? 0);
    this.stored.snapshot = { seq, data, digest: snapshotDigest(data) };
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    this.guard();
    return latestOf(this.stored);
  }

  async drain(): Promise<PostedMessage[]> {
    this.guard();
    return this.stored.mailbox.map((m) => ({ ...(JSON.parse(JSON.stringify(m.message)) as MailboxMessage), mseq: m.mseq }));
  }

  async ack(upTo: number): Promise<void> {
    this.guard();
    checkAckBound(upTo);
    this.stored.mailbox = this.stored.mailbox.filter((m) => m.mseq > upTo);
  }

  watch(listener: (signal: DatabaseSignal) => void): () => void {
    if (this.closed) return () => {};
    const stop = this.watchers.add(listener);
    if (this.stored.epoch !== this.epoch) this.watchers.deliver(listener, { type: "fenced", epoch: this.stored.epoch });
    else if (this.stored.mailbox.length > 0) this.watchers.deliver(listener, { type: "mailbox" });
    return stop;
  }

  stats(): DatabaseStats {
    return { adapter: "memory", epoch: this.epoch, fenced: this.stored.epoch !== this.epoch, poisoned: this.poisoned };
  }

  async close(): Promise<void> {
    this.closed = true;
    this.watchers.clear();
    this.stored.handles.delete(this);
  }

  /** Called by a newer open: tells watchers once. */
  fence(newEpoch: number): void {
    this.watchers.fenced(newEpoch);
  }

  /** Tells every watcher, asynchronously (a listener never runs inside a storage call). */
  notify(signal: DatabaseSignal): void {
    this.watchers.notify(signal);
  }

  private guard(): void {
    const fencedBy = this.stored.epoch !== this.epoch ? this.stored.epoch : undefined;
    guardHandle(this.name, this.epoch, { closed: this.closed, fencedBy, poisoned: this.poisoned });
  }
}

class MemoryReader implements Reader {
  readonly name: string;
  private closed = false;

  constructor(private readonly stored: Stored) {
    this.name = stored.name;
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    this.guard();
    return readEvents(this.stored, afterSeq, limit);
  }

  async head(): Promise<number> {
    this.guard();
    return this.stored.events.length;
  }

  async pending(): Promise<PostedMessage[]> {
    this.guard();
    return this.stored.mailbox.map((m) => ({ ...(JSON.parse(JSON.stringify(m.message)) as MailboxMessage), mseq: m.mseq }));
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    this.guard();
    return latestOf(this.stored);
  }

  async close(): Promise<void> {
    this.closed = true;
  }

  private guard(): void {
    if (this.closed) throw closedHandle(this.name, "reader");
  }
}
