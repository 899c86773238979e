/**
 * The owner lease's waiters' queue (for restart-always schedulers): a lease that falls free goes
 * to the oldest live waiter, so a worker restarted by its scheduler queues behind the standby that
 * waited longer instead of racing it. A waiter that withdraws, or whose process is SIGKILLed or frozen, drops
 * out; `force` (an operator's takeover) ignores the queue. On sqlite and on a real etcd cluster.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { hostname } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import type { OwnerInfo, Storage } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { REPO } from "../../chaos/support/cli.js";
import { devCluster, tempDir } from "../replicated/helpers.js";
import { exitAfterTests } from "../support/exit.js";

const me = (role: string): OwnerInfo => ({ host: hostname(), pid: process.pid, since: new Date().toISOString(), epoch: null, role });

/** A child process that joins the queue of `name`, says so, and waits to be killed. */
async function queuedChild(storageCode: string, name: string): Promise<{ freeze: () => void; kill: () => Promise<void> }> {
  const script = `
    ${storageCode}
    await s.leases.enqueue(${JSON.stringify(name)}, { host: (await import("node:os")).hostname(), pid: process.pid, since: new Date().toISOString(), epoch: null, role: "serve" });
    process.stdout.write("queued\\n");
    setInterval(() => undefined, 1000);
  `;
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { cwd: REPO, stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
  await new Promise<void>((resolve, reject) => {
    child.stdout.setEncoding("utf8").on("data", (d: string) => d.includes("queued") && resolve());
    child.once("exit", (code) => reject(new Error(`the queued child exited ${code}: ${err.slice(-2000)}`)));
  });
  return {
    /** SIGSTOP: silent, alive, no longer renewing its place (SIGCONT and SIGKILL come with `kill`). */
    freeze: () => void child.kill("SIGSTOP"),
    kill: async () => {
      child.kill("SIGCONT");
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGKILL");
      await exited;
    },
  };
}

function suite(adapter: string, setup: () => Promise<{ a: Storage; b: Storage; childStorage: string; stop: () => Promise<void> }>): void {
  describe(`owner lease queue on ${adapter}`, { timeout: 120_000 }, () => {
    let env: Awaited<ReturnType<typeof setup>>;
    before(async () => {
      env = await setup();
    });
    after(async () => {
      await env?.stop();
    });

    it("a freed lease goes to the oldest waiter; a later waiter and a newcomer without a ticket wait", async () => {
      const leases = env.a.leases!;
      const other = env.b.leases!;
      const holder = await leases.acquire("q1", me("serve"));
      assert.ok(holder, "the first taker holds the lease");
      const older = await other.enqueue("q1", me("serve"));
      const younger = await leases.enqueue("q1", me("serve"));
      assert.equal(await other.acquire("q1", me("serve"), { ticket: older }), null, "a live holder keeps it");
      await holder.release();
      assert.equal(await leases.acquire("q1", me("serve")), null, "a newcomer (a restarted worker) does not overtake the queue");
      assert.equal(await leases.acquire("q1", me("serve"), { ticket: younger }), null, "the younger waiter waits for the older");
      const taken = await other.acquire("q1", me("serve"), { ticket: older });
      assert.ok(taken, "the oldest waiter takes the freed lease");
      await taken.release();
      const next = await leases.acquire("q1", me("serve"), { ticket: younger });
      assert.ok(next, "then the next waiter");
      await next.release();
      const free = await leases.acquire("q1", me("serve"));
      assert.ok(free, "an empty queue lets anyone take a free lease");
      await free.release();
    });

    it("a waiter that withdraws, or whose process is SIGKILLed, drops out of the queue", async () => {
      const leases = env.a.leases!;
      const withdrawn = await env.b.leases!.enqueue("q2", me("serve"));
      const mine = await leases.enqueue("q2", me("serve"));
      assert.equal(await leases.acquire("q2", me("serve"), { ticket: mine }), null);
      await withdrawn.withdraw();
      const held = await leases.acquire("q2", me("serve"), { ticket: mine });
      assert.ok(held, "the withdrawn waiter no longer goes first");
      await held.release();

      const dead = await queuedChild(env.childStorage, "q3");
      const waiting = await leases.enqueue("q3", me("serve"));
      assert.equal(await leases.acquire("q3", me("serve"), { ticket: waiting }), null, "the live child waiter goes first");
      await dead.kill();
      let got = null;
      const end = Date.now() + 60_000;
      while (got === null && Date.now() < end) {
        got = await leases.acquire("q3", me("serve"), { ticket: waiting });
        if (got === null) await sleep(200);
      }
      assert.ok(got, "a killed waiter drops out (at once on sqlite, after its lease length on etcd)");
      await got.release();
    });

    it("a waiter that is frozen (SIGSTOP: alive, silent) drops out after the lease length", async () => {
      const leases = env.a.leases!;
      const frozen = await queuedChild(env.childStorage, "q5");
      const waiting = await leases.enqueue("q5", me("serve"));
      try {
        assert.equal(await leases.acquire("q5", me("serve"), { ticket: waiting }), null, "the live child waiter goes first");
        frozen.freeze();
        let got = null;
        const end = Date.now() + 60_000;
        while (got === null && Date.now() < end) {
          got = await leases.acquire("q5", me("serve"), { ticket: waiting });
          if (got === null) await sleep(200);
        }
        assert.ok(got, "a frozen waiter stops renewing its place and drops out; the next one takes the lease");
        await got.release();
      } finally {
        await frozen.kill();
      }
    });

    it("force (an operator's takeover) ignores the queue", async () => {
      const waiter = await env.b.leases!.enqueue("q4", me("serve"));
      const forced = await env.a.leases!.acquire("q4", me("resume"), { force: true });
      assert.ok(forced);
      await forced.release();
      await waiter.withdraw();
    });
  });
}

suite("sqlite", async () => {
  const t = tempDir("lease-queue");
  const dataDir = join(t.dir, "data");
  const a = createSqliteStorage({ dataDir, leaseMs: 1000 });
  const b = createSqliteStorage({ dataDir, leaseMs: 1000 });
  const childStorage = `const { createSqliteStorage } = await import("./storage-adapters/sqlite/index.ts"); const s = createSqliteStorage({ dataDir: ${JSON.stringify(dataDir)}, leaseMs: 1000 });`;
  return {
    a,
    b,
    childStorage,
    stop: async () => {
      await a.close();
      await b.close();
      t.remove();
    },
  };
});

suite("replicated", async () => {
  const etcd = await devCluster();
  const t = tempDir("lease-queue-rep");
  const endpoints = etcd.cluster.endpoints;
  const a = createReplicatedStorage({ endpoints, dataDir: join(t.dir, "a"), leaseMs: 1000 });
  const b = createReplicatedStorage({ endpoints, dataDir: join(t.dir, "b"), leaseMs: 1000 });
  const childStorage = `const { createReplicatedStorage } = await import("./storage-adapters/replicated/index.ts"); const s = createReplicatedStorage({ endpoints: ${JSON.stringify(endpoints)}, dataDir: ${JSON.stringify(join(t.dir, "child"))}, leaseMs: 1000 });`;
  return {
    a,
    b,
    childStorage,
    stop: async () => {
      await a.close();
      await b.close();
      await etcd.stop();
      t.remove();
    },
  };
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/storage/lease-queue.test.ts");
