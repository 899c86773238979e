/**
 * A tiny Storage adapter written the way one outside this repository would be: it imports only the
 * package's public entry (`cairn/storage`: the contract, its errors, the shared semantics and the
 * handle lifecycle) and Node, never a file of `storage-adapters/`. It keeps its databases in a Map
 * (nothing persists), declares its own adapter name, and passes the conformance suite
 * (../out-of-tree.test.ts).
 */
import {
  checkAckBound,
  checkDatabaseName,
  checkSnapshotWrite,
  snapshotDigest,
  verifiedSnapshot,
  checkRange,
  closedHandle,
  DatabaseNotFound,
  duplicateIdentity,
  guardHandle,
  isValidDatabaseName,
  lostAcknowledgement,
  MAILBOX_LIMIT,
  mailboxFull,
  messageConflict,
  prepareBatch,
  prepareMessage,
  sameMessage,
  Watchers,
  type CommitReceipt,
  type Database,
  type DatabaseSignal,
  type FaultHook,
  type LogEvent,
  type MailboxMessage,
  type NewEvent,
  type PostedMessage,
  type Reader,
  type Storage,
  type StoredSnapshot,
} from "cairn/storage";

interface Db {
  epoch: number;
  log: string[];
  ids: Set<string>;
  mail: { mseq: number; text: string }[];
  mseq: number;
  owner: TinyDatabase | null;
  snapshot: { seq: number; data: string; digest: string } | null;
}

const latest = (name: string, db: Db): StoredSnapshot | null => (db.snapshot === null ? null : verifiedSnapshot(name, db.snapshot.seq, db.snapshot.data, db.snapshot.digest));

/** A Storage named "tiny" over a Map; `faults` is called at the two commit fault points. */
export function createTinyStorage(faults?: FaultHook): Storage {
  const dbs = new Map<string, Db>();
  const existing = (name: string): Db => {
    const db = isValidDatabaseName(name) ? dbs.get(name) : undefined;
    if (db === undefined) throw new DatabaseNotFound(name);
    return db;
  };
  return {
    adapter: "tiny",
    async open(name, options = {}) {
      checkDatabaseName(name);
      let db = dbs.get(name);
      if (db === undefined) {
        if (options.create === false) throw new DatabaseNotFound(name);
        db = { epoch: 0, log: [], ids: new Set(), mail: [], mseq: 0, owner: null, snapshot: null };
        dbs.set(name, db);
      }
      db.epoch += 1;
      db.owner?.watchers.fenced(db.epoch);
      db.owner = new TinyDatabase(name, db, faults);
      return db.owner;
    },
    async reader(name) {
      return new TinyReader(name, existing(name));
    },
    async post(name, message) {
      const db = existing(name);
      const copy = prepareMessage(message);
      const same = db.mail.find((m) => (JSON.parse(m.text) as MailboxMessage).id === copy.id);
      if (same !== undefined) {
        if (sameMessage(JSON.parse(same.text) as MailboxMessage, copy)) return;
        throw messageConflict(name, copy.id);
      }
      if (db.mail.length >= MAILBOX_LIMIT) throw mailboxFull(name);
      db.mail.push({ mseq: ++db.mseq, text: JSON.stringify(copy) });
      db.owner?.watchers.notify({ type: "mailbox" });
    },
    async list() {
      return [...dbs.keys()].sort();
    },
    async close() {},
  };
}

const readLog = (db: Db, afterSeq: number, limit?: number): LogEvent[] => {
  checkRange(afterSeq, limit);
  return db.log.slice(afterSeq, limit === undefined ? undefined : afterSeq + limit).map((t) => JSON.parse(t) as LogEvent);
};

class TinyDatabase implements Database {
  readonly epoch: number;
  readonly watchers = new Watchers();
  private closed = false;
  private poisoned = false;

  constructor(
    readonly name: string,
    private readonly db: Db,
    private readonly faults: FaultHook | undefined,
  ) {
    this.epoch = db.epoch;
  }

  private guard(): void {
    guardHandle(this.name, this.epoch, { closed: this.closed, fencedBy: this.db.epoch === this.epoch ? undefined : this.db.epoch, poisoned: this.poisoned });
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    this.guard();
    return readLog(this.db, afterSeq, limit);
  }

  async commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    this.guard();
    const batch = prepareBatch(events);
    await this.faults?.("commit:before");
    this.guard();
    const present = batch.map((e) => e.identity).filter((id) => this.db.ids.has(id));
    if (present.length > 0) throw duplicateIdentity(present, "in the log");
    const firstSeq = this.db.log.length + 1;
    for (const e of batch) {
      this.db.log.push(JSON.stringify({ ...e, seq: this.db.log.length + 1 }));
      this.db.ids.add(e.identity);
    }
    // Taken before any await: a concurrent commit may append meanwhile.
    const lastSeq = this.db.log.length;
    try {
      await this.faults?.("commit:after-durable");
    } catch (cause) {
      this.poisoned = true;
      throw lostAcknowledgement(this.name, cause);
    }
    return { firstSeq, lastSeq };
  }

  async head(): Promise<number> {
    this.guard();
    return this.db.log.length;
  }

  async writeSnapshot(seq: number, data: string): Promise<void> {
    this.guard();
    checkSnapshotWrite(this.name, seq, data, this.db.log.length, this.db.snapshot?.seq ?? 0);
    this.db.snapshot = { seq, data, digest: snapshotDigest(data) };
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    this.guard();
    return latest(this.name, this.db);
  }

  async drain(): Promise<PostedMessage[]> {
    this.guard();
    return this.db.mail.map((m) => ({ ...(JSON.parse(m.text) as MailboxMessage), mseq: m.mseq }));
  }

  async ack(upTo: number): Promise<void> {
    this.guard();
    checkAckBound(upTo);
    this.db.mail = this.db.mail.filter((m) => m.mseq > upTo);
  }

  watch(listener: (signal: DatabaseSignal) => void): () => void {
    if (this.closed) return () => {};
    const stop = this.watchers.add(listener);
    if (this.db.epoch !== this.epoch) this.watchers.deliver(listener, { type: "fenced", epoch: this.db.epoch });
    else if (this.db.mail.length > 0) this.watchers.deliver(listener, { type: "mailbox" });
    return stop;
  }

  stats() {
    return { adapter: "tiny", epoch: this.epoch, fenced: this.db.epoch !== this.epoch, poisoned: this.poisoned };
  }

  async close(): Promise<void> {
    this.closed = true;
    this.watchers.clear();
    if (this.db.owner === this) this.db.owner = null;
  }
}

class TinyReader implements Reader {
  private closed = false;

  constructor(
    readonly name: string,
    private readonly db: Db,
  ) {}

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    if (this.closed) throw closedHandle(this.name, "reader");
    return readLog(this.db, afterSeq, limit);
  }

  async head(): Promise<number> {
    if (this.closed) throw closedHandle(this.name, "reader");
    return this.db.log.length;
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    if (this.closed) throw closedHandle(this.name, "reader");
    return latest(this.name, this.db);
  }

  async close(): Promise<void> {
    this.closed = true;
  }
}
