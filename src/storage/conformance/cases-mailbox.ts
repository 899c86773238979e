/**
 * Conformance cases about the mailbox: post without ownership, drain order, ack, idempotent post,
 * conflicting post, and watch reporting new mail.
 */
import assert from "node:assert/strict";
import type { ConformanceCase } from "./types.js";
import { collect, eventually, hasError, message, Owner, sessionCreated } from "./fixtures.js";

export const mailboxCases: ConformanceCase[] = [
  {
    id: "mailbox.post-drain-ack",
    name: "mailbox: post in order, drain, ack, same id same content is a no-op, other content conflicts",
    async run({ target, reopen, name }) {
      const owner = await Owner.open(target.storage, name, reopen);
      await owner.commit([sessionCreated("s1")]);
      assert.deepEqual(await owner.drain(), []);
      const poster = await target.reopenStorage();
      const m1 = message("m1", { text: "first ✓", nested: { list: [1, "two", null] } });
      const m2 = message("m2");
      const m3 = message("m3", "a plain string payload");
      await poster.post(name, m1);
      await poster.post(name, m2);
      await poster.post(name, m3);

      const drained = await owner.drain();
      assert.deepEqual(drained.map(({ mseq: _mseq, ...m }) => m), [m1, m2, m3], "drain returns the messages in post order, intact");
      const [d1, d2, d3] = drained;
      assert.ok(d1!.mseq < d2!.mseq && d2!.mseq < d3!.mseq, "mseq increases in post order");
      assert.deepEqual(await owner.drain(), drained, "drain does not consume: only ack does");

      await poster.post(name, { ...m3, payload: "a plain string payload" });
      assert.equal((await owner.drain()).length, 3, "the same id with the same content is a no-op");
      await assert.rejects(poster.post(name, { ...m3, payload: "different" }), hasError("rejected", "conflict"));
      await assert.rejects(poster.post(name, { ...m2, kind: "other-kind" }), hasError("rejected", "conflict"));

      await owner.ack(d2!.mseq);
      assert.deepEqual((await owner.drain()).map((m) => m.id), ["m3"], "ack removes messages with mseq <= upTo");
      const m4 = message("m4", { key: "ключ" });
      await poster.post(name, m4);
      const after = await owner.drain();
      assert.deepEqual(after.map((m) => m.id), ["m3", "m4"]);
      assert.ok(after[1]!.mseq > d3!.mseq, "a later post gets a higher mseq");
      await owner.ack(after[1]!.mseq);
      assert.deepEqual(await owner.drain(), []);
      assert.equal(owner.db.stats().fenced, false, "posting never fenced the owner");
      await owner.close();
    },
  },
  {
    id: "mailbox.watch",
    name: "mailbox: watch reports new mail without a commit",
    async run({ target, reopen, name, waitBoundMs }) {
      const owner = await Owner.open(target.storage, name, reopen);
      await owner.commit([sessionCreated("s1")]);
      const watched = collect(owner.db);
      const poster = await target.reopenStorage();
      await poster.post(name, message("wake-up"));
      await eventually(() => watched.signals.some((s) => s.type === "mailbox"), "the owner's watch reports {type: 'mailbox'}", waitBoundMs);
      assert.ok(!watched.signals.some((s) => s.type === "fenced"), "a post is not a fence");
      const drained = await owner.drain();
      assert.deepEqual(drained.map((m) => m.id), ["wake-up"]);
      await owner.ack(drained[0]!.mseq);
      const before = watched.signals.filter((s) => s.type === "mailbox").length;
      await poster.post(name, message("second"));
      await eventually(() => watched.signals.filter((s) => s.type === "mailbox").length > before, "a second message is reported too", waitBoundMs);
      watched.stop();
      await owner.close();
    },
  },
  {
    id: "mailbox.invalid",
    name: "mailbox: a message that is not valid is refused as invalid",
    async run({ target, reopen, name }) {
      const owner = await Owner.open(target.storage, name, reopen);
      await owner.commit([sessionCreated("s1")]);
      await assert.rejects(target.storage.post(name, { ...message("x"), id: "" }), hasError("rejected", "invalid"));
      await assert.rejects(target.storage.post(name, { ...message("y"), payload: undefined }), hasError("rejected", "invalid"));
      assert.deepEqual(await owner.drain(), []);
      await owner.close();
    },
  },
];
