/**
 * `cairn log` on the replicated adapter (it works on every adapter): a run on a real
 * 3-member etcd cluster, then its timeline read by another process's view with an empty data
 * directory (the local copy is rebuilt from the cluster), never taking ownership: the epoch is
 * unchanged after the log is read, and `--json` is exactly what the storage holds.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { Etcd3 } from "etcd3";
import { cmdPatch, concludePatch, writeScript } from "../../chaos/support/patches.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { devCluster, tempDir } from "../replicated/helpers.js";
import { exitAfterTests } from "../support/exit.js";
import { cairnIn } from "./support.js";

describe("cairn log on the replicated adapter", { timeout: 240_000 }, () => {
  const t = tempDir("log-replicated");
  let etcd: Awaited<ReturnType<typeof devCluster>>;
  let flags: string[];
  before(async () => {
    etcd = await devCluster();
    const endpoints = etcd.cluster.endpoints.join(",");
    const work = join(t.dir, "work");
    mkdirSync(work, { recursive: true });
    const model = join(t.dir, "model.json");
    writeScript(model, [cmdPatch(0, 1, ["sh", "-c", "echo hello from the cluster"]), concludePatch(1, 2, "success", "said hello")]);
    const run = await cairnIn(["run", "say hello", "--db", "lr", "--storage", "replicated", "--etcd", endpoints, "--data-dir", join(t.dir, "owner"), "--model", `scripted:${model}`, "--cwd", work]);
    assert.equal(run.code, 0, run.stderr + run.stdout);
    flags = ["--db", "lr", "--storage", "replicated", "--etcd", endpoints, "--data-dir", join(t.dir, "reader")];
  });
  after(async () => {
    await etcd?.stop();
    t.remove();
  });

  it("shows the run's rounds, its cell with where it ran and its output, the owner and the end; reading takes nothing", async () => {
    const client = new Etcd3({ hosts: etcd.cluster.endpoints });
    try {
      const epochBefore = await client.get("cairn/db/lr/epoch").string();
      const r = await cairnIn(["log", ...flags]);
      assert.equal(r.code, 0, r.stderr);
      for (const re of [
        /run\s+s1 started .*"say hello"/,
        /owner\s+epoch 1 on \S+ \(pid \d+\)/,
        /round 1\s+accepted: revision 1/,
        /cell 1\s+cmd started on \S+ epoch 1 \(pid \d+, sandbox (bwrap, network off|none)\)/,
        /│ hello from the cluster/,
        /cell 1\s+success exit 0/,
        /end\s+run s1 success/,
      ]) {
        assert.match(r.stdout, re);
      }
      assert.equal(await client.get("cairn/db/lr/epoch").string(), epochBefore, "reading the log never takes ownership");
    } finally {
      client.close();
    }
  });

  it("--json prints exactly the events the cluster holds", async () => {
    const r = await cairnIn(["log", ...flags, "--json"]);
    assert.equal(r.code, 0, r.stderr);
    const printed = r.stdout.trimEnd().split("\n").map((l) => JSON.parse(l) as { seq: number });
    const storage = createReplicatedStorage({ endpoints: etcd.cluster.endpoints, dataDir: join(t.dir, "check") });
    try {
      const reader = await storage.reader("lr");
      try {
        const stored = await reader.read(0);
        assert.deepEqual(printed, JSON.parse(JSON.stringify(stored)));
      } finally {
        await reader.close();
      }
    } finally {
      await storage.close();
    }
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/cli/log-replicated.test.ts");
