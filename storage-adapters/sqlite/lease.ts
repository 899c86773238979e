/**
 * Owner leases of the sqlite adapter (liveness for standby workers, never safety: the owner epoch in
 * the database file fences, as before). One small SQLite file per database,
 * `<dataDir>/leases/<name>.lease`, holding one row: who holds the lease, and when it last renewed it.
 *
 * Every process sharing a sqlite data directory runs on one host, so the renewal times compare on one
 * clock (wall time; a clock step shorter than the lease costs nothing, a longer one can make a standby
 * wait or take over early, and fencing still keeps the log safe). The holder renews the row itself
 * every third of the lease, so a hung or SIGSTOPped holder loses it. A holder on this host whose
 * process is gone (its pid no longer exists) costs no wait.
 *
 * Waiters queue in the same file (`waiting`, ordered by arrival), each renewing its own row; a free
 * lease goes to the oldest live waiter, so a worker restarted by its scheduler queues behind the
 * standby that waited longer. A waiter whose row stopped renewing (dead, frozen) drops out.
 */
import BetterSqlite3 from "better-sqlite3";
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import type { HeldLease, LeaseTicket, LeaseView, OwnerInfo, OwnerLeases } from "../../src/storage/contract.js";
import { checkDatabaseName } from "../../src/storage/semantics.js";

interface Row {
  token: string;
  host: string;
  pid: number;
  since: string;
  epoch: number | null;
  role: string;
  renewed_ms: number;
  ttl_ms: number;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

function isLive(row: Pick<Row, "host" | "pid" | "renewed_ms" | "ttl_ms">, now: number): boolean {
  if (now - row.renewed_ms >= row.ttl_ms) return false;
  if (row.host === hostname() && !pidAlive(row.pid)) return false;
  return true;
}

const view = (row: Row, now: number): LeaseView => ({
  owner: { host: row.host, pid: row.pid, since: row.since, epoch: row.epoch, role: row.role },
  live: isLive(row, now),
});

/** Leases for the databases in `dataDir`, each `ttlMs` long. */
export function sqliteLeases(dataDir: string, ttlMs: number): OwnerLeases {
  const dir = join(dataDir, "leases");
  const openFile = (name: string): BetterSqlite3.Database => {
    checkDatabaseName(name);
    mkdirSync(dir, { recursive: true });
    const conn = new BetterSqlite3(join(dir, `${name}.lease`));
    conn.pragma("busy_timeout = 5000");
    // No fsync: the lease is liveness, never safety (a renewal lost to a power cut makes the lease look
    // expired, and fencing still protects the log). It also keeps each write's exclusive lock to
    // microseconds: a holder SIGSTOPped while it holds that lock blocks every reader of this file
    // until it is thawed or killed, and with an fsync in the commit that window was milliseconds long
    // (a standby once waited on it for 90 s in chaos/sched.test.ts).
    conn.pragma("synchronous = OFF");
    conn.exec(
      "CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, since TEXT NOT NULL, epoch INTEGER, role TEXT NOT NULL, renewed_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL)",
    );
    conn.exec(
      "CREATE TABLE IF NOT EXISTS waiting (qid INTEGER PRIMARY KEY AUTOINCREMENT, token TEXT NOT NULL UNIQUE, host TEXT NOT NULL, pid INTEGER NOT NULL, renewed_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL)",
    );
    return conn;
  };
  /** The token of the oldest live waiter (dead ones are removed on the way), or undefined. */
  const oldestWaiter = (conn: BetterSqlite3.Database, now: number): string | undefined => {
    const rows = conn.prepare<[], { qid: number; token: string; host: string; pid: number; renewed_ms: number; ttl_ms: number }>("SELECT qid, token, host, pid, renewed_ms, ttl_ms FROM waiting ORDER BY qid").all();
    for (const w of rows) {
      if (isLive(w, now)) return w.token;
      conn.prepare("DELETE FROM waiting WHERE qid = ?").run(w.qid);
    }
    return undefined;
  };
  const current = (conn: BetterSqlite3.Database): Row | undefined => conn.prepare<[], Row>("SELECT token, host, pid, since, epoch, role, renewed_ms, ttl_ms FROM lease WHERE id = 1").get();

  return {
    ttlMs,

    async read(name: string): Promise<LeaseView | null> {
      checkDatabaseName(name);
      if (!existsSync(join(dir, `${name}.lease`))) return null; // a read never creates files
      const conn = openFile(name);
      try {
        const row = current(conn);
        return row === undefined ? null : view(row, Date.now());
      } finally {
        conn.close();
      }
    },

    async acquire(name: string, owner: OwnerInfo, options: { readonly force?: boolean; readonly ticket?: LeaseTicket } = {}): Promise<HeldLease | null> {
      const conn = openFile(name);
      const token = randomUUID();
      const ticket = options.ticket instanceof SqliteTicket ? options.ticket : undefined;
      const take = conn.transaction((): boolean => {
        const row = current(conn);
        const now = Date.now();
        if (options.force !== true) {
          if (row !== undefined && isLive(row, now)) return false;
          const first = oldestWaiter(conn, now);
          if (first !== undefined && first !== ticket?.token) return false;
        }
        if (ticket) conn.prepare("DELETE FROM waiting WHERE token = ?").run(ticket.token);
        conn
          .prepare("INSERT OR REPLACE INTO lease (id, token, host, pid, since, epoch, role, renewed_ms, ttl_ms) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)")
          .run(token, owner.host, owner.pid, owner.since, owner.epoch, owner.role, Date.now(), ttlMs);
        return true;
      });
      let taken: boolean;
      try {
        taken = take.immediate();
      } catch (err) {
        conn.close();
        throw err;
      }
      if (!taken) {
        conn.close();
        return null;
      }
      if (ticket) await ticket.withdraw();
      return new SqliteHeldLease(conn, token, ttlMs);
    },

    async enqueue(name: string, owner: OwnerInfo): Promise<LeaseTicket> {
      const conn = openFile(name);
      const token = randomUUID();
      try {
        conn.prepare("INSERT INTO waiting (token, host, pid, renewed_ms, ttl_ms) VALUES (?, ?, ?, ?, ?)").run(token, owner.host, owner.pid, Date.now(), ttlMs);
      } catch (err) {
        conn.close();
        throw err;
      }
      return new SqliteTicket(conn, token, ttlMs);
    },
  };
}

/** This process's row in the waiters' queue, renewed every third of the lease until withdrawn. */
class SqliteTicket implements LeaseTicket {
  private timer: NodeJS.Timeout | null;

  constructor(
    private readonly conn: BetterSqlite3.Database,
    readonly token: string,
    ttlMs: number,
  ) {
    this.timer = setInterval(() => {
      try {
        this.conn.prepare("UPDATE waiting SET renewed_ms = ? WHERE token = ?").run(Date.now(), this.token);
      } catch {
        // busy: the next tick renews; the row lasts three ticks
      }
    }, Math.max(50, Math.floor(ttlMs / 3)));
    this.timer.unref();
  }

  async withdraw(): Promise<void> {
    if (this.timer === null) return;
    clearInterval(this.timer);
    this.timer = null;
    try {
      this.conn.prepare("DELETE FROM waiting WHERE token = ?").run(this.token);
    } catch {
      // left behind: it drops out after the lease length
    } finally {
      this.conn.close();
    }
  }
}

class SqliteHeldLease implements HeldLease {
  private readonly listeners: ((why: string) => void)[] = [];
  private timer: NodeJS.Timeout | null;
  private lost: string | null = null;
  private released = false;

  constructor(
    private readonly conn: BetterSqlite3.Database,
    private readonly token: string,
    ttlMs: number,
  ) {
    this.timer = setInterval(() => this.renew(), Math.max(50, Math.floor(ttlMs / 3)));
    this.timer.unref();
  }

  private renew(): void {
    if (this.released || this.lost !== null) return;
    try {
      const r = this.conn.prepare("UPDATE lease SET renewed_ms = ? WHERE id = 1 AND token = ?").run(Date.now(), this.token);
      if (r.changes === 0) this.lose("another process took the lease over");
    } catch (err) {
      // A busy lease file is retried at the next tick; the lease lasts three ticks.
      if (!/SQLITE_BUSY|locked/i.test(String((err as Error).message))) this.lose(`renewing failed: ${(err as Error).message}`);
    }
  }

  private lose(why: string): void {
    if (this.lost !== null) return;
    this.lost = why;
    this.stopTimer();
    for (const l of this.listeners) l(why);
  }

  private stopTimer(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  async update(epoch: number): Promise<void> {
    if (this.released) return;
    const r = this.conn.prepare("UPDATE lease SET epoch = ?, renewed_ms = ? WHERE id = 1 AND token = ?").run(epoch, Date.now(), this.token);
    if (r.changes === 0) this.lose("another process took the lease over");
  }

  onLost(listener: (why: string) => void): void {
    if (this.lost !== null) listener(this.lost);
    else this.listeners.push(listener);
  }

  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    this.stopTimer();
    try {
      this.conn.prepare("DELETE FROM lease WHERE id = 1 AND token = ?").run(this.token);
    } catch {
      // Not released: it expires after its length, as if the holder had died.
    } finally {
      this.conn.close();
    }
  }
}
