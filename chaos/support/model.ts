/**
 * In-process models for the chaos suite. `PolicyModel` decides from the State it is shown (stateless,
 * as the Model contract requires) and records every call, so a test can count provider calls per turn.
 */
import { ModelError, type Model, type ModelReply, type ModelRequest } from "../../src/model/contract.js";
import { cmdPatch, concludePatch, resolvePatch } from "./patches.js";

/** One recorded call. */
export interface Call {
  readonly turn: string;
  readonly attempt: number;
  readonly revision: number;
}

/**
 * Revision 0: add cmd cell 1 running `argv`. Revision 1: if cell 1 is an UnknownExecution, resolve it
 * citing the evidence the harness recorded (as shown in `runtime.cells["1"].unknown`) and conclude
 * success; otherwise conclude success. Past that: a not-retryable error (the test is wrong).
 */
export class PolicyModel implements Model {
  readonly name = "chaos-policy";
  readonly calls: Call[] = [];

  constructor(private readonly argv: readonly string[]) {}

  /** Calls made for `turn`. */
  callsFor(turn: string): number {
    return this.calls.filter((c) => c.turn === turn).length;
  }

  async step(req: ModelRequest): Promise<ModelReply> {
    const revision = req.state.revision;
    this.calls.push({ turn: req.turn, attempt: req.attempt, revision });
    if (revision === 0) return { patch: cmdPatch(0, 1, this.argv), usage: null };
    if (revision === 1) {
      const cell = req.state.runtime.cells["1"];
      if (cell?.result === "UnknownExecution" && cell.unknown !== undefined) {
        const conclude = { id: 3, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "resolved and done" };
        return { patch: resolvePatch(1, 2, 1, cell.unknown.evidence_refs, [conclude]), usage: null };
      }
      return { patch: concludePatch(1, 2, "success", "done"), usage: null };
    }
    throw new ModelError("config", `chaos policy has no answer for revision ${revision}`, { retryable: false });
  }
}
