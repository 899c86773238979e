/**
 * The dev cluster functions the CLI wires as `cairn cluster up|down|status`: detached members, a
 * state file, health, and a down that only kills what it started.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { CLUSTER_STATE_FILE, clusterDown, clusterStatus, clusterUp, readClusterState } from "../../storage-adapters/replicated/devcluster.js";
import { tempDir } from "./helpers.js";

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
