/**
 * Memory-adapter specifics beyond the conformance suite: the mailbox bound, name and event
 * validation, watchers that throw.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { MAILBOX_LIMIT } from "../../src/storage/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { collect, eventually, hasError, inbox, message, sessionCreated } from "../../src/storage/conformance/fixtures.js";

describe("memory storage", () => {
  it("refuses mail beyond MAILBOX_LIMIT with backlog_full (retryable), and accepts again after ack", async () => {
    const storage = createMemoryStorage();
    const db = await storage.open("box");
    for (let i = 0; i < MAILBOX_LIMIT; i++) await storage.post("box", message(`m${i}`));
    await assert.rejects(storage.post("box", message("one-too-many")), (err: unknown) => {
      hasError("rejected", "backlog_full")(err);
      assert.equal((err as { retryable: boolean }).retryable, true);
      return true;
    });
    await storage.post("box", message("m0"));
    const drained = await db.drain();
    assert.equal(drained.length, MAILBOX_LIMIT, "a repeated post at the limit is still a no-op, not a refusal");
    await db.ack(drained[0]!.mseq);
    await storage.post("box", message("one-too-many"));
    assert.equal((await db.drain()).at(-1)!.id, "one-too-many");
    await db.close();
  });

  it("refuses invalid names with a ConfigError and invalid events as StorageRejected invalid", async () => {
    const storage = createMemoryStorage();
    for (const bad of ["", "../etc", "a/b", ".hidden", "x".repeat(129), "sp ace"]) {
      await assert.rejects(storage.open(bad), hasError("config"), `name ${JSON.stringify(bad)}`);
    }
    const db = await storage.open("ok-name_1.2");
    const broken = { ...sessionCreated("s1"), body: { goal: "" } } as unknown as ReturnType<typeof sessionCreated>;
    await assert.rejects(db.commit([broken]), hasError("rejected", "invalid"));
    const unknownKind = { ...inbox("s1", "o"), kind: "no_such_kind" } as unknown as ReturnType<typeof inbox>;
    await assert.rejects(db.commit([unknownKind]), hasError("rejected", "invalid"));
    assert.equal(await db.head(), 0);
    await db.close();
  });

  it("a watcher that throws does not break commits or other watchers", async () => {
    const storage = createMemoryStorage();
    const db = await storage.open("w");
    db.watch(() => {
      throw new Error("buggy watcher");
    });
    const good = collect(db);
    await storage.post("w", message("m"));
    await eventually(() => good.signals.some((s) => s.type === "mailbox"), "the good watcher is told");
    assert.deepEqual(await db.commit([sessionCreated("s1")]), { firstSeq: 1, lastSeq: 1 });
    await db.close();
  });

  it("a closed handle refuses calls with ResetError closed", async () => {
    const storage = createMemoryStorage();
    const db = await storage.open("c");
    await db.close();
    await db.close();
    await assert.rejects(db.head(), (err: unknown) => hasError("reset")(err) && (err as { reason: string }).reason === "closed");
  });
});
