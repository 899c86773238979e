/**
 * An owned sqlite database handle. Every call checks the owner epoch inside its own transaction
 * (BEGIN IMMEDIATE for writes), so a handle fenced by another process writes nothing; `watch` polls
 * cheaply (PRAGMA data_version, then the owner row and the mailbox) to notice a fence without a commit.
 */
import type { LogEvent, NewEvent } from "../../src/state/events.js";
import type {
  CommitReceipt,
  Database,
  DatabaseSignal,
  DatabaseStats,
  FaultHook,
  PostedMessage,
  StoredSnapshot,
} from "../../src/storage/contract.js";
import { checkSnapshotWrite, decodeOwnEvent, decodeValidated, eventCrc, snapshotDigest, verifiedSnapshot } from "../../src/storage/snapshots.js";
import { ResetError, StorageFailure } from "../../src/storage/errors.js";
import { guardHandle, Watchers } from "../../src/storage/handle.js";
import { checkAckBound, checkRange, duplicateIdentity, lostAcknowledgement, prepareBatch } from "../../src/storage/semantics.js";
import type BetterSqlite3 from "better-sqlite3";
import { hasCrcColumn, hasSnapshotTable, type Connection } from "./connection.js";
import type { SqliteLease } from "./liveness.js";
import { mapSqliteError, type SqlitePhase } from "./errors.js";
import { INSERT_ROWS, RowInserter } from "../../src/storage/sqlite-rows.js";

type Statement<P extends unknown[] = [], R = unknown> = BetterSqlite3.Statement<P, R>;

interface EventRow {
  seq: number;
  identity: string;
  kind: string;
  session: string;
  at: string;
  body: string;
  crc: number | null;
}

/** How reads decode rows: "integrity" (CRC check, no zod; the default) or "full" (zod on every row). */
export type ReadValidation = "integrity" | "full";

interface SnapshotRow {
  seq: number;
  digest: string;
  data: string;
}

interface MailRow {
  mseq: number;
  id: string;
  session: string;
  kind: string;
  payload: string;
  at: string;
}

/** Prepared statements of one connection, shared by the owner handle and the reader. */
export class Statements {
  readonly begin: Statement;
  readonly beginImmediate: Statement;
  readonly commit: Statement;
  readonly rollback: Statement;
  readonly epoch: Statement<[], number>;
  readonly read: Statement<[number, number], EventRow>;
  readonly head: Statement<[], number>;
  private snapshotStmt: Statement<[], SnapshotRow> | null = null;

  constructor(
    readonly conn: Connection,
    private readonly validation: ReadValidation = "integrity",
  ) {
    this.begin = conn.prepare<[]>("BEGIN");
    this.beginImmediate = conn.prepare<[]>("BEGIN IMMEDIATE");
    this.commit = conn.prepare<[]>("COMMIT");
    this.rollback = conn.prepare<[]>("ROLLBACK");
    this.epoch = conn.prepare<[], number>("SELECT epoch FROM owner WHERE id = 1").pluck();
    // A reader of a file no owner of this release opened yet has no crc column: NULL means "validate fully".
    const crc = hasCrcColumn(conn) ? "crc" : "NULL AS crc";
    this.read = conn.prepare<[number, number], EventRow>(`SELECT seq, identity, kind, session, at, body, ${crc} FROM events WHERE seq > ? ORDER BY seq LIMIT ?`);
    this.head = conn.prepare<[], number>("SELECT COALESCE(MAX(seq), 0) FROM events").pluck();
  }

  /**
   * Reads events. A row with a CRC is checked against it and decoded without zod (it was validated
   * before it was written); a row without one, or every row with validation "full", is parsed with
   * zod. A row that fails either is reported (StorageFailure), never returned.
   */
  readEvents(name: string, afterSeq: number, limit: number | undefined): LogEvent[] {
    checkRange(afterSeq, limit);
    const rows = this.read.all(afterSeq, limit === undefined ? -1 : limit);
    const full = this.validation === "full";
    return rows.map((row) => {
      const { seq, identity, kind, session, at, body, crc } = row;
      try {
        if (crc !== null && crc !== eventCrc(identity, kind, session, at, body)) throw new Error("the row does not match its CRC");
        return crc === null || full ? decodeValidated(seq, identity, kind, session, at, body) : decodeOwnEvent(seq, identity, kind, session, at, body);
      } catch (cause) {
        throw new StorageFailure(`database "${name}": the stored event at seq ${row.seq} is not a valid event; the file was altered or damaged.`, { cause });
      }
    });
  }

  /** The latest snapshot (its digest checked), or null; null too for a file without the table yet. */
  latestSnapshot(name: string): StoredSnapshot | null {
    if (this.snapshotStmt === null) {
      if (!hasSnapshotTable(this.conn)) return null;
      this.snapshotStmt = this.conn.prepare<[], SnapshotRow>("SELECT seq, digest, data FROM snapshots ORDER BY seq DESC LIMIT 1");
    }
    const row = this.snapshotStmt.get();
    return row === undefined ? null : verifiedSnapshot(name, row.seq, row.data, row.digest);
  }

  /** The latest snapshot's seq, or 0, without reading (or hashing) its text. */
  latestSnapshotSeq(): number {
    if (!hasSnapshotTable(this.conn)) return 0;
    return (this.conn.prepare("SELECT MAX(seq) FROM snapshots").pluck().get() as number | null) ?? 0;
  }

  /** Rolls back an open transaction, ignoring errors (the connection may already have rolled back). */
  rollbackQuietly(): void {
    if (!this.conn.inTransaction) return;
    try {
      this.rollback.run();
    } catch {
      // SQLite rolls back on its own after some errors; nothing more to undo.
    }
  }
}

/** The owner handle returned by `createSqliteStorage().open`. */
export class SqliteDatabase implements Database {
  readonly epoch: number;
  private readonly s: Statements;
  private readonly hasIdentity;
  /** Multi-row inserts into the log (src/storage/sqlite-rows.ts). */
  private readonly inserts;
  private readonly putSnapshot;
  private readonly dropSnapshots;
  private readonly drainRows;
  private readonly ackRows;
  private readonly maxMseq;
  private readonly dataVersion;
  private poisoned = false;
  private closed = false;
  /** The newer epoch once this handle learned it was fenced. */
  private fencedBy: number | null = null;
  private readonly watchers = new Watchers();
  private timer: ReturnType<typeof setInterval> | undefined;
  private seenDataVersion: number | undefined;
  private seenMseq = 0;

  constructor(
    readonly name: string,
    private readonly conn: Connection,
    epoch: number,
    private readonly faults: FaultHook | undefined,
    private readonly pollMs: number,
    private readonly onClose: () => void,
    /** The owner's heartbeat lease (lease.ts). */
    readonly lease: SqliteLease,
    validation: ReadValidation = "integrity",
  ) {
    this.epoch = epoch;
    this.s = new Statements(conn, validation);
    this.hasIdentity = conn.prepare<[string], number>("SELECT 1 FROM events WHERE identity = ?").pluck();
    this.inserts = new RowInserter(conn, "INSERT INTO events (identity, kind, session, at, body, crc)", 6);
    this.putSnapshot = conn.prepare<[number, string, string]>("INSERT OR REPLACE INTO snapshots (seq, digest, data) VALUES (?, ?, ?)");
    this.dropSnapshots = conn.prepare<[number]>("DELETE FROM snapshots WHERE seq < ?");
    this.drainRows = conn.prepare<[], MailRow>("SELECT mseq, id, session, kind, payload, at FROM mailbox ORDER BY mseq");
    this.ackRows = conn.prepare<[number]>("DELETE FROM mailbox WHERE mseq <= ?");
    this.maxMseq = conn.prepare<[], number>("SELECT COALESCE(MAX(mseq), 0) FROM mailbox").pluck();
    this.dataVersion = conn.prepare<[], number>("PRAGMA data_version").pluck();
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    return this.transact("read", "read", () => this.s.readEvents(this.name, afterSeq, limit));
  }

  async commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    this.guard();
    const batch = prepareBatch(events);
    if (this.faults !== undefined) await this.faults("commit:before");
    const receipt = this.transact("write", "commit", () => {
      // The identity column is UNIQUE: an insert of one already in the log fails, and the whole
      // transaction rolls back. Only then are the batch's identities looked up, to name every one
      // already present (the ones inserted before the failure were not: the batch has no repeats).
      // Rows go in INSERT_ROWS at a time, one statement each: a row's seq is the largest before it
      // plus one (INTEGER PRIMARY KEY, append-only, under the write lock), so one statement's rows
      // get consecutive seqs and the first is the last minus the count plus one. One native call
      // per statement instead of one per row: a 20-event batch costs 1 call, not 20.
      let firstSeq = 0;
      let lastSeq = 0;
      for (let from = 0; from < batch.length; from += INSERT_ROWS) {
        const rows = batch.slice(from, from + INSERT_ROWS);
        const params: (string | number)[] = [];
        for (const e of rows) {
          const body = JSON.stringify(e.body);
          params.push(e.identity, e.kind, e.session, e.at, body, eventCrc(e.identity, e.kind, e.session, e.at, body));
        }
        try {
          const result = this.inserts.statement(rows.length).run(...params);
          if (result.changes !== rows.length) throw new Error(`inserted ${result.changes} of ${rows.length} rows into the log of "${this.name}"`);
          lastSeq = Number(result.lastInsertRowid);
        } catch (err) {
          if ((err as { code?: unknown }).code !== "SQLITE_CONSTRAINT_UNIQUE") throw err;
          throw duplicateIdentity(
            batch.slice(from).filter((x) => this.hasIdentity.get(x.identity) !== undefined).map((x) => x.identity),
            "in the log",
          );
        }
        if (firstSeq === 0) firstSeq = lastSeq - rows.length + 1;
      }
      return { firstSeq, lastSeq };
    });
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
    return this.transact("read", "head", () => this.s.head.get() ?? 0);
  }

  async writeSnapshot(seq: number, data: string): Promise<void> {
    this.transact("write", "writeSnapshot", () => {
      checkSnapshotWrite(this.name, seq, data, this.s.head.get() ?? 0, this.s.latestSnapshotSeq());
      // One row per database: the new snapshot replaces the older ones in the same transaction.
      this.putSnapshot.run(seq, snapshotDigest(data), data);
      this.dropSnapshots.run(seq);
    });
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    return this.transact("read", "latestSnapshot", () => this.s.latestSnapshot(this.name));
  }

  async drain(): Promise<PostedMessage[]> {
    return this.transact("read", "drain", () =>
      this.drainRows.all().map((r) => ({ mseq: r.mseq, id: r.id, session: r.session, kind: r.kind, at: r.at, payload: JSON.parse(r.payload) as unknown })),
    );
  }

  async ack(upTo: number): Promise<void> {
    checkAckBound(upTo);
    this.transact("write", "ack", () => {
      this.ackRows.run(upTo);
    });
  }

  watch(listener: (signal: DatabaseSignal) => void): () => void {
    if (this.closed) return () => {};
    const stop = this.watchers.add(listener, () => this.stopPolling());
    if (this.fencedBy !== null) {
      this.watchers.deliver(listener, { type: "fenced", epoch: this.fencedBy });
    } else if (this.timer === undefined) {
      this.timer = setInterval(() => this.poll(), this.pollMs);
      this.timer.unref();
      setImmediate(() => this.poll()).unref();
    }
    return stop;
  }

  stats(): DatabaseStats {
    return { adapter: "sqlite", epoch: this.epoch, fenced: this.fencedBy !== null, poisoned: this.poisoned };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopPolling();
    this.watchers.clear();
    this.s.rollbackQuietly();
    this.conn.close();
    await this.lease.release();
    this.onClose();
  }

  /**
   * One transaction: BEGIN (IMMEDIATE for writes), the owner-epoch check, `body`, COMMIT. A fence
   * rolls back and throws ResetError; SQLite errors go through mapSqliteError (which may poison).
   */
  private transact<T>(kind: "read" | "write", op: string, body: () => T): T {
    this.guard();
    let phase: SqlitePhase = kind;
    try {
      (kind === "write" ? this.s.beginImmediate : this.s.begin).run();
      const current = this.s.epoch.get();
      if (current !== this.epoch) throw this.fenced(current);
      const result = body();
      if (kind === "write") phase = "commit";
      this.s.commit.run();
      return result;
    } catch (err) {
      this.s.rollbackQuietly();
      const mapped = mapSqliteError(err, phase, `${op} on database "${this.name}"`);
      if (mapped.poison) this.poisoned = true;
      throw mapped.error;
    }
  }

  private fenced(current: number | undefined): ResetError {
    if (current === undefined || current < this.epoch) {
      return new ResetError("stop", "diverged", `database "${this.name}": the owner epoch went from ${this.epoch} to ${String(current)}; the file was replaced. Stop and inspect it.`);
    }
    this.fencedBy = current;
    this.lease.stopRenewing();
    this.notifyFenced();
    return ResetError.fenced(this.name, this.epoch, current);
  }

  private guard(): void {
    guardHandle(this.name, this.epoch, { closed: this.closed, fencedBy: this.fencedBy ?? undefined, poisoned: this.poisoned });
  }

  /** The watch poll: cheap when nothing changed (data_version is per-connection and in memory). */
  private poll(): void {
    if (this.closed || this.watchers.size === 0) return this.stopPolling();
    try {
      const version = this.dataVersion.get();
      if (version === this.seenDataVersion) return;
      this.seenDataVersion = version;
      const current = this.s.epoch.get();
      if (current !== undefined && current > this.epoch) {
        this.fencedBy = current;
        this.lease.stopRenewing();
        this.notifyFenced();
        return;
      }
      const mseq = this.maxMseq.get() ?? 0;
      if (mseq > this.seenMseq) {
        this.seenMseq = mseq;
        this.watchers.notify({ type: "mailbox" });
      }
    } catch {
      // A transient read error (the disk, a lock): the next tick tries again; calls report real errors.
      this.seenDataVersion = undefined;
    }
  }

  private notifyFenced(): void {
    this.stopPolling();
    if (this.fencedBy !== null) this.watchers.fenced(this.fencedBy);
  }

  private stopPolling(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }
}
