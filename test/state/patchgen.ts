/**
 * fast-check generators for step patches: op "intents" that are turned into a concrete patch
 * against a given State, so positions and ids are mostly right and sometimes deliberately wrong.
 */
import fc from "fast-check";
import type { State } from "../../src/state/schema.js";
import { script } from "./helpers.js";

export type Kind = "note" | "cmd" | "script" | "badscript" | "noblock";

export type Intent =
  | { t: "add"; kind: Kind; idDelta: number }
  | { t: "replace"; pos: number; kind: Kind; idDelta: number; prevOk: boolean }
  | { t: "remove"; pos: number }
  | { t: "test"; pos: number; ok: boolean }
  | { t: "cancel"; target: number }
  | { t: "resolve"; pick: number; evidence: number; withEvidence: boolean }
  | { t: "conclude"; success: boolean }
  | { t: "garbage"; op: unknown };

const mostly = fc.integer({ min: 0, max: 9 }).map((x) => x > 0);
const idDelta = fc.oneof({ arbitrary: fc.constant(0), weight: 12 }, { arbitrary: fc.integer({ min: -2, max: 2 }), weight: 1 });
const kind = fc.oneof(
  { arbitrary: fc.constantFrom<Kind>("note", "cmd", "script"), weight: 12 },
  { arbitrary: fc.constantFrom<Kind>("badscript", "noblock"), weight: 1 },
);

const garbageOps: unknown[] = [
  { op: "move", from: "/cells/0", path: "/cells/1" },
  { op: "copy", from: "/cells/0", path: "/cells/-" },
  { op: "replace", path: "/goal", value: "new goal" },
  { op: "replace", path: "/runtime/next_cell_id", value: 1 },
  { op: "add", path: "/cells/0/text", value: "x" },
  { op: "test", path: "/cells/__proto__", value: {} },
  { op: "add", path: "/cells/-" },
  { op: "add", path: "/cells/-", value: { id: 1, kind: "note" } },
  { op: "remove", path: "/cells/-1" },
  { op: "replace", path: "/cells/00", value: null },
  "not an op",
  { op: "test", path: "/revision", value: -1 },
];

/** One op intent. */
export const intent: fc.Arbitrary<Intent> = fc.oneof(
  { arbitrary: fc.record({ t: fc.constant("add" as const), kind, idDelta }), weight: 8 },
  { arbitrary: fc.record({ t: fc.constant("replace" as const), pos: fc.nat(8), kind, idDelta, prevOk: mostly }), weight: 3 },
  { arbitrary: fc.record({ t: fc.constant("remove" as const), pos: fc.nat(8) }), weight: 3 },
  { arbitrary: fc.record({ t: fc.constant("test" as const), pos: fc.nat(8), ok: mostly }), weight: 2 },
  { arbitrary: fc.record({ t: fc.constant("cancel" as const), target: fc.nat(12) }), weight: 1 },
  { arbitrary: fc.record({ t: fc.constant("resolve" as const), pick: fc.nat(12), evidence: fc.nat(60), withEvidence: mostly }), weight: 2 },
  { arbitrary: fc.record({ t: fc.constant("conclude" as const), success: fc.boolean() }), weight: 1 },
  { arbitrary: fc.record({ t: fc.constant("garbage" as const), op: fc.constantFrom(...garbageOps) }), weight: 1 },
);

function cellValue(k: Kind, id: number, previous_id: number | null): unknown {
  switch (k) {
    case "note":
      return { id, previous_id, kind: "note", text: `note ${id}` };
    case "cmd":
      return { id, previous_id, kind: "cmd", argv: ["echo", String(id)] };
    case "script":
      return { id, previous_id, kind: "script", source: script(`print(${id})`) };
    case "badscript":
      return { id, previous_id, kind: "script", source: "# /// script\n# dependencies = [\n# ///\n" };
    case "noblock":
      return { id, previous_id, kind: "script", source: "print(1)\n" };
  }
}

/** A position: mostly in range, one time in six (and always for an empty array) just past the end. */
function at(seed: number, length: number): number {
  return length > 0 && seed % 6 !== 0 ? seed % length : length;
}

/** Ids of executions an intent may target (for resolutions), in ascending order. */
export interface Targets {
  readonly unknownIds: readonly number[];
  /** Ids of executable cells ever accepted (cancel targets). */
  readonly executableIds: readonly number[];
  readonly headSeq: number;
}

/**
 * The concrete patch for `intents` against `state`: a revision test (stale when `stale`), then one op
 * per intent, tracking positions and the next id as admission would.
 */
export function buildPatch(state: State, intents: readonly Intent[], targets: Targets, stale = false): unknown[] {
  const cells = state.cells.map((c) => ({ id: c.id }));
  let next = state.runtime.next_cell_id;
  const patch: unknown[] = [{ op: "test", path: "/revision", value: stale ? state.revision - 1 : state.revision }];
  for (const raw of intents) {
    // On an empty array most positional intents become adds, so runs get going.
    const it: Intent = cells.length === 0 && (raw.t === "replace" || raw.t === "remove" || raw.t === "test") && raw.pos % 4 !== 0 ? { t: "add", kind: "cmd", idDelta: 0 } : raw;
    switch (it.t) {
      case "add": {
        const id = next + it.idDelta;
        patch.push({ op: "add", path: "/cells/-", value: cellValue(it.kind, id, null) });
        cells.push({ id });
        next += 1;
        break;
      }
      case "replace": {
        const pos = at(it.pos, cells.length);
        const id = next + it.idDelta;
        const prev = cells[pos]?.id ?? 1;
        patch.push({ op: "replace", path: `/cells/${pos}`, value: cellValue(it.kind, id, it.prevOk ? prev : prev + 1) });
        if (pos < cells.length) cells[pos] = { id };
        next += 1;
        break;
      }
      case "remove": {
        const pos = at(it.pos, cells.length);
        patch.push({ op: "remove", path: `/cells/${pos}` });
        if (pos < cells.length) cells.splice(pos, 1);
        break;
      }
      case "test": {
        const pos = at(it.pos, cells.length);
        const id = cells[pos]?.id ?? 0;
        patch.push({ op: "test", path: `/cells/${pos}/id`, value: it.ok ? id : id + 1 });
        break;
      }
      case "cancel": {
        const ids = targets.executableIds;
        const target = ids.length > 0 && it.target % 5 !== 0 ? ids[it.target % ids.length]! : 1 + (it.target % Math.max(1, next));
        patch.push({ op: "add", path: "/cells/-", value: { id: next, previous_id: null, kind: "note", text: "stop", role: "cancel", target_cell_id: target } });
        cells.push({ id: next });
        next += 1;
        break;
      }
      case "resolve": {
        const ids = targets.unknownIds;
        if (ids.length === 0 && it.pick % 4 !== 0) {
          patch.push({ op: "add", path: "/cells/-", value: { id: next, previous_id: null, kind: "note", text: "nothing to resolve" } });
          cells.push({ id: next });
          next += 1;
          break;
        }
        const target = ids.length > 0 && it.pick % 4 !== 0 ? ids[it.pick % ids.length]! : 1 + (it.pick % Math.max(1, next));
        const seq = 1 + (it.evidence % Math.max(1, targets.headSeq + 2));
        const value: Record<string, unknown> = { id: next, previous_id: null, kind: "note", text: "checked", role: "resolution", target_cell_id: target };
        if (it.withEvidence) value["evidence_refs"] = [`event:${seq}`];
        patch.push({ op: "add", path: "/cells/-", value });
        cells.push({ id: next });
        next += 1;
        break;
      }
      case "conclude":
        patch.push({ op: "add", path: "/cells/-", value: { id: next, previous_id: null, kind: "note", text: "done", role: "conclusion", result: it.success ? "success" : "failure" } });
        cells.push({ id: next });
        next += 1;
        break;
      case "garbage":
        patch.push(it.op);
        break;
    }
  }
  return patch;
}
