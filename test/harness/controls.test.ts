import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelRequest } from "../../src/model/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { adds, cmd, conclude, note, scripted, tempDir } from "./support.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };

/** A model driven by a function of the request (for conditions a fixed script cannot express). */
function modelOf(f: (req: ModelRequest) => unknown[]): Model & { calls: ModelRequest[] } {
  const calls: ModelRequest[] = [];
  return {
    name: "fn",
    calls,
    async step(req) {
      calls.push(req);
      return { patch: f(req), usage: { input_tokens: 100, output_tokens: 10 } };
    },
  };
}

describe("control notes", () => {
  it("cancel of a queued cell finishes it as cancelled; it never runs", async () => {
    const t = tempDir();
    try {
      const never = join(t.dir, "never");
      const model = scripted([
        // Cell 1 blocks the queue; cell 2 is queued behind it; the cancel arrives in round 2, which the
        // outside observation below wakes while cell 1 still runs.
        adds(0, 1, [cmd("sleep", "1"), cmd("touch", never)]),
        adds(1, 3, [note("cancel cell 2", { role: "cancel", target_cell_id: 2 })]),
        adds(2, 4, [note("saw the cancellation")]),
        adds(3, 5, [conclude("failure", "end")]),
        adds(4, 6, [conclude("failure", "end")]),
      ]);
      await withHarness({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await h.post(s, { id: "nudge", kind: "nudge", payload: null });
        await h.wait(s);
        const sp = h.session(s)!;
        assert.equal(sp.executions.get(2)?.result, "cancelled");
        assert.equal(sp.executions.get(2)?.started, null, "the cancelled cell was never launched");
        assert.equal(sp.controls.get(3)?.outcome, "cancelled");
        assert.equal(existsSync(never), false);
      });
    } finally {
      t.cleanup();
    }
  });

  it("cancel of a running cell stops its process group and records UnknownExecution (cancelled_after_launch)", async () => {
    const t = tempDir();
    try {
      const marker = join(t.dir, "started");
      const after = join(t.dir, "after");
      const model = modelOf((req) => {
        const r = req.state.revision;
        if (r === 0) return adds(0, 1, [cmd("sh", "-c", `touch ${marker}; sleep 30; touch ${after}`)]);
        if (r === 1) return adds(1, 2, [note("stop it", { role: "cancel", target_cell_id: 1 })]);
        const unknown = req.state.runtime.cells["1"]?.result === "UnknownExecution";
        return adds(r, req.state.runtime.next_cell_id, [conclude("failure", unknown ? "cancelled as asked" : "cell 1 was not cancelled")]);
      });
      await withHarness({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        for (let i = 0; i < 2400 && !existsSync(marker); i++) await new Promise((r) => setTimeout(r, 25));
        await h.post(s, { id: "please-cancel", kind: "nudge", payload: null });
        const out = await h.wait(s);
        assert.equal(out.reason, "the model concluded failure: cancelled as asked");
        const ex = h.session(s)!.executions.get(1)!;
        assert.equal(ex.result, "UnknownExecution");
        assert.equal(ex.unknown?.reason, "cancelled_after_launch");
        assert.equal(ex.unknown?.worker_stopped, true);
        assert.equal(h.session(s)!.controls.get(2)?.outcome, "stopped");
        await new Promise((r) => setTimeout(r, 300));
        assert.equal(existsSync(after), false, "the process group was stopped");
      });
    } finally {
      t.cleanup();
    }
  });

  it("a resolution needs evidence and keeps the UnknownExecution in history", async () => {
    const t = tempDir();
    try {
      const model = modelOf((req) => {
        const r = req.state.revision;
        if (r === 0) return adds(0, 1, [cmd("sh", "-c", "sleep 30")]);
        if (r === 1) return adds(1, 2, [note("cancel", { role: "cancel", target_cell_id: 1 })]);
        if (r === 2) return adds(2, 3, [cmd("true")]);
        if (r === 3) return adds(3, 4, [note("the cell was stopped; nothing to redo", { role: "resolution", target_cell_id: 1, evidence_refs: ["cell:3"] }), conclude("success", "resolved")]);
        return adds(r, req.state.runtime.next_cell_id, [conclude("failure", "unexpected")]);
      });
      await withHarness({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await new Promise((r) => setTimeout(r, 300));
        await h.post(s, { id: "go", kind: "nudge", payload: null });
        const out = await h.wait(s);
        assert.equal(out.result, "success", out.reason);
        const ex = h.session(s)!.executions.get(1)!;
        assert.equal(ex.result, "UnknownExecution", "the original uncertainty stays in history");
        assert.equal(ex.resolved_by, 4);
        assert.equal(h.inspect().sessions[0]!.unresolved_unknown.length, 0);
      });
    } finally {
      t.cleanup();
    }
  });
});

describe("inbox", () => {
  it("a round sees a fixed snapshot: what arrives during the model call waits for the next round", async () => {
    const t = tempDir();
    try {
      const ref: { h?: Harness; s: string } = { s: "" };
      const model = modelOf((req) => {
        const r = req.state.revision;
        if (r === 0) {
          // Arrives while round 1 is being decided.
          void ref.h!.post(ref.s, { id: "late", kind: "nudge", payload: 1 });
          return adds(0, 1, [note("first")]);
        }
        return adds(r, req.state.runtime.next_cell_id, [conclude("failure", "end")]);
      });
      const h = await Harness.open({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast });
      ref.h = h;
      try {
        ref.s = await h.start({ goal: "g", cwd: t.dir });
        await h.wait(ref.s);
        assert.deepEqual(model.calls[0]!.state.runtime.inbox.map((o) => o.id), []);
        assert.deepEqual(model.calls[1]!.state.runtime.inbox.map((o) => o.id), ["late"]);
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("is bounded: a full inbox tells the sender to retry", async () => {
    const t = tempDir();
    try {
      const model = modelOf(() => adds(0, 1, [cmd("sleep", "5")]));
      await withHarness({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: { ...fast, inboxLimit: 2 } }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await h.post(s, { id: "a", kind: "k", payload: 1 });
        await h.post(s, { id: "b", kind: "k", payload: 2 });
        await assert.rejects(h.post(s, { id: "c", kind: "k", payload: 3 }), (e: Error & { code?: string; reason?: string; retryable?: boolean }) => e.code === "rejected" && e.reason === "backlog_full" && e.retryable === true && /retry later/.test(e.message));
      });
    } finally {
      t.cleanup();
    }
  });
});

describe("budgets", () => {
  it("a round budget ends the run as a failure with a clear reason, and survives a restart", async () => {
    const t = tempDir();
    try {
      const storage = createSqliteStorage({ dataDir: t.dir });
      const model = modelOf((req) => adds(req.state.revision, req.state.runtime.next_cell_id, [cmd("true")]));
      let h = await Harness.open({ storage, name: "b", model, workDir: t.dir, limits: fast });
      const s = await h.start({ goal: "g", cwd: t.dir, budgets: { max_rounds: 3 } });
      await h.close();
      // The budget is in the log: a new process enforces it.
      h = await Harness.open({ storage: createSqliteStorage({ dataDir: t.dir }), name: "b", model, workDir: t.dir, limits: fast });
      try {
        await h.resume();
        const out = await h.wait(s);
        assert.equal(out.result, "failure");
        assert.match(out.reason, /round budget of 3 is exhausted/);
        assert.equal(h.session(s)!.turn_count, 3);
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("a token budget ends the run once the tokens in and out reach it", async () => {
    const t = tempDir();
    try {
      const model = modelOf((req) => adds(req.state.revision, req.state.runtime.next_cell_id, [cmd("true")]));
      await withHarness({ storage: createMemoryStorage(), name: "b", model, workDir: t.dir, limits: fast }, async (h) => {
        const s = await h.start({ goal: "g", cwd: t.dir, budgets: { max_tokens: 250 } });
        const out = await h.wait(s);
        assert.match(out.reason, /token budget of 250 is exhausted \(330 used\)/);
        assert.equal(model.calls.length, 3);
      });
    } finally {
      t.cleanup();
    }
  });
});

describe("timers", () => {
  it("a timer registered before a restart fires exactly once after it, late rather than never", async () => {
    const t = tempDir();
    try {
      const cli = join(process.cwd(), "src", "cli", "entry.ts");
      const model = modelOf((req) => {
        const r = req.state.revision;
        if (r === 0) return adds(0, 1, [cmd(process.execPath, "--import", "tsx", cli, "timer", "--id", "later", "--in", "4s")]);
        if (r === 1) return adds(1, 2, [note("waiting for the timer")]);
        return adds(r, req.state.runtime.next_cell_id, [conclude("failure", `woke with ${req.state.runtime.inbox.map((o) => o.id).join(",")}`)]);
      });
      let h = await Harness.open({ storage: createSqliteStorage({ dataDir: t.dir }), name: "t", model, workDir: t.dir, limits: fast });
      const s = await h.start({ goal: "g", cwd: process.cwd() });
      // The timer command is a real process (tsx start-up can take seconds on a loaded machine): a
      // generous guard, since revision 2 needs the command to have finished (registration first).
      for (let i = 0; i < 2400 && h.session(s)!.state.revision < 2; i++) await new Promise((r) => setTimeout(r, 25));
      const later = h.session(s)!.timers.get("later");
      assert.equal(later?.fired, false);
      await h.close();
      // The timer falls due while nobody owns the run: wait past its due time (the registration may
      // have come seconds after `--in 4s` was asked, on a loaded machine), not a fixed 4.5 s.
      await new Promise((r) => setTimeout(r, Math.max(0, Date.parse(later!.due_at) - Date.now()) + 250));
      h = await Harness.open({ storage: createSqliteStorage({ dataDir: t.dir }), name: "t", model, workDir: t.dir, limits: fast });
      try {
        await h.resume();
        const out = await h.wait(s);
        assert.equal(out.reason, "the model concluded failure: woke with timer:later");
        const fired = [...h.session(s)!.timers.values()].filter((x) => x.fired);
        assert.equal(fired.length, 1);
        await h.resume(); // idempotent: nothing fires twice
        await h.settled();
      } finally {
        await h.close();
      }
      const storage = createSqliteStorage({ dataDir: t.dir });
      const reader = await storage.reader("t");
      const events = await reader.read(0);
      const firedEvents = events.filter((e) => e.kind === "timer_fired");
      assert.equal(firedEvents.length, 1);
      assert.ok((firedEvents[0]!.body as { late_ms: number }).late_ms > 0, "it fired late, not never");
      await reader.close();
      await storage.close();
      assert.ok(readFileSync(join(t.dir, "t.db")).length > 0);
    } finally {
      t.cleanup();
    }
  });
});
