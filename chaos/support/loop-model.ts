/**
 * A scripted model for round loops (bench/rounds.ts and the harness tests): each round it removes
 * every cell and adds one `true` cmd cell, and after `rounds` rounds it concludes with success.
 */
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";

export class LoopModel implements Model {
  readonly name = "loop";
  constructor(private readonly rounds: number) {}

  async step(req: ModelRequest): Promise<ModelReply> {
    const s = req.state;
    const ops: unknown[] = [{ op: "test", path: "/revision", value: s.revision }];
    for (let i = s.cells.length - 1; i >= 0; i--) ops.push({ op: "remove", path: `/cells/${i}` });
    const id = s.runtime.next_cell_id;
    ops.push(
      s.runtime.usage.rounds > this.rounds
        ? { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", text: "done", role: "conclusion", result: "success" } }
        : { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "cmd", argv: ["true"] } },
    );
    return { patch: ops, usage: { input_tokens: 1, output_tokens: 1 } };
  }
}
