/**
 * Conformance cases about bounds: a full mailbox, the largest commits the harness makes (the
 * contract's COMMIT_FLOOR), and handles used after `close()`.
 */
import assert from "node:assert/strict";
import { hasCode } from "../../errors.js";
import { event, identity, type NewEvent } from "../../state/events.js";
import { COMMIT_FLOOR, MAILBOX_LIMIT, type DatabaseSignal } from "../contract.js";
import type { ConformanceCase } from "./types.js";
import { AT, eventually, hasError, inbox, message, Owner, sessionCreated, withSeq } from "./fixtures.js";

/** An assert.rejects predicate: ResetError {action: "stop", reason: "closed"}. */
function isClosed(err: unknown): boolean {
  assert.ok(hasCode(err, "reset"), `expected a ResetError, got ${String(err)}`);
  assert.equal((err as { action?: unknown }).action, "stop");
  assert.equal((err as { reason?: unknown }).reason, "closed");
  return true;
}

/** `COMMIT_FLOOR.outputEvents` execution_output events of cell `cell`, each `COMMIT_FLOOR.outputEventChars` characters of `char`. */
function outputBatch(session: string, cell: number, char: string): NewEvent[] {
  const data = char.repeat(COMMIT_FLOOR.outputEventChars);
  assert.equal(data.length, COMMIT_FLOOR.outputEventChars);
  return Array.from({ length: COMMIT_FLOOR.outputEvents }, (_, n) =>
    event("execution_output", session, identity.output(session, cell, n), AT, { cell_id: cell, n, stream: n % 2 === 0 ? "stdout" : "stderr", data }),
  );
}

/** A JSON Patch whose JSON text is exactly `COMMIT_FLOOR.patchJsonChars` characters. */
function largestPatch(): unknown {
  const make = (fill: number) => [{ op: "add", path: "/cells/-", value: { id: 1, kind: "script", source: "x".repeat(fill) } }];
  const overhead = JSON.stringify(make(0)).length;
  const patch = make(COMMIT_FLOOR.patchJsonChars - overhead);
  assert.equal(JSON.stringify(patch).length, COMMIT_FLOOR.patchJsonChars);
  return patch;
}

export const limitCases: ConformanceCase[] = [
  {
    id: "mailbox.full",
    name: `mailbox: ${MAILBOX_LIMIT} unacknowledged messages fill it; the next post is refused backlog_full (retryable) until the owner acks`,
    once: true,
    async run({ target, reopen, name }) {
      const owner = await Owner.open(target.storage, name, reopen);
      await owner.commit([sessionCreated("s1")]);
      const poster = await target.reopenStorage();
      for (let i = 0; i < MAILBOX_LIMIT; i++) await poster.post(name, message(`full-${i}`));
      const refused = (err: unknown) => {
        hasError("rejected", "backlog_full")(err);
        assert.equal((err as { retryable?: unknown }).retryable, true, "backlog_full says: retry later");
        return true;
      };
      await assert.rejects(poster.post(name, message("one-too-many")), refused);
      await poster.post(name, message("full-7"));
      await assert.rejects(poster.post(name, { ...message("full-8"), payload: "other content" }), hasError("rejected", "conflict"), "a conflict is still a conflict when full");
      const drained = await owner.drain();
      assert.equal(drained.length, MAILBOX_LIMIT, "the refused posts added nothing; the repeated one is a no-op");
      assert.deepEqual(drained.map((m) => m.id), Array.from({ length: MAILBOX_LIMIT }, (_, i) => `full-${i}`));
      assert.equal(owner.db.stats().fenced, false, "a full mailbox never fences the owner");

      await owner.ack(drained[0]!.mseq);
      await poster.post(name, message("one-too-many"));
      await assert.rejects(poster.post(name, message("another")), refused, "full again after one more");
      const again = await owner.drain();
      assert.equal(again.length, MAILBOX_LIMIT);
      assert.equal(again.at(-1)!.id, "one-too-many");
      await owner.ack(again.at(-1)!.mseq);
      assert.deepEqual(await owner.drain(), []);
      await poster.post(name, message("another"));
      assert.deepEqual((await owner.drain()).map((m) => m.id), ["another"], "an emptied mailbox takes posts again");
      await owner.close();
    },
  },
  {
    id: "log.commit-floor",
    name: `takes the harness's largest commits: ${COMMIT_FLOOR.outputEvents} output events of ${COMMIT_FLOOR.outputEventChars} characters (plain, multi-byte, escaped), and a ${COMMIT_FLOOR.patchJsonChars / 1024} KiB patch`,
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      const committed: NewEvent[] = [sessionCreated("s1")];
      await db.commit(committed);
      // ASCII; 3 bytes per character in UTF-8; 6 bytes per character once escaped in JSON (the worst case).
      for (const [cell, char] of [[1, "x"], [2, "界"], [3, "\u0001"]] as const) {
        const batch = outputBatch("s1", cell, char);
        const receipt = await db.commit(batch);
        assert.equal(receipt.lastSeq - receipt.firstSeq + 1, batch.length);
        committed.push(...batch);
      }
      const patch = largestPatch();
      const response = event("model_response", "s1", identity.response("s1:t1", 1), AT, { turn: "s1:t1", attempt: 1, patch, usage: null });
      await db.commit([response]);
      const accepted = [
        event("patch_accepted", "s1", identity.patch("s1:t1"), AT, { turn: "s1:t1", attempt: 1, patch, revision: 1, new_cell_ids: [1], removed_ids: [], consumed: [] }),
        event("execution_queued", "s1", identity.queued("s1", 1), AT, { cell_id: 1, kind: "script" }),
      ];
      await db.commit(accepted);
      committed.push(response, ...accepted);
      assert.deepEqual(await db.read(), withSeq(committed, 1), "every large event reads back exactly");
      await db.close();
      const other = await target.reopenStorage();
      const reader = await other.reader(name);
      assert.equal(await reader.head(), committed.length);
      assert.deepEqual(await reader.read(committed.length - 3), withSeq(committed.slice(-3), committed.length - 2), "another Storage reads them back too");
      await reader.close();
    },
  },
  {
    id: "ownership.closed-handle",
    name: "a closed handle refuses every call with ResetError stop/closed, tells its watchers nothing more, and keeps no claim",
    once: true,
    async run({ target, name, waitBoundMs }) {
      const storage = target.storage;
      const db = await storage.open(name);
      await db.commit([sessionCreated("s1")]);
      const heard: DatabaseSignal[] = [];
      db.watch((s) => heard.push(s));
      await db.close();
      await db.close();
      await assert.rejects(db.commit([inbox("s1", "after-close")]), isClosed);
      await assert.rejects(db.read(), isClosed);
      await assert.rejects(db.head(), isClosed);
      await assert.rejects(db.drain(), isClosed);
      await assert.rejects(db.ack(1), isClosed);
      const late: DatabaseSignal[] = [];
      const stop = db.watch((s) => late.push(s));
      stop();
      assert.equal(typeof db.stats().epoch, "number", "stats() never throws, closed or not");

      const next = await storage.open(name);
      assert.ok(next.epoch > db.epoch, "closing does not give up the epoch: the next opener goes above it");
      const woken: DatabaseSignal[] = [];
      const stopNext = next.watch((s) => woken.push(s));
      const poster = await target.reopenStorage();
      await poster.post(name, message("after-close"));
      await eventually(() => woken.some((s) => s.type === "mailbox"), "the new owner's watch reports the post", waitBoundMs);
      assert.deepEqual(heard, [], "the closed handle's watcher heard neither the new open nor the post");
      assert.deepEqual(late, [], "a watch on a closed handle never fires");
      assert.deepEqual(await next.commit([inbox("s1", "next")]), { firstSeq: 2, lastSeq: 2 }, "the new owner is not disturbed by the closed handle");
      stopNext();
      await next.close();

      const reader = await storage.reader(name);
      assert.equal(await reader.head(), 2);
      await reader.close();
      await reader.close();
      await assert.rejects(reader.read(), isClosed);
      await assert.rejects(reader.head(), isClosed);
    },
  },
];
