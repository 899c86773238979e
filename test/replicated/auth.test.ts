/**
 * The replicated adapter on a cluster with etcd authentication enabled: a user whose role grants one
 * database's prefix opens and commits to it, is refused the other database with a clear ConfigError,
 * and no password ever appears in the logs or the error messages.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { grantDatabaseAccess } from "../../storage-adapters/replicated/roles.js";
import type { DevCluster } from "../../src/cli/devcluster/index.js";
import { Etcd3 } from "etcd3";
import { classifyEtcdError } from "../../storage-adapters/replicated/etcd-errors.js";
import { keepAliveOnce } from "../../storage-adapters/replicated/client.js";
import { captureLogger, devCluster, ev, tempDir, untilQuorum } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

/** Waits until every member answers and all agree on one leader and one term, then 2 s more (a member just thawed catches up). */
async function settled(cluster: DevCluster, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    const st = await cluster.status();
    const leaders = new Set(st.members.map((m) => m.leader));
    const terms = new Set(st.members.map((m) => m.raftTerm));
    if (st.reachable === st.members.length && leaders.size === 1 && !leaders.has("0") && !leaders.has(null) && terms.size === 1) break;
    if (Date.now() > deadline) assert.fail(`the dev cluster did not settle within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
  await new Promise((r) => setTimeout(r, 2000));
}

describe("replicated adapter with etcd auth", () => {
  let dc: Awaited<ReturnType<typeof devCluster>>;
  const dirs = tempDir("auth");
  const storages: Storage[] = [];
  const alicePassword = "alice-S3cret-pw-9f2c";
  const logger = captureLogger();
  const make = (username: string, password: string, dataDir: string) => {
    const s = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir, username, password, logger, healthIntervalMs: 300 });
    storages.push(s);
    return s;
  };

  before(async () => {
    dc = await devCluster({ auth: true });
    await grantDatabaseAccess({ endpoints: dc.cluster.endpoints, admin: dc.cluster.root!, user: "alice", password: alicePassword, databases: ["alpha"] });
  });
  after(async () => {
    for (const s of storages) await s.close().catch(() => undefined);
    await dc?.stop();
    dirs.remove();
  });

  it("the user of database alpha opens alpha and commits; a fresh open reads it back", async () => {
    const alice = make("alice", alicePassword, `${dirs.dir}/alice`);
    const db = await alice.open("alpha");
    assert.deepEqual(await db.commit([ev("a1"), ev("a2")]), { firstSeq: 1, lastSeq: 2 });
    await alice.post("alpha", { id: "m1", session: "s1", kind: "note", payload: { x: 1 }, at: "t" });
    assert.equal((await db.drain()).length, 1);
    await db.close();
    const again = await make("alice", alicePassword, `${dirs.dir}/alice2`).open("alpha");
    assert.deepEqual((await again.read()).map((e) => e.identity), ["a1", "a2"]);
    await again.close();
  });

  it("opening another database as that user fails with a ConfigError naming the user, the database and the prefix", async () => {
    // beta exists (created by root), so the refusal is about permission, not a missing database.
    const root = make(dc.cluster.root!.username, dc.cluster.root!.password, `${dirs.dir}/root`);
    const beta = await root.open("beta");
    await beta.commit([ev("b1")]);
    const alice = make("alice", alicePassword, `${dirs.dir}/alice3`);
    await assert.rejects(alice.open("beta"), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "config");
      const msg = (err as Error).message;
      assert.match(msg, /etcd user "alice" may not open database "beta"/);
      assert.match(msg, /cairn\/db\/beta\//);
      assert.ok(!msg.includes(alicePassword));
      return true;
    });
    await assert.rejects(alice.reader("beta"), (err: unknown) => (err as { code?: string }).code === "config");
    await assert.rejects(alice.post("beta", { id: "x", session: "s", kind: "k", payload: 1, at: "t" }), (err: unknown) => (err as { code?: string }).code === "config");
    // beta's owner was not disturbed: its epoch is still the one it claimed.
    assert.equal(await beta.head(), 1);
    await beta.close();
  });

  it("a wrong password is refused with a ConfigError that names the user and not the password", async () => {
    const wrong = "not-the-password-77";
    const s = make("alice", wrong, `${dirs.dir}/wrong`);
    await assert.rejects(s.open("alpha"), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "config");
      assert.match((err as Error).message, /refused the credentials of etcd user "alice"/);
      assert.ok(!(err as Error).message.includes(wrong));
      return true;
    });
  });

  // The ownership lease is renewed by one-shot keep-alive streams (client.ts keepAliveOnce), with the
  // token of an authenticated user: these two show that a renewal gives up on a frozen member at its
  // own deadline (a stream of the etcd3 client has no deadline of its own) and that the owner's lease
  // holds meanwhile.
  it("an authenticated keep-alive to a frozen member (SIGSTOP) gives up at its deadline with an outage; after SIGCONT it renews", async () => {
    const url = dc.cluster.endpoints[2]!;
    const one = new Etcd3({ hosts: url, auth: { username: "alice", password: alicePassword } });
    try {
      const granted = await one.leaseClient.leaseGrant({ TTL: 30 });
      assert.ok((await keepAliveOnce(one, granted.ID, 2000)) > 0, "renewed before the freeze");
      await dc.cluster.freeze(2);
      try {
        for (const deadline of [300, 800]) {
          const t0 = Date.now();
          const err = await keepAliveOnce(one, granted.ID, deadline).then(
            (ttl) => assert.fail(`a frozen member answered a keep-alive (TTL ${ttl})`),
            (e: unknown) => e,
          );
          const took = Date.now() - t0;
          assert.equal(classifyEtcdError(err), "outage", String(err));
          assert.match(String(err), new RegExp(`within ${deadline} ms`));
          assert.ok(took >= deadline - 10 && took < deadline + 1500, `given up at its deadline: ${took} ms for ${deadline}`);
        }
      } finally {
        dc.cluster.signal(2, "SIGCONT");
      }
      await untilQuorum(dc.cluster);
      const deadline = Date.now() + 20_000;
      let ttl = 0;
      while (ttl <= 0 && Date.now() < deadline) ttl = await keepAliveOnce(one, granted.ID, 2000).catch(() => 0);
      assert.ok(ttl > 0, "the member renews again after SIGCONT");
      await one.leaseClient.leaseRevoke({ ID: granted.ID });
      assert.equal(await keepAliveOnce(one, granted.ID, 2000), 0, "a revoked lease renews to 0 (gone)");
    } finally {
      one.close();
    }
  });

  it("an authenticated owner keeps its ownership lease (the default 3 s) and commits while a follower it talks to is frozen for longer than the lease", async () => {
    // Followers only: freezing the leader costs an election, and the etcd here (3.4.23) revokes every
    // lease when a stalled leader resumes (etcd issue #15247, see the README), which is not what this
    // tests. The storage lists the followers first, so the member it talks to is the one frozen: the
    // first in its list, then (once that one failed it) the second.
    await settled(dc.cluster);
    const st = await dc.cluster.status();
    const leader = st.members.findIndex((m) => m.isLeader);
    assert.ok(leader >= 0, "a leader");
    const followers = [0, 1, 2].filter((i) => i !== leader);
    const endpoints = [...followers, leader].map((i) => dc.cluster.endpoints[i]!);
    const s = createReplicatedStorage({ endpoints, dataDir: `${dirs.dir}/alice-frozen`, username: "alice", password: alicePassword, logger, healthIntervalMs: 300 });
    storages.push(s);
    const db = await s.open("alpha");
    const lease = db.lease!;
    assert.equal(lease.ttlMs, 3000, "the default lease");
    let lost: string | null = null;
    lease.onLost((reason) => (lost = reason));
    for (const i of followers) {
      await settled(dc.cluster);
      assert.equal((await dc.cluster.status()).members.findIndex((m) => m.isLeader), leader, "the leader did not change");
      await dc.cluster.freeze(i);
      try {
        // Longer than the lease: a renewal stuck on the frozen member would lose it.
        const until = Date.now() + 4000;
        let n = 0;
        while (Date.now() < until) {
          await db.commit([ev(`frozen-${i}-${n++}`)]);
          await new Promise((r) => setTimeout(r, 250));
        }
        assert.equal(lost, null, `the lease was lost while member ${i} was frozen: ${lost}`);
        assert.ok(lease.held() && lease.remainingMs() > 0, `the lease is held while member ${i} is frozen`);
      } finally {
        dc.cluster.signal(i, "SIGCONT");
      }
      await untilQuorum(dc.cluster);
    }
    assert.equal(lost, null);
    await db.close();
  });

  it("no password appears in any captured log line", () => {
    assert.ok(logger.lines.length > 0, "the adapter logged something");
    for (const line of logger.lines) {
      assert.ok(!line.includes(alicePassword), line);
      assert.ok(!line.includes(dc.cluster.root!.password), line);
      assert.ok(!line.includes("not-the-password-77"), line);
    }
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/auth.test.ts");
