/**
 * The local copy of a replicated database: a SQLite file per database under `dataDir` that mirrors
 * the cluster's log. It is a cache, never the truth: WAL with synchronous=NORMAL is enough, because
 * at every open it is checked against the cluster (hash chain) and rebuilt or caught up from it.
 *
 * Tables: `batches(first, last, epoch, token, hash)` and `events(seq, identity UNIQUE, json)`; a
 * batch's events JSON is `[` + the events' json joined by `,` + `]`, exactly the bytes the cluster's
 * record holds, so the hash chain can be recomputed locally.
 *
 * A copy rebuilt after the cluster dropped its older entries (a snapshot and compaction) starts at a
 * base: `meta` holds `base_seq` and `base_hash` (the chain hash at that seq), and `idarch` holds the
 * gzipped identity segments of the events before it, so duplicate refusal stays exact (layout.ts).
 * Reads before the base are refused as `compacted`. A copy that kept up holds the full history.
 *
 * The owner's own commits are appended a little later (`appendSoon`): within FLUSH_MS, or at once
 * when anything reads the copy (every method but `existing` writes what is pending first), when
 * PENDING_EVENTS are pending, or when the copy is closed. One SQLite transaction for the commits
 * of FLUSH_MS instead of one per commit: with one session that was 0.7 ms of a round's harness CPU
 * (three commits a round, each a transaction of its own). Nothing is lost by the delay: the copy is
 * a cache of what the cluster holds, caught up from it at the next open, and the cluster drops
 * entries only up to a snapshot's cut, which is computed from this copy after it wrote what was
 * pending (`batchEndingBy`), so a process killed while commits are pending leaves them in the
 * cluster. `existing` sees the pending identities, so duplicate refusal never waits for a write.
 */
import Database from "better-sqlite3";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { LogEvent, NewEvent } from "../../src/state/events.js";
import { StorageRejected } from "../../src/storage/errors.js";
import { ownEvent } from "../../src/storage/snapshots.js";
import { RowInserter } from "../../src/storage/sqlite-rows.js";
import { InUseLock } from "./copy-in-use.js";
import { GENESIS_HASH, chainHash, segmentIdentities, type BatchRecord } from "./layout.js";

/** The path of the local copy of database `name` under `dataDir`. */
export function localCopyPath(dataDir: string, name: string): string {
  return join(dataDir, `${name}.replica.sqlite`);
}

/** Identities per lookup statement in `existing` (a power of two, far below SQLite's parameter limit). */
const HELD_CHUNK = 256;

/** The longest the owner's commits wait in memory before they are written to the copy. */
export const FLUSH_MS = 50;
/** Pending events that make the copy write at once. */
const PENDING_EVENTS = 2048;

/** A committed record with its events already split (identities and JSON texts, as in its eventsJson). */
type Split = { readonly identities: readonly string[]; readonly jsons: readonly string[] };

/** The last batch the local copy holds. */
export interface LocalBatch {
  readonly first: number;
  readonly last: number;
  readonly hash: string;
}

/** Splits a batch's events JSON into the per-event JSON strings (re-serialization is byte-exact for JSON.stringify output). */
export function splitEvents(eventsJson: string): { events: NewEvent[]; jsons: string[] } {
  const events = JSON.parse(eventsJson) as NewEvent[];
  if (!Array.isArray(events)) throw new Error("a batch's events must be a JSON array");
  return { events, jsons: events.map((e) => JSON.stringify(e)) };
}

/** One database's local copy. Synchronous (better-sqlite3); every method may throw on a disk error. */
export class LocalCopy {
  private readonly db: Database.Database;
  /** The in-use lock held while this copy is an owner's (holdInUse). */
  private readonly inUse: InUseLock;
  private readonly stmt: {
    head: Database.Statement;
    hasIdentity: Database.Statement;
    base: Database.Statement;
    lastBatch: Database.Statement;
    insertBatches: RowInserter;
    insertEvents: RowInserter;
  };

  private readonly heldOfStmts = new Map<number, Database.Statement>();
  private baseCache: { seq: number; hash: string } | null = null;
  private archive: Set<string> | null = null;
  /** Committed records not written yet (appendSoon), in seq order, and their identities. */
  private pending: { records: BatchRecord[]; split: Split[] } = { records: [], split: [] };
  private readonly pendingIds = new Set<string>();
  private flushTimer: NodeJS.Timeout | null = null;
  /** Told when writing pending records failed (the caller's handle is then unusable); may return the error a read then throws. */
  private onFlushError: ((err: unknown) => Error | void) | null = null;

  /** Opens (creating when missing) the local copy at `path`. */
  constructor(readonly path: string) {
    this.inUse = new InUseLock(path);
    mkdirSync(join(path, ".."), { recursive: true });
    this.db = new Database(path);
    try {
      this.db.pragma("journal_mode = WAL");
      this.db.pragma("synchronous = NORMAL");
      this.db.pragma("busy_timeout = 5000");
      this.db.exec(`
        CREATE TABLE IF NOT EXISTS batches (first INTEGER PRIMARY KEY, last INTEGER NOT NULL, epoch INTEGER NOT NULL, token TEXT NOT NULL, hash TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, identity TEXT NOT NULL UNIQUE, json TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS idarch (key TEXT PRIMARY KEY, gz BLOB NOT NULL);
      `);
    } catch (err) {
      // Not left open: the caller may remove the file (a damaged one) or give up.
      this.db.close();
      throw err;
    }
    this.stmt = {
      head: this.db.prepare("SELECT MAX(seq) AS h FROM events"),
      hasIdentity: this.db.prepare("SELECT 1 FROM events WHERE identity = ?"),
      base: this.db.prepare("SELECT key, value FROM meta WHERE key IN ('base_seq', 'base_hash')"),
      lastBatch: this.db.prepare("SELECT first, last, hash FROM batches ORDER BY first DESC LIMIT 1"),
      insertBatches: new RowInserter(this.db, "INSERT INTO batches (first, last, epoch, token, hash)", 5),
      insertEvents: new RowInserter(this.db, "INSERT INTO events (seq, identity, json)", 3),
    };
  }

  /**
   * Whose copy this is: the database id and exact name it was first opened for. Stamps an unstamped
   * copy with `uid` and `name` and returns the stamp in force, in one write transaction, so that two
   * first opens at once cannot both take it. Kept by `discard`.
   */
  stamp(uid: string, name: string): { uid: string; name: string } {
    const put = this.db.prepare("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)");
    const read = this.db.prepare("SELECT key, value FROM meta WHERE key IN ('db_uid', 'db_name')");
    return this.db
      .transaction(() => {
        put.run("db_uid", uid);
        put.run("db_name", name);
        const m = new Map((read.all() as { key: string; value: string }[]).map((r) => [r.key, r.value]));
        return { uid: m.get("db_uid")!, name: m.get("db_name")! };
      })
      .immediate();
  }

  /** Marks this copy as open by its database's owner while it stays open (copy-in-use.ts). */
  holdInUse(): void {
    this.inUse.hold();
  }

  /** Gives up this copy's in-use lock (holdInUse), as close() does. */
  releaseInUse(): void {
    this.inUse.release();
  }

  /** Runs `f` while no process holds this copy in use (holdInUse); returns false, without running it, when one does. */
  whileUnused(f: () => void): boolean {
    return this.inUse.whileUnused(f);
  }

  /** Empties the copy, its stamp included, and stamps it for database `uid` named `name` (another database's copy, taken over). */
  takeOver(uid: string, name: string): void {
    this.dropPending();
    this.db.transaction(() => {
      this.db.exec("DELETE FROM events; DELETE FROM batches; DELETE FROM idarch; DELETE FROM meta;");
      const put = this.db.prepare("INSERT INTO meta (key, value) VALUES (?, ?)");
      put.run("db_uid", uid);
      put.run("db_name", name);
    })();
    this.baseCache = null;
    this.archive = null;
  }

  /** The highest seq held locally (the base when it holds no event after it; 0 when empty). */
  head(): number {
    this.flush();
    const row = this.stmt.head.get() as { h: number | null };
    return row.h ?? this.base().seq;
  }

  /** Where the copy starts: events 1..seq are not held (0 and GENESIS_HASH for a full copy). */
  base(): { seq: number; hash: string } {
    if (this.baseCache === null) {
      const rows = this.stmt.base.all() as { key: string; value: string }[];
      const m = new Map(rows.map((r) => [r.key, r.value]));
      this.baseCache = { seq: Number(m.get("base_seq") ?? "0"), hash: m.get("base_hash") ?? GENESIS_HASH };
    }
    return this.baseCache;
  }

  /** The last batch held locally, or null. */
  lastBatch(): LocalBatch | null {
    this.flush();
    return (this.stmt.lastBatch.get() as LocalBatch | undefined) ?? null;
  }

  /** The chain hash at the local head (the base's hash when no batch follows it). */
  tipHash(): string {
    return this.lastBatch()?.hash ?? this.base().hash;
  }

  /**
   * The local head and the chain hash there, read in one read transaction: another connection to
   * the file (another process on this data dir) may append or rebase between two separate reads.
   */
  tip(): { head: number; hash: string } {
    this.flush();
    return this.db.transaction(() => {
      this.rereadBase();
      const base = this.base();
      const last = this.stmt.lastBatch.get() as LocalBatch | undefined;
      const h = (this.stmt.head.get() as { h: number | null }).h;
      return { head: h ?? base.seq, hash: last?.hash ?? base.hash };
    })();
  }

  /** The last whole batch ending at or before `seq` (null when none is held). */
  batchEndingBy(seq: number): LocalBatch | null {
    this.flush();
    return (this.db.prepare("SELECT first, last, hash FROM batches WHERE last <= ? ORDER BY last DESC LIMIT 1").get(seq) as LocalBatch | undefined) ?? null;
  }

  /** Identities of the events with from < seq <= to, sorted (for an identity segment). */
  identitiesIn(from: number, to: number): string[] {
    this.flush();
    return (this.db.prepare("SELECT identity FROM events WHERE seq > ? AND seq <= ? ORDER BY identity").pluck().all(from, to) as string[]);
  }

  /**
   * Empties the copy and makes it start after `seq` (chain hash `hash`), holding the identity
   * segments `segments` (key -> gzipped, newline-joined identities) of everything before it.
   */
  rebase(seq: number, hash: string, segments: readonly { key: string; gz: Buffer }[]): void {
    this.dropPending();
    this.db.transaction(() => {
      this.db.exec("DELETE FROM events; DELETE FROM batches; DELETE FROM idarch;");
      const put = this.db.prepare("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)");
      put.run("base_seq", String(seq));
      put.run("base_hash", hash);
      const seg = this.db.prepare("INSERT INTO idarch (key, gz) VALUES (?, ?)");
      for (const s of segments) seg.run(s.key, s.gz);
    })();
    this.baseCache = null;
    this.archive = null;
  }

  /**
   * Recomputes the hash chain over every local batch. Returns null when the copy is internally
   * consistent, else a sentence saying where it is not (a corrupted, missing or extra entry).
   */
  verify(): string | null {
    this.flush();
    const batches = this.db.prepare("SELECT first, last, hash FROM batches ORDER BY first").iterate() as Iterable<LocalBatch>;
    const eventsOf = this.db.prepare("SELECT seq, json FROM events WHERE seq BETWEEN ? AND ? ORDER BY seq");
    const base = this.base();
    let prev = base.hash;
    let expectFirst = base.seq + 1;
    let count = 0;
    for (const b of batches) {
      if (b.first !== expectFirst || b.last < b.first) return `batch at seq ${b.first} does not follow seq ${expectFirst - 1}`;
      const rows = eventsOf.all(b.first, b.last) as { seq: number; json: string }[];
      if (rows.length !== b.last - b.first + 1) return `batch ${b.first}..${b.last} has ${rows.length} events locally`;
      const hash = chainHash(prev, b.first, `[${rows.map((r) => r.json).join(",")}]`);
      if (hash !== b.hash) return `batch ${b.first}..${b.last} does not match its hash`;
      prev = hash;
      expectFirst = b.last + 1;
      count += rows.length;
    }
    const total = (this.db.prepare("SELECT COUNT(*) AS n FROM events").get() as { n: number }).n;
    if (total !== count) return `${total - count} events are outside any batch (local head ${this.head()})`;
    return null;
  }

  /** The hash of the batch ending right before `first` (GENESIS for the first batch). */
  hashBefore(first: number): string {
    this.flush();
    if (first === 1) return GENESIS_HASH;
    if (first === this.base().seq + 1) return this.base().hash;
    const row = this.db.prepare("SELECT hash FROM batches WHERE last = ?").get(first - 1) as { hash: string } | undefined;
    if (!row) throw new Error(`the local copy has no batch ending at seq ${first - 1}`);
    return row.hash;
  }

  /**
   * Appends committed batches in one SQLite transaction, skipping those already held (another handle
   * on the same file may have caught up first). Batches must follow the local head. `split[k]`, when
   * given, is record k's events already split (identities and JSON texts, as in its eventsJson).
   * Anything pending (appendSoon) is written first.
   */
  append(records: readonly BatchRecord[], split?: readonly Split[]): void {
    this.flush();
    this.write(records, split);
  }

  /**
   * Appends the owner's own committed batches within FLUSH_MS (see the file comment). `onError` is
   * told if writing them fails later, on the timer; a read that writes them throws instead.
   */
  appendSoon(records: readonly BatchRecord[], split: readonly Split[], onError: (err: unknown) => Error | void): void {
    this.onFlushError = onError;
    for (const [k, r] of records.entries()) {
      const parts = split[k]!;
      this.pending.records.push(r);
      this.pending.split.push(parts);
      for (const id of parts.identities) this.pendingIds.add(id);
    }
    if (this.pendingIds.size >= PENDING_EVENTS) {
      this.flushNow();
      return;
    }
    if (this.flushTimer === null) {
      this.flushTimer = setTimeout(() => {
        this.flushTimer = null;
        this.flushNow();
      }, FLUSH_MS);
      this.flushTimer.unref();
    }
  }

  /**
   * Writes what is pending (see appendSoon). A failure is told to the pending records' owner (the
   * copy now lags what it acknowledged), and the error it returns (its handle's StorageFailure) is
   * thrown, else the disk error itself.
   */
  flush(): void {
    if (this.pending.records.length === 0) return;
    const { records, split } = this.takePending();
    try {
      this.write(records, split);
    } catch (err) {
      throw this.onFlushError?.(err) ?? err;
    }
  }

  /** flush() on the timer or at close: the failure is told to the owner, not thrown. */
  private flushNow(): void {
    try {
      this.flush();
    } catch {
      // told to onFlushError
    }
  }

  private takePending(): { records: BatchRecord[]; split: Split[] } {
    const taken = this.pending;
    this.pending = { records: [], split: [] };
    this.pendingIds.clear();
    if (this.flushTimer !== null) {
      clearTimeout(this.flushTimer);
      this.flushTimer = null;
    }
    return taken;
  }

  private dropPending(): void {
    this.takePending();
  }

  private write(records: readonly BatchRecord[], split: readonly Split[] | undefined): void {
    if (records.length === 0) return;
    const { insertBatches, insertEvents } = this.stmt;
    this.db.transaction(() => {
      // The base is read again here, not from the cache: another connection to this file (the next
      // owner's, after this process was fenced) may have rebuilt the copy from a later snapshot
      // since, and records from before its base must be skipped as held, not written below it.
      this.rereadBase();
      let head = (this.stmt.head.get() as { h: number | null }).h ?? this.base().seq;
      // Every row first, then multi-row inserts (src/storage/sqlite-rows.ts): a group of 63
      // one-event commits costs 4 statements, not 126.
      const batchRows: (string | number)[] = [];
      const eventRows: (string | number)[] = [];
      for (const [k, r] of records.entries()) {
        const h = r.header;
        if (h.last <= head) continue;
        if (h.first !== head + 1) throw new Error(`cannot append batch ${h.first}..${h.last} to a local copy at seq ${head}`);
        // The committer's own batches come split already (each event's identity and JSON); batches
        // read from the cluster are split here.
        const parts = split?.[k] ?? splitEvents(r.eventsJson);
        const identities = "identities" in parts ? parts.identities : parts.events.map((e) => e.identity);
        if (identities.length !== h.last - h.first + 1) throw new Error(`batch ${h.first}..${h.last} holds ${identities.length} events`);
        batchRows.push(h.first, h.last, h.epoch, h.token, h.hash);
        identities.forEach((id, i) => eventRows.push(h.first + i, id, parts.jsons[i]!));
        head = h.last;
      }
      insertBatches.insertAll(batchRows);
      insertEvents.insertAll(eventRows);
    })();
  }

  /** Reads the base again (another connection may have rebased the file); drops the identity archive when it moved. */
  private rereadBase(): void {
    const cached = this.baseCache;
    this.baseCache = null;
    if (cached !== null && cached.seq !== this.base().seq) this.archive = null;
  }

  /** Of `identities`, those already in the log: in the local copy, or in the identity segments before its base. */
  existing(identities: readonly string[]): string[] {
    const archive = this.base().seq > 0 ? this.archived() : null;
    if (identities.length === 1) {
      const id = identities[0]!;
      return this.pendingIds.has(id) || this.stmt.hasIdentity.get(id) !== undefined || archive?.has(id) === true ? [id] : [];
    }
    // One statement per HELD_CHUNK identities (a round's commits hold several identities each, and
    // the commit pipeline checks a whole group's at once), padded to a power of two so that a few
    // prepared statements serve every count.
    const held = new Set<string>();
    for (let at = 0; at < identities.length; at += HELD_CHUNK) {
      const part = identities.slice(at, at + HELD_CHUNK);
      let n = 1;
      while (n < part.length) n *= 2;
      while (part.length < n) part.push(part[0]!);
      for (const id of this.heldOf(n).all(...part) as string[]) held.add(id);
    }
    return identities.filter((id) => this.pendingIds.has(id) || held.has(id) || archive?.has(id) === true);
  }

  /** `SELECT identity ... IN (?, ..., ?)` with n placeholders, prepared once per n. */
  private heldOf(n: number): Database.Statement {
    let stmt = this.heldOfStmts.get(n);
    if (stmt === undefined) {
      stmt = this.db.prepare(`SELECT identity FROM events WHERE identity IN (${Array.from({ length: n }, () => "?").join(", ")})`).pluck();
      this.heldOfStmts.set(n, stmt);
    }
    return stmt;
  }

  /** The identities before the base, loaded once from the segments (exact, in memory). */
  private archived(): ReadonlySet<string> {
    if (this.archive === null) {
      const set = new Set<string>();
      for (const row of this.db.prepare("SELECT key, gz FROM idarch").iterate() as Iterable<{ key: string; gz: Buffer }>) {
        for (const id of segmentIdentities(row.key, row.gz)) set.add(id);
      }
      this.archive = set;
    }
    return this.archive;
  }

  /**
   * Events with seq > afterSeq, in order, at most `limit`. Decoded without zod: every event was
   * validated before its commit, and the copy's hash chain is verified when it is opened. A read
   * before the base throws StorageRejected `compacted`.
   */
  read(afterSeq: number, limit: number | undefined): LogEvent[] {
    this.flush();
    // The base and the rows in one read transaction, the base read again: another connection to the
    // file may have rebuilt it from a later snapshot, and a read must then be refused, not return a gap.
    const rows = this.db.transaction(() => {
      this.rereadBase();
      const base = this.base().seq;
      if (afterSeq < base && (limit === undefined || limit > 0)) {
        throw new StorageRejected(
          "compacted",
          `events up to seq ${base} were dropped from the cluster after a snapshot and this machine's copy was rebuilt without them; read from seq ${base} on, starting from latestSnapshot() (the full history is in the copy of a machine that kept up, or in an archive).`,
        );
      }
      return (
        limit === undefined
          ? this.db.prepare("SELECT seq, json FROM events WHERE seq > ? ORDER BY seq").all(afterSeq)
          : this.db.prepare("SELECT seq, json FROM events WHERE seq > ? ORDER BY seq LIMIT ?").all(afterSeq, limit)
      ) as { seq: number; json: string }[];
    })();
    return rows.map((r) => decodeOwnJson(r.seq, r.json));
  }

  /** Empties the copy (in place, so other connections to the file stay valid). */
  discard(): void {
    this.dropPending();
    this.db.transaction(() => {
      this.db.exec("DELETE FROM events; DELETE FROM batches; DELETE FROM idarch; DELETE FROM meta WHERE key NOT IN ('db_uid', 'db_name');");
    })();
    this.baseCache = null;
    this.archive = null;
  }

  /** Writes what is pending and closes the file. Idempotent; a failure to write is reported, not thrown (the cluster holds it). */
  close(): void {
    if (!this.db.open) return;
    this.flushNow();
    this.dropPending();
    this.db.close();
    this.releaseInUse();
  }
}

/** Decodes one event's JSON as this adapter wrote it (validated before its commit): shape checks, no zod. */
export function decodeOwnJson(seq: number, json: string): LogEvent {
  const e = JSON.parse(json) as NewEvent;
  return ownEvent(seq, e.identity, e.kind, e.session, e.at, e.body);
}
