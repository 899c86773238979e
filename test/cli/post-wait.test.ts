/**
 * `cairn post --wait`: waits until the owner moved the message into the run's inbox
 * (exit 0, "delivered"), also when the message was posted before any owner was there; a message for
 * a run only submitted so far is delivered after its start. The owner is a real Harness on the same
 * sqlite files (its mailbox watch polls them), the CLI runs in this process through `main`.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { tempDir } from "../replicated/helpers.js";
import { until } from "../support/wait.js";
import { addCell, rev } from "../hostile/support.js";
import { main } from "../../src/cli/main.js";
import { cairnIn } from "./support.js";

/** A model that waits for `release()` before concluding: the run stays open (and drains its mailbox) meanwhile. */
function heldModel(): Model & { release(): void; calls: number } {
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const m = {
    name: "scripted:held",
    calls: 0,
    release: () => open(),
    async step(req: ModelRequest): Promise<ModelReply> {
      m.calls++;
      await gate;
      return { patch: [rev(req.state.revision), addCell({ id: req.state.runtime.next_cell_id, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "done" })], usage: { input_tokens: 1, output_tokens: 1 } } as unknown as ModelReply;
    },
  };
  return m;
}

describe("cairn post --wait", { timeout: 240_000 }, () => {
  const t = tempDir("post-wait");
  after(() => t.remove());

  it("returns 'delivered' once the owner moved the message into the inbox, posted with and without an owner running", async () => {
    const dataDir = join(t.dir, "data");
    const storage = createSqliteStorage({ dataDir, fencePollMs: 100 });
    const model = heldModel();
    let h = await Harness.open({ storage, name: "pw", model, workDir: join(t.dir, "work") });
    try {
      const s = await h.start({ goal: "wait for posts", cwd: t.dir });
      await until("the round to ask the model", () => model.calls >= 1);
      const base = ["post", "--db", "pw", "--data-dir", dataDir, "--session", s, "--kind", "ci"];

      // An owner is running: the message is delivered while post waits.
      const live = await cairnIn([...base, "--id", "ci-live", "--payload", '{"green":true}', "--wait"]);
      assert.equal(live.code, 0, live.stderr);
      assert.match(live.stdout, /posted ci-live/);
      assert.match(live.stdout, /delivered ci-live to the inbox of s1/);
      assert.ok(h.session(s)!.observations.has("ci-live"), "the owner's projection holds it");

      // No owner: post waits; the next owner delivers it, and post returns then.
      await h.close();
      const waiting = cairnIn([...base, "--id", "ci-later", "--payload", "{}", "--wait"]);
      const reopenStorage = createSqliteStorage({ dataDir, fencePollMs: 100 });
      await new Promise((r) => setTimeout(r, 500));
      h = await Harness.open({ storage: reopenStorage, name: "pw", model, workDir: join(t.dir, "work") });
      const later = await waiting;
      assert.equal(later.code, 0, later.stderr);
      assert.match(later.stdout, /delivered ci-later to the inbox of s1/);
      assert.ok(h.session(s)!.observations.has("ci-later"));
    } finally {
      model.release();
      await h.close();
      await storage.close();
    }
  });

  it("a message for a submitted run that has not started yet is delivered after the start", async () => {
    const dataDir = join(t.dir, "data2");
    const sub = await cairnIn(["submit", "a later run", "--db", "pw2", "--data-dir", dataDir, "--session", "job"]);
    assert.equal(sub.code, 0, sub.stderr + sub.stdout);
    // The owner opens only once the post is durable and has said so: the run has not started yet.
    let stdout = "";
    let stderr = "";
    let said: () => void = () => undefined;
    const posted = new Promise<void>((resolve) => (said = resolve));
    const args = ["post", "--db", "pw2", "--data-dir", dataDir, "--session", "job", "--kind", "ci", "--id", "early", "--payload", "{}", "--wait"];
    const waiting = main(args, { out: (l) => ((stdout += `${l}\n`), said()), err: (l) => ((stderr += `${l}\n`), said()), env: process.env, isTTY: false }).then((code) => ({ code, stdout, stderr }));
    await posted;
    const storage = createSqliteStorage({ dataDir, fencePollMs: 100 });
    const model = heldModel();
    const h = await Harness.open({ storage, name: "pw2", model, workDir: join(t.dir, "work2"), submitCwd: t.dir });
    try {
      const r = await waiting;
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /waits to be started/);
      await until("the run started and the message delivered", () => h.session("job")?.observations.has("early") === true);
    } finally {
      model.release();
      await h.close();
      await storage.close();
    }
  });
});
