/**
 * What the timeline page is sent about an operator's steering: a run paused, a cell waiting for
 * approval, the decision, the unpause, a cancel. A real harness on the memory adapter commits the
 * events; the page's builder folds them from the storage, as `cairn ui` does, in increments, so the
 * header a live page receives is checked after each change.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import { forkRun } from "../../src/harness/operator.js";
import { TimelineBuilder } from "../../src/ui/timeline.js";
import { parseLogEvent } from "../../src/state/events.js";
import type { Storage } from "../../src/storage/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, scripted, tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";

const t = tempDir("cairn-steer-timeline-");
after(() => t.cleanup());
const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };

/** Folds what `storage` committed since the last call into `b`; returns the headers that changed. */
async function follow(storage: Storage, name: string, b: TimelineBuilder, from: { seq: number }) {
  const reader = await storage.reader(name);
  try {
    const events = (await reader.read(from.seq)).map((e) => parseLogEvent(e));
    if (events.length > 0) from.seq = events.at(-1)!.seq;
    b.apply(events);
  } finally {
    await reader.close();
  }
  return b.takeChanges().sessions.map((c) => c.header);
}

describe("the timeline page shows an operator's steering", () => {
  it("a paused run with a cell waiting for approval, then approved, unpaused and ended", async () => {
    const storage = createMemoryStorage();
    const target = join(t.dir, "gated");
    const h = await Harness.open({ storage, name: "tl", model: scripted([adds(0, 1, [cmd("touch", target)]), adds(1, 2, [conclude("success", "touched")])]), workDir: t.dir, limits: fast });
    try {
      const b = new TimelineBuilder();
      const from = { seq: 0 };
      const s = await h.start({ goal: "touch a file", cwd: t.dir, approval: [{ kind: "all" }] });
      await until("cell 1 to wait for approval", () => h.session(s)!.executions.get(1)?.approval?.state === "waiting");
      await h.steer(s, "p1", { action: "pause", reason: "reviewing", now: false });

      let [header] = await follow(storage, "tl", b, from);
      assert.equal(header!.status, "paused");
      assert.deepEqual(header!.paused && { reason: header!.paused.reason, now: header!.paused.now }, { reason: "reviewing", now: false });
      assert.deepEqual(header!.awaiting_approval, [1]);
      const waiting = b.view(s)!.cells.find((c) => c.id === 1)!;
      assert.equal(waiting.approval?.state, "waiting");
      assert.equal(waiting.approval?.rule, "all");
      assert.equal(waiting.started_at, null);
      assert.deepEqual(b.view(s)!.marks.map((m) => m.kind), ["approval", "pause"]);

      await h.steer(s, "a1", { action: "approve", cell_id: 1, reason: "fine" });
      [header] = await follow(storage, "tl", b, from);
      assert.equal(header!.status, "paused", "approved, still paused");
      assert.deepEqual(header!.awaiting_approval, []);
      assert.equal(b.view(s)!.cells[0]!.approval?.state, "approved");
      assert.equal(b.view(s)!.cells[0]!.approval?.reason, "fine");
      await h.settled();
      assert.equal(existsSync(target), false, "approved but paused: not launched");

      await h.steer(s, "u1", { action: "unpause", reason: "" });
      await h.wait(s);
      [header] = await follow(storage, "tl", b, from);
      assert.equal(header!.status, "success");
      assert.equal(header!.paused, null);
      assert.equal(b.view(s)!.cells[0]!.result, "success");
      assert.deepEqual(b.view(s)!.marks.map((m) => m.kind), ["approval", "pause", "approval", "unpause", "control", "end"]);
      assert.match(b.view(s)!.marks[2]!.text, /cell 1 approved: fine/);
    } finally {
      await h.close();
    }
  });

  it("a cancelled run ends as cancelled, its waiting cell no longer waits", async () => {
    const storage = createMemoryStorage();
    const h = await Harness.open({ storage, name: "tc", model: scripted([adds(0, 1, [cmd("touch", join(t.dir, "never"))])]), workDir: t.dir, limits: fast });
    try {
      const b = new TimelineBuilder();
      const s = await h.start({ goal: "g", cwd: t.dir, approval: [{ kind: "argv", prefix: ["touch"] }] });
      await until("cell 1 to wait for approval", () => h.session(s)!.executions.get(1)?.approval?.state === "waiting");
      await h.steer(s, "c1", { action: "cancel", reason: "wrong goal" });
      const out = await h.wait(s);
      assert.equal(out.result, "cancelled");
      const [header] = await follow(storage, "tc", b, { seq: 0 });
      assert.equal(header!.status, "cancelled");
      assert.deepEqual(header!.awaiting_approval, []);
      assert.equal(b.view(s)!.cells[0]!.result, "cancelled");
      assert.ok(b.view(s)!.marks.some((m) => m.kind === "cancel" && m.text === "cancelled by an operator: wrong goal"));
      assert.equal(existsSync(join(t.dir, "never")), false);
    } finally {
      await h.close();
    }
  });

  it("a fork shows where it comes from, then its copy done, beside its untouched origin", async () => {
    const storage = createMemoryStorage();
    // The origin: round 1 runs a cell, round 2 concludes. The fork (after round 1) concludes too.
    const h = await Harness.open({ storage, name: "tf", model: scripted([adds(0, 1, [cmd("true")]), adds(1, 2, [conclude("success", "done")]), adds(1, 2, [conclude("failure", "forked")])]), workDir: t.dir, limits: fast });
    try {
      const b = new TimelineBuilder();
      const from = { seq: 0 };
      const s = await h.start({ goal: "g", cwd: t.dir });
      await h.wait(s);
      await follow(storage, "tf", b, from);
      const originMarks = b.view(s)!.marks.map((m) => m.kind);

      const out = await forkRun(storage, "tf", s, { atRound: 1, newSession: "again", reason: "try another way" }, { waitMs: 60_000 });
      assert.equal(out.status, "applied", out.message);
      await h.wait("again");
      const headers = await follow(storage, "tf", b, from);
      const header = headers.find((x) => x.id === "again");
      assert.ok(header !== undefined, "the page is sent the fork's header");
      assert.deepEqual(header.fork_of, { session: s, round: 1 });
      const marks = b.view("again")!.marks;
      assert.equal(marks[0]!.kind, "fork");
      assert.equal(marks[0]!.text, `forked from run ${s} after round 1`);
      assert.match(marks.find((m, i) => i > 0 && m.kind === "fork")!.text, new RegExp(`^fork ready \\(\\d+ events copied from run ${s}\\)$`));
      assert.deepEqual(b.view("again")!.cells.map((c) => [c.id, c.result]), [[1, "success"]], "the origin's cell, as it ran there");
      assert.deepEqual(b.view(s)!.marks.map((m) => m.kind), originMarks, "the origin is untouched");
    } finally {
      await h.close();
    }
  });
});
