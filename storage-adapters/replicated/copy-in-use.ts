/**
 * The in-use lock of a local copy (local-copy.ts): a shared lock on a file beside the copy that says
 * an owner has the copy open. It is a read transaction in rollback-journal mode, so the operating
 * system drops it when the process dies; several owners of the same database may hold it at once (a
 * fenced one and its successor), and `whileUnused` runs only while none does.
 */
import Database from "better-sqlite3";

/** The file beside a copy whose shared lock says an owner has the copy open. */
export function inUsePath(copyPath: string): string {
  return `${copyPath}-inuse`;
}

export class InUseLock {
  /** The read transaction on the in-use file while held, or null. */
  private lock: Database.Database | null = null;

  constructor(private readonly copyPath: string) {}

  /** Takes the shared lock (idempotent); released by `release` and when the process dies. */
  hold(): void {
    if (this.lock !== null) return;
    const lock = new Database(inUsePath(this.copyPath));
    try {
      lock.pragma("journal_mode = DELETE");
      lock.pragma("busy_timeout = 5000");
      lock.exec("BEGIN");
      lock.prepare("SELECT count(*) FROM sqlite_master").get();
    } catch (err) {
      lock.close();
      throw err;
    }
    this.lock = lock;
  }

  release(): void {
    this.lock?.close();
    this.lock = null;
  }

  /** Runs `f` while no process holds the lock; returns false, without running it, when one does. */
  whileUnused(f: () => void): boolean {
    const probe = new Database(inUsePath(this.copyPath));
    try {
      probe.pragma("busy_timeout = 0");
      try {
        probe.exec("BEGIN EXCLUSIVE");
      } catch (err) {
        if ((err as { code?: unknown }).code === "SQLITE_BUSY") return false;
        throw err;
      }
      try {
        f();
      } finally {
        probe.exec("ROLLBACK");
      }
      return true;
    } finally {
      probe.close();
    }
  }
}
