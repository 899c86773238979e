import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { Admission, AdmissionContext, RejectionCode } from "../../src/state/admission.js";
import { admit } from "../../src/state/admission.js";
import { applyAccepted } from "../../src/state/apply.js";
import type { Cell } from "../../src/state/schema.js";
import { State } from "../../src/state/schema.js";
import { cmd, deepFreeze, execution, makeCtx, note, observation, rev, script, scriptCell } from "./helpers.js";

/** Admits with deep-frozen inputs and proves they are unchanged afterwards. */
function run(ctx: AdmissionContext, patch: unknown, round = "s1:t1"): Admission {
  const before = JSON.stringify(snapshot(ctx, patch));
  deepFreeze(ctx);
  deepFreeze(patch);
  const out = admit(ctx, patch, round);
  assert.equal(JSON.stringify(snapshot(ctx, patch)), before, "admit changed its inputs");
  return out;
}

function snapshot(ctx: AdmissionContext, patch: unknown): unknown {
  return { state: ctx.state, ex: [...ctx.executions], ever: [...ctx.cellsEver], acc: [...ctx.accepted], p: patch === undefined ? null : patch };
}

function rejects(out: Admission, code: RejectionCode, ...mentions: (string | RegExp)[]): string {
  assert.equal(out.ok, false, `expected rejection ${code}, got acceptance`);
  if (out.ok) throw new Error("unreachable");
  assert.equal(out.code, code, `expected ${code}, got ${out.code}: ${out.reason}`);
  for (const m of mentions) {
    if (typeof m === "string") assert.ok(out.reason.includes(m), `reason should mention ${JSON.stringify(m)}: ${out.reason}`);
    else assert.match(out.reason, m);
  }
  return out.reason;
}

function accepts(out: Admission) {
  if (!out.ok) assert.fail(`expected acceptance, got ${out.code}: ${out.reason}`);
  State.parse(out.receipt.state);
  return out.receipt;
}

const twoCells = (): Cell[] => [note(1, "Inspect app/routes.py"), cmd(2, ["pytest", "-q"])];

describe("admit: the doc example and effects", () => {
  test("replacing cell 1 by cell 3 leaves cells [3, 2] (rio-durable.md)", () => {
    const ctx = makeCtx({ cells: twoCells(), revision: 12, executions: [execution(2, "finished")] });
    const patch = [
      rev(12),
      { op: "test", path: "/cells/0/id", value: 1 },
      { op: "replace", path: "/cells/0", value: { id: 3, previous_id: 1, kind: "note", text: "Check the route and its tests" } },
    ];
    const r = accepts(run(ctx, patch));
    assert.deepEqual(
      r.state.cells.map((c) => c.id),
      [3, 2],
    );
    assert.equal(r.state.cells[0]!.previous_id, 1);
    assert.equal(r.revision, 13);
    assert.equal(r.state.runtime.next_cell_id, 4);
    assert.deepEqual(
      r.newCells.map((c) => c.id),
      [3],
    );
    assert.deepEqual(r.removedIds, []);
    assert.equal(r.replay, false);
  });

  test("success consumes the inbox, advances ids, queues executable cells and reports removals", () => {
    const ctx = makeCtx({ cells: twoCells(), revision: 4, inbox: [observation("o1"), observation("o2")], executions: [execution(2, "finished")] });
    const patch = [rev(4), { op: "remove", path: "/cells/0" }, { op: "add", path: "/cells/-", value: scriptCell(3) }, { op: "add", path: "/cells/-", value: cmd(4, ["ls"]) }];
    const r = accepts(run(ctx, patch));
    assert.equal(r.state.revision, 5);
    assert.deepEqual(r.consumed, ["o1", "o2"]);
    assert.deepEqual(r.state.runtime.inbox, []);
    assert.equal(r.state.runtime.next_cell_id, 5);
    assert.deepEqual(r.removedIds, [1]);
    assert.deepEqual(
      r.state.cells.map((c) => c.id),
      [2, 3, 4],
    );
    assert.deepEqual(r.state.runtime.cells["3"], { phase: "queued" });
    assert.deepEqual(r.state.runtime.cells["4"], { phase: "queued" });
    assert.equal(r.state.runtime.cells["2"]?.phase, "finished");
  });

  test("a patch of only the revision test is accepted and consumes the inbox", () => {
    const ctx = makeCtx({ revision: 0, inbox: [observation("o1")] });
    const r = accepts(run(ctx, [rev(0)]));
    assert.equal(r.revision, 1);
    assert.deepEqual(r.consumed, ["o1"]);
  });

  test("the returned State shares nothing with the patch", () => {
    const ctx = makeCtx({ revision: 0 });
    const value = { id: 1, previous_id: null, kind: "cmd", argv: ["ls"] };
    const r = accepts(admit(ctx, [rev(0), { op: "add", path: "/cells/-", value }], "r"));
    value.argv.push("mutated-after");
    assert.deepEqual((r.state.cells[0] as { argv: string[] }).argv, ["ls"]);
  });

  test("admit's State equals applyAccepted's on the same inputs", () => {
    const ctx = makeCtx({ cells: twoCells(), revision: 12, inbox: [observation("o")] });
    const patch = [rev(12), { op: "add", path: "/cells/-", value: cmd(3) }];
    const r = accepts(run(ctx, patch));
    const folded = applyAccepted(ctx.state, ctx.executions, patch, ["o"]);
    assert.deepEqual(folded.state, r.state);
  });
});

describe("admit: patch shape", () => {
  for (const [label, patch] of [
    ["an object", { op: "test" }],
    ["an empty array", []],
    ["null", null],
  ] as const) {
    test(`refuses ${label}: invalid_patch`, () => {
      rejects(run(makeCtx(), patch), "invalid_patch", "non-empty JSON array");
    });
  }
  test("refuses an unknown op field", () => {
    rejects(run(makeCtx(), [{ ...rev(12), from: "/x" }]), "invalid_patch", "op 0", 'Unrecognized key: "from"');
  });
  test("refuses an op without value", () => {
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-" }]), "invalid_patch", "op 1", "value");
  });
  test("refuses an unknown op name", () => {
    rejects(run(makeCtx(), [rev(12), { op: "merge", path: "/cells/-", value: 1 }]), "invalid_patch", "op 1", '"merge"');
  });
  test("refuses non-JSON values", () => {
    rejects(run(makeCtx(), [rev(12), { op: "test", path: "/goal", value: Number.NaN }]), "invalid_patch", "plain JSON");
  });
  test("refuses a path that is not a JSON pointer", () => {
    rejects(run(makeCtx(), [rev(12), { op: "test", path: "cells/0", value: 1 }]), "invalid_patch", '"cells/0"', "JSON pointer");
    rejects(run(makeCtx(), [rev(12), { op: "test", path: "/goal~2", value: 1 }]), "invalid_patch", "~0");
  });
  test("move and copy: forbidden_op", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "move", from: "/cells/0", path: "/cells/1" }]), "forbidden_op", '"move"', "op 1");
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "copy", from: "/cells/0", path: "/cells/-" }]), "forbidden_op", '"copy"');
  });
});

describe("admit: revision", () => {
  test("the first op must be the revision test", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [{ op: "add", path: "/cells/-", value: note(3) }]), "revision", '{"op":"test","path":"/revision","value":12}', "current revision is 12");
  });
  test("a stale revision names the current one", () => {
    rejects(run(makeCtx({ revision: 12 }), [rev(11)]), "revision", "written for revision 11", "current revision is 12");
  });
});

describe("admit: test ops", () => {
  test("a failing test names the path, the expected and the actual value", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "test", path: "/cells/0/id", value: 2 }]), "test_failed", "/cells/0/id", "expected 2", "found 1");
  });
  test("tests run in order against the working copy", () => {
    const ctx = makeCtx({ cells: twoCells() });
    const patch = [rev(12), { op: "remove", path: "/cells/0" }, { op: "test", path: "/cells/0/id", value: 2 }];
    accepts(run(ctx, patch));
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "remove", path: "/cells/0" }, { op: "test", path: "/cells/0/id", value: 1 }]), "test_failed", "expected 1", "found 2");
  });
  test("a path that does not resolve fails the test", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "test", path: "/cells/5/id", value: 1 }]), "test_failed", "/cells/5 does not exist", "2 cells");
  });
  test("test compares JSON key-order-insensitively", () => {
    const ctx = makeCtx({ cells: twoCells() });
    accepts(run(ctx, [rev(12), { op: "test", path: "/cells/0", value: { text: "Inspect app/routes.py", kind: "note", previous_id: null, id: 1 } }]));
  });
});

describe("admit: paths", () => {
  for (const path of ["/cells/__proto__", "/__proto__/x", "/cells/0/constructor", "/prototype", "/cells/0~1__proto__"]) {
    test(`${path}: forbidden_path`, () => {
      rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "test", path, value: 1 }]), "forbidden_path", "never allowed");
    });
  }
  for (const top of ["goal", "runtime", "revision", "schema", "id"]) {
    test(`/${top} cannot be patched`, () => {
      rejects(run(makeCtx(), [rev(12), { op: "replace", path: `/${top}`, value: "x" }]), "forbidden_path", `/${top} belongs to the harness`, "only whole cells are patchable");
    });
  }
  test("/runtime/next_cell_id cannot be patched", () => {
    rejects(run(makeCtx(), [rev(12), { op: "replace", path: "/runtime/next_cell_id", value: 99 }]), "forbidden_path", "/runtime belongs to the harness");
  });
  test("a path inside a cell says to replace the whole cell", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "replace", path: "/cells/1/argv", value: ["ls"] }]), "forbidden_path", "inside cell 2", "replace the whole cell at /cells/1", '"previous_id":2');
  });
  test("add only appends", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "add", path: "/cells/0", value: note(3) }]), "forbidden_path", "use /cells/-");
  });
  test("replace and remove need a position", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "remove", path: "/cells/-" }]), "forbidden_path", "needs a position");
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "remove", path: "/cells" }]), "forbidden_path", "whole /cells array");
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "remove", path: "/cells/01" }]), "forbidden_path", '"01" is not a position', "0 to 1");
  });
  test("positions are checked against the working copy", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "remove", path: "/cells/2" }]), "forbidden_path", "out of range", "0 to 1");
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "remove", path: "/cells/1" }, { op: "replace", path: "/cells/1", value: note(3, "x", {}, 2) }]), "forbidden_path", "out of range", "0 to 0");
  });
});

describe("admit: new cells", () => {
  test("cells are validated strictly: invalid_cell", () => {
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: { ...note(1), color: "red" } }]), "invalid_cell", 'Unrecognized key: "color"');
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "shell", cmd: "ls" } }]), "invalid_cell", "kind");
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: [] } }]), "invalid_cell", "argv");
  });
  test("ids are consecutive from next_cell_id: cell_id", () => {
    rejects(run(makeCtx({ cells: twoCells(), nextId: 5 }), [rev(12), { op: "add", path: "/cells/-", value: note(7) }]), "cell_id", "the next cell id is 5; op 1 used 7");
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "add", path: "/cells/-", value: note(3) }, { op: "add", path: "/cells/-", value: note(3) }]), "cell_id", "the next cell id is 4", "used 3", "never reused");
  });
  test("add needs previous_id null", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "add", path: "/cells/-", value: note(3, "x", {}, 1) }]), "previous_id", "previous_id must be null");
  });
  test("replace needs previous_id of the cell at that position", () => {
    const cells = [note(3), note(5), note(7)];
    rejects(run(makeCtx({ cells, nextId: 8 }), [rev(12), { op: "replace", path: "/cells/2", value: note(8, "y", {}, 2) }]), "previous_id", "/cells/2 is a position; it holds cell 7, so previous_id must be 7");
    accepts(run(makeCtx({ cells, nextId: 8 }), [rev(12), { op: "replace", path: "/cells/2", value: note(8, "y", {}, 7) }]));
  });
  for (const phase of ["queued", "started"] as const) {
    test(`a ${phase} cell cannot be replaced but can be removed`, () => {
      const init = { cells: twoCells(), executions: [execution(2, phase)] };
      rejects(run(makeCtx(init), [rev(12), { op: "replace", path: "/cells/1", value: cmd(3, ["ls"], 2) }]), "busy_cell", `cell 2`, phase, "removal never cancels", '"role":"cancel"', '"target_cell_id":2');
      const r = accepts(run(makeCtx(init), [rev(12), { op: "remove", path: "/cells/1" }]));
      assert.equal(r.state.runtime.cells["2"]?.phase, phase, "removal never cancels: the execution stays visible");
    });
  }
  test("a cell added earlier in the patch is queued, so it cannot be replaced", () => {
    rejects(run(makeCtx({ cells: twoCells() }), [rev(12), { op: "add", path: "/cells/-", value: cmd(3) }, { op: "replace", path: "/cells/2", value: cmd(4, ["x"], 3) }]), "busy_cell", "cell 3", "queued");
  });
  test("removals go in descending position order", () => {
    const cells = [note(1), note(2), note(3)];
    rejects(run(makeCtx({ cells }), [rev(12), { op: "remove", path: "/cells/0" }, { op: "remove", path: "/cells/1" }]), "removal_order", "descending", "/cells/0", "/cells/1");
    const r = accepts(run(makeCtx({ cells }), [rev(12), { op: "remove", path: "/cells/2" }, { op: "remove", path: "/cells/0" }]));
    assert.deepEqual(r.removedIds, [3, 1]);
    assert.deepEqual(
      r.state.cells.map((c) => c.id),
      [2],
    );
  });
});

describe("admit: scripts need PEP 723", () => {
  test("a malformed block is refused with the parse problem", () => {
    const bad = "# /// script\n# requires-python = >=3.11\n# ///\nprint(1)\n";
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: scriptCell(1, bad) }]), "pep723", "script cell 1", "not valid TOML", "line 2");
  });
  test("an unclosed block is refused", () => {
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: scriptCell(1, "# /// script\n# dependencies = []\nprint(1)\n") }]), "pep723", "never closed");
  });
  test("a script without a block is refused, asking for requires-python", () => {
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: scriptCell(1, "print(1)\n") }]), "pep723", "# /// script", "requires-python", "uv run --script");
  });
  test("a valid script is accepted", () => {
    accepts(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: scriptCell(1, script("import sys")) }]));
  });
});

describe("admit: role notes", () => {
  const add = (cell: Cell) => ({ op: "add", path: "/cells/-", value: cell });
  test("cancel needs an executable target that exists", () => {
    const ctx = () => makeCtx({ cells: twoCells(), executions: [execution(2, "started")] });
    rejects(run(ctx(), [rev(12), add(note(3, "stop", { role: "cancel" }))]), "role", '"cancel"', "target_cell_id");
    rejects(run(ctx(), [rev(12), add(note(3, "stop", { role: "cancel", target_cell_id: 1 }))]), "role", "cell 1", "note");
    rejects(run(ctx(), [rev(12), add(note(3, "stop", { role: "cancel", target_cell_id: 9 }))]), "role", "cell 9", "does not exist");
    accepts(run(ctx(), [rev(12), add(note(3, "stop", { role: "cancel", target_cell_id: 2 }))]));
  });
  test("cancel may target a removed cell or one created earlier in the patch", () => {
    accepts(run(makeCtx({ removed: [cmd(1)], executions: [execution(1, "started")] }), [rev(12), add(note(2, "stop", { role: "cancel", target_cell_id: 1 }))]));
    accepts(run(makeCtx(), [rev(12), add(cmd(1)), add(note(2, "stop", { role: "cancel", target_cell_id: 1 }))]));
  });
  test("resolution needs an unresolved UnknownExecution and real evidence", () => {
    const ctx = () => makeCtx({ cells: [cmd(1), cmd(2), note(3)], executions: [execution(1, "finished", "UnknownExecution"), execution(2, "finished", "success")], headSeq: 40 });
    const res = (extra: Partial<Cell>) => add(note(4, "checked the file", { role: "resolution", ...extra }));
    rejects(run(ctx(), [rev(12), res({ evidence_refs: ["event:3"] })]), "role", "target_cell_id");
    rejects(run(ctx(), [rev(12), res({ target_cell_id: 2, evidence_refs: ["event:3"] })]), "role", "cell 2 finished with result success", "UnknownExecution");
    rejects(run(ctx(), [rev(12), res({ target_cell_id: 1 })]), "role", "without evidence", "evidence_refs");
    rejects(run(ctx(), [rev(12), res({ target_cell_id: 1, evidence_refs: [] })]), "role", "without evidence");
    rejects(run(ctx(), [rev(12), res({ target_cell_id: 1, evidence_refs: ["event:41"] })]), "role", "event:41", "ends at event 40");
    rejects(run(ctx(), [rev(12), res({ target_cell_id: 1, evidence_refs: ["event:0"] })]), "role", '"event:0"');
    rejects(run(ctx(), [rev(12), res({ target_cell_id: 1, evidence_refs: ["cell:99"] })]), "role", "cell 99 does not exist");
    rejects(run(ctx(), [rev(12), res({ target_cell_id: 1, evidence_refs: ["session:event:3"] })]), "role", '"session:event:3"', "event:<seq>");
    const r = accepts(run(ctx(), [rev(12), res({ target_cell_id: 1, evidence_refs: ["event:40", "cell:3"] })]));
    assert.equal(r.state.runtime.cells["1"]?.resolved_by, 4);
  });
  test("an UnknownExecution cannot be resolved twice", () => {
    const ctx = makeCtx({ cells: [cmd(1)], executions: [execution(1, "finished", "UnknownExecution", { resolved_by: 2 })], removed: [note(2)] });
    rejects(run(ctx, [rev(12), add(note(3, "again", { role: "resolution", target_cell_id: 1, evidence_refs: ["event:1"] }))]), "role", "note 2 already resolved");
  });
  test("conclusion needs a result", () => {
    rejects(run(makeCtx(), [rev(12), add(note(1, "done", { role: "conclusion" }))]), "role", '"conclusion"', '"result"');
    accepts(run(makeCtx(), [rev(12), add(note(1, "gave up", { role: "conclusion", result: "failure" }))]));
  });
  test("role-only fields without their role are refused", () => {
    rejects(run(makeCtx({ cells: [cmd(1)] }), [rev(12), add(note(2, "x", { target_cell_id: 1 }))]), "role", "no role", '"target_cell_id"');
    rejects(run(makeCtx(), [rev(12), add(note(1, "x", { result: "success" }))]), "role", '"result" belongs to role "conclusion"');
    rejects(run(makeCtx({ cells: [cmd(1)] }), [rev(12), add(note(2, "x", { role: "cancel", target_cell_id: 1, evidence_refs: ["event:1"] }))]), "role", 'role "cancel"', '"evidence_refs" belongs to role "resolution"');
  });
});

describe("admit: success conclusions", () => {
  const done = (id: number) => ({ op: "add", path: "/cells/-", value: note(id, "all tests pass", { role: "conclusion", result: "success" }) });
  test("blocked by queued, started and unresolved work, and unread observations, naming each", () => {
    const ctx = makeCtx({
      cells: [cmd(1), cmd(2), cmd(3), cmd(4)],
      executions: [execution(1, "queued"), execution(2, "started"), execution(3, "finished", "UnknownExecution"), execution(4, "finished")],
      pending: 2,
    });
    rejects(run(ctx, [rev(12), done(5)]), "conclusion_blocked", "cell 1 still queued", "cell 2 still running", "cell 3 with an unresolved UnknownExecution", "2 unread observations");
  });
  test("blocked by an executable cell this same patch adds", () => {
    rejects(run(makeCtx(), [rev(12), { op: "add", path: "/cells/-", value: cmd(1) }, done(2)]), "conclusion_blocked", "cell 1 still queued");
  });
  test("a resolution in the same patch counts; with nothing pending success is accepted", () => {
    const ctx = makeCtx({ cells: [cmd(1)], executions: [execution(1, "finished", "UnknownExecution")] });
    rejects(run(ctx, [rev(12), done(2)]), "conclusion_blocked", "cell 1 with an unresolved UnknownExecution");
    const resolve = { op: "add", path: "/cells/-", value: note(2, "file is fixed", { role: "resolution", target_cell_id: 1, evidence_refs: ["event:5"] }) };
    const r = accepts(run(makeCtx({ cells: [cmd(1)], executions: [execution(1, "finished", "UnknownExecution")] }), [rev(12), resolve, done(3)]));
    assert.equal(r.state.runtime.cells["1"]?.resolved_by, 2);
  });
  test("a removed cell's pending work still blocks", () => {
    const ctx = makeCtx({ removed: [cmd(1)], executions: [execution(1, "started")] });
    rejects(run(ctx, [rev(12), done(2)]), "conclusion_blocked", "cell 1 still running");
  });
});

describe("admit: round identity", () => {
  test("the same patch again is a replay with the original receipt", () => {
    const patch = [rev(12), { op: "add", path: "/cells/-", value: note(3, "x") }];
    const first = accepts(run(makeCtx({ cells: twoCells() }), patch, "s1:t7"));
    const ctx = makeCtx({
      cells: first.state.cells as Cell[],
      revision: 13,
      accepted: new Map([["s1:t7", { patch, revision: 13, newCellIds: [3], removedIds: [], consumed: ["o1"] }]]),
    });
    // Same patch, keys in another order.
    const again = [{ value: 12, path: "/revision", op: "test" }, { value: { text: "x", kind: "note", previous_id: null, id: 3 }, op: "add", path: "/cells/-" }];
    const r = accepts(run(ctx, again, "s1:t7"));
    assert.equal(r.replay, true);
    assert.equal(r.revision, 13);
    assert.equal(r.state, ctx.state);
    assert.deepEqual(r.newCells, [note(3, "x")]);
    assert.deepEqual(r.consumed, ["o1"]);
  });
  test("a different patch for an accepted round is refused", () => {
    const patch = [rev(12), { op: "add", path: "/cells/-", value: note(3, "x") }];
    const ctx = makeCtx({ cells: [...twoCells(), note(3, "x")], revision: 13, accepted: new Map([["s1:t7", { patch, revision: 13, newCellIds: [3] }]]) });
    rejects(run(ctx, [rev(13), { op: "add", path: "/cells/-", value: note(4, "y") }], "s1:t7"), "round_conflict", "round s1:t7", "already accepted", "revision 13");
    rejects(run(ctx, "garbage", "s1:t7"), "round_conflict");
  });
});

describe("patch size", () => {
  test("refuses more than MAX_PATCH_OPS operations, so one accepted patch always fits one commit", async () => {
    const { admit, MAX_PATCH_OPS } = await import("../../src/state/admission.js");
    const { initialState } = await import("../../src/state/schema.js");
    const state = initialState("s1", "g");
    const ops = [{ op: "test", path: "/revision", value: 0 }, ...Array.from({ length: MAX_PATCH_OPS }, (_, i) => ({ op: "add", path: "/cells/-", value: { id: i + 1, previous_id: null, kind: "note", text: "n" } }))];
    const r = admit({ state, executions: new Map(), cellsEver: new Map(), pendingObservations: 0, headSeq: 0, accepted: new Map() }, ops, "s1:t1");
    assert.equal(r.ok, false);
    assert.equal(!r.ok && r.code, "invalid_patch");
    assert.match(!r.ok ? r.reason : "", /at most 100 are accepted in one step/);
    const fits = admit({ state, executions: new Map(), cellsEver: new Map(), pendingObservations: 0, headSeq: 0, accepted: new Map() }, ops.slice(0, MAX_PATCH_OPS), "s1:t1");
    assert.equal(fits.ok, true);
  });
});
