/**
 * Issue 10 through the Harness (public API, real processes): whatever a model returns is admitted and
 * runs, or is refused with a bounded reason the model can act on; an execution that cannot start is
 * a finished `error`; a bug in one session never stops the others.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { HarnessWorld } from "../../src/harness/world.js";
import { defaultWorld } from "../../src/harness/world.js";
import { MAX_REASON_CHARS } from "../../src/state/admission.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { tempDir } from "../harness/support.js";
import { addCell, modelOf, nested, rev } from "./support.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };
const HANG_GUARD_MS = 60_000;

function guard<T>(p: Promise<T>, what: string): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  return Promise.race([p, new Promise<T>((_, reject) => (t = setTimeout(() => reject(new Error(`${what}: no outcome after ${HANG_GUARD_MS} ms`)), HANG_GUARD_MS)))]).finally(() => clearTimeout(t));
}

/**
 * A model that first sends `bad` (a patch built for the round's revision), then a conclusion. The run
 * must end `failure` by the model's own conclusion: the hostile patch was refused, not fatal.
 */
async function refusedThenConcluded(bad: (revision: number, nextId: number) => unknown) {
  const t = tempDir();
  const model = modelOf((req, call) => {
    const r = req.state.revision;
    const id = req.state.runtime.next_cell_id;
    if (call === 1) return bad(r, id);
    return [rev(r), addCell({ id, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: "gave up after the refusal" })];
  });
  return await withHarness({ storage: createMemoryStorage(), name: "hostile", model, workDir: t.dir, limits: fast }, async (h) => {
    const s = await h.start({ goal: "g", cwd: t.dir });
    const out = await guard(h.wait(s), "the run");
    assert.equal(out.result, "failure");
    assert.match(out.reason, /gave up after the refusal/);
    const turn = [...h.session(s)!.turns.values()][0]!;
    assert.equal(turn.rejections.length, 1, "the hostile patch was refused once");
    const rej = turn.rejections[0]!;
    assert.ok(rej.reason.length <= MAX_REASON_CHARS, `reason of ${rej.reason.length} characters`);
    assert.ok(model.calls[1]?.rejection !== undefined, "the model was shown the refusal");
    return { rejection: rej, session: h.session(s)! };
  }).finally(() => t.cleanup());
}

describe("hostile model replies are refused with a bounded reason, and the run goes on", () => {
  it("a cmd argv with a NUL byte is refused at admission (not queued forever)", async () => {
    const { rejection, session } = await refusedThenConcluded((r, id) => [rev(r), addCell({ id, previous_id: null, kind: "cmd", argv: ["echo", "a\u0000b"] })]);
    assert.equal(rejection.code, "invalid_cell");
    assert.match(rejection.reason, /NUL/);
    assert.equal(session.executions.size, 0);
  });

  it("an argv string over the kernel's per-argument limit (65,536 three-byte characters) is refused at admission", async () => {
    const { rejection } = await refusedThenConcluded((r, id) => [rev(r), addCell({ id, previous_id: null, kind: "cmd", argv: ["echo", "€".repeat(65_536)] })]);
    assert.equal(rejection.code, "invalid_cell");
    assert.match(rejection.reason, /196608 bytes.*kernel's limit/);
  });

  it("a reply nested 5,000 levels deep is refused before anything recursive touches it", async () => {
    const { rejection } = await refusedThenConcluded((r, id) => [rev(r), addCell({ id, previous_id: null, kind: "note", text: "x", extra: nested(5000) })]);
    assert.equal(rejection.code, "invalid_patch");
    assert.match(rejection.reason, /nested more than 64 levels/);
  });

  it("a reply nested 100,000 levels deep (a stack overflow for JSON.stringify) is refused too", async () => {
    const { rejection } = await refusedThenConcluded(() => nested(100_000));
    assert.equal(rejection.code, "invalid_patch");
  });

  it("a refusal that quotes a 1 MB path stays bounded", async () => {
    const { rejection } = await refusedThenConcluded((r) => [rev(r), { op: "add", path: `/${"p".repeat(1_000_000)}`, value: 1 }]);
    assert.equal(rejection.code, "forbidden_path");
  });
});

describe("an execution that cannot start", () => {
  it("is recorded as finished with result error and a reason, and the run goes on", async () => {
    const t = tempDir();
    const base = defaultWorld();
    const world: HarnessWorld = {
      ...base,
      executor: {
        prepare: async (spec) => {
          if (spec.cellId === 1) throw new TypeError("a bug in the launch path");
          return base.executor.prepare(spec);
        },
      },
    };
    const model = modelOf((req) => {
      const r = req.state.revision;
      const id = req.state.runtime.next_cell_id;
      const one = req.state.runtime.cells["1"];
      if (one === undefined) return [rev(r), addCell({ id, previous_id: null, kind: "cmd", argv: ["true"] })];
      return [rev(r), addCell({ id, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: `cell 1 ended ${one.result}` })];
    });
    await withHarness({ storage: createMemoryStorage(), name: "nostart", model, workDir: t.dir, world, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      const out = await guard(h.wait(s), "the run");
      assert.match(out.reason, /cell 1 ended error/);
      const ex = h.session(s)!.executions.get(1)!;
      assert.equal(ex.phase, "finished");
      assert.equal(ex.result, "error");
      assert.equal(ex.started, null, "it never started, so it is not uncertain");
      assert.match(ex.detail ?? "", /could not be started: a bug in the launch path/);
    }).finally(() => t.cleanup());
  });
});

describe("a bug in one session never stops the others", () => {
  it("a session whose driver throws stops alone; the other finishes, and resume continues the first", async () => {
    const t = tempDir();
    const storage = createMemoryStorage();
    const model = modelOf((req) => {
      const r = req.state.revision;
      const id = req.state.runtime.next_cell_id;
      if (r === 0) return [rev(r), addCell({ id, previous_id: null, kind: "note", text: "plan" })];
      return [rev(r), addCell({ id, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: `${req.state.id} concluded` })];
    });
    let broken = true;
    const faults = (point: string, d: { session: string }) => {
      if (point === "patch:committed" && d.session === "s1" && broken) throw new TypeError("a bug that only session s1 hits");
    };
    await withHarness({ storage, name: "iso", model, workDir: t.dir, limits: fast, faults }, async (h) => {
      const s1 = await h.start({ goal: "one", cwd: t.dir });
      const s2 = await h.start({ goal: "two", cwd: t.dir });
      const [r1, r2] = await guard(Promise.allSettled([h.wait(s1), h.wait(s2)]), "both runs");
      assert.equal(r1.status, "rejected", "s1's driver stopped on its bug");
      assert.equal(r2.status, "fulfilled");
      if (r2.status === "fulfilled") assert.match(r2.value.reason, /s2 concluded/);
      assert.equal(h.status, "open", "the harness is still open");
    });
    broken = false;
    await withHarness({ storage, name: "iso", model, workDir: t.dir, limits: fast, faults }, async (again) => {
      // s1 stopped where its bug hit (a later wake-up may have moved it on); resume finishes it.
      await again.resume();
      const out = await guard(again.wait("s1"), "the resumed run");
      assert.match(out.reason, /s1 concluded/);
      assert.equal(again.session("s2")!.terminal?.reason.includes("s2 concluded"), true);
    }).finally(() => t.cleanup());
  });
});
