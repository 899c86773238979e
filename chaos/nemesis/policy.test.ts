/**
 * The nemesis workload's model (policy.ts): an UnknownExecution is resolved and its effect made again
 * by a new cell (which asks the ledger first), at most MAX_TRIES cells per effect; a run whose
 * conclusion is refused because observations arrived after its round was prepared waits a round
 * instead of sending the same conclusion again (which would be refused every attempt and end the run
 * in failure, as a run of a 20-minute nemesis with seed 71226 did before).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { initialState, type RuntimeCell, type State } from "../../src/state/schema.js";
import { cellArgv, effectOf, MAX_TRIES, PolicyModel, decide, planGoal } from "./policy.js";

const unknown = (cell: number): RuntimeCell => ({
  phase: "finished",
  result: "UnknownExecution",
  unknown: { type: "UnknownExecution", cell_id: cell, reason: "worker stopped", worker_stopped: true, evidence_refs: [`event:${cell * 10}`] },
});
const success: RuntimeCell = { phase: "finished", result: "success", exit_code: 0 };

/** A run of two planned effects whose cells are `cells` (effect, runtime), with ids from 1. */
function stateOf(cells: [string, RuntimeCell][], revision = 4): State {
  const base = initialState("s1", planGoal({ req: "r1", cells: 2, long: 0, timer: false }));
  return {
    ...base,
    revision,
    cells: cells.map(([effect], i) => ({ id: i + 1, previous_id: null, kind: "cmd", argv: cellArgv("/dev/null", null, "plain", 1500, effect) })),
    runtime: { ...base.runtime, next_cell_id: cells.length + 1, cells: Object.fromEntries(cells.map(([, rc], i) => [String(i + 1), rc])) },
  } as State;
}

const values = (patch: unknown[]) => patch.slice(1).map((op) => (op as { value: Record<string, unknown> }).value);

describe("the nemesis policy", () => {
  it("a cell's script asks the ledger for its effect, which the policy reads back", () => {
    const argv = cellArgv("/tmp/f", "'node' 'cli.mjs'", "timer", 1500, "e3");
    assert.equal(effectOf(argv), "e3");
    assert.match(argv[2]!, /'node' 'cli\.mjs' timer --id t\$CAIRN_CELL/);
    assert.match(argv[2]!, /effect begin e3 >\/dev\/null; rc=\$\?/);
    assert.match(argv[2]!, /effect begin e3 --retry/);
  });

  it("resolves an uncertain cell and makes its effect again with a new cell, up to MAX_TRIES cells; then moves on", () => {
    const again = values(decide(stateOf([["e1", success], ["e2", unknown(2)]]), "/dev/null", null, 1500));
    assert.deepEqual(again.map((c) => c["role"] ?? c["kind"]), ["resolution", "cmd"]);
    assert.equal(effectOf(again[1]!["argv"] as string[]), "e2");
    const cells: [string, RuntimeCell][] = [["e1", success], ...Array.from({ length: MAX_TRIES }, (_, i): [string, RuntimeCell] => ["e2", { ...unknown(i + 2), resolved_by: 99 }])];
    const moved = values(decide(stateOf(cells), "/dev/null", null, 1500));
    assert.deepEqual(moved.map((c) => c["role"]), ["conclusion"], "e2 was tried MAX_TRIES times and it was the last effect");
  });

  it("after its conclusion was refused as blocked, resolves the same cell and waits a round instead of concluding again", async () => {
    const state = stateOf([["e1", success], ["e2", unknown(2)], ["e2", success]]);
    const model = new PolicyModel("/dev/null", null, 1500);
    const first = values((await model.step({ state, turn: "s1:t5", attempt: 1 })).patch as unknown[]);
    assert.deepEqual(first.map((c) => c["role"]), ["resolution", "conclusion"]);
    assert.equal(first[1]!["result"], "success");
    const again = values((await model.step({ state, turn: "s1:t5", attempt: 2, rejection: { code: "conclusion_blocked", reason: "2 unread observations (they arrive next round)", patch: [] } })).patch as unknown[]);
    assert.deepEqual(again.map((c) => c["role"]), ["resolution", undefined], "the resolution stays, the conclusion becomes a plain note");
    assert.equal(again[1]!["kind"], "note");
    const other = values((await model.step({ state, turn: "s1:t5", attempt: 2, rejection: { code: "stale_revision", reason: "x", patch: [] } })).patch as unknown[]);
    assert.equal(other.at(-1)!["role"], "conclusion", "another refusal changes nothing");
  });
});
