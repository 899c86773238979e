/**
 * A ledger of commits made under faults, and its check against the log a fresh reader sees: every
 * acknowledged commit exactly once at its receipt's seqs, in call order; nothing refused as "nothing
 * was written" in the log; a commit of unknown outcome (StorageFailure) whole or absent; nothing in
 * the log that no commit sent. Used by the tests of member faults and lost answers.
 */
import assert from "node:assert/strict";
import { event, type LogEvent, type NewEvent } from "../../src/state/events.js";
import type { CommitReceipt, Database, Storage } from "../../src/storage/contract.js";
import { ResetError, StorageFailure } from "../../src/storage/errors.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { AT, ev } from "./helpers.js";

/** An event carrying `data` (execution_output has no size limit of its own). */
export const out = (id: string, data: string): NewEvent => event("execution_output", "s1", id, AT, { cell_id: 1, n: 0, stream: "stdout", data });

interface Attempt {
  readonly db: string;
  readonly ids: readonly string[];
  /** The handle's epoch (one handle per open). */
  readonly epoch: number;
  /** Call order on that handle. */
  readonly order: number;
  outcome: "pending" | "acked" | "failed";
  receipt?: CommitReceipt;
  error?: unknown;
}

export class Ledger {
  readonly attempts: Attempt[] = [];
  private orders = 0;

  commit(db: Database, ids: readonly string[], events: readonly NewEvent[] = ids.map((id) => ev(id))): Promise<void> {
    const a: Attempt = { db: db.name, ids, epoch: db.epoch, order: this.orders++, outcome: "pending" };
    this.attempts.push(a);
    return db.commit(events).then(
      (r) => {
        a.outcome = "acked";
        a.receipt = r;
      },
      (err: unknown) => {
        a.outcome = "failed";
        a.error = err;
      },
    );
  }

  acked(db?: string): number {
    return this.attempts.filter((a) => a.outcome === "acked" && (db === undefined || a.db === db)).length;
  }

  /** The failed attempts whose error is not StorageFailure (outcome unknown): refusals. */
  refused(): Attempt[] {
    return this.attempts.filter((a) => a.outcome === "failed" && !(a.error instanceof StorageFailure));
  }

  summary(): string {
    const failed = this.attempts.filter((a) => a.outcome === "failed");
    const kinds = new Map<string, number>();
    for (const a of failed) {
      const k = `${(a.error as Error)?.name}: ${String((a.error as Error)?.message).slice(0, 140)}`;
      kinds.set(k, (kinds.get(k) ?? 0) + 1);
    }
    return `${this.acked()} acked, ${failed.length} failed ${JSON.stringify([...kinds])}`;
  }
}

/** The whole log of `name` as a brand-new machine reads it (its own dataDir). */
export async function freshLog(endpoints: readonly string[], dataDir: string, name: string): Promise<LogEvent[]> {
  const s = createReplicatedStorage({ endpoints, dataDir });
  try {
    const r = await s.reader(name);
    return await r.read();
  } finally {
    await s.close();
  }
}

/**
 * Checks `log` against the ledger's commits to `name` (see the file comment). Returns how many
 * StorageFailure commits turned out durable / not.
 */
export function checkLog(name: string, log: readonly LogEvent[], ledger: Ledger): { unknownIn: number; unknownOut: number } {
  const where = new Map<string, number>();
  log.forEach((e, i) => {
    assert.equal(e.seq, i + 1, `${name}: seqs are contiguous from 1`);
    assert.ok(!where.has(e.identity), `${name}: identity ${e.identity} is in the log twice (seqs ${where.get(e.identity)} and ${e.seq})`);
    where.set(e.identity, e.seq);
  });
  const mine = ledger.attempts.filter((a) => a.db === name);
  const sent = new Set(mine.flatMap((a) => a.ids));
  for (const e of log) assert.ok(sent.has(e.identity), `${name}: ${e.identity} at seq ${e.seq} was never committed`);
  let unknownIn = 0;
  let unknownOut = 0;
  for (const a of mine) {
    assert.notEqual(a.outcome, "pending", `${name}: a commit of ${a.ids.join(",")} never settled`);
    if (a.outcome === "acked") {
      const r = a.receipt!;
      assert.equal(r.lastSeq - r.firstSeq + 1, a.ids.length, `${name}: the receipt of ${a.ids[0]} spans its events`);
      a.ids.forEach((id, k) => assert.equal(where.get(id), r.firstSeq + k, `${name}: acknowledged ${id} (receipt ${JSON.stringify(r)}) is at seq ${where.get(id)} in the log`));
      continue;
    }
    const present = a.ids.filter((id) => where.has(id));
    if (a.error instanceof StorageFailure) {
      assert.ok(present.length === 0 || present.length === a.ids.length, `${name}: a commit is in the log in part: ${present.join(",")}`);
      if (present.length > 0) unknownIn++;
      else unknownOut++;
    } else {
      assert.deepEqual(present, [], `${name}: a commit refused with ${(a.error as Error)?.name} ("${(a.error as Error)?.message}") is in the log`);
    }
  }
  // Per handle, acknowledged commits in call order; later handles after earlier ones.
  const acked = mine.filter((a) => a.outcome === "acked").sort((x, y) => x.epoch - y.epoch || x.order - y.order);
  for (let i = 1; i < acked.length; i++) {
    assert.ok(acked[i]!.receipt!.firstSeq > acked[i - 1]!.receipt!.lastSeq, `${name}: ${acked[i]!.ids[0]} (epoch ${acked[i]!.epoch}, call ${acked[i]!.order}) is before ${acked[i - 1]!.ids[0]} in the log`);
  }
  return { unknownIn, unknownOut };
}

/**
 * Commits to `name` until `stop()`, `concurrency` commits at a time (1..3 events each, so groups
 * form), reopening the database when a handle is poisoned or fenced, as its owner would. Failed
 * opens go to `problems`.
 */
export async function worker(storage: Storage, name: string, ledger: Ledger, stop: () => boolean, concurrency: number, problems: unknown[]): Promise<void> {
  let db: Database | null = null;
  let n = 0;
  while (!stop()) {
    if (db === null) {
      try {
        db = await storage.open(name);
      } catch (err) {
        problems.push(err);
        await new Promise((r) => setTimeout(r, 200));
        continue;
      }
    }
    const handle: Database = db;
    const batch = Array.from({ length: concurrency }, () => {
      const size = 1 + (n % 3);
      const ids = Array.from({ length: size }, () => `${name}-${n++}`);
      return ledger.commit(handle, ids);
    });
    await Promise.all(batch);
    const last = ledger.attempts.filter((a) => a.db === name).slice(-concurrency);
    if (last.some((a) => a.error instanceof StorageFailure || a.error instanceof ResetError)) {
      await handle.close().catch(() => undefined);
      db = null;
    }
  }
  await db?.close().catch(() => undefined);
}
