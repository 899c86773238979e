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
 *
 * A process frozen (SIGSTOP) while it holds the file's write lock keeps that lock. So: the file is in
 * WAL mode, where readers never wait for a writer (a standby can always see who holds the lease and
 * that it stopped renewing); a standby asks for the write lock only once the lease is not live; and a
 * writer (or opener) refused with SQLITE_BUSY looks up the lock's holder in /proc/locks (`unstick`).
 * It is ended with SIGKILL (which releases the lock), and the write tried again, only when it is
 * stopped and: it holds the lease and has not renewed it for its length; or it only waits in the
 * queue and has missed one renewal of its place (a frozen waiter must not cost the running holder its
 * lease); or it has no row here and this process has seen it stopped with the lock, without running in
 * between, for a lease length (a connection's last close, which checkpoints under an exclusive lock;
 * an older version's rollback-journal file). A stopped process cannot act, so ending it changes
 * nothing it was doing; a running one is never ended. The database file's claim does the same with a
 * frozen owner (liveness.ts). Not covered: a process frozen by the cgroup freezer (`docker pause`)
 * is not in state T, and is left alone.
 */
import BetterSqlite3 from "better-sqlite3";
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import type { HeldLease, LeaseTicket, LeaseView, OwnerInfo, OwnerLeases } from "../../src/storage/contract.js";
import { checkDatabaseName } from "../../src/storage/semantics.js";
import { pidAlive } from "../../src/storage/pid.js";
import { isStopped, killAndWait, runMark, writeLockHolders } from "./procs.js";

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

/**
 * How long a write waits for the file's lock (better-sqlite3 is synchronous: the event loop waits
 * with it). Writes hold it for microseconds (no fsync); only a frozen holder holds it longer, and
 * that is `unstick`'s case, not a reason to wait.
 */
const BUSY_TIMEOUT_MS = 100;

function isBusy(err: unknown): boolean {
  const code = String((err as { code?: unknown }).code ?? "");
  return code.startsWith("SQLITE_BUSY") || /SQLITE_BUSY|database is locked/i.test(String((err as Error).message));
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
    try {
      prepareFile(conn);
    } catch (err) {
      conn.close();
      throw err;
    }
    return conn;
  };
  const prepareFile = (conn: BetterSqlite3.Database): void => {
    conn.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS}`);
    try {
      // Persistent once set; a file created by an older version is converted when nothing holds it.
      conn.pragma("journal_mode = WAL");
    } catch (err) {
      if (!isBusy(err)) throw err;
    }
    // No fsync: the lease is liveness, never safety (a renewal lost to a power cut makes the lease look
    // expired, and fencing still protects the log). It also keeps each write's lock to microseconds,
    // so a SIGSTOP rarely lands inside one (when it does, `unstick` ends the frozen process).
    conn.pragma("synchronous = OFF");
    conn.exec(
      "CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, since TEXT NOT NULL, epoch INTEGER, role TEXT NOT NULL, renewed_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL)",
    );
    conn.exec(
      "CREATE TABLE IF NOT EXISTS waiting (qid INTEGER PRIMARY KEY AUTOINCREMENT, token TEXT NOT NULL UNIQUE, host TEXT NOT NULL, pid INTEGER NOT NULL, renewed_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL)",
    );
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

  /**
   * Lock holders this process saw stopped ("name:pid"): since when, in which run of the process
   * (`runMark`: a process that ran in between, or a new process with a reused pid, starts the clock
   * again), and whether it was found impossible to signal (warned once).
   */
  const seenStuck = new Map<string, { first: number; mark: string | null; denied: boolean }>();
  /**
   * After SQLITE_BUSY on the lease file of `name`: ends the holder of its write lock when it is frozen
   * (see the file comment). True when one was ended: the caller may try its write again.
   */
  const unstick = async (name: string): Promise<boolean> => {
    const path = join(dir, `${name}.lease`);
    const holders = writeLockHolders(path).filter((pid) => pid !== process.pid);
    if (holders.length === 0) return false;
    let rows: { pid: number; renewed_ms: number; ttl_ms: number; waiting: number }[] = [];
    try {
      const conn = new BetterSqlite3(path, { readonly: true, fileMustExist: true, timeout: 0 });
      try {
        rows = conn.prepare<[string, string], { pid: number; renewed_ms: number; ttl_ms: number; waiting: number }>("SELECT pid, renewed_ms, ttl_ms, 0 AS waiting FROM lease WHERE host = ? UNION ALL SELECT pid, renewed_ms, ttl_ms, 1 FROM waiting WHERE host = ?").all(hostname(), hostname());
      } finally {
        conn.close();
      }
    } catch {
      // unreadable now (a rollback-mode file from an older version, locked): judged by what was seen
    }
    let ended = false;
    for (const pid of holders) {
      const key = `${name}:${pid}`;
      if (!isStopped(pid)) {
        seenStuck.delete(key);
        continue;
      }
      const own = rows.filter((r) => r.pid === pid);
      const now = Date.now();
      // A waiter's place protects nobody: a stopped waiter holding the lock (it blocks the holder's
      // renewals) is ended once it has missed one renewal of its place (a third of its lease).
      const expired = own.length > 0 && own.every((r) => now - r.renewed_ms >= (r.waiting === 1 ? Math.max(50, Math.floor(r.ttl_ms / 3)) : r.ttl_ms));
      const mark = runMark(pid);
      const prev = seenStuck.get(key);
      const same = prev !== undefined && prev.mark === mark;
      const entry = { first: same ? prev.first : performance.now(), mark, denied: same ? prev.denied : false };
      seenStuck.set(key, entry);
      const seenLong = own.length === 0 && performance.now() - entry.first >= ttlMs;
      if (!expired && !seenLong) continue;
      const why = !expired
        ? `has held the lock stopped for at least ${ttlMs} ms`
        : own.some((r) => r.waiting === 0)
          ? "has not renewed its lease for its length"
          : "has missed a renewal of its place in the queue";
      const what = `the owner lease file ${path} is write-locked by pid ${pid}, which is stopped (SIGSTOP, or under a debugger) and ${why}`;
      if (entry.denied) continue; // said once already
      process.emitWarning(`${what}: ending it with SIGKILL so that its lock is released`, "CairnFrozenLeaseHolder");
      if (!(await killAndWait(pid))) {
        process.emitWarning(`pid ${pid} may not be signalled by this process (EPERM): thaw it or end it by hand; the lease file stays locked until then`, "CairnFrozenLeaseHolder");
        entry.denied = true;
        continue;
      }
      seenStuck.delete(key);
      ended = true;
    }
    return ended;
  };
  /** Runs the write `fn`; when it is refused as busy and `unstick` ended the lock's frozen holder, runs it once more. */
  const writing = async <T>(name: string, fn: () => T): Promise<T> => {
    try {
      return fn();
    } catch (err) {
      if (!isBusy(err) || !(await unstick(name))) throw err;
      return fn();
    }
  };
  /**
   * `openFile`, through `writing`: opening reads the schema, which a stopped process holding the
   * file's EXCLUSIVE lock refuses too (a rollback-journal file of an older version inside a commit,
   * or, in WAL mode, the last connection's checkpoint at close).
   */
  const opening = async (name: string): Promise<BetterSqlite3.Database> => await writing(name, () => openFile(name));
  /**
   * For the renewals of tickets and held leases: a busy file is retried at the next tick, or at once
   * (`retry`) when `unstick` ended a frozen lock holder.
   */
  const onBusy = (name: string) => (retry: () => void): void =>
    void unstick(name).then((ended) => ended && retry(), () => undefined);

  return {
    ttlMs,

    async read(name: string): Promise<LeaseView | null> {
      checkDatabaseName(name);
      if (!existsSync(join(dir, `${name}.lease`))) return null; // a read never creates files
      const conn = await opening(name);
      try {
        const row = current(conn);
        return row === undefined ? null : view(row, Date.now());
      } finally {
        conn.close();
      }
    },

    async acquire(name: string, owner: OwnerInfo, options: { readonly force?: boolean; readonly ticket?: LeaseTicket } = {}): Promise<HeldLease | null> {
      const conn = await opening(name);
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
        // A live holder is seen by a read (never blocked in WAL mode): no write lock is asked for
        // while the holder renews, so a holder frozen inside a renewal blocks nobody until it expires.
        const row = options.force === true ? undefined : current(conn);
        taken = row !== undefined && isLive(row, Date.now()) ? false : await writing(name, () => take.immediate());
      } catch (err) {
        conn.close();
        throw err;
      }
      if (!taken) {
        conn.close();
        return null;
      }
      if (ticket) await ticket.withdraw();
      return new SqliteHeldLease(conn, token, ttlMs, onBusy(name));
    },

    async enqueue(name: string, owner: OwnerInfo): Promise<LeaseTicket> {
      const conn = await opening(name);
      const token = randomUUID();
      try {
        await writing(name, () => conn.prepare("INSERT INTO waiting (token, host, pid, renewed_ms, ttl_ms) VALUES (?, ?, ?, ?, ?)").run(token, owner.host, owner.pid, Date.now(), ttlMs));
      } catch (err) {
        conn.close();
        throw err;
      }
      return new SqliteTicket(conn, token, ttlMs, onBusy(name));
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
    onBusy: (retry: () => void) => void,
  ) {
    const renew = (): void => {
      if (this.timer === null) return;
      try {
        this.conn.prepare("UPDATE waiting SET renewed_ms = ? WHERE token = ?").run(Date.now(), this.token);
      } catch (err) {
        // busy: the next tick renews (the row lasts three ticks); a frozen lock holder is ended first
        if (isBusy(err)) onBusy(() => undefined);
      }
    };
    this.timer = setInterval(renew, Math.max(50, Math.floor(ttlMs / 3)));
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
  /** The owner's epoch once known (`update`), written with every renewal. */
  private epoch: number | null = null;

  constructor(
    private readonly conn: BetterSqlite3.Database,
    private readonly token: string,
    ttlMs: number,
    private readonly onBusy: (retry: () => void) => void,
  ) {
    this.timer = setInterval(() => this.renew(), Math.max(50, Math.floor(ttlMs / 3)));
    this.timer.unref();
  }

  private renew(): void {
    if (this.released || this.lost !== null) return;
    try {
      const r = this.conn.prepare("UPDATE lease SET renewed_ms = ?, epoch = COALESCE(?, epoch) WHERE id = 1 AND token = ?").run(Date.now(), this.epoch, this.token);
      if (r.changes === 0) this.lose("another process took the lease over");
    } catch (err) {
      // A busy lease file is retried at the next tick (the lease lasts three ticks); a frozen lock holder is ended first.
      if (isBusy(err)) this.onBusy(() => this.renew());
      else this.lose(`renewing failed: ${(err as Error).message}`);
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
    this.epoch = epoch;
    try {
      const r = this.conn.prepare("UPDATE lease SET epoch = ?, renewed_ms = ? WHERE id = 1 AND token = ?").run(epoch, Date.now(), this.token);
      if (r.changes === 0) this.lose("another process took the lease over");
    } catch (err) {
      // Busy: the next renewal writes the epoch (it is shown to standbys, never relied on).
      if (!isBusy(err)) throw err;
      this.onBusy(() => this.renew());
    }
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
