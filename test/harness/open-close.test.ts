/**
 * A process that opens and closes harnesses for a long time (a worker that loses and regains a
 * database, a test runner, a tool that inspects many databases) keeps nothing of a closed one: no
 * Harness, no Committer, no timer server stays reachable, on sqlite with real runs of `true` cells.
 * Checked with WeakRefs and a forced GC after the event loop has turned (closed sockets release
 * their wrappers only then; a heap measured before that counts them as if they leaked).
 */
import assert from "node:assert/strict";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { Harness } from "../../src/harness/harness.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { LoopModel } from "../../chaos/support/loop-model.js";
import { tempDir } from "./support.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

async function collect(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await new Promise((r) => setTimeout(r, 20));
    gc();
  }
}

test("closed harnesses are not kept: 25 open/run/close cycles on one sqlite storage leave at most one reachable", async (t) => {
  const tmp = tempDir("cairn-open-close-");
  t.after(() => tmp.cleanup());
  const storage = createSqliteStorage({ dataDir: join(tmp.dir, "data") });
  t.after(() => storage.close());
  const workDir = join(tmp.dir, "work");
  const harnesses: WeakRef<Harness>[] = [];
  const cycles = 25;
  for (let i = 0; i < cycles; i++) {
    const h = await Harness.open({ storage, name: "reopened", model: new LoopModel(3), workDir });
    harnesses.push(new WeakRef(h));
    if (i % 5 === 0) {
      const id = await h.start({ goal: `loop ${i}`, cwd: tmp.dir });
      assert.equal((await h.wait(id)).result, "success");
    }
    await h.close();
  }
  await collect();
  const alive = harnesses.filter((r) => r.deref() !== undefined).length;
  // V8 may keep the last one a little longer (its code's feedback); more than that is a leak.
  assert.ok(alive <= 1, `${alive} of ${cycles} closed harnesses are still reachable`);
  // Every timer socket was removed with its server.
  const sockets = join(workDir, "sockets");
  assert.deepEqual(existsSync(sockets) ? readdirSync(sockets) : [], []);
});
