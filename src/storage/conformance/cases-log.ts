/**
 * Conformance cases about the log itself: seq assignment, atomic batches, identity uniqueness,
 * read ranges, reopening, and exact round trips.
 */
import assert from "node:assert/strict";
import { event, identity, type NewEvent } from "../../state/events.js";
import type { ConformanceCase } from "./types.js";
import { AT, hasError, inbox, inboxBatch, Owner, sessionCreated, withSeq } from "./fixtures.js";

export const logCases: ConformanceCase[] = [
  {
    id: "log.seq-order",
    name: "assigns seq 1, 2, 3... in commit order and returns each batch's receipt",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      assert.equal(await db.head(), 0);
      assert.deepEqual(await db.read(), []);
      const first = [sessionCreated("s1")];
      const second = inboxBatch("s1", "o", 3);
      assert.deepEqual(await db.commit(first), { firstSeq: 1, lastSeq: 1 });
      assert.deepEqual(await db.commit(second), { firstSeq: 2, lastSeq: 4 });
      assert.deepEqual(await db.commit([inbox("s1", "last")]), { firstSeq: 5, lastSeq: 5 });
      assert.equal(await db.head(), 5);
      const log = await db.read();
      assert.deepEqual(log.map((e) => e.seq), [1, 2, 3, 4, 5]);
      assert.deepEqual(log.map((e) => e.identity), [...first, ...second, inbox("s1", "last")].map((e) => e.identity));
      await db.close();
    },
  },
  {
    id: "log.concurrent-commits",
    name: "concurrent commits each get their own receipt, in call order, and fail alone (Database.groupsCommits or not)",
    async run({ target, reopen, name }) {
      const owner = await Owner.open(target.storage, name, false);
      const db = owner.db;
      await db.commit([sessionCreated("s1")]);
      // Sent without waiting, as the harness does on an adapter that groups commits: one batch
      // repeats an identity of an earlier one in flight, another repeats one already in the log.
      const batches: NewEvent[][] = Array.from({ length: 12 }, (_, i) => inboxBatch("s1", `c${i}`, 1 + (i % 3)));
      batches[5] = [inbox("s1", "c5-own"), batches[2]![0]!];
      batches[9] = [sessionCreated("s1")];
      const settled = await Promise.allSettled(batches.map((b) => db.commit(b)));
      for (const i of [5, 9]) {
        const r = settled[i]!;
        assert.equal(r.status, "rejected", `batch ${i} repeats an identity`);
        if (r.status === "rejected") hasError("rejected", "duplicate_identity")(r.reason);
      }
      let next = 2;
      const expected: string[] = [sessionCreated("s1").identity];
      settled.forEach((r, i) => {
        if (i === 5 || i === 9) return;
        assert.equal(r.status, "fulfilled", `batch ${i} has distinct identities`);
        if (r.status !== "fulfilled") return;
        assert.deepEqual(r.value, { firstSeq: next, lastSeq: next + batches[i]!.length - 1 }, `batch ${i}: contiguous, in call order`);
        next += batches[i]!.length;
        expected.push(...batches[i]!.map((e) => e.identity));
      });
      assert.equal(await db.head(), next - 1);
      assert.deepEqual((await db.read()).map((e) => e.identity), expected);
      if (reopen) {
        await db.close();
        const again = await target.storage.open(name);
        assert.deepEqual((await again.read()).map((e) => e.identity), expected, "the same after reopening");
        await again.close();
      } else {
        await db.close();
      }
    },
  },
  {
    id: "log.large-batch",
    name: "a batch of 100 events gets contiguous seqs in order; one of 70 with a duplicate near its end writes none of it",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      const first = sessionCreated("s1");
      await db.commit([first]);
      const hundred = inboxBatch("s1", "h", 100);
      assert.deepEqual(await db.commit(hundred), { firstSeq: 2, lastSeq: 101 });
      assert.deepEqual(await db.read(), withSeq([first, ...hundred], 1), "every event of the batch at its seq, in batch order");
      // The duplicate is the 66th: an adapter that writes a large batch in parts must undo the parts before it.
      const seventy = inboxBatch("s1", "s", 70);
      const withDuplicate = [...seventy.slice(0, 65), hundred[40]!, ...seventy.slice(65)];
      await assert.rejects(db.commit(withDuplicate), (err: unknown) => {
        hasError("rejected", "duplicate_identity")(err);
        assert.deepEqual([...(err as { identities: string[] }).identities], [hundred[40]!.identity]);
        return true;
      });
      assert.equal(await db.head(), 101, "the refused batch left no trace");
      assert.deepEqual(await db.commit(seventy), { firstSeq: 102, lastSeq: 171 });
      assert.deepEqual((await db.read(101)).map((e) => e.identity), seventy.map((e) => e.identity));
      await db.close();
    },
  },
  {
    id: "log.atomic-batch",
    name: "a batch with one duplicate identity writes none of it (atomic batch)",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      const a = sessionCreated("s1");
      await db.commit([a]);
      const b = inbox("s1", "b");
      const c = inbox("s1", "c");
      await assert.rejects(db.commit([b, c, a]), (err: unknown) => {
        hasError("rejected", "duplicate_identity")(err);
        assert.deepEqual([...(err as { identities: string[] }).identities], [a.identity]);
        return true;
      });
      assert.equal(await db.head(), 1);
      assert.deepEqual((await db.read()).map((e) => e.identity), [a.identity]);
      assert.deepEqual(await db.commit([b, c]), { firstSeq: 2, lastSeq: 3 }, "the refused batch left no trace");
      await db.close();
    },
  },
  {
    id: "log.duplicate-in-batch",
    name: "an identity twice in one batch refuses the whole batch",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      const x = inbox("s1", "x");
      await assert.rejects(db.commit([x, inbox("s1", "y"), inbox("s1", "x", { other: true })]), (err: unknown) => {
        hasError("rejected", "duplicate_identity")(err);
        assert.deepEqual([...(err as { identities: string[] }).identities], [x.identity]);
        return true;
      });
      assert.equal(await db.head(), 0);
      await db.close();
    },
  },
  {
    id: "log.identities-across-reopen",
    name: "identities stay unique across batches and across reopening",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      await db.commit([inbox("s1", "a")]);
      await db.commit([inbox("s1", "b")]);
      await assert.rejects(db.commit([inbox("s1", "a", "different body, same identity")]), hasError("rejected", "duplicate_identity"));
      await db.close();
      const other = await target.reopenStorage();
      const again = await Owner.open(other, name, reopen);
      await assert.rejects(again.commit([inbox("s1", "c"), inbox("s1", "b")]), hasError("rejected", "duplicate_identity"));
      assert.equal(await again.head(), 2);
      await again.close();
    },
  },
  {
    id: "log.exact-copy",
    name: "read after commit returns exactly what was committed; the caller's objects are not kept",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      const batch = [sessionCreated("s1"), inbox("s1", "o1", { list: [1, 2, 3] })];
      const expected = withSeq(structuredClone(batch), 1);
      const receipt = await db.commit(batch);
      // Mutating the caller's objects after the commit must not change the log.
      (batch[1]!.body as { observation: { payload: unknown } }).observation.payload = "mutated";
      batch[0]!.session = "mutated";
      assert.deepEqual(receipt, { firstSeq: 1, lastSeq: 2 });
      assert.deepEqual(await db.read(), expected);
      const log = await db.read();
      (log[0] as { session: string }).session = "mutated by reader";
      assert.deepEqual(await db.read(), expected, "mutating a read result does not change the log");
      await db.close();
    },
  },
  {
    id: "log.read-window",
    name: "read(afterSeq, limit) returns the requested window",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      await db.commit(inboxBatch("s1", "a", 3));
      await db.commit(inboxBatch("s1", "b", 4));
      await db.commit(inboxBatch("s1", "c", 3));
      const seqs = async (after?: number, limit?: number) => (await db.read(after, limit)).map((e) => e.seq);
      assert.deepEqual(await seqs(), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      assert.deepEqual(await seqs(3, 4), [4, 5, 6, 7]);
      assert.deepEqual(await seqs(0, 2), [1, 2]);
      assert.deepEqual(await seqs(8), [9, 10]);
      assert.deepEqual(await seqs(9, 100), [10]);
      assert.deepEqual(await seqs(10), []);
      assert.deepEqual(await seqs(50), []);
      assert.equal((await db.read(3, 1))[0]!.identity, inbox("s1", "b0").identity);
      await db.close();
    },
  },
  {
    id: "log.reopen-sees-all",
    name: "a reopened database (another Storage object) sees everything committed",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      const all: NewEvent[] = [sessionCreated("s1"), ...inboxBatch("s1", "a", 5), inbox("s1", "z")];
      await db.commit(all.slice(0, 1));
      await db.commit(all.slice(1, 6));
      await db.commit(all.slice(6));
      const epoch = db.db.epoch;
      await db.close();
      const other = await target.reopenStorage();
      const again = await other.open(name, { create: false });
      assert.ok(again.epoch > epoch, `a new open claims a higher epoch (${again.epoch} > ${epoch})`);
      assert.equal(await again.head(), all.length);
      assert.deepEqual(await again.read(), withSeq(all, 1));
      assert.ok((await other.list()).includes(name), "list() names the database");
      await again.close();
    },
  },
  {
    id: "log.empty-batch",
    name: "an empty batch is refused as invalid and writes nothing",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      await assert.rejects(db.commit([]), hasError("rejected", "invalid"));
      assert.equal(await db.head(), 0);
      assert.deepEqual(await db.commit([sessionCreated("s1")]), { firstSeq: 1, lastSeq: 1 }, "the handle is still usable");
      await db.close();
    },
  },
  {
    id: "log.round-trip",
    name: "events round-trip exactly (unicode, escapes, numbers, nesting)",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      const session = "séance-日本-🚀";
      const payload = {
        text: "ünïcödé — 修复 the bug 🚀👩‍💻 \u2028\u2029 \"quoted\" \\back\\ \t\n\r tab",
        nul: "a\u0000b",
        empty: "",
        numbers: [0, -1, 1.5, -2.25e-7, 9007199254740991, 1e21],
        flags: [true, false, null],
        nested: { "key with spaces": { "ключ": ["値", { "": "empty key" }] }, emptyObj: {}, emptyArr: [] },
      };
      const events: NewEvent[] = [
        event("session_created", session, identity.session(session), AT, {
          goal: "Réparer « calc » — 计算器 ✓",
          cwd: "/tmp/wörk dir",
          validators: [["python3", "-c", "print('ok ✓')"]],
          budgets: {},
        }),
        inbox(session, "obs-ü-1", payload),
        inbox(session, "obs-2", "just a string"),
      ];
      await db.commit(events);
      assert.deepEqual(await db.read(), withSeq(events, 1));
      await db.close();
      const other = await target.reopenStorage();
      const reader = await other.reader(name);
      assert.deepEqual(await reader.read(), withSeq(events, 1), "a reader in another process sees the same bytes");
      await reader.close();
    },
  },
];
