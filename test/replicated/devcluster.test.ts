/**
 * The dev cluster functions the CLI wires as `cairn cluster up|down|status`: detached members, a
 * state file, health, and a down that only kills what it started.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { readFileSync, readdirSync } from "node:fs";
import { Etcd3 } from "etcd3";
import { CLUSTER_STATE_FILE, clusterDown, clusterStatus, clusterUp, readClusterState } from "../../src/cli/devcluster/index.js";
import { devCluster, tempDir, untilQuorum } from "./helpers.js";

describe("dev cluster up / status / down", () => {
  const dirs = tempDir("cluster-cli");
  after(async () => {
    await clusterDown(dirs.dir).catch(() => undefined);
    dirs.remove();
  });

  it("up starts three detached healthy members and writes the state file; a second up is refused; down stops them", async () => {
    const state = await clusterUp({ dir: dirs.dir });
    assert.ok(existsSync(join(dirs.dir, CLUSTER_STATE_FILE)));
    assert.deepEqual(readClusterState(dirs.dir), state);
    assert.deepEqual(state.members.map((m) => m.name), ["zone-a", "zone-b", "zone-c"]);
    assert.equal(state.endpoints.length, 3);

    const up = await clusterStatus(dirs.dir);
    assert.ok(up);
    assert.equal(up.reachable, 3);
    assert.equal(up.quorumHeld, true);
    assert.equal(up.members.filter((m) => m.isLeader).length, 1);

    await assert.rejects(clusterUp({ dir: dirs.dir }), (err: unknown) => (err as { code?: string }).code === "config");

    const stopped = await clusterDown(dirs.dir);
    assert.deepEqual(stopped.sort(), ["zone-a", "zone-b", "zone-c"]);
    const down = await clusterStatus(dirs.dir);
    assert.ok(down);
    assert.equal(down.reachable, 0);
    assert.equal(down.quorumHeld, false);
    assert.ok(down.members.every((m) => !m.running));
    assert.deepEqual(await clusterDown(dirs.dir), [], "down twice is safe and kills nothing");
  });

  it("status of a directory without a cluster is null", async () => {
    const empty = tempDir("cluster-none");
    try {
      assert.equal(await clusterStatus(empty.dir), null);
    } finally {
      empty.remove();
    }
  });
});

describe("dev cluster freeze", () => {
  it("freeze(i) resolves once every thread of the member is stopped: from then on it answers nothing, and after SIGCONT it answers again", async () => {
    const dc = await devCluster();
    try {
      const pid = (await dc.cluster.status()).members[1]!.pid!;
      const states = () => readdirSync(`/proc/${pid}/task`).map((tid) => { const st = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8"); return st[st.lastIndexOf(")") + 2]; });
      assert.ok(states().some((s) => s !== "T"), "running before");
      const one = new Etcd3({ hosts: dc.cluster.endpoints[1]!, defaultCallOptions: () => ({ deadline: Date.now() + 500 }) });
      try {
        await one.maintenance.status();
        await dc.cluster.freeze(1);
        assert.ok(states().every((s) => s === "T"), `every thread stopped: ${states().join("")}`);
        // Right away, not after some settling: a request is not answered.
        await assert.rejects(one.maintenance.status(), "a frozen member answered");
      } finally {
        dc.cluster.signal(1, "SIGCONT");
      }
      await untilQuorum(dc.cluster);
      assert.ok(states().some((s) => s !== "T"), "running after SIGCONT");
      one.close();
      await dc.cluster.kill(2);
      await assert.rejects(dc.cluster.freeze(2), /not running; it cannot be frozen/);
    } finally {
      await dc.stop();
    }
  });

  it("serving() is true only when a write proposal commits through every running member: false with one member frozen, true again after SIGCONT, and a killed member is not asked", async () => {
    const dc = await devCluster();
    try {
      assert.equal(await dc.cluster.serving(), true, "a fresh cluster serves");
      await dc.cluster.freeze(0);
      try {
        // Two members still hold the quorum, but the frozen one answers nothing.
        assert.equal((await dc.cluster.status()).quorumHeld, true);
        assert.equal(await dc.cluster.serving(), false, "a frozen member was counted as serving");
      } finally {
        dc.cluster.signal(0, "SIGCONT");
      }
      await untilQuorum(dc.cluster);
      assert.equal(await dc.cluster.serving(), true);
      await dc.cluster.kill(1);
      assert.equal(await dc.cluster.serving(), true, "a killed member is not running: only the two running members are asked");
      await dc.cluster.kill(2);
      assert.equal(await dc.cluster.serving(), false, "one member alone has no quorum: a proposal through it cannot commit");
    } finally {
      await dc.stop();
    }
  });
});
