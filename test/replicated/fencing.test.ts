/**
 * Ownership and the local copy, with two Storage objects on separate data directories (two
 * machines) and one real cluster: the second opener fences the first promptly (watch, no commit
 * needed), a fenced process can never append (also with commits in flight while it is fenced), the
 * second machine's empty copy is rebuilt, a diverged copy is discarded and rebuilt, a lagging one
 * catches up.
 */
import assert from "node:assert/strict";
import { existsSync, rmSync, statSync, writeFileSync } from "node:fs";
import { after, before, describe, it } from "node:test";
import Sqlite from "better-sqlite3";
import type { Database, DatabaseSignal, Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage, localCopyPath, type ReplicatedStats } from "../../storage-adapters/replicated/index.js";
import { chainHash, keysOf } from "../../storage-adapters/replicated/layout.js";
import { Etcd3 } from "etcd3";
import { message } from "../../src/storage/conformance/fixtures.js";
import { captureLogger, damageTable, devCluster, ev, tempDir } from "./helpers.js";
import { LocalCopy } from "../../storage-adapters/replicated/local-copy.js";
import { exitAfterTests } from "../support/exit.js";

async function eventually(done: () => boolean, what: string, ms = 120_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!done()) {
    if (Date.now() > deadline) assert.fail(`never happened within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const isFenced = (err: unknown): boolean => {
  assert.equal((err as { code?: string }).code, "reset", String(err));
  assert.equal((err as { action?: string }).action, "stop");
  assert.equal((err as { reason?: string }).reason, "fenced");
  return true;
};

describe("replicated ownership and local copy", () => {
  let dc: Awaited<ReturnType<typeof devCluster>>;
  const dirs = tempDir("fencing");
  const storages: Storage[] = [];
  const machine = (label: string, logger = captureLogger()) => {
    const s = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/${label}`, logger });
    storages.push(s);
    return { storage: s, logger, dataDir: `${dirs.dir}/${label}` };
  };
  /** A machine whose owner lease is long (60 s), so that it outlives a test's waits unless revoked. */
  const long = (label: string): Storage => {
    const s = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/${label}`, livenessMs: 60_000 });
    storages.push(s);
    return s;
  };
  /** The `<db>/waitfor/` entries of `name`: [the lease the key names, the lease it is attached to], sorted. */
  const waiting = async (name: string): Promise<string[][]> => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const res = await admin.getAll().prefix(keysOf(name).waitForPrefix).exec();
      return res.kvs.map((kv) => [kv.key.toString().slice(keysOf(name).waitForPrefix.length), String(kv.lease)]).sort();
    } finally {
      admin.close();
    }
  };
  /**
   * `db` waits before launching (its `previousGone()` still pending a second on) while an earlier owner
   * lives, and stops waiting once `end()` has ended that owner (its lease revoked by its close).
   */
  const waitsUntil = async (db: Database, end: () => Promise<unknown>, who: string): Promise<void> => {
    let gone = false;
    void db.lease!.previousGone().then(() => (gone = true));
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(gone, false, `it waits while ${who}'s lease lives`);
    await end();
    await eventually(() => gone, `the wait ends once ${who}'s lease is gone`, 30_000);
  };
  /** Identities of the whole log as a brand-new machine reads it from the cluster. */
  const clusterLog = async (name: string): Promise<string[]> => {
    const s = machine(`probe-${Math.random().toString(36).slice(2)}`).storage;
    const r = await s.reader(name);
    return (await r.read()).map((e) => e.identity);
  };

  before(async () => {
    dc = await devCluster();
  });
  after(async () => {
    for (const s of storages) await s.close().catch(() => undefined);
    await dc?.stop();
    dirs.remove();
  });

  it("B opens: A's watch reports fenced without a commit; A is refused everything; B's empty copy is rebuilt with all of A's commits", async () => {
    const A = machine("A");
    const B = machine("B");
    const a = await A.storage.open("f");
    const acked: string[] = [];
    for (let i = 0; i < 10; i++) {
      await a.commit([ev(`a${i}`), ev(`a${i}-2`)]);
      acked.push(`a${i}`, `a${i}-2`);
    }
    const signals: DatabaseSignal[] = [];
    a.watch((s) => signals.push(s));
    assert.ok(!existsSync(localCopyPath(B.dataDir, "f")), "B's machine starts with no local copy");
    const b = await B.storage.open("f");
    assert.ok(b.epoch > a.epoch);
    await eventually(() => signals.some((s) => s.type === "fenced"), "A's watch reports fenced");
    assert.deepEqual(signals.find((s) => s.type === "fenced"), { type: "fenced", epoch: b.epoch });
    assert.equal(a.stats().fenced, true);
    await assert.rejects(a.commit([ev("late")]), isFenced);
    await assert.rejects(a.read(), isFenced);
    await assert.rejects(a.head(), isFenced);
    await assert.rejects(a.drain(), isFenced);
    await assert.rejects(a.ack(1), isFenced);
    assert.deepEqual((await b.read()).map((e) => e.identity), acked);
    assert.ok(existsSync(localCopyPath(B.dataDir, "f")));
    assert.ok(B.logger.lines.some((l) => l.includes("rebuilt from the cluster")), "the rebuild is logged");
    await b.commit([ev("b0")]);
    assert.deepEqual(await clusterLog("f"), [...acked, "b0"]);
    await a.close();
    await b.close();
  });

  it("commits in flight while another machine opens: every resolved commit is in the log, every refused one is not, none after the fence", async () => {
    const A = machine("A2");
    const B = machine("B2");
    const a = await A.storage.open("race");
    const resolved: string[] = [];
    const refused: string[] = [];
    let stop = false;
    const worker = async (w: number): Promise<void> => {
      for (let i = 0; !stop; i++) {
        const id = `w${w}-${i}`;
        try {
          await a.commit([ev(id)]);
          resolved.push(id);
        } catch (err) {
          isFenced(err);
          refused.push(id);
          return;
        }
      }
    };
    const workers = [0, 1, 2, 3, 4].map((w) => worker(w));
    await eventually(() => resolved.length >= 20, "some commits landed before the second opener");
    const b = await B.storage.open("race");
    await Promise.all(workers);
    stop = true;
    assert.equal(refused.length, 5, "every worker was eventually refused");
    const log = (await b.read()).map((e) => e.identity);
    assert.deepEqual([...log].sort(), [...resolved].sort(), "the log holds exactly the resolved commits");
    for (const id of refused) assert.ok(!log.includes(id));
    assert.equal(await b.head(), resolved.length);
    await a.close();
    await b.close();
  });

  it("the epoch key written between commit() and its transaction, with the owner's own number (as a database deleted and created again at epoch 1 holds it) or the next: the transaction's guard refuses it, the read-back says fenced and by which epoch, nothing is written", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    let rewrite: (() => Promise<void>) | null = null;
    const storage = createReplicatedStorage({
      endpoints: dc.cluster.endpoints,
      dataDir: `${dirs.dir}/rewritten`,
      faults: async (point) => {
        if (point !== "commit:before" || rewrite === null) return;
        const f = rewrite;
        rewrite = null;
        await f();
      },
    });
    storages.push(storage);
    try {
      for (const written of ["1", "2"]) {
        // The handle's epoch watch may learn of the write before the commit is sent (then the commit
        // is refused before sending); each round uses a new database until the transaction's own
        // guard decided at least once.
        let guardDecided = 0;
        for (let round = 0; round < 12 && guardDecided < 1; round++) {
          const name = `rewritten-${written}-${round}`;
          const db = await storage.open(name);
          assert.equal(db.epoch, 1);
          await db.commit([ev("a1")]);
          const signals: DatabaseSignal[] = [];
          db.watch((s) => signals.push(s));
          const keys = keysOf(name);
          // Right before the commit is sent. With "1" the number and the head are what they were:
          // only the key's revision tells that the claim is gone.
          rewrite = async () => {
            await admin.put(keys.epoch).value(written);
          };
          const before = (db.stats() as ReplicatedStats).commitTxns;
          const err = await db.commit([ev("a2")]).then(
            () => assert.fail("a commit after the epoch key was written was acknowledged"),
            (e: unknown) => e,
          );
          assert.ok(isFenced(err));
          if (written === "2") assert.match((err as Error).message, /epoch 2/, "the epoch read back is named");
          assert.equal(rewrite, null, "the fault point was reached");
          if ((db.stats() as ReplicatedStats).commitTxns > before) guardDecided++;
          assert.equal(await admin.get(keys.head).string(), "1", "nothing was written");
          assert.deepEqual(await clusterLog(name), ["a1"]);
          await eventually(() => signals.some((s) => s.type === "fenced"), "the watch reports the fence");
          await assert.rejects(db.commit([ev("a3")]), isFenced);
          await db.close();
        }
        assert.ok(guardDecided >= 1, `epoch key written as ${written}: at least one fence was decided by the transaction's guard, not by the watch`);
      }
    } finally {
      admin.close();
    }
  });

  it("a database deleted and created again by another machine while its owner (epoch 1, nothing committed) runs: the old owner is refused, and the new database's log and mailbox are untouched", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const A = machine("recreated-A");
      const B = machine("recreated-B");
      const a = await A.storage.open("recreated");
      assert.equal(a.epoch, 1);
      const signals: DatabaseSignal[] = [];
      a.watch((s) => signals.push(s));
      await admin.delete().prefix(keysOf("recreated").prefix);
      await eventually(() => signals.some((s) => s.type === "fenced"), "the deletion fences the owner (its watch)");
      const b = await B.storage.open("recreated");
      assert.equal(b.epoch, 1, "the new database starts at the old owner's epoch");
      await B.storage.post("recreated", message("m1"));
      assert.deepEqual(await b.commit([ev("b1")]), { firstSeq: 1, lastSeq: 1 });
      await assert.rejects(a.commit([ev("a1")]), isFenced);
      await assert.rejects(a.ack(1), isFenced);
      assert.deepEqual(await clusterLog("recreated"), ["b1"]);
      assert.deepEqual((await b.drain()).map((m) => m.id), ["m1"], "the new database's mailbox is whole");
      assert.deepEqual(await b.commit([ev("b2")]), { firstSeq: 2, lastSeq: 2 });
      await a.close();
      await b.close();
    } finally {
      admin.close();
    }
  });

  it("an open that fails after its claim (the cluster's log unreadable) while the previous owner's lease lives hands that lease over (an entry attached to it), so the next opener still waits for it", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      // The first owner's lease is long (60 s), so that it outlives this test's waits unless revoked.
      const storageA = long("abandon-A");
      const a = await storageA.open("abandon");
      await a.commit([ev("x1")]);
      const keys = keysOf("abandon");
      const ownerA = JSON.parse((await admin.get(keys.liveness).string())!) as { lease: string };
      // The one batch record made unreadable: a machine with an empty copy fails while catching up.
      const good = (await admin.get(keys.log(1)).string())!;
      await admin.put(keys.log(1)).value("not a batch record");
      const B = machine("abandon-B");
      await assert.rejects(B.storage.open("abandon"), (err: unknown) => {
        assert.match(String(err), /abandon/);
        assert.doesNotMatch(String(err), /opened by another process|unavailable|timed out/i, "it failed while catching up, not on the cluster");
        return true;
      });
      assert.equal(await admin.get(keys.epoch).string(), "2", "the failed open had claimed");
      assert.deepEqual(await waiting("abandon"), [[ownerA.lease, ownerA.lease]], "the previous owner's lease, handed over on itself");
      // The next opener (the log mended) waits for the first owner, which still runs...
      await admin.put(keys.log(1)).value(good);
      const c = await machine("abandon-C").storage.open("abandon");
      await waitsUntil(c, () => a.close(), "the first owner");
      await c.close();
    } finally {
      admin.close();
    }
  });

  it("a clean close soon after an open, before the earlier owners' leases were seen gone, hands each over to an entry attached to that lease: the next opener still waits for them, and one's revoke ends only its own", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      // Two earlier owners with long leases (60 s), so that they outlive this test's waits unless revoked.
      const keys = keysOf("handover");
      const record = async () => JSON.parse((await admin.get(keys.liveness).string())!) as { epoch: number; lease: string; pending: { lease: string }[] };
      const a = await long("handover-A").open("handover");
      await a.commit([ev("h1")]);
      const ownerA = await record();
      // The second owner fences the first (whose lease lives on).
      const b = await long("handover-B").open("handover");
      const ownerB = await record();
      // The third owner opens and closes at once, never having seen either lease gone.
      const entryA = async () => (await admin.get(keys.waitFor(ownerA.lease)).exec()).kvs[0]?.mod_revision;
      const handedByB = await entryA();
      assert.notEqual(handedByB, undefined, "the second owner's claim handed the first lease over");
      const c = await machine("handover-C").storage.open("handover");
      assert.equal(c.epoch, 3);
      assert.equal(await entryA(), handedByB, "an entry already there (it lasts as long as its lease) is not put again");
      const ownerC = await record();
      assert.deepEqual(
        ownerC.pending.map((p) => p.lease).sort(),
        [ownerA.lease, ownerB.lease].sort(),
      );
      await c.close();
      assert.equal(await admin.get(keys.liveness).string(), null, "its own record went with its revoked lease");
      assert.deepEqual(
        await waiting("handover"),
        [
          [ownerA.lease, ownerA.lease],
          [ownerB.lease, ownerB.lease],
        ].sort(),
        "each earlier lease handed over, attached to itself",
      );
      // The second owner learns it was fenced and closes: its lease is revoked, and only its entry goes.
      await b.close();
      assert.deepEqual(await waiting("handover"), [[ownerA.lease, ownerA.lease]]);
      // The next opener waits for the first owner, which still holds its lease...
      const d = await machine("handover-D").storage.open("handover");
      await waitsUntil(d, () => a.close(), "the first owner");
      assert.deepEqual(await waiting("handover"), []);
      // The fourth owner saw every earlier lease gone: its close revokes its lease and its record with it.
      await d.close();
      assert.equal(await admin.get(keys.liveness).string(), null);
    } finally {
      admin.close();
    }
  });

  it("an owner that dies right after its claim (never closing) has already handed the earlier leases over: the next opener still waits for them", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const storageA = long("dies-A");
      const a = await storageA.open("dies");
      await a.commit([ev("d1")]);
      const keys = keysOf("dies");
      const ownerA = JSON.parse((await admin.get(keys.liveness).string())!) as { lease: string };
      const b = await machine("dies-B").storage.open("dies");
      assert.deepEqual(await waiting("dies"), [[ownerA.lease, ownerA.lease]], "handed over by the open itself");
      // The second owner dies: its lease runs out (revoked here, at once), and its record with it.
      const ownerB = JSON.parse((await admin.get(keys.liveness).string())!) as { lease: string };
      await admin.leaseClient.leaseRevoke({ ID: ownerB.lease });
      assert.equal(await admin.get(keys.liveness).string(), null);
      const c = await machine("dies-C").storage.open("dies");
      await waitsUntil(c, () => a.close(), "the first owner");
      await c.close();
      await b.close().catch(() => undefined);
    } finally {
      admin.close();
    }
  });

  it("an owner that dies the moment its claim lands (before it sends anything else) leaves the earlier leases handed over by the claim itself: an opener claiming right then still waits for them", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const a = await long("instant-A").open("instant");
      await a.commit([ev("i1")]);
      const keys = keysOf("instant");
      const ownerA = JSON.parse((await admin.get(keys.liveness).string())!) as { lease: string };
      let c: Database | null = null;
      let gone = false;
      const storageB = createReplicatedStorage({
        endpoints: dc.cluster.endpoints,
        dataDir: `${dirs.dir}/instant-B`,
        faults: async (point, detail) => {
          if (point !== "open:after-claim") return;
          // The new owner's lease runs out right after its claim (it froze, or died), its record with
          // it, and another opener claims before this one sends anything more.
          assert.deepEqual(await waiting("instant"), [[ownerA.lease, ownerA.lease]], "handed over by the claim's own transaction");
          await admin.leaseClient.leaseRevoke({ ID: detail!.lease! });
          assert.equal(await admin.get(keys.liveness).string(), null);
          c = await machine("instant-C").storage.open("instant");
          void c.lease!.previousGone().then(() => (gone = true));
        },
      });
      storages.push(storageB);
      // B was fenced by C meanwhile: its open fails or hands back a fenced database; either way C owns.
      const b = await storageB.open("instant").catch(() => null);
      assert.ok(c !== null);
      assert.equal((c as Database).epoch, 3);
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(gone, false, "the third owner waits while the first owner's lease lives");
      await a.close();
      await eventually(() => gone, "the wait ends once the first owner's lease is gone", 30_000);
      await (c as Database).close();
      await b?.close().catch(() => undefined);
    } finally {
      admin.close();
    }
  });

  it("a claim that lands late in its lease's life (past the safety margin, before etcd's expiry) renews the lease before counting it: the owner starts held, not lost", async () => {
    const logger = captureLogger();
    const s = createReplicatedStorage({
      endpoints: dc.cluster.endpoints,
      dataDir: `${dirs.dir}/late-claim`,
      livenessMs: 4000,
      logger,
      faults: async (point) => {
        // 4 s lease, margin 1 s: counted lost from 3 s after the grant unless renewed.
        if (point === "open:after-claim") await new Promise((r) => setTimeout(r, 3300));
      },
    });
    storages.push(s);
    const db = await s.open("late-claim");
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(db.lease!.held(), true, logger.lines.join("\n"));
    assert.deepEqual(await db.commit([ev("late1")]), { firstSeq: 1, lastSeq: 1 });
    await db.close();
  });

  it("an earlier owner's lease gone between the reading of the record naming it and the claim: etcd refuses the claim, the opener drops that lease and claims again, and waits for the others", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const keys = keysOf("dropgone");
      const record = async () => JSON.parse((await admin.get(keys.liveness).string())!) as { lease: string; pending: { lease: string }[] };
      const a = await long("dropgone-A").open("dropgone");
      await a.commit([ev("g1")]);
      const ownerA = await record();
      const b = await long("dropgone-B").open("dropgone");
      const ownerB = await record();
      assert.deepEqual(ownerB.pending.map((p) => p.lease), [ownerA.lease]);
      // The first owner closes (its lease revoked, its entry with it); the second never saw it gone, so
      // its record still names it.
      await a.close();
      assert.deepEqual(await waiting("dropgone"), [], "the first owner's entry went with its lease");
      assert.deepEqual((await record()).pending.map((p) => p.lease), [ownerA.lease]);
      const C = machine("dropgone-C");
      const c = await C.storage.open("dropgone");
      assert.equal(c.epoch, 3, "one epoch claimed: the refused claim wrote nothing");
      assert.deepEqual(await waiting("dropgone"), [[ownerB.lease, ownerB.lease]], "the live earlier lease handed over, the gone one not");
      assert.deepEqual((await record()).pending.map((p) => p.lease), [ownerB.lease], "the new record names the live earlier lease only");
      await waitsUntil(c, () => b.close(), "the second owner");
      await c.close();
    } finally {
      admin.close();
    }
  });

  it("a clean close with no earlier owner to wait for, or after it saw them gone, deletes its owner record (its lease revoked)", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const keys = keysOf("handover-none");
      const a = await machine("handover-none-A").storage.open("handover-none");
      assert.notEqual(await admin.get(keys.liveness).string(), null);
      await a.close();
      assert.equal(await admin.get(keys.liveness).string(), null, "first owner: nothing to hand over");
      const b = await machine("handover-none-B").storage.open("handover-none");
      await b.lease!.previousGone();
      await b.close();
      assert.equal(await admin.get(keys.liveness).string(), null, "after previousGone(): nothing to hand over");
    } finally {
      admin.close();
    }
  });

  it("an opener whose lease runs out between its grant and its claim (a pause) claims again with a new lease: one epoch claimed, the owner record on a live lease; three in a row: StorageUnavailable, nothing claimed", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const keys = keysOf("expire");
      const first = await machine("expire-A").storage.open("expire");
      await first.commit([ev("x1")]);
      await first.close();
      // Once: the open claims with a second lease.
      let grants = 0;
      const logger = captureLogger();
      const once = createReplicatedStorage({
        endpoints: dc.cluster.endpoints,
        dataDir: `${dirs.dir}/expire-B`,
        logger,
        faults: async (point, detail) => {
          if (point !== "open:after-grant") return;
          grants++;
          // The lease just granted runs out (revoked here) before the claim reaches etcd.
          if (grants === 1) await admin.leaseClient.leaseRevoke({ ID: detail!.lease! });
        },
      });
      storages.push(once);
      const b = await once.open("expire");
      assert.equal(grants, 2);
      assert.equal(b.epoch, 2, "one epoch claimed: the refused claim wrote nothing");
      const kv = (await admin.get(keys.liveness).exec()).kvs[0];
      assert.ok(kv !== undefined);
      const ttl = await admin.leaseClient.leaseTimeToLive({ ID: kv.lease, keys: false });
      assert.ok(Number(ttl.TTL) > 0, "the owner record is attached to a live lease");
      assert.ok(logger.lines.some((l) => l.includes("claiming again with a new lease")), "the retry is logged");
      assert.deepEqual(await b.commit([ev("x2")]), { firstSeq: 2, lastSeq: 2 });
      await b.close();

      // Every time: the open gives up with a sentence that says what happened, and claims nothing.
      let revoked = 0;
      const always = createReplicatedStorage({
        endpoints: dc.cluster.endpoints,
        dataDir: `${dirs.dir}/expire-C`,
        faults: async (point, detail) => {
          if (point !== "open:after-grant") return;
          await admin.leaseClient.leaseRevoke({ ID: detail!.lease! });
          revoked++;
        },
      });
      storages.push(always);
      await assert.rejects(always.open("expire"), (err: unknown) => {
        assert.equal((err as { code?: string }).code, "unavailable");
        assert.match(String(err), /the lease granted for its claim ran out before the claim reached etcd, 3 times in a row .*nothing was claimed/);
        return true;
      });
      assert.equal(revoked, 3);
      assert.equal(await admin.get(keys.epoch).string(), "2", "nothing claimed");
      const c = await machine("expire-D").storage.open("expire");
      assert.equal(c.epoch, 3);
      assert.deepEqual((await c.read()).map((e) => e.identity), [ev("x1"), ev("x2")].map((e) => e.identity));
      await c.close();
    } finally {
      admin.close();
    }
  });

  it("an open claiming again with a new lease still waits for an earlier owner its first attempt saw named, though the record naming it is gone by then", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      // The first owner runs on a long lease (60 s).
      const storageA = long("seen-A");
      const a = await storageA.open("seen");
      await a.commit([ev("s1")]);
      let grants = 0;
      let x: Database | null = null;
      const storageB = createReplicatedStorage({
        endpoints: dc.cluster.endpoints,
        dataDir: `${dirs.dir}/seen-B`,
        faults: async (point, detail) => {
          if (point !== "open:after-grant") return;
          grants++;
          if (grants === 1) {
            // B's first lease runs out before its claim (which reads the first owner's record).
            await admin.leaseClient.leaseRevoke({ ID: detail!.lease! });
          } else if (grants === 2) {
            // Meanwhile another opener claims and dies before handing anything over: its record
            // (naming the first owner) goes with its lease, and nothing names the first owner any
            // more (the other opener's hand-over entry is deleted here too, as if never written).
            x = await machine("seen-X").storage.open("seen");
            const other = JSON.parse((await admin.get(keysOf("seen").liveness).string())!) as { lease: string };
            await admin.leaseClient.leaseRevoke({ ID: other.lease });
            await admin.delete().prefix(keysOf("seen").waitForPrefix);
            assert.equal(await admin.get(keysOf("seen").liveness).string(), null);
          }
        },
      });
      storages.push(storageB);
      const b = await storageB.open("seen");
      assert.equal(grants, 2);
      assert.equal(b.epoch, 3);
      await waitsUntil(b, () => a.close(), "the first owner");
      await b.close();
      await (x as Database | null)?.close();
    } finally {
      admin.close();
    }
  });

  it("a local copy damaged past the pages its opening reads (its events table) is removed and rebuilt during the open, which succeeds", async () => {
    const A = machine("damaged-A");
    const a = await A.storage.open("damaged");
    for (let i = 0; i < 5; i++) await a.commit([ev(`m${i}`)]);
    await a.close();
    await A.storage.close();
    const path = localCopyPath(A.dataDir, "damaged");
    // Closed by its last connection: the WAL is checkpointed into the file. The events table's root
    // page overwritten: the header, the schema and the stamp still read.
    damageTable(path, "events");
    const B = machine("damaged-A");
    const b = await B.storage.open("damaged");
    assert.ok(B.logger.lines.some((l) => l.includes("local copy damaged")), B.logger.lines.join("\n"));
    assert.deepEqual((await b.read()).map((e) => e.identity), [0, 1, 2, 3, 4].map((i) => ev(`m${i}`).identity));
    assert.deepEqual(await b.commit([ev("m5")]), { firstSeq: 6, lastSeq: 6 });
    await b.close();
  });

  it("a disk that damages the rebuilt copy too: the open fails once, saying the disk or file system is failing, and the next open on a sound disk succeeds", async () => {
    const A = machine("failing-A");
    const a = await A.storage.open("failing");
    for (let i = 0; i < 3; i++) await a.commit([ev(`f${i}`)]);
    await a.close();
    // A failing disk as SQLite reports one: every catch-up of the copy meets damage, the old file's and the rebuilt one's.
    const tip = LocalCopy.prototype.tip;
    let calls = 0;
    LocalCopy.prototype.tip = function (): never {
      calls++;
      throw Object.assign(new Error("database disk image is malformed"), { code: "SQLITE_CORRUPT" });
    };
    const B = machine("failing-A");
    try {
      await assert.rejects(B.storage.open("failing"), (err: unknown) => {
        assert.equal((err as { code?: string }).code, "unavailable");
        assert.match((err as Error).message, /its local copy .* was damaged, and the copy rebuilt from the cluster in its place reads as damaged too .*the disk or the file system under .* is failing\. Check them/);
        return true;
      });
    } finally {
      LocalCopy.prototype.tip = tip;
    }
    assert.equal(calls, 2, "rebuilt once, not again and again");
    assert.ok(B.logger.lines.some((l) => l.includes("local copy damaged")), B.logger.lines.join("\n"));
    const C = machine("failing-A");
    const c = await C.storage.open("failing");
    assert.equal(c.epoch, 3, "the failed open had claimed epoch 2 and released it");
    assert.deepEqual((await c.read()).map((e) => e.identity), [0, 1, 2].map((i) => ev(`f${i}`).identity));
    assert.deepEqual(await c.commit([ev("f3")]), { firstSeq: 4, lastSeq: 4 });
    await c.close();
  });

  it("a local copy that cannot be opened for a reason other than damage (another process holds it locked) is left in place: the open fails saying so and claims nothing", async () => {
    const admin = new Etcd3({ hosts: dc.cluster.endpoints });
    try {
      const A = machine("locked-A");
      const a = await A.storage.open("locked");
      await a.commit([ev("k1")]);
      await a.close();
      const path = localCopyPath(A.dataDir, "locked");
      const inode = statSync(path).ino;
      // Another process's connection holding the file in exclusive locking mode: every other
      // connection gets SQLITE_BUSY (after the copy's busy timeout).
      const holder = new Sqlite(path);
      try {
        holder.pragma("locking_mode = EXCLUSIVE");
        holder.exec("BEGIN EXCLUSIVE; INSERT OR REPLACE INTO meta (key, value) VALUES ('held', '1'); COMMIT");
        const B = machine("locked-A");
        await assert.rejects(B.storage.open("locked"), (err: unknown) => {
          assert.equal((err as { code?: string }).code, "unavailable", String(err));
          assert.match(String(err), /its local copy .*locked\.replica\.sqlite could not be opened or written \(database is locked\)\. Another process holds it locked/);
          return true;
        });
        assert.equal(statSync(path).ino, inode, "the copy is the same file: not removed");
        assert.ok(!B.logger.lines.some((l) => l.includes("unreadable")), B.logger.lines.join("\n"));
        assert.equal(await admin.get(keysOf("locked").epoch).string(), "1", "nothing claimed: the copy is checked before the claim");
      } finally {
        holder.close();
      }
      const C = machine("locked-A");
      const c = await C.storage.open("locked");
      assert.deepEqual((await c.read()).map((e) => e.identity), [ev("k1").identity]);
      await c.close();
    } finally {
      admin.close();
    }
  });

  it("a diverged local copy (an extra entry, or a corrupted one) is discarded and rebuilt; a lagging one catches up", async () => {
    const A = machine("A3");
    const a = await A.storage.open("div");
    for (let i = 0; i < 5; i++) await a.commit([ev(`d${i}`)]);
    await a.close();
    await A.storage.close();
    const expected = ["d0", "d1", "d2", "d3", "d4"];
    const path = localCopyPath(A.dataDir, "div");

    // 1. An entry appended locally that the cluster never had (with a valid local hash chain, so
    //    only the comparison with the cluster can tell).
    const file = new Sqlite(path);
    const prev = (file.prepare("SELECT hash FROM batches WHERE last = 5").get() as { hash: string }).hash;
    const phantomJson = JSON.stringify(ev("phantom"));
    file.prepare("INSERT INTO batches (first, last, epoch, token, hash) VALUES (6, 6, 1, 'x', ?)").run(chainHash(prev, 6, `[${phantomJson}]`));
    file.prepare("INSERT INTO events (seq, identity, json) VALUES (6, 'phantom', ?)").run(phantomJson);
    file.close();
    const A2 = machine("A3");
    let db: Database = await A2.storage.open("div");
    assert.ok(A2.logger.lines.some((l) => l.includes("diverged") && l.includes("past the cluster")), A2.logger.lines.join("\n"));
    assert.deepEqual((await db.read()).map((e) => e.identity), expected);
    assert.deepEqual(await db.commit([ev("phantom")]), { firstSeq: 6, lastSeq: 6 }, "the phantom identity was never the cluster's");
    await db.close();
    await A2.storage.close();

    // 2. A committed entry altered on disk (same seq, other content).
    const file2 = new Sqlite(path);
    file2.prepare("UPDATE events SET json = ? WHERE seq = 3").run(JSON.stringify(ev("d2", "s1", "-tampered")));
    file2.close();
    const A3 = machine("A3");
    db = await A3.storage.open("div");
    assert.ok(A3.logger.lines.some((l) => l.includes("diverged") && l.includes("hash")), A3.logger.lines.join("\n"));
    const log = await db.read();
    assert.deepEqual(log.map((e) => e.identity), [...expected, "phantom"]);
    assert.deepEqual(log[2], { ...ev("d2"), seq: 3 }, "the tampered entry is the cluster's again");
    await db.close();

    // 3. Lag: another machine appends; this machine's copy catches up at its next open.
    const B = machine("B3");
    const b = await B.storage.open("div");
    await b.commit([ev("x1")]);
    await b.commit([ev("x2"), ev("x3")]);
    await b.close();
    const A4 = machine("A3");
    db = await A4.storage.open("div");
    assert.ok(A4.logger.lines.some((l) => l.includes("caught up") && l.includes('"from":6') && l.includes('"to":9')), A4.logger.lines.join("\n"));
    assert.ok(!A4.logger.lines.some((l) => l.includes("diverged")), "a lagging copy is not discarded");
    assert.deepEqual((await db.read()).map((e) => e.identity), [...expected, "phantom", "x1", "x2", "x3"]);
    await db.close();
    await A4.storage.close();

    // 4. A file SQLite cannot read at all (a torn write): removed and rebuilt.
    for (const suffix of ["-wal", "-shm"]) rmSync(path + suffix, { force: true });
    writeFileSync(path, "this is not a sqlite file".repeat(100));
    const A5 = machine("A3");
    db = await A5.storage.open("div");
    assert.ok(A5.logger.lines.some((l) => l.includes("unreadable")), A5.logger.lines.join("\n"));
    assert.deepEqual((await db.read()).map((e) => e.identity), [...expected, "phantom", "x1", "x2", "x3"]);
    await db.close();
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/fencing.test.ts");
