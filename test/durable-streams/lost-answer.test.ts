/**
 * Lost answers, resolved by reading, never by guessing: the adapter talks to the reference server
 * through a proxy that loses the answer to a chosen request (after the server applied it) or loses
 * the request itself, and can let another process open the database in between.
 *  - a commit's answer lost: resent unchanged, answered "duplicate" (204), read back: committed once;
 *  - a claim's or an opened mark's answer lost: the opener resends, reads its own claim back, opens;
 *  - a commit's answer lost while another process opens: the resend is refused (403), the read back
 *    finds the commit before the new claim, so it is committed and the receipt stands; the handle is
 *    fenced from its next call on;
 *  - a commit lost on the way while another process opens: refused, not in the log, ResetError fenced;
 *  - a post's answer lost: resent; the mailbox holds it once.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { hasCode } from "../../src/errors.js";
import type { Database, Storage } from "../../src/storage/contract.js";
import { inbox, message, sessionCreated } from "../../src/storage/conformance/fixtures.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { devServer, lossyProxy, type ProxiedRequest } from "./helpers.js";

const isFenced = (err: unknown) => hasCode(err, "reset") && (err as { reason?: string }).reason === "fenced";
/** A POST to database `name`'s log as producer seq `seq`. */
const logAppend = (name: string, seq: number) => (r: ProxiedRequest) => r.method === "POST" && r.path.endsWith(`/${name}/log`) && r.headers["producer-seq"] === String(seq);

async function rawRecords(url: string, path: string): Promise<{ t: string; f?: number; e?: number }[]> {
  return (await (await fetch(`${url}/${path}?offset=-1`)).json()) as { t: string; f?: number; e?: number }[];
}

describe("durable-streams: lost answers", { timeout: 300_000 }, () => {
  it("a commit whose answer is lost is resent, answered as a duplicate, read back, and counted once", async () => {
    const server = await devServer("lost-commit");
    const proxy = await lossyProxy(server);
    const storage = createDurableStreamsStorage({ url: proxy.url });
    try {
      const db = await storage.open("lc");
      await db.commit([sessionCreated("s1")]);
      const lost = proxy.lose(logAppend("lc", 3));
      const batch = [inbox("s1", "a"), inbox("s1", "b")];
      assert.deepEqual(await db.commit(batch), { firstSeq: 2, lastSeq: 3 });
      await lost;
      assert.equal(db.stats().poisoned, false);
      assert.deepEqual(await db.commit([inbox("s1", "c")]), { firstSeq: 4, lastSeq: 4 }, "the handle goes on at the next producer seq");
      assert.equal((await rawRecords(server.url, "lc/log")).filter((r) => r.t === "commit").length, 3, "the server holds one copy (it answered the resend as a duplicate)");
      assert.deepEqual((await db.read()).map((e) => e.identity), [sessionCreated("s1"), ...batch, inbox("s1", "c")].map((e) => e.identity));
    } finally {
      await storage.close();
    }
  });

  it("a claim's and an opened mark's answers lost: the opener resends, reads its claim back, and opens", async () => {
    const server = await devServer("lost-claim");
    const proxy = await lossyProxy(server);
    const storage = createDurableStreamsStorage({ url: proxy.url });
    try {
      const first = await storage.open("lcl");
      await first.commit([sessionCreated("s1")]);
      await first.close();
      const lostClaim = proxy.lose(logAppend("lcl", 0));
      const lostMark = proxy.lose(logAppend("lcl", 1));
      const db = await storage.open("lcl");
      await Promise.all([lostClaim, lostMark]);
      assert.equal(db.epoch, first.epoch + 1);
      assert.equal((await rawRecords(server.url, "lcl/log")).filter((r) => r.t === "claim" && r.e === db.epoch).length, 1, "one claim at the new epoch");
      assert.deepEqual(await db.commit([inbox("s1", "after")]), { firstSeq: 2, lastSeq: 2 });
    } finally {
      await storage.close();
    }
  });

  it("a commit's answer lost while another process opens: refused on resend, found before the new claim: committed; the handle is fenced next", async () => {
    const server = await devServer("lost-fenced");
    const proxy = await lossyProxy(server);
    const a = createDurableStreamsStorage({ url: proxy.url });
    const b = createDurableStreamsStorage({ url: server.url });
    let newOwner: Database | null = null;
    try {
      const db = await a.open("lf");
      await db.commit([sessionCreated("s1")]);
      const lost = proxy.lose(logAppend("lf", 3), { hook: async () => void (newOwner = await b.open("lf")) });
      assert.deepEqual(await db.commit([inbox("s1", "landed")]), { firstSeq: 2, lastSeq: 2 }, "the commit landed before the claim: its receipt stands");
      await lost;
      await assert.rejects(db.commit([inbox("s1", "late")]), isFenced);
      const other = newOwner as Database | null;
      assert.ok(other !== null);
      assert.deepEqual((await other.read()).map((e) => e.identity), [sessionCreated("s1"), inbox("s1", "landed")].map((e) => e.identity));
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("a commit lost on the way while another process opens: refused as fenced, and not in the log", async () => {
    const server = await devServer("lost-before");
    const proxy = await lossyProxy(server);
    const a = createDurableStreamsStorage({ url: proxy.url });
    const b = createDurableStreamsStorage({ url: server.url });
    let newOwner: Database | null = null;
    try {
      const db = await a.open("lb");
      await db.commit([sessionCreated("s1")]);
      const lost = proxy.lose(logAppend("lb", 3), { before: true, hook: async () => void (newOwner = await b.open("lb")) });
      await assert.rejects(db.commit([inbox("s1", "never")]), isFenced);
      await lost;
      const other = newOwner as Database | null;
      assert.ok(other !== null);
      assert.equal(await other.head(), 1, "nothing of the refused commit is in the log");
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("a post whose answer is lost is resent; the mailbox holds it once", async () => {
    const server = await devServer("lost-post");
    const proxy = await lossyProxy(server);
    const owner = createDurableStreamsStorage({ url: server.url });
    const poster: Storage = createDurableStreamsStorage({ url: proxy.url });
    try {
      const db = await owner.open("lp");
      await db.commit([sessionCreated("s1")]);
      const lost = proxy.lose((r) => r.method === "POST" && r.path.endsWith("/lp/mail"));
      await poster.post("lp", message("m1"));
      await lost;
      assert.equal((await rawRecords(server.url, "lp/mail")).filter((r) => r.t === "post").length, 2, "the stream holds both copies");
      assert.deepEqual((await db.drain()).map((m) => m.id), ["m1"], "the mailbox holds it once");
    } finally {
      await poster.close();
      await owner.close();
    }
  });
});
