/**
 * The nemesis workload's model (policy.ts): a run whose conclusion is refused because observations
 * arrived after its round was prepared waits a round instead of sending the same conclusion again
 * (which would be refused every attempt and end the run in failure, as a run of a 20-minute nemesis
 * with seed 71226 did before).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { initialState, type State } from "../../src/state/schema.js";
import { PolicyModel, decide, planGoal } from "./policy.js";

/** A run of one planned `cmd` cell that finished, with cell 2 (a cmd) ended as an unresolved UnknownExecution. */
function doneState(): State {
  const base = initialState("s1", planGoal({ req: "r1", cells: 2, long: 0, timer: false }));
  const argv = ["sh", "-c", "true"];
  return {
    ...base,
    revision: 4,
    cells: [
      { id: 1, previous_id: null, kind: "cmd", argv },
      { id: 2, previous_id: null, kind: "cmd", argv },
    ],
    runtime: {
      ...base.runtime,
      next_cell_id: 3,
      cells: {
        "1": { phase: "finished", result: "success", exit_code: 0 },
        "2": { phase: "finished", result: "UnknownExecution", unknown: { type: "UnknownExecution", cell_id: 2, reason: "worker stopped", worker_stopped: true, evidence_refs: ["event:19"] } },
      },
    },
  } as State;
}

const values = (patch: unknown[]) => patch.slice(1).map((op) => (op as { value: Record<string, unknown> }).value);

describe("the nemesis policy", () => {
  it("resolves the uncertain cell and concludes success once every planned cell is handled", () => {
    const cells = values(decide(doneState(), "/dev/null", null, 1500));
    assert.deepEqual(cells.map((c) => c["role"]), ["resolution", "conclusion"]);
    assert.equal(cells[1]!["result"], "success");
  });

  it("after its conclusion was refused as blocked, resolves the same cell and waits a round instead of concluding again", async () => {
    const model = new PolicyModel("/dev/null", null, 1500);
    const first = values((await model.step({ state: doneState(), turn: "s1:t5", attempt: 1 })).patch as unknown[]);
    assert.equal(first.at(-1)!["role"], "conclusion");
    const again = values(
      (await model.step({ state: doneState(), turn: "s1:t5", attempt: 2, rejection: { code: "conclusion_blocked", reason: "2 unread observations (they arrive next round)", patch: [] } })).patch as unknown[],
    );
    assert.deepEqual(again.map((c) => c["role"]), ["resolution", undefined], "the resolution stays, the conclusion becomes a plain note");
    assert.equal(again[1]!["kind"], "note");
    const other = values((await model.step({ state: doneState(), turn: "s1:t5", attempt: 2, rejection: { code: "stale_revision", reason: "x", patch: [] } })).patch as unknown[]);
    assert.equal(other.at(-1)!["role"], "conclusion", "another refusal changes nothing");
  });
});
