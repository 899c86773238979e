/**
 * The replicated adapter while etcd members die: with one member killed commits keep resolving; with
 * two killed a commit waits (and nothing resolves it wrongly) until a member is back; acknowledged
 * commits are all there for a fresh opener; onOutage "reject" refuses with backlog_full past its
 * limit; a commit whose reply was lost (members frozen with SIGSTOP past the deadline) lands once.
 * Then commits kept in flight from several databases while members are frozen, killed and stopped
 * (leader and followers), the leader killed during a burst of grouped commits, and an endpoint that
 * refuses connections: a fresh reader sees every acknowledged commit once, at its receipt, in order
 * (ledger.ts). (A harness closed during a quorum loss: close.test.ts.)
 *
 * Members are numbered 0..2 and each case leaves the cluster whole again for the next.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { describe, it } from "node:test";
import type { CommitReceipt } from "../../src/storage/contract.js";
import type { ReplicatedStats } from "../../storage-adapters/replicated/index.js";
import { bounded, clusterSuite, ev, eventually, stillPending, untilQuorum } from "./helpers.js";
import { Ledger, checkLog, freshLog, worker } from "./ledger.js";
import { exitAfterTests } from "../support/exit.js";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe("replicated adapter under member loss", () => {
  const suite = clusterSuite("members");
  const { dirs, make, logger, cluster } = suite;

  it("one member down: commits resolve; two down: a commit waits; one back: it resolves and a fresh open has every acknowledged commit", async () => {
    const db = await make(`${dirs.dir}/a`).open("outage");
    const acked: string[] = [];
    const commit = async (id: string): Promise<CommitReceipt> => {
      const r = await db.commit([ev(id)]);
      acked.push(id);
      return r;
    };
    for (let i = 0; i < 5; i++) await commit(`before${i}`);

    await cluster().kill(0);
    assert.equal((await cluster().status()).reachable, 2);
    for (let i = 0; i < 10; i++) await bounded(commit(`one-down${i}`), "commit with one member down");
    assert.equal(acked.length, 15);
    await eventually(() => db.stats().membersReachable === 2, "stats see one member unreachable");
    assert.equal(db.stats().quorumHeld, true, "one member down is no quorum loss");

    await cluster().kill(1);
    const waiting = commit("no-quorum");
    assert.equal(await stillPending(waiting, 5000), "pending", "a commit without quorum must wait, not resolve or fail");
    await eventually(() => (db.stats() as ReplicatedStats).quorumHeld === false, "stats report the quorum lost");
    const st = db.stats();
    assert.equal(st.backlogCommits, 1);
    assert.ok((st.backlogBytes ?? 0) > 0);
    assert.ok((st.membersReachable ?? 3) < 2);
    assert.ok(logger.lines.some((l) => l.includes("etcd quorum lost")), "the loss is logged");

    await cluster().restart(0);
    const receipt = await bounded(waiting, "the waiting commit after a member came back");
    assert.deepEqual(receipt, { firstSeq: 16, lastSeq: 16 });
    await eventually(() => (db.stats() as ReplicatedStats).quorumHeld === true, "stats report the quorum back");
    assert.ok(logger.lines.some((l) => l.includes("etcd quorum is back")), "the recovery is logged");
    assert.ok((db.stats().quorumWaitSeconds ?? 0) > 0);
    await db.close();

    const fresh = await make(`${dirs.dir}/fresh`).open("outage");
    assert.deepEqual((await fresh.read()).map((e) => e.identity), acked, "every acknowledged commit, in order, exactly once");
    await fresh.close();
    await cluster().restart(1);
  });

  it('onOutage "reject": past backlogLimit, new commits are refused with backlog_full while the quorum is lost', async () => {
    const db = await make(`${dirs.dir}/r`, { onOutage: "reject", backlogLimit: 2 }).open("rejecting");
    await db.commit([ev("r0")]);
    await cluster().kill(1);
    await cluster().kill(2);
    await eventually(() => db.stats().quorumHeld === false, "the quorum is seen lost");
    const waiting = [db.commit([ev("w1")]), db.commit([ev("w2")])];
    for (const p of waiting) void p.catch(() => undefined);
    await assert.rejects(db.commit([ev("refused")]), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "rejected");
      assert.equal((err as { reason?: string }).reason, "backlog_full");
      assert.equal((err as { retryable?: boolean }).retryable, true);
      return true;
    });
    assert.equal(await stillPending(Promise.all(waiting), 1000), "pending");
    await cluster().restart(1);
    await cluster().restart(2);
    const receipts = await bounded(Promise.all(waiting), "the waiting commits after the quorum came back");
    assert.deepEqual(receipts.map((r) => r.firstSeq).sort(), [2, 3]);
    const ids = (await db.read()).map((e) => e.identity);
    assert.deepEqual(ids.slice(0, 1), ["r0"]);
    assert.deepEqual(ids.slice(1).sort(), ["w1", "w2"]);
    // Accepted again once the quorum is back.
    assert.deepEqual(await db.commit([ev("refused")]), { firstSeq: 4, lastSeq: 4 });
    await db.close();
  });

  it("a commit whose reply is lost (members frozen past the deadline) is resolved by reading back and lands exactly once", async () => {
    // The etcd client itself retries an unanswered request a few times within one adapter attempt;
    // the freeze outlasts those, so the adapter's own read-back/resend path must run.
    const db = await make(`${dirs.dir}/u`, { commitTimeoutMs: 800 }).open("uncertain");
    await db.commit([ev("u0")]);
    const txnsBefore = (db.stats() as ReplicatedStats).commitTxns;
    // Freeze every member: the request reaches nobody that can answer; the client's deadline passes.
    for (let i = 0; i < 3; i++) await cluster().freeze(i);
    const pending = db.commit([ev("u1")]);
    try {
      assert.equal(await stillPending(pending, 6000), "pending");
    } finally {
      for (let i = 0; i < 3; i++) cluster().signal(i, "SIGCONT");
    }
    assert.deepEqual(await bounded(pending, "the frozen commit after thawing"), { firstSeq: 2, lastSeq: 2 });
    assert.ok((db.stats() as ReplicatedStats).commitTxns - txnsBefore >= 2, "the commit was sent again after the deadline");
    assert.deepEqual(await db.commit([ev("u2")]), { firstSeq: 3, lastSeq: 3 });
    const fresh = await make(`${dirs.dir}/u-fresh`).open("uncertain");
    assert.deepEqual((await fresh.read()).map((e) => e.identity), ["u0", "u1", "u2"]);
    await fresh.close();
  });

  /** The index of the current leader (waits for one). */
  const leader = async (): Promise<number> => {
    for (const t0 = Date.now(); ; await sleep(50)) {
      const i = (await cluster().status()).members.findIndex((m) => m.isLeader);
      if (i >= 0) return i;
      if (Date.now() - t0 > 60_000) assert.fail("no leader within 60 s");
    }
  };

  it("member faults while commits are in flight on three databases (leader SIGSTOP, follower SIGKILL, leader SIGTERM): every acknowledged commit is in a fresh reader's log once, at its receipt, in order", async () => {
    const storage = make(`${dirs.dir}/faults`, { attemptTimeoutMs: 500, commitTimeoutMs: 2000 });
    const ledger = new Ledger();
    const problems: unknown[] = [];
    let stop = false;
    const names = ["fa", "fb", "fc"];
    const workers = names.map((n) => worker(storage, n, ledger, () => stop, 4, problems));
    const progress = async (more: number, what: string): Promise<void> => {
      const target = ledger.acked() + more;
      await eventually(() => ledger.acked() >= target, `${more} more acknowledged commits ${what} (${ledger.summary()})`, 45_000);
    };
    try {
      await progress(30, "before any fault");
      const l1 = await leader();
      cluster().signal(l1, "SIGSTOP");
      await sleep(2500);
      cluster().signal(l1, "SIGCONT");
      await untilQuorum(cluster());
      await progress(30, "after the leader was frozen");
      const l2 = await leader();
      const follower = [0, 1, 2].find((i) => i !== l2)!;
      await cluster().kill(follower);
      await sleep(1000);
      await cluster().restart(follower);
      await untilQuorum(cluster());
      await progress(30, "after a follower was killed");
      const l3 = await leader();
      await cluster().kill(l3, "SIGTERM"); // graceful: leadership transfer and GOAWAY on its connections
      await sleep(500);
      await cluster().restart(l3);
      await untilQuorum(cluster());
      await progress(30, "after the leader was stopped gracefully");
    } finally {
      stop = true;
      await Promise.all(workers);
    }
    await storage.close();
    let unknown = { unknownIn: 0, unknownOut: 0 };
    for (const n of names) {
      const r = checkLog(n, await freshLog(cluster().endpoints, `${dirs.dir}/faults-fresh-${n}`, n), ledger);
      unknown = { unknownIn: unknown.unknownIn + r.unknownIn, unknownOut: unknown.unknownOut + r.unknownOut };
    }
    // Only StorageFailure (outcome unknown) is an acceptable failure: member faults never refuse a commit otherwise.
    assert.deepEqual(ledger.refused().map((a) => String(a.error)), [], ledger.summary());
    assert.deepEqual(problems.map(String), [], "every reopen succeeded");
    process.stderr.write(`[member faults] ${ledger.summary()}; unknown outcomes durable ${unknown.unknownIn}, not ${unknown.unknownOut}\n`);
  });

  it("the leader is SIGKILLed during a burst of grouped commits on two databases: nothing acknowledged is lost or doubled", async () => {
    const storage = make(`${dirs.dir}/burst`, { attemptTimeoutMs: 500, commitTimeoutMs: 2000 });
    const ledger = new Ledger();
    const dbs = [await storage.open("burst-a"), await storage.open("burst-b")];
    for (const db of dbs) await ledger.commit(db, [`${db.name}-warm`]);
    const l = await leader();
    const pending: Promise<void>[] = [];
    for (let i = 0; i < 80; i++) for (const db of dbs) pending.push(ledger.commit(db, [`${db.name}-x${i}`, `${db.name}-y${i}`]));
    await sleep(15);
    await cluster().kill(l);
    for (let i = 0; i < 40; i++) for (const db of dbs) pending.push(ledger.commit(db, [`${db.name}-z${i}`]));
    const settled = Promise.all(pending);
    await sleep(1500);
    await cluster().restart(l);
    await bounded(settled, `commits after the leader kill (${ledger.summary()})`, 60_000);
    await untilQuorum(cluster());
    for (const db of dbs) {
      checkLog(db.name, await freshLog(cluster().endpoints, `${dirs.dir}/burst-fresh-${db.name}`, db.name), ledger);
      await db.close();
    }
    assert.deepEqual(ledger.refused().map((a) => String(a.error)), [], ledger.summary());
    process.stderr.write(`[leader kill] ${ledger.summary()}\n`);
  });

  it("one endpoint of four refuses connections: commits go around it, every one acknowledged", async () => {
    const port = await new Promise<number>((resolve) => {
      const srv = net.createServer();
      srv.listen(0, "127.0.0.1", () => {
        const p = (srv.address() as net.AddressInfo).port;
        srv.close(() => resolve(p));
      });
    });
    const storage = make(`${dirs.dir}/refused`, { endpoints: [`http://127.0.0.1:${port}`, ...cluster().endpoints], attemptTimeoutMs: 500 });
    const ledger = new Ledger();
    const db = await storage.open("refused");
    for (let round = 0; round < 8; round++) {
      await Promise.all(Array.from({ length: 5 }, (_, i) => ledger.commit(db, [`ref-${round}-${i}`])));
      await sleep(400); // lets the dead member's penalty run out, so it is tried again
    }
    assert.equal(ledger.acked(), 40, ledger.summary());
    await db.close();
    checkLog("refused", await freshLog(cluster().endpoints, `${dirs.dir}/refused-fresh`, "refused"), ledger);
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/members.test.ts");
