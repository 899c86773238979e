/**
 * The round-loop model the harness and replicated tests share (chaos/support/loop-model.ts): a run
 * whose worker stopped between a cell's `started` and its result (an UnknownExecution on resume)
 * still concludes, because the model resolves the uncertainty first. Without that, every test that
 * closes or kills a LoopModel run mid-round and then resumes it would pass or fail on timing.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { event, identity, turnId, type NewEvent } from "../../src/state/events.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { LoopModel } from "../../chaos/support/loop-model.js";
import { tempDir } from "./support.js";
import { withHarness } from "../support/harness.js";

describe("LoopModel", () => {
  it("resolves an UnknownExecution left by a stopped worker, then concludes success", async () => {
    const t = tempDir();
    const storage = createSqliteStorage({ dataDir: join(t.dir, "data") });
    try {
      const cwd = join(t.dir, "cwd");
      mkdirSync(cwd, { recursive: true });
      const at = new Date().toISOString();
      const s = "s1";
      const turn = turnId(s, 1);
      const patch = [{ op: "test", path: "/revision", value: 0 }, { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["true"] } }];
      // A log as a worker on another host leaves it when it dies after `started`: cell 1's outcome is unknown.
      const db = await storage.open("loop");
      const events: NewEvent[] = [
        event("session_created", s, identity.session(s), at, { goal: "loop", cwd, validators: [], budgets: { max_rounds: 10 } }),
        event("turn_prepared", s, identity.turn(turn), at, { turn, n: 1, revision: 0, delivered: [] }),
        event("model_attempt", s, identity.attempt(turn, 1), at, { turn, attempt: 1 }),
        event("model_response", s, identity.response(turn, 1), at, { turn, attempt: 1, patch, usage: { input_tokens: 1, output_tokens: 1 } }),
        event("patch_accepted", s, identity.patch(turn), at, { turn, attempt: 1, patch, revision: 1, new_cell_ids: [1], removed_ids: [], consumed: [] }),
        event("execution_queued", s, identity.queued(s, 1), at, { cell_id: 1, kind: "cmd" }),
        event("execution_started", s, identity.execution(s, 1), at, { cell_id: 1, host: "another-host", boot_id: "b", pid: 4_000_000, pgid: 4_000_000, start_time: "1" }),
      ];
      await db.commit(events);
      await db.close();

      await withHarness({ storage, name: "loop", model: new LoopModel(2), workDir: join(t.dir, "work") }, async (h) => {
        await h.resume();
        const outcome = await h.wait(s);
        assert.equal(outcome.result, "success", outcome.reason);
      });
      const log = await (async () => {
        const r = await storage.open("loop");
        try {
          return await r.read();
        } finally {
          await r.close();
        }
      })();
      const finished = log.filter((e) => e.kind === "execution_finished").map((e) => (e.body as { cell_id: number; result: string }));
      assert.deepEqual(finished[0], { ...finished[0], cell_id: 1, result: "UnknownExecution" }, "cell 1 is recorded as uncertain, never run again");
      const resolutions = log.filter((e) => e.kind === "patch_accepted").flatMap((e) => JSON.stringify(e.body).includes('"role":"resolution"') ? [e] : []);
      assert.equal(resolutions.length, 1, "one resolution note, in the first round after resume");
    } finally {
      await storage.close();
      t.cleanup();
    }
  });
});
