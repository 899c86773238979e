/**
 * Helpers of the storage conformance suite: valid events, error predicates, a bounded wait, and the
 * Owner wrapper that implements "reopen after every commit" mode.
 */
import assert from "node:assert/strict";
import { hasCode } from "../../errors.js";
import { event, identity, type NewEvent } from "../../state/events.js";
import type { CommitReceipt, Database, DatabaseSignal, MailboxMessage, PostedMessage, Storage } from "../contract.js";

/** A fixed timestamp: the storage never interprets `at`. */
export const AT = "2025-01-02T03:04:05.678Z";

/** A valid session_created event. */
export function sessionCreated(session: string, goal = "make the tests pass"): NewEvent {
  return event("session_created", session, identity.session(session), AT, {
    goal,
    cwd: "/tmp/work",
    validators: [["python3", "-m", "unittest"]],
    budgets: { max_rounds: 10 },
  });
}

/** A valid inbox_received event for observation `id`, carrying `payload`. */
export function inbox(session: string, id: string, payload: unknown = { n: id }): NewEvent {
  return event("inbox_received", session, identity.inbox(session, id), AT, {
    observation: { id, source: "external", kind: "note", at: AT, payload },
  });
}

/** `count` inbox events with ids `${prefix}0`, `${prefix}1`, ... */
export function inboxBatch(session: string, prefix: string, count: number): NewEvent[] {
  return Array.from({ length: count }, (_, i) => inbox(session, `${prefix}${i}`, { i, text: `${prefix}-${i}` }));
}

/** A mailbox message. */
export function message(id: string, payload: unknown = { text: `hello ${id}` }): MailboxMessage {
  return { id, session: "s1", kind: "note", payload, at: AT };
}

/** An assert.rejects predicate: ResetError {action: "stop", reason: "fenced"}. */
export function isFenced(err: unknown): boolean {
  assert.ok(hasCode(err, "reset"), `expected a ResetError, got ${String(err)}`);
  const e = err as { action?: unknown; reason?: unknown };
  assert.equal(e.action, "stop");
  assert.equal(e.reason, "fenced");
  return true;
}

/** An assert.rejects predicate: a CairnError with `code` (and `reason`, for StorageRejected). */
export function hasError(code: string, reason?: string): (err: unknown) => boolean {
  return (err: unknown) => {
    assert.ok(err instanceof Error, `expected an Error, got ${String(err)}`);
    assert.equal((err as { code?: unknown }).code, code, `expected code ${code}, got: ${err.message}`);
    if (reason !== undefined) assert.equal((err as { reason?: unknown }).reason, reason, err.message);
    return true;
  };
}

/**
 * Waits until `done()` is true. The bound only keeps a broken adapter from hanging the run; it is
 * not a latency assertion (the contract says "within a few seconds").
 */
export async function eventually(done: () => boolean, what: string, boundMs = 15_000): Promise<void> {
  const deadline = Date.now() + boundMs;
  while (!done()) {
    if (Date.now() > deadline) assert.fail(`never happened within ${boundMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Collects a handle's watch signals. */
export function collect(db: Database): { signals: DatabaseSignal[]; stop: () => void } {
  const signals: DatabaseSignal[] = [];
  const stop = db.watch((s) => signals.push(s));
  return { signals, stop };
}

/**
 * An owner handle as a case sees it. In "reopen after every commit" mode, each resolved commit closes
 * the Database and opens it again on the same Storage, so every case also proves that nothing lives
 * only in a handle's memory.
 */
export class Owner {
  private constructor(
    private readonly storage: Storage,
    readonly name: string,
    private readonly reopen: boolean,
    public db: Database,
  ) {}

  /** Opens `name` on `storage` (creating it). */
  static async open(storage: Storage, name: string, reopen: boolean): Promise<Owner> {
    return new Owner(storage, name, reopen, await storage.open(name));
  }

  async commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    const receipt = await this.db.commit(events);
    if (this.reopen) {
      await this.db.close();
      this.db = await this.storage.open(this.name);
    }
    return receipt;
  }

  read(afterSeq?: number, limit?: number) {
    return this.db.read(afterSeq, limit);
  }

  head(): Promise<number> {
    return this.db.head();
  }

  drain(): Promise<PostedMessage[]> {
    return this.db.drain();
  }

  ack(upTo: number): Promise<void> {
    return this.db.ack(upTo);
  }

  close(): Promise<void> {
    return this.db.close();
  }
}

/** The events as the log returns them: `seq` assigned from `firstSeq`. */
export function withSeq(events: readonly NewEvent[], firstSeq: number): unknown[] {
  return events.map((e, i) => ({ ...e, seq: firstSeq + i }));
}
