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
import { captureLogger, devCluster, ev, tempDir } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

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
