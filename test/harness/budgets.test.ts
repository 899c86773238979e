/**
 * Budgets and limits at their edges (a hanging model, durations past setTimeout's range),
 * and models that misbehave.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelRequest } from "../../src/model/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, scripted, tempDir } from "./support.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A model whose call never returns (it honours the abort signal only). */
const hanging: Model = {
  name: "hangs",
  step: (req: ModelRequest) =>
    new Promise((_resolve, reject) => {
      req.signal?.addEventListener("abort", () => reject(new Error("aborted")));
    }),
};

describe("budgets", () => {
  it("the wall-time budget ends a run whose model call hangs", async () => {
    const t = tempDir();
    await withHarness({ storage: createMemoryStorage(), name: "b", model: hanging, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir, budgets: { max_wall_seconds: 1 } });
      const out = await Promise.race([h.wait(s), sleep(10_000).then(() => null)]);
      assert.ok(out !== null, "10 s after a 1 s wall-time budget the run had not ended: the budget is only checked between model calls");
      assert.equal(out.result, "failure");
      assert.match(out.reason, /wall-time budget/);
    }).finally(() => t.cleanup());
  });

  it("a wall-time budget longer than 24.8 days does not overflow setTimeout (no wake-up storm)", async () => {
    const t = tempDir();
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on("warning", onWarning);
    const model = scripted([adds(0, 1, [cmd("sleep", "1")]), adds(1, 2, [conclude("failure", "end")])]);
    const h = await Harness.open({ storage: createMemoryStorage(), name: "b", model, workDir: t.dir, limits: fast });
    try {
      // `cairn run --max-wall 30d`.
      const s = await h.start({ goal: "g", cwd: t.dir, budgets: { max_wall_seconds: 30 * 86400 } });
      await h.wait(s);
      await sleep(50);
      const overflow = warnings.filter((w) => w.startsWith("TimeoutOverflowWarning"));
      assert.deepEqual(overflow.slice(0, 1), [], `${overflow.length} TimeoutOverflowWarning(s): the budget timer fired after 1 ms, re-armed, and fired again, all run long`);
    } finally {
      process.off("warning", onWarning);
      await h.close();
      t.cleanup();
    }
  });

  it("an execution wall-time limit past setTimeout's range is refused with a sentence, instead of killing every cell at once", async () => {
    const t = tempDir();
    const model = scripted([adds(0, 1, [cmd("sleep", "0.3")]), adds(1, 2, [conclude("failure", "end")])]);
    try {
      await assert.rejects(
        Harness.open({ storage: createMemoryStorage(), name: "b", model, workDir: t.dir, limits: { ...fast, executionWallTimeMs: 30 * 86_400_000 } }),
        (e: Error & { code?: string }) => e.code === "config" && /executionWallTimeMs/.test(e.message) && /2147483647/.test(e.message),
      );
    } finally {
      t.cleanup();
    }
  });

  it("max_rounds 1 allows exactly one model round, then ends the run", async () => {
    const t = tempDir();
    const calls: number[] = [];
    const model: Model = {
      name: "count",
      step: async (req) => {
        calls.push(req.state.revision);
        return { patch: adds(req.state.revision, req.state.runtime.next_cell_id, [cmd("true")]), usage: null };
      },
    };
    await withHarness({ storage: createMemoryStorage(), name: "b", model, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir, budgets: { max_rounds: 1 } });
      const out = await h.wait(s);
      assert.equal(out.result, "failure");
      assert.match(out.reason, /round budget of 1/);
      assert.equal(calls.length, 1);
    }).finally(() => t.cleanup());
  });
});

describe("misbehaving models", () => {
  const cases: { name: string; step: (req: ModelRequest) => unknown }[] = [
    { name: "throws a TypeError", step: () => Promise.reject(new TypeError("provider bug")) },
    { name: "returns undefined", step: async () => undefined },
    { name: "returns a patch without usage", step: async (req: ModelRequest) => ({ patch: adds(req.state.revision, 1, [conclude("failure", "no usage")]) }) },
    {
      name: "returns a patch with 10k ops",
      step: async (req: ModelRequest) => ({ patch: [{ op: "test", path: "/revision", value: req.state.revision }, ...Array.from({ length: 10_000 }, (_, i) => ({ op: "add", path: "/cells/-", value: { id: i + 1, previous_id: null, kind: "note", text: "x" } }))], usage: null }),
    },
  ];
  for (const c of cases) {
    it(`a model that ${c.name}: the run still ends (wait() settles) and nothing hangs`, async () => {
      const t = tempDir();
      const model = { name: "bad", step: c.step } as unknown as Model;
      await withHarness({ storage: createMemoryStorage(), name: "m", model, workDir: t.dir, limits: { ...fast, maxAttemptsPerTurn: 3 } }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        const out = await Promise.race([h.wait(s).then((o) => o.result, (e: Error) => `rejected: ${e.message}`), sleep(15_000).then(() => "hung")]);
        assert.notEqual(out, "hung");
        assert.equal(out, "failure");
        const u = h.session(s)!.state.runtime.usage;
        assert.ok(u.attempts >= 1 && u.attempts <= 3, `attempts ${u.attempts}`);
      }).finally(() => t.cleanup());
    });
  }
});
