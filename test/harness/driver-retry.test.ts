// A session whose driver failed on a commit (refused or failed before it was sent) is driven again
// after a back-off, without a resume: a long-lived worker (`cairn serve`) never leaves it wedged.
// Without the re-drive, a commit fault on a run's first `turn_prepared` would leave that run at
// `session_created` for the rest of the worker's life while its other runs finished.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Harness } from "../../src/harness/harness.js";
import type { FaultPoint } from "../../src/storage/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, scripted, tempDir } from "./support.js";
import { until } from "../support/wait.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };


describe("session driver after a failed commit", () => {
  it("drives the run again after a back-off: it ends without a resume, and nothing is done twice", async () => {
    const t = tempDir();
    let commits = 0;
    const failed: number[] = [];
    // Fail the 2nd commit (the first round's turn_prepared) before it is sent.
    const faults = (point: FaultPoint): void => {
      if (point !== "commit:before") return;
      commits += 1;
      if (commits === 2) {
        failed.push(commits);
        throw new Error("injected: the commit failed before it was sent");
      }
    };
    const model = scripted([adds(0, 1, [cmd("true")]), adds(1, 2, [conclude("success")])]);
    await withHarness({ storage: createMemoryStorage({ faults }), name: "r", model, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      await until("the run to end", () => h.session(s)!.terminal !== null);
      assert.deepEqual(failed, [2], "the fault was injected once");
      const p = h.session(s)!;
      assert.equal(p.terminal!.result, "success", p.terminal!.reason);
      assert.equal(p.executions.get(1)!.result, "success");
      assert.equal(p.turn_count, 2, "two rounds: the failed pass repeated nothing");
    }).finally(() => t.cleanup());
  });

  it("a closed harness cancels the pending retry (no pass after close)", async () => {
    const t = tempDir();
    let commits = 0;
    const faults = (point: FaultPoint): void => {
      if (point === "commit:before" && ++commits === 2) throw new Error("injected");
    };
    const model = scripted([adds(0, 1, [conclude("success")])]);
    const h = await Harness.open({ storage: createMemoryStorage({ faults }), name: "r", model, workDir: t.dir, limits: fast });
    const s = await h.start({ goal: "g", cwd: t.dir });
    await until("the failed commit", () => commits >= 2);
    await h.close();
    const after = commits;
    await new Promise((r) => setTimeout(r, 1500)); // past the first back-off (1 s)
    assert.equal(commits, after, "no commit was attempted after close");
    assert.equal(h.session(s)!.terminal, null);
    t.cleanup();
  });
});
