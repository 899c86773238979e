/**
 * Issue 10, the smaller broken promises: a mailbox message refused at drain time is recorded where
 * the poster sees it; `submit`'s replay returns the original receipt; payloads differing only under
 * `__proto__` are different; posted payloads are bounded.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { checkOutsideObservation, MAX_PAYLOAD_SIZE } from "../../src/harness/observations.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { tempDir } from "../harness/support.js";
import { addCell, modelOf, nested, rev } from "./support.js";
import { until } from "../support/wait.js";
import { withHarness } from "../support/harness.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };


describe("mailbox messages refused at drain time", () => {
  it("a message for a run that ended meanwhile, and one whose id conflicts, become post_refused events shown by status", async () => {
    const t = tempDir();
    const storage = createMemoryStorage();
    const model = modelOf((req) => [rev(req.state.revision), addCell({ id: req.state.runtime.next_cell_id, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: "over" })]);
    await withHarness({ storage, name: "mb", model, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      const s2 = await h.start({ goal: "other", cwd: t.dir });
      await h.wait(s);
      await h.wait(s2).catch(() => undefined);
      // Posted as `cairn post` does (it checked before the run ended): straight into the mailbox.
      await storage.post("mb", { id: "late", session: s, kind: "ci", payload: { ok: true }, at: new Date().toISOString() });
      await until("the refusal to be recorded", () => h.inspect(s).sessions[0]!.refused_posts.length === 1);
      const r = h.inspect(s).sessions[0]!.refused_posts[0]!;
      assert.equal(r.id, "late");
      assert.equal(r.code, "ended");
      assert.match(r.reason, /has ended/);
    }).finally(() => t.cleanup());
  });
});

describe("Harness.submit", () => {
  it("a replay (same round, same patch) returns the original receipt: the cells it created, the ids it removed, what it consumed", async () => {
    const t = tempDir();
    const patches: unknown[] = [];
    const model = modelOf((req) => {
      const r = req.state.revision;
      const id = req.state.runtime.next_cell_id;
      const p = r === 0 ? [rev(r), addCell({ id, previous_id: null, kind: "note", text: "a" }), addCell({ id: id + 1, previous_id: null, kind: "note", text: "b" })] : [rev(r), { op: "remove", path: "/cells/1" }, addCell({ id, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: "end" })];
      patches.push(p);
      return p;
    });
    await withHarness({ storage: createMemoryStorage(), name: "sub", model, workDir: t.dir, limits: { ...fast, maxIdle: 5 } }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      await h.wait(s);
      const first = await h.submit(s, `${s}:t1`, patches[0]);
      assert.ok(first.ok && first.receipt.replay);
      if (!first.ok) return;
      assert.deepEqual(first.receipt.newCells.map((c) => c.id), [1, 2]);
      const second = await h.submit(s, `${s}:t2`, patches[1]);
      assert.ok(second.ok && second.receipt.replay);
      if (!second.ok) return;
      assert.deepEqual(second.receipt.newCells.map((c) => c.id), [3]);
      assert.deepEqual(second.receipt.removedIds, [2]);
      assert.deepEqual([...second.receipt.consumed], [...h.session(s)!.turns.get(`${s}:t2`)!.accepted!.consumed]);
    }).finally(() => t.cleanup());
  });
});

describe("posted payloads", () => {
  it("payloads that differ only under a __proto__ key are different (a conflicting re-post is not a duplicate)", () => {
    const a = JSON.parse('{"__proto__": {"x": 1}}') as unknown;
    const b = JSON.parse('{"__proto__": {"x": 2}}') as unknown;
    const session = { id: "s1", observations: new Map([["p", { id: "p", source: "external", kind: "k", at: "", payload: a }]]), terminal: null, pending: [] } as never;
    const again = checkOutsideObservation(session, { id: "p", kind: "k", payload: b }, 10);
    assert.equal(again.ok, false);
    assert.equal(checkOutsideObservation(session, { id: "p", kind: "k", payload: JSON.parse('{"__proto__": {"x": 1}}') as unknown }, 10).ok, true);
  });

  it("Harness.post refuses a payload over the size bound, or nested too deeply, with one sentence", async () => {
    const t = tempDir();
    await withHarness({ storage: createMemoryStorage(), name: "pl", model: { name: "hangs", step: () => new Promise(() => undefined) }, workDir: t.dir, limits: fast }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      await assert.rejects(h.post(s, { id: "big", kind: "k", payload: "x".repeat(MAX_PAYLOAD_SIZE + 1) }), /larger than 65536 characters/);
      await assert.rejects(h.post(s, { id: "deep", kind: "k", payload: nested(50_000) as never }), /nested more than 32 levels/);
      assert.deepEqual(await h.post(s, { id: "fine", kind: "k", payload: { ok: true } }), { duplicate: false });
    }).finally(() => t.cleanup());
  });
});
