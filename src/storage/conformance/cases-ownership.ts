/**
 * Conformance cases about ownership and failure: last opener wins (fencing), readers never fence,
 * poison after an uncertain commit, a plain failure before the commit, and missing databases.
 */
import assert from "node:assert/strict";
import type { FaultPoint } from "../contract.js";
import type { ConformanceCase } from "./types.js";
import { collect, eventually, hasError, inbox, inboxBatch, isFenced, message, Owner, sessionCreated, withSeq } from "./fixtures.js";

export const ownershipCases: ConformanceCase[] = [
  {
    id: "ownership.last-opener-wins",
    name: "last opener wins: the fenced handle's commit, read, head, drain and ack throw ResetError stop/fenced and write nothing",
    async run({ target, reopen, name, waitBoundMs }) {
      const a = await Owner.open(target.storage, name, reopen);
      const first = [sessionCreated("s1"), inbox("s1", "a1")];
      const second = inboxBatch("s1", "a2-", 3);
      await a.commit(first);
      const last = await a.commit(second);
      const watched = collect(a.db);
      assert.equal(a.db.stats().fenced, false);

      const other = await target.reopenStorage();
      const b = await other.open(name);
      assert.ok(b.epoch > a.db.epoch, `the new opener's epoch ${b.epoch} is above the old one's ${a.db.epoch}`);

      await assert.rejects(a.db.commit([inbox("s1", "after-fence")]), isFenced);
      await assert.rejects(a.db.read(), isFenced);
      await assert.rejects(a.db.head(), isFenced);
      await assert.rejects(a.db.drain(), isFenced);
      await assert.rejects(a.db.ack(1), isFenced);
      await assert.rejects(a.db.commit([inbox("s1", "after-fence-2")]), isFenced, "still fenced on a second try");

      assert.equal(await b.head(), last.lastSeq, "A wrote nothing after the fence");
      assert.deepEqual(await b.read(), withSeq([...first, ...second], 1), "B sees every commit A resolved");
      await eventually(() => watched.signals.some((s) => s.type === "fenced"), "A's watch reports {type: 'fenced'}", waitBoundMs);
      assert.equal(watched.signals.filter((s) => s.type === "fenced").length, 1, "fenced is reported once");
      assert.equal(a.db.stats().fenced, true);
      assert.deepEqual(await b.commit([inbox("s1", "b1")]), { firstSeq: last.lastSeq + 1, lastSeq: last.lastSeq + 1 }, "B appends after A's events");
      watched.stop();
      await a.close();
      await b.close();
    },
  },
  {
    id: "ownership.reader-and-poster-never-fence",
    name: "a reader and a poster never fence the owner",
    async run({ target, reopen, name }) {
      const a = await Owner.open(target.storage, name, reopen);
      await a.commit([sessionCreated("s1")]);
      const other = await target.reopenStorage();
      const reader = await other.reader(name);
      assert.deepEqual(await reader.read(), withSeq([sessionCreated("s1")], 1));
      await other.post(name, message("m1"));
      assert.deepEqual(await a.commit([inbox("s1", "x")]), { firstSeq: 2, lastSeq: 2 }, "the owner still commits");
      assert.equal(await reader.head(), 2, "the reader sees the owner's later commit");
      assert.deepEqual((await reader.read(1)).map((e) => e.identity), [inbox("s1", "x").identity]);
      assert.equal(a.db.stats().fenced, false);
      assert.equal((await a.drain()).length, 1);
      await reader.close();
      await a.close();
    },
  },
  {
    id: "ownership.lost-ack-poisons",
    name: "a lost acknowledgement (throw at commit:after-durable) poisons the handle; a fresh open shows the batch was committed",
    async run({ target, reopen, name }) {
      let armed: FaultPoint | null = null;
      const storage = await target.storageWithFaults(async (point) => {
        if (point === armed) {
          armed = null;
          throw new Error(`injected fault at ${point}`);
        }
      });
      const db = await Owner.open(storage, name, reopen);
      await db.commit([sessionCreated("s1")]);
      const lost = [inbox("s1", "lost-ack-1"), inbox("s1", "lost-ack-2")];
      armed = "commit:after-durable";
      await assert.rejects(db.commit(lost), hasError("uncertain"));
      assert.equal(armed, null, "the fault point was reached");
      assert.equal(db.db.stats().poisoned, true);
      await assert.rejects(db.db.commit([inbox("s1", "next")]), hasError("uncertain"));
      await assert.rejects(db.db.read(), hasError("uncertain"));
      await assert.rejects(db.db.head(), hasError("uncertain"));
      await assert.rejects(db.db.drain(), hasError("uncertain"));
      await assert.rejects(db.db.ack(1), hasError("uncertain"));

      const fresh = await storage.open(name);
      assert.deepEqual(await fresh.read(), withSeq([sessionCreated("s1"), ...lost], 1), "the uncertain batch WAS committed");
      await assert.rejects(fresh.commit(lost), hasError("rejected", "duplicate_identity"), "retrying it is refused as a duplicate");
      assert.equal(fresh.stats().poisoned, false);
      await db.close();
      await fresh.close();
    },
  },
  {
    id: "ownership.fault-before-commit",
    name: "a throw at commit:before is a plain failure: nothing is written and the handle stays usable",
    async run({ target, reopen, name }) {
      let armed = false;
      const storage = await target.storageWithFaults((point) => {
        if (armed && point === "commit:before") {
          armed = false;
          throw new Error("injected fault before the commit");
        }
      });
      const db = await Owner.open(storage, name, reopen);
      await db.commit([sessionCreated("s1")]);
      armed = true;
      await assert.rejects(db.commit([inbox("s1", "never")]), /injected fault before the commit/);
      assert.equal(armed, false, "the fault point was reached");
      assert.equal(await db.head(), 1);
      assert.equal(db.db.stats().poisoned, false);
      assert.deepEqual(await db.commit([inbox("s1", "never")]), { firstSeq: 2, lastSeq: 2 }, "the same batch commits on retry");
      await db.close();
    },
  },
  {
    id: "ownership.missing-database",
    name: "a missing database: open with create:false, reader and post throw DatabaseNotFound",
    async run({ target, reopen, name }) {
      const storage = target.storage;
      await assert.rejects(storage.open(`${name}-missing`, { create: false }), hasError("not_found"));
      await assert.rejects(storage.reader(`${name}-missing`), hasError("not_found"));
      await assert.rejects(storage.post(`${name}-missing`, message("m")), hasError("not_found"));
      assert.ok(!(await storage.list()).includes(`${name}-missing`), "a refused open creates nothing");
      const db = await Owner.open(storage, name, reopen);
      await db.commit([sessionCreated("s1")]);
      await db.close();
      const again = await storage.open(name, { create: false });
      assert.equal(await again.head(), 1, "create:false opens an existing database");
      await again.close();
    },
  },
];
