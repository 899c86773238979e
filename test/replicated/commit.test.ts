/**
 * The replicated commit path on a real cluster: grouping of concurrent commits into fewer etcd
 * transactions with one receipt each, a duplicate identity failing only its own batch (checked at once
 * for a lone commit, and for a whole group at once when it is taken), etcd's size limits refused as
 * too_large before anything is written, large and multi-byte commits up to the limits read back
 * exactly, and answers lost after etcd applied the commit (a proxy holds them past the attempt
 * deadline, then resets every connection): each commit acknowledged once, none doubled.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, describe, it } from "node:test";
import { Etcd3 } from "etcd3";
import type { NewEvent } from "../../src/state/events.js";
import type { Storage } from "../../src/storage/contract.js";
import { StorageRejected } from "../../src/storage/errors.js";
import { MAX_BATCH_BYTES, MAX_BATCH_EVENTS, createReplicatedStorage, type ReplicatedStats } from "../../storage-adapters/replicated/index.js";
import { AT, bounded, devCluster, ev, tempDir } from "./helpers.js";
import { Ledger, checkLog, freshLog, out } from "./ledger.js";
import { keysOf } from "../../storage-adapters/replicated/layout.js";
import { event } from "../../src/state/events.js";
import { exitAfterTests } from "../support/exit.js";

/** HTTP/2 frame types that carry a response (held back by `hold`); the others (SETTINGS, PING, GOAWAY, WINDOW_UPDATE) always pass, so flow control keeps working. */
const RESPONSE_FRAMES = new Set([0x0 /* DATA */, 0x1 /* HEADERS */, 0x3 /* RST_STREAM */, 0x9 /* CONTINUATION */]);

interface Pair {
  readonly client: net.Socket;
  readonly upstream: net.Socket;
  /** Bytes from etcd not yet parsed into whole frames. */
  partial: Buffer;
  /** Whole response frames held back, in order. */
  readonly held: Buffer[];
}

/**
 * A TCP proxy in front of one etcd member that parses etcd's HTTP/2 frames toward the client: `hold`
 * keeps back the frames that carry answers while flow control and pings still pass (so a large
 * request is received, and applied, in full); `release` delivers them; `resetAll` resets every
 * connection.
 */
class TcpProxy {
  private readonly server: net.Server;
  private readonly pairs = new Set<Pair>();
  private holding = false;

  constructor(target: URL) {
    this.server = net.createServer((client) => {
      const upstream = net.connect(Number(target.port), target.hostname);
      const pair: Pair = { client, upstream, partial: Buffer.alloc(0), held: [] };
      this.pairs.add(pair);
      const end = (): void => {
        this.pairs.delete(pair);
        client.destroy();
        upstream.destroy();
      };
      client.on("error", end).on("close", end);
      upstream.on("error", end).on("close", end);
      client.on("data", (b: Buffer) => upstream.write(b));
      upstream.on("data", (b: Buffer) => {
        pair.partial = Buffer.concat([pair.partial, b]);
        while (pair.partial.length >= 9) {
          const len = pair.partial.readUIntBE(0, 3);
          if (pair.partial.length < 9 + len) break;
          const f = pair.partial.subarray(0, 9 + len);
          pair.partial = pair.partial.subarray(9 + len);
          if ((this.holding || pair.held.length > 0) && RESPONSE_FRAMES.has(f[3]!)) pair.held.push(Buffer.from(f));
          else client.write(f);
        }
      });
    });
  }

  async start(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", () => r()));
    return `http://127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
  }

  /** Answers from etcd are kept back (requests still reach etcd in full, and apply). */
  hold(): void {
    this.holding = true;
  }

  /** Delivers the answers kept back, in order, and forwards again. */
  release(): void {
    this.holding = false;
    for (const p of this.pairs) for (const b of p.held.splice(0)) if (!p.client.destroyed) p.client.write(b);
  }

  /** Resets every connection (TCP RST toward the client). */
  resetAll(): number {
    const n = this.pairs.size;
    for (const p of [...this.pairs]) {
      p.client.resetAndDestroy();
      p.upstream.destroy();
    }
    return n;
  }

  async stop(): Promise<void> {
    this.resetAll();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

describe("replicated commits", () => {
  let dc: Awaited<ReturnType<typeof devCluster>>;
  let storage: Storage;
  let etcd: Etcd3;
  const dirs = tempDir("commit");

  before(async () => {
    dc = await devCluster();
    storage = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: dirs.dir });
    etcd = new Etcd3({ hosts: dc.cluster.endpoints });
  });
  after(async () => {
    etcd?.close();
    await storage?.close().catch(() => undefined);
    await dc?.stop();
    dirs.remove();
  });

  it("64 concurrent commits from one process resolve with distinct, ordered receipts in fewer etcd transactions", async () => {
    const db = await storage.open("group");
    await db.commit([ev("warm")]);
    const before = db.stats() as ReplicatedStats;
    const batches = Array.from({ length: 64 }, (_, i) => (i % 3 === 0 ? [ev(`g${i}a`), ev(`g${i}b`)] : [ev(`g${i}`)]));
    const commits = batches.map((b) => db.commit(b));
    // Reads and heads racing the in-flight commits see a prefix of the log, never an error.
    const reads = await Promise.all([db.read(), db.head(), db.read(1), db.head()]);
    const receipts = await Promise.all(commits);
    assert.ok((reads[0] as unknown[]).length >= 1 && (reads[1] as number) >= 1);
    const afterStats = db.stats() as ReplicatedStats;
    const txns = afterStats.commitTxns - before.commitTxns;
    assert.ok(txns < 64, `expected grouping: ${txns} etcd transactions for 64 commits`);
    assert.equal(afterStats.commitsResolved - before.commitsResolved, 64);
    // Receipts tile seq 2..N exactly, each the size of its batch.
    const sorted = receipts.map((r, i) => ({ ...r, i })).sort((a, b) => a.firstSeq - b.firstSeq);
    let next = 2;
    for (const r of sorted) {
      assert.equal(r.firstSeq, next);
      assert.equal(r.lastSeq - r.firstSeq + 1, batches[r.i]!.length);
      next = r.lastSeq + 1;
    }
    // The log holds each batch at its receipt, read from a fresh machine (rebuilt from the cluster).
    const other = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/other` });
    try {
      const reader = await other.reader("group");
      const log = await reader.read();
      assert.equal(log.length, next - 1);
      receipts.forEach((r, i) => {
        assert.deepEqual(
          log.slice(r.firstSeq - 1, r.lastSeq).map((e) => e.identity),
          batches[i]!.map((e) => e.identity),
        );
      });
    } finally {
      await other.close();
    }
    await db.close();
  });

  it("a duplicate identity among concurrent commits fails only its own batch", async () => {
    const db = await storage.open("dups");
    await db.commit([ev("old")]);
    const results = await Promise.allSettled([
      db.commit([ev("d1")]),
      db.commit([ev("d2"), ev("old")]), // already in the log
      db.commit([ev("d3")]),
      db.commit([ev("same")]),
      db.commit([ev("same"), ev("d4")]), // same identity as a concurrent batch: only one of them lands
      db.commit([ev("d5")]),
    ]);
    assert.equal(results[0]!.status, "fulfilled");
    assert.equal(results[2]!.status, "fulfilled");
    assert.equal(results[5]!.status, "fulfilled");
    const r1 = results[1]!;
    assert.ok(r1.status === "rejected" && (r1.reason as { reason?: string }).reason === "duplicate_identity");
    assert.deepEqual([...(r1.reason as { identities: string[] }).identities], ["old"]);
    const sameOutcomes = [results[3]!.status, results[4]!.status].sort();
    assert.deepEqual(sameOutcomes, ["fulfilled", "rejected"]);
    const ids = (await db.read()).map((e) => e.identity);
    assert.equal(ids.filter((i) => i === "same").length, 1);
    assert.ok(!ids.includes("d2"), "the refused batch left no trace");
    await db.close();
  });

  it("a batch queued behind one in flight with the same identity is refused locally once that one lands; a later batch sharing its other identity lands", async () => {
    const db = await storage.open("contended");
    const before = (db.stats() as ReplicatedStats).commitTxns;
    // The first is sent at once; the other two queue behind it.
    const results = await Promise.allSettled([db.commit([ev("y")]), db.commit([ev("y"), ev("x")]), db.commit([ev("x")])]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["fulfilled", "rejected", "fulfilled"],
    );
    const refused = results[1]!;
    assert.ok(refused.status === "rejected");
    assert.deepEqual([...(refused.reason as { identities: string[] }).identities], ["y"]);
    assert.equal((db.stats() as ReplicatedStats).commitTxns - before, 2, "the duplicate was refused from the local copy, not by a failed etcd transaction");
    const ids = (await db.read()).map((e) => e.identity);
    assert.deepEqual(ids, ["y", "x"]);
    await db.close();
  });

  it("group commit: after a transaction of several commits the next waits for company (up to groupDelayMs, or until as many are queued); a lone committer never waits; 0 turns it off", async () => {
    const make = (groupDelayMs: number, dir: string) => createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/${dir}`, groupDelayMs });
    const delayed = make(100, "delayed");
    const off = make(0, "off");
    const later = <T>(ms: number, f: () => Promise<T>): Promise<T> => new Promise<void>((r) => setTimeout(r, ms)).then(f);
    try {
      for (const [s, delay] of [[delayed, 100], [off, 0]] as const) {
        const db = await s.open(`group-delay-${delay}`);
        const stats = () => db.stats() as ReplicatedStats;
        // Three at once: the first goes alone (nothing was grouped before), the other two together.
        await Promise.all([db.commit([ev("a1")]), db.commit([ev("a2")]), db.commit([ev("a3")])]);
        assert.equal(stats().commitTxns, 2);
        assert.equal(stats().commitGroupWaits, 0, "no transaction waited: the one before each carried a single commit");
        // The last transaction carried two. b1 waits for company; b2, asked 10 ms later, makes two
        // queued: the wait ends and they go together; b3, asked at 20 ms, is not held for (timers fire
        // in deadline order: 10, 20, then the 100 ms wait, which b2 cut short).
        const receipts = await Promise.all([db.commit([ev("b1")]), later(10, () => db.commit([ev("b2")])), later(20, () => db.commit([ev("b3")]))]);
        if (delay > 0) {
          assert.equal(stats().commitTxns, 4, "b1 and b2 in one transaction, sent when b2 came (not after the whole delay, or b3 would have joined), then b3");
          assert.equal(stats().commitGroupWaits, 2, "b1 waited, and b3 after the group of two");
        } else {
          assert.equal(stats().commitTxns, 5, "without the delay each went alone, at once");
          assert.equal(stats().commitGroupWaits, 0);
        }
        assert.deepEqual(receipts.map((r) => r.firstSeq), [4, 5, 6], "receipts in the order asked");
        // One committer in turn after a transaction of one commit: never waits.
        const waits = stats().commitGroupWaits;
        for (let i = 0; i < 5; i++) await db.commit([ev(`c${i}`)]);
        assert.equal(stats().commitGroupWaits - waits, 0, "a lone committer never waits");
        // Twenty at once: the first alone, nineteen together. After a group that large the next
        // commit does not wait (the transaction's cost is already shared that many ways).
        await Promise.all(Array.from({ length: 20 }, (_, i) => db.commit([ev(`d${i}`)])));
        const txns = stats().commitTxns;
        await db.commit([ev("e")]);
        assert.equal(stats().commitTxns - txns, 1);
        assert.equal(stats().commitGroupWaits - waits, 0, "no wait after a group of 19, nor after the lone one before it");
        assert.equal((await db.read()).length, 3 + 3 + 5 + 20 + 1);
        await db.close();
      }
    } finally {
      await delayed.close();
      await off.close();
    }
  });

  it("close() while a commit waits for company: the commit is refused as not written, nothing of it reaches the log, and the next owner carries on", async () => {
    const s = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/close-wait`, groupDelayMs: 100 });
    try {
      const db = await s.open("close-wait");
      await Promise.all([db.commit([ev("w1")]), db.commit([ev("w2")]), db.commit([ev("w3")])]);
      // Its outcome is taken at once (it is refused during close(), before an assertion could attach).
      const waiting = db.commit([ev("waiting")]).then(
        () => assert.fail("a commit waiting for company was acknowledged although its handle closed first"),
        (err: unknown) => err,
      );
      await new Promise((r) => setImmediate(r)); // the pump that sent w2 and w3 winds down, a new one starts waiting
      assert.equal((db.stats() as ReplicatedStats).commitGroupWaits, 1, "the commit waits for company (the last transaction carried two)");
      await db.close();
      const err = await waiting;
      assert.equal((err as { code?: string }).code, "reset");
      assert.match((err as Error).message, /closed before this commit was sent; nothing was written/);
      assert.equal((db.stats() as ReplicatedStats).commitTxns, 2, "the waiting commit was never sent");
      const next = await s.open("close-wait");
      assert.deepEqual((await next.read()).map((e) => e.identity), ["w1", "w2", "w3"]);
      assert.deepEqual(await next.commit([ev("waiting")]), { firstSeq: 4, lastSeq: 4 }, "the refused commit can be made again");
      await next.close();
    } finally {
      await s.close();
    }
  });

  it("commits queued behind a transaction are checked for duplicates together when their group is taken: each duplicate is refused with exactly its identities, the rest land once each", async () => {
    const db = await storage.open("queued-dups");
    await db.commit(Array.from({ length: 20 }, (_, i) => ev(`logged${i}`)));
    await db.commit(Array.from({ length: 20 }, (_, i) => ev(`logged${20 + i}`)));
    const before = (db.stats() as ReplicatedStats).commitTxns;
    // 300 commits at once: the first goes alone, the rest queue behind it (more than one group's worth).
    const kindOf = (i: number): "logged" | "shared" | "new" => (i % 7 === 3 ? "logged" : i % 11 === 5 ? "shared" : "new");
    const batches = Array.from({ length: 300 }, (_, i) => {
      switch (kindOf(i)) {
        case "logged":
          return [ev(`q${i}`), ev(`logged${i % 40}`)]; // holds an identity already in the log
        case "shared":
          return [ev(`shared${i % 3}`)]; // shares its identity with other queued commits
        case "new":
          return [ev(`q${i}`)];
      }
    });
    const results = await Promise.allSettled(batches.map((b) => db.commit(b)));
    const landed: string[] = [];
    const sharedLanded = new Map<string, number>();
    results.forEach((r, i) => {
      const kind = kindOf(i);
      if (kind === "new") {
        assert.equal(r.status, "fulfilled", `commit ${i}: ${r.status === "rejected" ? String(r.reason) : ""}`);
      } else if (kind === "logged") {
        assert.ok(r.status === "rejected", `commit ${i} holds an identity of the log`);
        assert.equal((r.reason as { reason?: string }).reason, "duplicate_identity");
        assert.deepEqual([...(r.reason as { identities: string[] }).identities], [`logged${i % 40}`], "only the identity in the log is named");
      } else if (r.status === "fulfilled") {
        sharedLanded.set(`shared${i % 3}`, (sharedLanded.get(`shared${i % 3}`) ?? 0) + 1);
      } else {
        assert.equal((r.reason as { reason?: string }).reason, "duplicate_identity");
        assert.deepEqual([...(r.reason as { identities: string[] }).identities], [`shared${i % 3}`]);
      }
      if (r.status === "fulfilled") landed.push(...batches[i]!.map((e) => e.identity));
    });
    assert.deepEqual([...sharedLanded.entries()].sort(), [["shared0", 1], ["shared1", 1], ["shared2", 1]], "exactly one commit of each shared identity landed");
    const ids = (await db.read()).map((e) => e.identity);
    assert.equal(new Set(ids).size, ids.length, "no identity twice in the log");
    assert.deepEqual(ids.slice(40).sort(), landed.sort(), "the log holds exactly the commits that resolved");
    const txns = (db.stats() as ReplicatedStats).commitTxns - before;
    assert.ok(txns >= Math.ceil(landed.length / 127) && txns <= 8, `${landed.length} commits went in a few groups of at most 127 (${txns} transactions)`);
    // The groups as etcd holds them: the records one transaction wrote share its revision.
    const records = await etcd.getAll().prefix(keysOf("queued-dups").logPrefix).exec();
    const perTxn = new Map<string, number>();
    for (const kv of records.kvs) perTxn.set(kv.mod_revision, (perTxn.get(kv.mod_revision) ?? 0) + 1);
    const sizes = [...perTxn.values()];
    assert.equal(sizes.reduce((a, b) => a + b, 0), 2 + landed.length, "one record per commit");
    assert.ok(Math.max(...sizes) <= 127, `no group over 127 commits (etcd's 128 operations, the head's put included): ${sizes.join(", ")}`);
    assert.ok(sizes.includes(127), `the queued commits filled a group to the limit (all 300 were queued before the first transaction returned): ${sizes.join(", ")}`);
    await db.close();
  });

  it("a queued commit left out of a full group is checked again when it shares an identity with that group", async () => {
    const db = await storage.open("left-out");
    const big = (id: string) => event("execution_output", "s1", id, AT, { cell_id: 1, n: 0, stream: "stdout", data: "z".repeat(600 * 1024) });
    // One in flight; behind it c0 (600 KiB, identity X), c1 (600 KiB: c0 and c1 do not fit one
    // transaction), and d (identity X again, a few bytes). All three are checked when c0's group is
    // taken; c1 and d are left for the next, where d must be refused, not sent beside c1.
    const results = await Promise.allSettled([db.commit([ev("lead")]), db.commit([big("X")]), db.commit([big("Y")]), db.commit([ev("X")])]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["fulfilled", "fulfilled", "fulfilled", "rejected"],
    );
    const refused = results[3]!;
    assert.ok(refused.status === "rejected");
    assert.equal((refused.reason as { reason?: string }).reason, "duplicate_identity");
    assert.deepEqual([...(refused.reason as { identities: string[] }).identities], ["X"]);
    assert.deepEqual(
      (await db.read()).map((e) => e.identity),
      ["lead", "X", "Y"],
    );
    assert.deepEqual(await db.commit([ev("after")]), { firstSeq: 4, lastSeq: 4 }, "the handle is healthy");
    await db.close();
  });

  it("a head key removed under its owner: the commit is refused with nothing written, says what was altered, and the handle is poisoned", async () => {
    const db = await storage.open("headless");
    await db.commit([ev("h1")]);
    await etcd.delete().key("cairn/db/headless/head");
    await assert.rejects(db.commit([ev("h2")]), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "uncertain");
      assert.match((err as Error).message, /was refused and nothing of it was written: the head key was removed outside Cairn under this owner.s epoch \(it held 1\)/);
      return true;
    });
    assert.equal(await etcd.get("cairn/db/headless/log/0000000000000002").string(), null, "no record was written");
    await assert.rejects(db.commit([ev("h3")]), (err: unknown) => (err as { code?: string }).code === "uncertain", "the handle stays poisoned");
    await db.close().catch(() => undefined);
  });

  it("list() names every database once, sorted, without reading their logs", async () => {
    const names = await storage.list();
    for (const n of ["dups", "group", "queued-dups"]) assert.ok(names.includes(n), `${n} in ${names.join(",")}`);
    assert.deepEqual(names, [...new Set(names)].sort());
  });

  it("an event over the size limit, or too many events, is refused as too_large before anything is written", async () => {
    const db = await storage.open("big");
    await db.commit([ev("small")]);
    const revisionBefore = (await etcd.get("cairn/db/big/head").exec()).header.revision;
    const huge = event("execution_output", "s1", "huge", AT, { cell_id: 1, n: 0, stream: "stdout", data: "x".repeat(MAX_BATCH_BYTES + 10) });
    await assert.rejects(db.commit([huge]), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "rejected");
      assert.equal((err as { reason?: string }).reason, "too_large");
      assert.match((err as Error).message, /at most \d+ bytes per commit/);
      return true;
    });
    const many = Array.from({ length: MAX_BATCH_EVENTS + 1 }, (_, i) => ev(`many${i}`));
    await assert.rejects(db.commit(many), (err: unknown) => (err as { reason?: string }).reason === "too_large");
    // Nothing was written anywhere in etcd, and the handle is still usable.
    assert.equal((await etcd.get("cairn/db/big/head").exec()).header.revision, revisionBefore);
    assert.deepEqual(await db.commit([ev("after")]), { firstSeq: 2, lastSeq: 2 });
    // The largest allowed batch goes through as one atomic commit.
    const max = Array.from({ length: MAX_BATCH_EVENTS }, (_, i) => ev(`max${i}`));
    assert.deepEqual(await db.commit(max), { firstSeq: 3, lastSeq: 2 + MAX_BATCH_EVENTS });
    // Just under the byte limit still fits etcd's request limit (1.5 MiB), and reads back whole.
    const nearly = event("execution_output", "s1", "nearly", AT, { cell_id: 1, n: 1, stream: "stdout", data: "y".repeat(MAX_BATCH_BYTES - 4096) });
    const r = await db.commit([nearly]);
    assert.equal(r.firstSeq, 3 + MAX_BATCH_EVENTS);
    const fresh = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/fresh-big` });
    try {
      const back = await (await fresh.reader("big")).read(r.firstSeq - 1);
      assert.deepEqual(back, [{ ...nearly, seq: r.firstSeq }]);
    } finally {
      await fresh.close();
    }
    await db.close();
  });

  it("large and multi-byte commits: exactly MAX_BATCH_BYTES, MAX_BATCH_EVENTS events with 512-character non-ASCII identities, one byte over is refused and not written", async () => {
    const db = await storage.open("large");
    const ledger = new Ledger();
    // One event whose JSON array is exactly MAX_BATCH_BYTES, with 2-, 3- and 4-byte characters and escapes.
    const sized = (id: string, target: number): NewEvent => {
      const mixed = "é€😀\u0000\u001f\"\\\n\t".repeat(2000);
      const base = Buffer.byteLength(JSON.stringify([out(id, mixed)]));
      return out(id, mixed + "a".repeat(target - base));
    };
    const exact = sized("exact-ü-😀", MAX_BATCH_BYTES);
    assert.equal(Buffer.byteLength(JSON.stringify([exact])), MAX_BATCH_BYTES);
    await ledger.commit(db, [exact.identity], [exact]);
    const over = sized("over-1", MAX_BATCH_BYTES + 1);
    await ledger.commit(db, [over.identity], [over]);
    // MAX_BATCH_EVENTS events with the longest identities, non-ASCII, totalling near the byte limit.
    const idOf = (i: number): string => `${String(i).padStart(3, "0")}-🔑` + "ключ-鍵/".repeat(80).slice(0, 512 - 6);
    const perEvent = Math.floor(MAX_BATCH_BYTES / MAX_BATCH_EVENTS) - 1400;
    const many = Array.from({ length: MAX_BATCH_EVENTS }, (_, i) => out(idOf(i), "ж".repeat(perEvent / 2)));
    assert.ok(Buffer.byteLength(JSON.stringify(many)) <= MAX_BATCH_BYTES);
    await ledger.commit(db, many.map((e) => e.identity), many);
    // Several large commits at once (each goes alone: two would pass the byte limit).
    await Promise.all(Array.from({ length: 4 }, (_, i) => ledger.commit(db, [`par-${i}`], [out(`par-${i}`, "p".repeat(700 * 1024))])));
    const overAttempt = ledger.attempts.find((a) => a.ids[0] === "over-1")!;
    assert.ok(overAttempt.error instanceof StorageRejected && overAttempt.error.reason === "too_large", String(overAttempt.error));
    assert.deepEqual(ledger.attempts.filter((a) => a.outcome === "failed" && a !== overAttempt).map((a) => String(a.error)), [], ledger.summary());
    await db.close();
    const log = await freshLog(dc.cluster.endpoints, `${dirs.dir}/fresh-large`, "large");
    checkLog("large", log, ledger);
    const byId = new Map(log.map((e) => [e.identity, e]));
    assert.deepEqual(byId.get(exact.identity)!.body, exact.body, "the exact-limit event reads back equal");
    many.forEach((e) => assert.deepEqual(byId.get(e.identity)?.body, e.body, "each of the many events reads back equal"));
  });

  it("the largest transaction the adapter can build (128-character name, MAX_BATCH_EVENTS 512-character 3-byte identities, exactly MAX_BATCH_BYTES) fits etcd's request limit and reads back", async () => {
    const name = "W" + "x".repeat(127);
    const db = await storage.open(name);
    const ledger = new Ledger();
    const idOf = (i: number): string => String(i).padStart(4, "0") + "鍵".repeat(508);
    const base = Array.from({ length: MAX_BATCH_EVENTS }, (_, i) => out(idOf(i), ""));
    const room = MAX_BATCH_BYTES - Buffer.byteLength(JSON.stringify(base));
    assert.ok(room > 0, `room ${room}`);
    const each = Math.floor(room / MAX_BATCH_EVENTS);
    const events = base.map((e, i) => out(e.identity, "d".repeat(each + (i === 0 ? room - each * MAX_BATCH_EVENTS : 0))));
    assert.equal(Buffer.byteLength(JSON.stringify(events)), MAX_BATCH_BYTES);
    await ledger.commit(db, events.map((e) => e.identity), events);
    assert.deepEqual(ledger.attempts.map((a) => (a.outcome === "acked" ? "acked" : String(a.error))), ["acked"]);
    await db.close();
    const log = await freshLog(dc.cluster.endpoints, `${dirs.dir}/fresh-largest`, name);
    checkLog(name, log, ledger);
    assert.deepEqual(log.map((e) => e.body), events.map((e) => e.body));
  });

  it("answers lost after etcd applied the commit (a proxy holds every answer past the attempt deadline, then resets every connection), including a 300 KiB record read back: each commit acknowledged once, none doubled", async () => {
    const proxies = dc.cluster.endpoints.map((u) => new TcpProxy(new URL(u)));
    const endpoints = await Promise.all(proxies.map((p) => p.start()));
    const proxied = createReplicatedStorage({ endpoints, dataDir: `${dirs.dir}/proxied`, attemptTimeoutMs: 1000, commitTimeoutMs: 2500, healthIntervalMs: 250 });
    const ledger = new Ledger();
    // Large enough for many DATA frames; small enough that a resend (the whole payload again) and its
    // read-back fit one attempt deadline on a loaded machine.
    const big = "é€😀\u0001\"\\ " + "b".repeat(300 * 1024);
    try {
      const small = await proxied.open("lost-small");
      const large = await proxied.open("lost-large");
      await ledger.commit(small, ["warm-s"]);
      await ledger.commit(large, ["warm-l"]);
      const before = (small.stats() as ReplicatedStats).commitAttempts;
      for (const p of proxies) p.hold();
      const pending = [ledger.commit(small, ["s1", "s2"]), ledger.commit(small, ["s3"]), ledger.commit(large, ["big1"], [out("big1", big)])];
      await new Promise((r) => setTimeout(r, 2300));
      // etcd applied them while no answer reached the adapter.
      assert.equal(await etcd.get(keysOf("lost-large").head).string(), "2", "the large commit applied while its answer was held");
      // The two small commits go in one group or the second waits for the first's outcome.
      assert.match((await etcd.get(keysOf("lost-small").head).string())!, /^[34]$/, "the first small commit applied while its answer was held");
      assert.equal(ledger.attempts.filter((a) => a.outcome !== "pending").length, 2, "nothing was acknowledged while the answers were held");
      for (const p of proxies) p.release();
      await bounded(Promise.all(pending), `commits after the answers came back (${ledger.summary()})`, 30_000);
      const attempts = (small.stats() as ReplicatedStats).commitAttempts - before;
      assert.ok(attempts > 3, `the lost answers were resent (${attempts} attempts for 3 commits)`);
      // Then every connection is reset (RST) while a burst is in flight.
      const burst: Promise<void>[] = [];
      for (let i = 0; i < 30; i++) burst.push(ledger.commit(small, [`r${i}`]), ledger.commit(large, [`R${i}`], [out(`R${i}`, "x".repeat(20_000))]));
      await new Promise((r) => setTimeout(r, 5));
      const reset = proxies.reduce((n, p) => n + p.resetAll(), 0);
      await bounded(Promise.all(burst), `commits after the resets (${ledger.summary()})`, 30_000);
      assert.ok(reset > 0, "connections were reset");
      await small.close();
      await large.close();
    } finally {
      await proxied.close();
      for (const p of proxies) await p.stop();
    }
    const failed = ledger.attempts.filter((a) => a.outcome === "failed");
    assert.deepEqual(failed.map((a) => String(a.error)), [], `lost answers are resolved by reading back, never reported as failures: ${ledger.summary()}`);
    for (const name of ["lost-small", "lost-large"]) {
      const log = await freshLog(dc.cluster.endpoints, `${dirs.dir}/fresh-${name}`, name);
      checkLog(name, log, ledger);
      if (name === "lost-large") assert.equal((log.find((x) => x.identity === "big1")!.body as { data: string }).data, big, "the 300 KiB record is read back byte for byte");
    }
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/commit.test.ts");
