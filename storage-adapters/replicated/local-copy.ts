/**
 * The local copy of a replicated database: a SQLite file per database under `dataDir` that mirrors
 * the cluster's log. It is a cache, never the truth: WAL with synchronous=NORMAL is enough, because
 * at every open it is checked against the cluster (hash chain) and rebuilt or caught up from it.
 *
 * Tables: `batches(first, last, epoch, token, hash)` and `events(seq, identity UNIQUE, json)`; a
 * batch's events JSON is `[` + the events' json joined by `,` + `]`, exactly the bytes the cluster's
 * record holds, so the hash chain can be recomputed locally.
 */
import Database from "better-sqlite3";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { parseLogEvent, type LogEvent, type NewEvent } from "../../src/state/events.js";
import { GENESIS_HASH, chainHash, type BatchRecord } from "./layout.js";

/** The path of the local copy of database `name` under `dataDir`. */
export function localCopyPath(dataDir: string, name: string): string {
  return join(dataDir, `${name}.replica.sqlite`);
}

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
  private readonly stmt: {
    head: Database.Statement;
    hasIdentity: Database.Statement;
    insertBatch: Database.Statement;
    insertEvent: Database.Statement;
  };

  /** Opens (creating when missing) the local copy at `path`. */
  constructor(readonly path: string) {
    mkdirSync(join(path, ".."), { recursive: true });
    this.db = new Database(path);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = NORMAL");
    this.db.pragma("busy_timeout = 5000");
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS batches (first INTEGER PRIMARY KEY, last INTEGER NOT NULL, epoch INTEGER NOT NULL, token TEXT NOT NULL, hash TEXT NOT NULL);
      CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, identity TEXT NOT NULL UNIQUE, json TEXT NOT NULL);
    `);
    this.stmt = {
      head: this.db.prepare("SELECT MAX(seq) AS h FROM events"),
      hasIdentity: this.db.prepare("SELECT 1 FROM events WHERE identity = ?"),
      insertBatch: this.db.prepare("INSERT INTO batches (first, last, epoch, token, hash) VALUES (?, ?, ?, ?, ?)"),
      insertEvent: this.db.prepare("INSERT INTO events (seq, identity, json) VALUES (?, ?, ?)"),
    };
  }

  /** The highest seq held locally (0 when empty). */
  head(): number {
    const row = this.stmt.head.get() as { h: number | null };
    return row.h ?? 0;
  }

  /** The last batch held locally, or null. */
  lastBatch(): LocalBatch | null {
    return (this.db.prepare("SELECT first, last, hash FROM batches ORDER BY first DESC LIMIT 1").get() as LocalBatch | undefined) ?? null;
  }

  /**
   * Recomputes the hash chain over every local batch. Returns null when the copy is internally
   * consistent, else a sentence saying where it is not (a corrupted, missing or extra entry).
   */
  verify(): string | null {
    const batches = this.db.prepare("SELECT first, last, hash FROM batches ORDER BY first").iterate() as Iterable<LocalBatch>;
    const eventsOf = this.db.prepare("SELECT seq, json FROM events WHERE seq BETWEEN ? AND ? ORDER BY seq");
    let prev = GENESIS_HASH;
    let expectFirst = 1;
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
    if (first === 1) return GENESIS_HASH;
    const row = this.db.prepare("SELECT hash FROM batches WHERE last = ?").get(first - 1) as { hash: string } | undefined;
    if (!row) throw new Error(`the local copy has no batch ending at seq ${first - 1}`);
    return row.hash;
  }

  /**
   * Appends committed batches in one SQLite transaction, skipping those already held (another handle
   * on the same file may have caught up first). Batches must follow the local head.
   */
  append(records: readonly BatchRecord[]): void {
    const { insertBatch, insertEvent } = this.stmt;
    this.db.transaction(() => {
      let head = this.head();
      for (const r of records) {
        const h = r.header;
        if (h.last <= head) continue;
        if (h.first !== head + 1) throw new Error(`cannot append batch ${h.first}..${h.last} to a local copy at seq ${head}`);
        const { events, jsons } = splitEvents(r.eventsJson);
        if (events.length !== h.last - h.first + 1) throw new Error(`batch ${h.first}..${h.last} holds ${events.length} events`);
        insertBatch.run(h.first, h.last, h.epoch, h.token, h.hash);
        events.forEach((e, i) => insertEvent.run(h.first + i, e.identity, jsons[i]!));
        head = h.last;
      }
    })();
  }

  /** Of `identities`, those already in the local copy. */
  existing(identities: readonly string[]): string[] {
    return identities.filter((id) => this.stmt.hasIdentity.get(id) !== undefined);
  }

  /** Events with seq > afterSeq, in order, at most `limit`; validated as they are read. */
  read(afterSeq: number, limit: number | undefined): LogEvent[] {
    const rows = (
      limit === undefined
        ? this.db.prepare("SELECT seq, json FROM events WHERE seq > ? ORDER BY seq").all(afterSeq)
        : this.db.prepare("SELECT seq, json FROM events WHERE seq > ? ORDER BY seq LIMIT ?").all(afterSeq, limit)
    ) as { seq: number; json: string }[];
    return rows.map((r) => parseLogEvent({ ...(JSON.parse(r.json) as NewEvent), seq: r.seq }));
  }

  /** Empties the copy (in place, so other connections to the file stay valid). */
  discard(): void {
    this.db.transaction(() => {
      this.db.exec("DELETE FROM events; DELETE FROM batches;");
    })();
  }

  /** Closes the file. Idempotent. */
  close(): void {
    if (this.db.open) this.db.close();
  }
}
