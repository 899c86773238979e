/**
 * Helpers for the hostile-input tests: a model driven by a function of the round, and a deeply nested value.
 */
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";

/** A model whose reply is `decide(request, call number)`; every request is recorded. */
export function modelOf(decide: (req: ModelRequest, call: number) => unknown): Model & { calls: ModelRequest[] } {
  const calls: ModelRequest[] = [];
  return {
    name: "hostile",
    calls,
    async step(req: ModelRequest): Promise<ModelReply> {
      calls.push(req);
      return { patch: decide(req, calls.length), usage: { input_tokens: 1, output_tokens: 1 } };
    },
  };
}

/** `[[[...]]]` nested `depth` levels, built without recursion. */
export function nested(depth: number): unknown {
  let v: unknown = "core";
  for (let i = 0; i < depth; i++) v = i % 2 === 0 ? [v] : { k: v };
  return v;
}

/** The revision test op every patch starts with. */
export const rev = (n: number) => ({ op: "test", path: "/revision", value: n });
export const addCell = (value: Record<string, unknown>) => ({ op: "add", path: "/cells/-", value });
