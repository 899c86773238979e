/**
 * Harness edge cases: a success conclusion beside a new cell, invalid UTF-8 and a 3 MB line of
 * output, a fence during a model call, and posts to a session that does not exist.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelRequest } from "../../src/model/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, note, scripted, tempDir } from "./support.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };

describe("Harness edge cases", () => {
  it("a success conclusion in the same patch as a new cell is refused at admission; a failure conclusion ends the run and the cell never runs", async () => {
    const t = tempDir();
    const never = join(t.dir, "never");
    const model: Model = {
      name: "fn",
      step: async (req) => ({ patch: adds(0, 1, [cmd("touch", never), req.rejection === undefined ? conclude("success") : conclude("failure", "give up")]), usage: null }),
    };
    await withHarness({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      const out = await h.wait(s);
      assert.equal(out.reason, "the model concluded failure: give up");
      const turn = [...h.session(s)!.turns.values()][0]!;
      assert.equal(turn.rejections[0]?.code, "conclusion_blocked");
      assert.equal(existsSync(never), false);
      assert.equal(h.session(s)!.executions.get(1)?.started, null);
    }).finally(() => t.cleanup());
  });

  it("invalid UTF-8 and a 3 MB single line: output is bounded, truncation recorded, and the run goes on", async () => {
    const t = tempDir();
    const model = scripted([
      adds(0, 1, [cmd("python3", "-c", "import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\xc3 bad ' + b'x' * 3000000)")]),
      adds(1, 2, [conclude("failure", "end")]),
    ]);
    await withHarness({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      const out = await h.wait(s);
      assert.equal(out.reason, "the model concluded failure: end");
      const ex = h.session(s)!.executions.get(1)!;
      assert.equal(ex.result, "success");
      assert.ok(ex.dropped_bytes > 0, "truncation is recorded");
      assert.ok(ex.output_bytes <= 1024 * 1024 + 200, `kept ${ex.output_bytes} bytes`);
      assert.equal(h.session(s)!.state.runtime.cells["1"]?.truncated, true);
    }).finally(() => t.cleanup());
  });

  it("fenced during a model call: wait() rejects with a reset error and the old owner commits nothing more", async () => {
    const t = tempDir();
    const storage = createMemoryStorage();
    let called!: () => void;
    const inCall = new Promise<void>((r) => (called = r));
    const model: Model = {
      name: "slow",
      step: (req: ModelRequest) =>
        new Promise((resolve) => {
          called();
          setTimeout(() => resolve({ patch: adds(req.state.revision, 1, [note("late")]), usage: null }), 300);
        }),
    };
    const h1 = await Harness.open({ storage, name: "f", model, workDir: t.dir, limits: fast });
    const s = await h1.start({ goal: "g", cwd: t.dir });
    const waited = h1.wait(s).then(
      () => "resolved",
      (e: { code?: string }) => e.code,
    );
    await inCall;
    const h2 = await Harness.open({ storage, name: "f", model: scripted([]), workDir: t.dir, limits: fast });
    try {
      assert.equal(await waited, "reset");
      await new Promise((r) => setTimeout(r, 500));
      const reader = await storage.reader("f");
      const events = await reader.read(0);
      await reader.close();
      assert.equal(events.filter((e) => e.kind === "model_response").length, 0, "the fenced owner recorded nothing after the fence");
      await assert.rejects(h1.post(s, { id: "x", kind: "k", payload: null }), (e: { code?: string }) => e.code === "reset");
    } finally {
      await h1.close();
      await h2.close();
      t.cleanup();
    }
  });

  it("post() to a session that does not exist, or with a reserved prefix, is refused with a stable code", async () => {
    const t = tempDir();
    await withHarness({ storage: createMemoryStorage(), name: "p", model: scripted([adds(0, 1, [cmd("sleep", "3")])]), workDir: t.dir, limits: fast }, async (h) => {
      await assert.rejects(h.post("s9", { id: "a", kind: "k", payload: null }), (e: { code?: string }) => e.code === "config");
      const s = await h.start({ goal: "g", cwd: t.dir });
      for (const id of ["execution:1", "timer:x", "control:2", "idle:1"]) {
        await assert.rejects(h.post(s, { id, kind: "k", payload: null }), (e: { code?: string }) => e.code === "rejected", id);
      }
    }).finally(() => t.cleanup());
  });
});
