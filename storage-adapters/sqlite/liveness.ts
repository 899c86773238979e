/**
 * The owner's lease on sqlite: a heartbeat row per owner epoch, on one machine's clock.
 * Liveness only: fencing stays the owner epoch checked inside every transaction.
 *
 * - The claim inserts this owner's row in `lease` (epoch, host, pid, renewed_at, ttl_ms) and reads the
 *   rows of earlier owners not yet released: `previousGone()` waits until each is released (clean
 *   close, or stopped its cells after a fence), stale (no heartbeat for its ttl), or its process on
 *   this host is gone.
 * - Heartbeats go through a second connection with no busy timeout (better-sqlite3 is synchronous: a
 *   busy wait would freeze the event loop), every ttl/4, without fsync. No heartbeat written for ttl - margin:
 *   `onLost` fires (the harness kills its cells and stops).
 * - A frozen owner (SIGSTOP) inside its write transaction keeps SQLite's write lock, so the next
 *   opener's claim gets SQLITE_BUSY. `endFrozenOwner` decides, on the same host only: the owner row's
 *   process is stopped (state T in /proc) and its heartbeat is older than its lease, so it cannot be
 *   acting (a stopped process runs nothing) and could not have renewed: it is SIGKILLed, which
 *   releases its lock, and the claim is retried. Last opener wins, as on every other adapter.
 */
import BetterSqlite3 from "better-sqlite3";
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import type { OwnershipLease } from "../../src/storage/contract.js";
import type { Connection } from "./connection.js";
import { pidAlive } from "../../src/storage/pid.js";
import { isStopped, killAndWait } from "./procs.js";

export const DEFAULT_LEASE_MS = 3000;

/** The table, created with the rest of the schema (IF NOT EXISTS: older files gain it). */
export const LEASE_SCHEMA = `
CREATE TABLE IF NOT EXISTS lease (
  epoch INTEGER PRIMARY KEY,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  renewed_at INTEGER NOT NULL,
  ttl_ms INTEGER NOT NULL,
  released INTEGER NOT NULL DEFAULT 0
);`;

interface LeaseRow {
  epoch: number;
  host: string;
  pid: number;
  renewed_at: number;
  ttl_ms: number;
  released: number;
}

const margin = (ttlMs: number) => Math.max(500, Math.round(ttlMs / 4));

/** Inside the claim transaction: records this owner's lease, returns earlier owners' unreleased ones. */
export function recordLease(conn: Connection, epoch: number, ttlMs: number): LeaseRow[] {
  conn.exec(LEASE_SCHEMA);
  const earlier = conn.prepare<[number], LeaseRow>("SELECT epoch, host, pid, renewed_at, ttl_ms, released FROM lease WHERE epoch < ? AND released = 0").all(epoch);
  conn.prepare("INSERT OR REPLACE INTO lease (epoch, host, pid, renewed_at, ttl_ms, released) VALUES (?, ?, ?, ?, ?, 0)").run(epoch, hostname(), process.pid, Date.now(), ttlMs);
  return earlier;
}

/**
 * After SQLITE_BUSY on a claim: ends the owner if it is frozen on this host with its lease expired
 * (see the file comment). Returns a description of what was done, or null when nothing may be done
 * (another host, a running process, a fresh heartbeat): the caller reports the busy database.
 */
export async function endFrozenOwner(path: string, log: (msg: string) => void): Promise<string | null> {
  let conn: Connection | null = null;
  let owner: { host: string | null; pid: number | null; epoch: number } | undefined;
  let lease: LeaseRow | undefined;
  try {
    conn = new BetterSqlite3(path, { readonly: true, fileMustExist: true });
    owner = conn.prepare<[], { host: string | null; pid: number | null; epoch: number }>("SELECT host, pid, epoch FROM owner WHERE id = 1").get();
    const hasLease = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'lease'").get() !== undefined;
    if (owner && hasLease) lease = conn.prepare<[number], LeaseRow>("SELECT epoch, host, pid, renewed_at, ttl_ms, released FROM lease WHERE epoch = ?").get(owner.epoch);
  } catch {
    return null;
  } finally {
    conn?.close();
  }
  if (!owner || owner.host !== hostname() || owner.pid === null || owner.pid === process.pid) return null;
  const pid = owner.pid;
  if (!isStopped(pid)) return null;
  const age = lease ? Date.now() - lease.renewed_at : Number.POSITIVE_INFINITY;
  const ttl = lease?.ttl_ms ?? DEFAULT_LEASE_MS;
  if (age <= ttl) return null;
  log(`the owner of ${path} (pid ${pid}, epoch ${owner.epoch}) is stopped (SIGSTOP) inside its write transaction and its lease expired ${Math.round(age - ttl)} ms ago: ending it with SIGKILL so that its lock is released`);
  await killAndWait(pid);
  return `ended the frozen owner pid ${pid} (epoch ${owner.epoch})`;
}

/** The lease of an owned sqlite handle. */
export class SqliteLease implements OwnershipLease {
  private heart: Connection | null;
  private timer: NodeJS.Timeout | null = null;
  private lastOk = performance.now();
  private lost: string | null = null;
  private stopped = false;
  private fenced = false;
  private released = false;
  private readonly listeners = new Set<(reason: string) => void>();
  private previous: Promise<void> | null = null;

  constructor(
    path: string,
    private readonly epoch: number,
    readonly ttlMs: number,
    private readonly earlier: readonly LeaseRow[],
  ) {
    this.heart = new BetterSqlite3(path, { fileMustExist: true, timeout: 0 });
    this.heart.pragma("busy_timeout = 0");
    // A heartbeat need not survive a power loss (its writer would not either): no fsync for it.
    this.heart.pragma("synchronous = OFF");
    this.timer = setInterval(() => this.beat(), Math.max(100, Math.round(ttlMs / 4)));
    this.timer.unref();
  }

  private beat(): void {
    if (this.stopped || this.heart === null) return;
    if (!this.fenced) {
      try {
        // Only while this handle still owns the database: a fenced owner's heartbeat stops by itself.
        const r = this.heart.prepare("UPDATE lease SET renewed_at = ? WHERE epoch = ? AND released = 0 AND (SELECT epoch FROM owner WHERE id = 1) = ?").run(Date.now(), this.epoch, this.epoch);
        if (r.changes === 1) this.lastOk = performance.now();
        else this.fenced = true;
      } catch {
        // busy (another writer holds the lock) or unwritable: checked below
      }
    }
    if (performance.now() - this.lastOk > this.ttlMs - margin(this.ttlMs)) this.markLost(`no heartbeat written for ${Math.round(performance.now() - this.lastOk)} ms (lease ${this.ttlMs} ms)`);
  }

  private markLost(reason: string): void {
    if (this.lost !== null || this.released) return;
    this.lost = reason;
    this.halt();
    for (const l of [...this.listeners]) {
      try {
        l(reason);
      } catch {
        // a listener's own bug must not stop the others
      }
    }
  }

  private halt(): void {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** Fenced: no right to the lease any more. The loss still fires when it runs out (cells are killed then at the latest). */
  stopRenewing(): void {
    this.fenced = true;
  }

  onLost(listener: (reason: string) => void): () => void {
    if (this.lost !== null) {
      queueMicrotask(() => listener(this.lost!));
      return () => {};
    }
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  held(): boolean {
    return this.lost === null && !this.released && !this.stopped && !this.fenced;
  }

  remainingMs(): number {
    if (this.lost !== null || this.released) return 0;
    return Math.max(0, this.lastOk + this.ttlMs - margin(this.ttlMs) - performance.now());
  }

  previousGone(): Promise<void> {
    this.previous ??= this.waitPrevious();
    return this.previous;
  }

  private async waitPrevious(): Promise<void> {
    const host = hostname();
    for (const row of this.earlier) {
      for (;;) {
        if (this.released || this.heart === null) return;
        if (row.host === host && row.pid !== process.pid && !pidAlive(row.pid)) break;
        let now: LeaseRow | undefined;
        try {
          now = this.heart.prepare<[number], LeaseRow>("SELECT epoch, host, pid, renewed_at, ttl_ms, released FROM lease WHERE epoch = ?").get(row.epoch);
        } catch {
          now = row; // busy: read again
        }
        if (now === undefined || now.released === 1 || Date.now() - now.renewed_at > now.ttl_ms) break;
        await sleep(100);
      }
    }
    // Forget what is gone (best effort: the next owner would find them gone too).
    try {
      this.heart?.prepare("DELETE FROM lease WHERE epoch < ?").run(this.epoch);
    } catch {
      // busy: left for the next owner
    }
  }

  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    this.halt();
    const heart = this.heart;
    this.heart = null;
    if (heart === null) return;
    for (let i = 0; i < 20; i++) {
      try {
        heart.prepare("UPDATE lease SET released = 1 WHERE epoch = ?").run(this.epoch);
        break;
      } catch {
        await sleep(50);
      }
    }
    heart.close();
  }
}
