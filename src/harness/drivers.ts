/**
 * The session drivers of one harness (session.ts), one per session, made on first use: waking them
 * after commits, recovery of the runs unfinished at open, holding the runs a mailbox batch starts
 * until the batch is delivered, settling and stopping them all.
 */
import type { StopReason } from "./stop.js";
import type { HarnessCore } from "./core.js";
import { SessionDriver } from "./session.js";

/** The drivers of one harness, one per session, made on first use. */
export class SessionDrivers {
  private readonly drivers = new Map<string, SessionDriver>();
  private recovery: Promise<number> | null = null;
  private resuming: Promise<{ sessions: string[]; recovered: number }> | null = null;
  /** Sessions started while a mailbox batch is delivered (see `holding`): driven when it ends. */
  private held: Set<string> | null = null;

  constructor(private readonly core: HarnessCore) {}

  /** The driver of `id`, made if needed. */
  of(id: string): SessionDriver {
    let d = this.drivers.get(id);
    if (d === undefined) {
      d = new SessionDriver(this.core, id);
      this.drivers.set(id, d);
    }
    return d;
  }

  /** Starts driving a session just created: now, or when the mailbox batch being delivered ends. */
  begin(id: string): void {
    if (this.held !== null) this.held.add(id);
    else this.of(id).wake();
  }

  /**
   * Runs `deliver` (one batch of the storage mailbox) holding the drivers of the sessions started
   * meanwhile until it ends: a run started from the mailbox gets what was posted to it before its
   * start in its first turn, instead of racing that turn's preparation (an observation committed
   * after a turn was decided arrives a round later, and blocks a conclusion until then).
   */
  async holding(deliver: () => Promise<void>): Promise<void> {
    if (this.held !== null) return deliver();
    this.held = new Set();
    try {
      await deliver();
    } finally {
      const ids = this.held;
      this.held = null;
      for (const id of ids) this.of(id).wake();
    }
  }

  /** The error that stopped `id`'s driver, if it has one and it stopped. */
  error(id: string): unknown {
    return this.drivers.get(id)?.error ?? null;
  }

  /** Wakes the drivers that exist among `ids` (a commit touched their sessions). */
  wake(ids: Iterable<string>): void {
    for (const id of ids) this.drivers.get(id)?.wake();
  }

  /**
   * Recovers the runs unfinished at open (`ids`), once per owner (survivors stopped, lost cells
   * UnknownExecution): whichever command opened the database, before anything new is launched.
   */
  recoverAll(ids: readonly string[]): Promise<number> {
    if (this.recovery === null) {
      this.recovery = (async () => {
        let n = 0;
        for (const id of ids) n += await this.of(id).recover();
        return n;
      })();
      this.recovery.catch(() => (this.recovery = null));
    }
    return this.recovery;
  }

  /**
   * Waits for `drained` (the mailbox delivered: a pause or cancel that waited for an owner applies
   * first), recovers, then schedules every unfinished run (`unfinished` lists them); `done` is told
   * once per pass. Concurrent calls share one pass; a later call recovers nothing new and schedules
   * nothing twice.
   */
  resumeAll(drained: () => Promise<void>, unfinished: () => string[], done: (r: { sessions: string[]; recovered: number }) => void): Promise<{ sessions: string[]; recovered: number }> {
    this.resuming ??= (async () => {
      await drained();
      const sessions = unfinished();
      const recovered = await this.recoverAll(sessions);
      await this.resume(unfinished());
      const r = { sessions, recovered };
      done(r);
      return r;
    })().finally(() => (this.resuming = null));
    return this.resuming;
  }

  /** Recovers every session in `ids`, then wakes each. Resolves with the number of executions recovered. */
  async resume(ids: readonly string[]): Promise<number> {
    let recovered = 0;
    for (const id of ids) recovered += await this.of(id).recover();
    for (const id of ids) this.of(id).wake();
    return recovered;
  }

  /** Resolves when no driver has anything in flight. */
  async settled(): Promise<void> {
    await Promise.all([...this.drivers.values()].map((d) => d.settled()));
  }

  async stop(reason: "shutdown" | StopReason): Promise<void> {
    await Promise.all([...this.drivers.values()].map((d) => d.stop(reason)));
  }
}
