/**
 * The harness's commit path (src/harness/committer.ts) against a Database whose commits resolve when
 * the test says so: how many batches are in flight per adapter kind, folding strictly in seq order
 * whatever order receipts arrive in, owner claims never left out when a claiming batch is refused,
 * a receipt gap filled by reading the log, and close waiting for what is in flight.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Committer } from "../../src/harness/committer.js";
import { event, identity, type LogEvent, type NewEvent } from "../../src/state/events.js";
import { sessionCreated } from "../../src/state/outcomes.js";
import { Reducer } from "../../src/state/reducer.js";
import type { CommitReceipt, Database } from "../../src/storage/contract.js";
import { StorageRejected } from "../../src/storage/errors.js";

const AT = "2026-12-04T00:00:00.000Z";
const OWNER = { epoch: 7, host: "h", boot_id: "b", pid: 1 };

interface Sent {
  readonly events: readonly NewEvent[];
  resolve(receipt: CommitReceipt): void;
  reject(err: unknown): void;
}

/** A Database whose commits wait for the test; `log` is what `read` returns. */
function fakeDb(groupsCommits: boolean): { db: Database; sent: Sent[]; log: LogEvent[]; reads: number[] } {
  const sent: Sent[] = [];
  const log: LogEvent[] = [];
  const reads: number[] = [];
  const db = {
    name: "t",
    epoch: OWNER.epoch,
    groupsCommits,
    commit: (events: readonly NewEvent[]) => new Promise<CommitReceipt>((resolve, reject) => sent.push({ events, resolve, reject })),
    read: async (after = 0) => {
      reads.push(after);
      return log.filter((e) => e.seq > after);
    },
  } as unknown as Database;
  return { db, sent, log, reads };
}

function harness(db: Database, open = () => true) {
  const reducer = new Reducer();
  const committed: LogEvent[][] = [];
  const failures: unknown[] = [];
  const committer = new Committer({
    db,
    reducer: () => reducer,
    assertOpen: () => {
      if (!open()) throw new Error("the harness was closed");
    },
    owner: () => OWNER,
    committed: (logged) => committed.push([...logged]),
    failed: (err) => failures.push(err),
  });
  return { committer, reducer, committed, failures };
}

const created = (s: string): NewEvent => sessionCreated(s, { goal: "g", cwd: "/" }, AT);
const refusal = (s: string, n: number): NewEvent => event("post_refused", s, identity.postRefused(s, n), AT, { id: `m${n}`, kind: "note", code: "invalid", reason: "r" });
const tick = () => new Promise((r) => setImmediate(r));

/** Receipt for a sent batch at `first`. */
const receipt = (s: Sent, first: number): CommitReceipt => ({ firstSeq: first, lastSeq: first + s.events.length - 1 });

describe("the harness's committer", () => {
  it("groups: sends every batch asked for at once, and folds them in seq order when receipts arrive out of order", async () => {
    const { db, sent } = fakeDb(true);
    const h = harness(db);
    const done = [h.committer.commit([created("a")]), h.committer.commit([created("b")]), h.committer.commit([created("c")])];
    await tick();
    assert.equal(sent.length, 3, "all three in flight together");
    // session_created + owner_claimed each: seqs 1-2, 3-4, 5-6. The last receipt arrives first.
    sent[2]!.resolve(receipt(sent[2]!, 5));
    await tick();
    assert.equal(h.reducer.headSeq, 0, "seq 5 waits for 1..4");
    sent[0]!.resolve(receipt(sent[0]!, 1));
    await tick();
    assert.equal(h.reducer.headSeq, 2);
    sent[1]!.resolve(receipt(sent[1]!, 3));
    const logged = await Promise.all(done);
    assert.equal(h.reducer.headSeq, 6);
    assert.deepEqual(h.committed.map((l) => l.map((e) => e.seq)), [[1, 2], [3, 4], [5, 6]], "folded in seq order");
    assert.deepEqual(logged.map((l) => l.map((e) => e.kind)), [["session_created"], ["session_created"], ["session_created"]], "callers do not see the claims added for them");
    assert.deepEqual(h.reducer.projection().order, ["a", "b", "c"]);
  });

  it("one at a time: the next batch is sent only after the previous one was folded", async () => {
    const { db, sent } = fakeDb(false);
    const h = harness(db);
    const first = h.committer.commit([created("a")]);
    const second = h.committer.commit([created("b")]);
    await tick();
    assert.equal(sent.length, 1);
    sent[0]!.resolve(receipt(sent[0]!, 1));
    await first;
    await tick();
    assert.equal(sent.length, 2);
    sent[1]!.resolve(receipt(sent[1]!, 3));
    await second;
    assert.equal(h.reducer.headSeq, 4);
  });

  it("a refused batch fails alone; the ones around it are folded", async () => {
    const { db, sent } = fakeDb(true);
    const h = harness(db);
    const a = h.committer.commit([created("a")]);
    const b = h.committer.commit([created("b")]);
    const c = h.committer.commit([created("c")]);
    await tick();
    sent[1]!.reject(new StorageRejected("duplicate_identity", "already in the log"));
    sent[0]!.resolve(receipt(sent[0]!, 1));
    sent[2]!.resolve(receipt(sent[2]!, 3));
    await a;
    await assert.rejects(b, /already in the log/);
    await c;
    assert.equal(h.reducer.headSeq, 4);
    assert.equal(h.failures.length, 1);
  });

  it("a batch that needs a claim still in flight waits for it, and carries the claim itself when the claiming batch is refused", async () => {
    const { db, sent } = fakeDb(true);
    const h = harness(db);
    const s = "s";
    // Session s was created under an earlier owner: epoch 7 has not claimed it yet.
    h.reducer.apply([{ ...created(s), seq: 1 } as LogEvent]);
    const one = h.committer.commit([refusal(s, 1)]);
    const two = h.committer.commit([refusal(s, 2)]);
    const other = h.committer.commit([created("t")]);
    await tick();
    assert.equal(sent.length, 1, "the second batch of s (and everything after it) waits for the first's claim");
    assert.deepEqual(sent[0]!.events.map((e) => e.kind), ["owner_claimed", "post_refused"]);
    sent[0]!.reject(new StorageRejected("duplicate_identity", "refused"));
    await assert.rejects(one, /refused/);
    await tick();
    assert.equal(sent.length, 3);
    assert.deepEqual(sent[1]!.events.map((e) => e.kind), ["owner_claimed", "post_refused"], "the claim moved to the next batch of s");
    assert.deepEqual(sent[2]!.events.map((e) => e.kind), ["session_created", "owner_claimed"]);
    sent[1]!.resolve(receipt(sent[1]!, 2));
    sent[2]!.resolve(receipt(sent[2]!, 4));
    await Promise.all([two, other]);
    assert.ok(h.reducer.folded(identity.owner(s, OWNER.epoch)));
  });

  it("a receipt that continues nothing in flight is filled by reading the log", async () => {
    const { db, sent, log, reads } = fakeDb(true);
    const h = harness(db);
    const p = h.committer.commit([created("b")]);
    await tick();
    // Someone's batch at seqs 1..2 (not expected in practice: this owner is the one writer).
    log.push({ ...created("a"), seq: 1 } as LogEvent, { ...event("owner_claimed", "a", identity.owner("a", 7), AT, OWNER), seq: 2 } as LogEvent);
    for (const [i, e] of sent[0]!.events.entries()) log.push({ ...e, seq: 3 + i } as LogEvent);
    sent[0]!.resolve(receipt(sent[0]!, 3));
    const logged = await p;
    assert.deepEqual(reads, [0]);
    assert.deepEqual(logged.map((e) => e.seq), [3]);
    assert.equal(h.reducer.headSeq, 4);
    assert.deepEqual(h.reducer.projection().order, ["a", "b"]);
    assert.deepEqual(h.committed.flat().map((e) => e.seq).sort(), [1, 2, 3, 4], "the events read are shown to the listeners too");
  });

  it("a listener that throws after a fold rejects that caller (never a hang), and later commits go on", async () => {
    const { db, sent } = fakeDb(true);
    const reducer = new Reducer();
    const failures: unknown[] = [];
    let throwOnce = true;
    const committer = new Committer({
      db,
      reducer: () => reducer,
      assertOpen: () => undefined,
      owner: () => OWNER,
      committed: () => {
        if (throwOnce) {
          throwOnce = false;
          throw new Error("a listener's bug");
        }
      },
      failed: (err) => failures.push(err),
    });
    const first = committer.commit([created("a")]);
    const second = committer.commit([created("b")]);
    await tick();
    sent[0]!.resolve(receipt(sent[0]!, 1));
    sent[1]!.resolve(receipt(sent[1]!, 3));
    await assert.rejects(first, /a listener's bug/);
    assert.deepEqual((await second).map((e) => e.seq), [3]);
    assert.equal(failures.length, 1);
    await committer.settled();
  });

  it("settled() waits for what is in flight, and refuses what waits once the harness stopped", async () => {
    const { db, sent } = fakeDb(false);
    let open = true;
    const h = harness(db, () => open);
    const first = h.committer.commit([created("a")]);
    const second = h.committer.commit([created("b")]);
    await tick();
    open = false;
    let settled = false;
    const idle = h.committer.settled().then(() => (settled = true));
    await tick();
    assert.equal(settled, false, "the first batch is still in flight");
    sent[0]!.resolve(receipt(sent[0]!, 1));
    await first;
    await idle;
    await assert.rejects(second, /closed/);
    assert.equal(sent.length, 1, "the waiting batch was never sent");
  });
});
