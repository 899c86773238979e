/**
 * A scripted model for round loops (bench/rounds.ts and the harness tests): each round it removes
 * every cell and adds one `true` cmd cell, and after `rounds` rounds it concludes with success.
 * An execution left uncertain by a stopped worker (an unresolved UnknownExecution, which
 * `runtime.cells` always shows) is resolved in the next round with a note citing that cell, as an
 * agent would after checking that a `true` cell has nothing to redo; until then success could not be
 * concluded.
 */
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";

export class LoopModel implements Model {
  readonly name = "loop";
  constructor(private readonly rounds: number) {}

  async step(req: ModelRequest): Promise<ModelReply> {
    const s = req.state;
    const ops: unknown[] = [{ op: "test", path: "/revision", value: s.revision }];
    for (let i = s.cells.length - 1; i >= 0; i--) ops.push({ op: "remove", path: `/cells/${i}` });
    let id = s.runtime.next_cell_id;
    for (const [cell, rc] of Object.entries(s.runtime.cells)) {
      if (rc.result !== "UnknownExecution" || rc.resolved_by !== undefined) continue;
      const value = { id: id++, previous_id: null, kind: "note", role: "resolution", target_cell_id: Number(cell), evidence_refs: [`cell:${cell}`], text: "a `true` cell: nothing to redo" };
      ops.push({ op: "add", path: "/cells/-", value });
    }
    ops.push(
      s.runtime.usage.rounds > this.rounds
        ? { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", text: "done", role: "conclusion", result: "success" } }
        : { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv: ["true"] } },
    );
    return { patch: ops, usage: { input_tokens: 1, output_tokens: 1 } };
  }
}
