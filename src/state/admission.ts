/**
 * step admission: the only way the model changes State (ARCHITECTURE.md section 3).
 *
 * `admit` validates the model's RFC 6902 patch against the admission context and, when every rule
 * holds, returns the State it produces; otherwise it returns one rejection: a stable `code` and a
 * `reason` written for the model (what was wrong and what would be right). It is pure and atomic: it
 * never mutates its inputs, and a rejected patch changes nothing. `applyAccepted` (apply.ts) is the
 * one function that folds an accepted patch into State; `admit` calls it for its final step and the
 * reducer calls it for `patch_accepted`, so both produce exactly the same State.
 *
 * Pure: no I/O, no clock.
 */
import { z } from "zod";
import { ARRAY_INDEX, boundText, canonicalEqual, describeJson, isJsonValue, jsonBounds, MAX_JSON_DEPTH, parsePointer, resolvePointer } from "./canonical.js";
import { applyAccepted } from "./apply.js";
import { argvProblem } from "./argv.js";
import { parsePep723 } from "./pep723.js";
import type { ExecutionRecord } from "./projection.js";
import { isUnresolvedUnknown } from "./projection.js";
import type { NoteCell, State } from "./schema.js";
import { Cell, isExecutable } from "./schema.js";

/** What admission needs to know besides the patch. Never mutated by `admit`. */
export interface AdmissionContext {
  /** The current State; `runtime.inbox` holds the observations delivered to this round. */
  readonly state: State;
  /** Every execution of this session, by cell id. */
  readonly executions: ReadonlyMap<number, ExecutionRecord>;
  /** Every cell version ever accepted in this session, by id (removed ones too). */
  readonly cellsEver: ReadonlyMap<number, Cell>;
  /** Observations received but not yet delivered to any round (unread). */
  readonly pendingObservations: number;
  /** The highest committed seq: `event:<seq>` evidence must not exceed it. */
  readonly headSeq: number;
  /**
   * Rounds already accepted, by round id, with the patch that was accepted and the revision it
   * produced. `removedIds` and `consumed` (optional) are echoed in a replayed receipt; without them a
   * replay reports none.
   */
  readonly accepted: ReadonlyMap<
    string,
    { readonly patch: unknown; readonly revision: number; readonly newCellIds: readonly number[]; readonly removedIds?: readonly number[]; readonly consumed?: readonly string[] }
  >;
}

/** Why a patch was refused. Stable: the harness and tests branch on it. */
export type RejectionCode =
  | "invalid_patch"
  | "revision"
  | "forbidden_op"
  | "forbidden_path"
  | "invalid_cell"
  | "cell_id"
  | "previous_id"
  | "busy_cell"
  | "removal_order"
  | "test_failed"
  | "role"
  | "conclusion_blocked"
  | "round_conflict"
  | "pep723";

/** What an accepted (or replayed) patch did. */
export interface Receipt {
  readonly round: string;
  /** The revision the accepted patch produced. */
  readonly revision: number;
  /** The State after the patch (for a replay: the current State, unchanged). */
  readonly state: State;
  /** Cells this patch created, in op order (including any it created and then removed). */
  readonly newCells: readonly Cell[];
  /** Ids of the cells `remove` ops took out of context (a replaced cell is named by its successor's previous_id). */
  readonly removedIds: readonly number[];
  /** Observation ids this patch consumed (those delivered to the round). */
  readonly consumed: readonly string[];
  /** True when this round was already accepted with the same patch: nothing new happened. */
  readonly replay: boolean;
}

/** The outcome of `admit`. */
export type Admission = { readonly ok: true; readonly receipt: Receipt } | { readonly ok: false; readonly code: RejectionCode; readonly reason: string };

const Present = z.custom<unknown>((v) => v !== undefined, { message: "is required" });
const Op = z.discriminatedUnion("op", [
  z.strictObject({ op: z.literal("test"), path: z.string(), value: Present }),
  z.strictObject({ op: z.literal("add"), path: z.string(), value: Present }),
  z.strictObject({ op: z.literal("replace"), path: z.string(), value: Present }),
  z.strictObject({ op: z.literal("remove"), path: z.string() }),
]);
type Op = z.infer<typeof Op>;

const FORBIDDEN_SEGMENTS = new Set(["__proto__", "constructor", "prototype"]);
const HARNESS_FIELDS = new Set(["goal", "runtime", "revision", "schema", "id"]);
const PATCHABLE = "only whole cells are patchable: add a new cell at /cells/-, or replace or remove the cell at /cells/N, where N is its position in the cells array";

class Refusal {
  constructor(
    readonly code: RejectionCode,
    readonly reason: string,
  ) {}
}

function refuse(code: RejectionCode, reason: string): never {
  throw new Refusal(code, reason);
}

/**
 * Admits the model's patch for round `round`, or says why not. Pure: `ctx` and `patch` are never
 * mutated, and the returned State shares nothing with `patch`.
 *
 * A round already accepted with a canonically equal patch (key order ignored) is a replay: `ok` with
 * `replay: true`, the revision it produced and the current State unchanged. A different patch for an
 * accepted round is `round_conflict`. Otherwise the rules of ARCHITECTURE.md section 3 apply, checked
 * in op order on a working copy; the first rule broken is the rejection. On success the State is
 * `applyAccepted(ctx.state, ctx.executions, patch, consumed)` with `consumed` the ids of
 * `ctx.state.runtime.inbox`. Never throws for any patch; throws only when `ctx` contradicts itself (an
 * accepted round naming a cell that `cellsEver` lacks).
 */
export function admit(ctx: AdmissionContext, patch: unknown, round: string): Admission {
  // Before anything recursive looks at it: a reply nested thousands of levels deep, or one so large
  // that checking it would take long, is refused here, in bounded work.
  const bounds = patchBoundsProblem(patch);
  if (bounds !== null) return { ok: false, code: "invalid_patch", reason: bounds };
  const prior = ctx.accepted.get(round);
  if (prior !== undefined) return replay(ctx, prior, patch, round);
  try {
    const ops = validateShape(patch);
    checkRevision(ops, ctx.state.revision);
    const walk = walkOps(ctx, ops);
    const consumed = ctx.state.runtime.inbox.map((o) => o.id);
    const applied = applyAccepted(ctx.state, ctx.executions, ops, consumed);
    if (walk.successNote !== null) checkConclusion(ctx, applied.executions, walk.successNote);
    return {
      ok: true,
      receipt: { round, revision: applied.state.revision, state: applied.state, newCells: applied.newCells, removedIds: applied.removedIds, consumed, replay: false },
    };
  } catch (err) {
    if (err instanceof Refusal) return { ok: false, code: err.code, reason: boundText(err.reason, MAX_REASON_CHARS) };
    throw err;
  }
}

/** A refusal reason is at most this long: it is committed to the log and shown to the model. */
export const MAX_REASON_CHARS = 2000;

/**
 * The largest patch admission looks at, in UTF-16 units of its JSON text (about 4 MiB; the storage
 * refuses far smaller commits anyway), and the deepest nesting (the same bound `isJsonValue` applies).
 */
export const MAX_PATCH_JSON_SIZE = 4 * 1024 * 1024;

/**
 * Why a patch is out of bounds (too deep or too large to examine), in words for the model, or null.
 * Non-recursive: safe on any value, in work bounded by the limits. The harness calls it before it
 * records a model's reply, since recording (validation, serialization) is recursive.
 */
export function patchBoundsProblem(patch: unknown): string | null {
  const b = jsonBounds(patch, { maxDepth: MAX_JSON_DEPTH, maxSize: MAX_PATCH_JSON_SIZE });
  if (b.ok) return null;
  return b.problem === "depth"
    ? `the patch is nested more than ${MAX_JSON_DEPTH} levels deep; a patch is a flat array of operations whose values are cells: send plain cells`
    : `the patch is larger than ${MAX_PATCH_JSON_SIZE} characters of JSON; keep each step well under 512 KiB, e.g. split a large script or write big files from several cells`;
}

function replay(ctx: AdmissionContext, prior: NonNullable<ReturnType<AdmissionContext["accepted"]["get"]>>, patch: unknown, round: string): Admission {
  if (!canonicalEqual(prior.patch, patch)) {
    return {
      ok: false,
      code: "round_conflict",
      reason: `round ${round} was already accepted with a different patch (it produced revision ${prior.revision}); an accepted round cannot change: read the current State (revision ${ctx.state.revision}) and make your change in the next round`,
    };
  }
  const newCells = prior.newCellIds.map((id) => {
    const cell = ctx.cellsEver.get(id);
    if (cell === undefined) throw new Error(`admission context is inconsistent: accepted round ${round} created cell ${id}, which cellsEver does not hold`);
    return cell;
  });
  return {
    ok: true,
    receipt: { round, revision: prior.revision, state: ctx.state, newCells, removedIds: prior.removedIds ?? [], consumed: prior.consumed ?? [], replay: true },
  };
}

// ---------------------------------------------------------------------------------------------
// Shape: an array of RFC 6902 ops we accept, with harmless paths.

/**
 * Operations in one patch at most. One accepted patch is one atomic commit (the patch, one queued
 * event per new executable cell, maybe an idle observation), and the replicated adapter takes at most
 * 126 events per commit (etcd's 128 operations per transaction).
 */
export const MAX_PATCH_OPS = 100;

function validateShape(patch: unknown): Op[] {
  if (!Array.isArray(patch) || patch.length === 0) {
    refuse("invalid_patch", `the patch must be a non-empty JSON array of RFC 6902 operations starting with {"op":"test","path":"/revision","value":<current revision>}; got ${describeJson(patch, 80)}`);
  }
  if (patch.length > MAX_PATCH_OPS) {
    refuse("invalid_patch", `the patch has ${patch.length} operations; at most ${MAX_PATCH_OPS} are accepted in one step. Split the work over several steps.`);
  }
  if (!isJsonValue(patch)) refuse("invalid_patch", "the patch must be plain JSON (no undefined, NaN, Infinity or values nested deeper than 64 levels)");
  const ops: Op[] = [];
  patch.forEach((raw: unknown, k: number) => {
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) refuse("invalid_patch", `op ${k} is ${describeJson(raw, 60)}; each op must be an object like {"op":"add","path":"/cells/-","value":{...}}`);
    const name = (raw as { op?: unknown }).op;
    if (name === "move" || name === "copy") {
      refuse("forbidden_op", `op ${k} is "${name}", which step does not allow (cells are immutable versions); allowed ops: test, add at /cells/-, replace and remove at /cells/N`);
    }
    const parsed = Op.safeParse(raw);
    if (!parsed.success) {
      const known = ["test", "add", "replace", "remove"].includes(name as string);
      const why = known ? issueWords(parsed.error) : `"op" must be one of test, add, replace, remove (got ${describeJson(name, 40)})`;
      refuse("invalid_patch", `op ${k} is not a valid operation: ${why}`);
    }
    checkPathSafety(parsed.data.path, k);
    ops.push(parsed.data);
  });
  return ops;
}

function checkPathSafety(path: string, k: number): void {
  const rawSegments = path.split("/");
  const segments = parsePointer(path);
  // An unescaped segment may hold "/" (from "~1"): a later consumer that re-splits it must not find one either.
  for (const seg of [...rawSegments, ...(segments ?? []).flatMap((s) => [s, ...s.split("/")])]) {
    if (FORBIDDEN_SEGMENTS.has(seg)) refuse("forbidden_path", `op ${k} path ${describeJson(path, 200)} contains the segment "${seg}", which is never allowed in a path; ${PATCHABLE}`);
  }
  if (segments === null) {
    refuse("invalid_patch", `op ${k} path ${describeJson(path, 200)} is not a JSON pointer: it must start with "/" and write "~" as "~0" and "/" inside a segment as "~1"`);
  }
}

function checkRevision(ops: readonly Op[], revision: number): void {
  const want = `{"op":"test","path":"/revision","value":${revision}}`;
  const first = ops[0]!;
  if (first.op !== "test" || first.path !== "/revision") {
    refuse("revision", `the first op must be ${want} (the current revision is ${revision}); op 0 is ${describeJson(first, 100)}`);
  }
  if (first.value !== revision) {
    refuse("revision", `this patch was written for revision ${describeJson(first.value, 40)}, but the current revision is ${revision}: read the current State and start the patch with ${want}`);
  }
}

// ---------------------------------------------------------------------------------------------
// The walk: every op in order, against a working copy of the cells.

interface Walk {
  readonly successNote: number | null;
}

interface WalkState {
  readonly ctx: AdmissionContext;
  readonly cells: Cell[];
  readonly created: Map<number, Cell>;
  nextId: number;
  lastRemoval: { k: number; n: number } | null;
  readonly resolvedHere: Map<number, number>;
  successNote: number | null;
}

function walkOps(ctx: AdmissionContext, ops: readonly Op[]): Walk {
  const w: WalkState = {
    ctx,
    cells: [...ctx.state.cells],
    created: new Map(),
    nextId: ctx.state.runtime.next_cell_id,
    lastRemoval: null,
    resolvedHere: new Map(),
    successNote: null,
  };
  ops.forEach((op, k) => {
    switch (op.op) {
      case "test":
        return testOp(w, op.path, op.value, k);
      case "add": {
        const segs = mutationPath(w, op.path, k, "add");
        if (segs !== "-") refuse("forbidden_path", `op ${k} adds at ${op.path}; add only appends: use /cells/- (to change the cell at ${op.path}, replace it)`);
        const cell = newCell(w, op.value, k, null, op.path);
        w.cells.push(cell);
        return;
      }
      case "replace": {
        const n = positionOf(w, op.path, k, "replace");
        const old = w.cells[n]!;
        const cell = newCell(w, op.value, k, old, op.path);
        w.cells[n] = cell;
        return;
      }
      case "remove": {
        const n = positionOf(w, op.path, k, "remove");
        if (w.lastRemoval !== null && n >= w.lastRemoval.n) {
          refuse(
            "removal_order",
            `removals must go in descending position order: op ${w.lastRemoval.k} removes /cells/${w.lastRemoval.n} and op ${k} then removes /cells/${n}; remove the highest position first so each position still names the cell you read`,
          );
        }
        w.lastRemoval = { k, n };
        w.cells.splice(n, 1);
        return;
      }
    }
  });
  return { successNote: w.successNote };
}

function testOp(w: WalkState, path: string, expected: unknown, k: number): void {
  const doc = { ...w.ctx.state, cells: w.cells };
  const got = resolvePointer(doc, parsePointer(path)!);
  if (!got.found) {
    const where = got.missing.startsWith("/cells/") ? ` (at this point of the patch State has ${w.cells.length} cells)` : "";
    refuse("test_failed", `op ${k} tests ${path}, but ${got.missing} does not exist${where}; expected ${describeJson(expected)}`);
  }
  if (!canonicalEqual(got.value, expected)) {
    refuse("test_failed", `op ${k} test at ${path} failed: expected ${describeJson(expected)}, found ${describeJson(got.value)}`);
  }
}

/** The cells-array segment a mutating op targets ("-" or a position string), or a refusal. */
function mutationPath(w: WalkState, path: string, k: number, op: "add" | "replace" | "remove"): string {
  const segs = parsePointer(path)!;
  const top = segs[0];
  if (top === undefined) refuse("forbidden_path", `op ${k} would ${op} the whole State; ${PATCHABLE}`);
  if (HARNESS_FIELDS.has(top)) refuse("forbidden_path", `op ${k} would ${op} ${path}, but /${top} belongs to the harness and cannot be patched; ${PATCHABLE}`);
  if (top !== "cells") refuse("forbidden_path", `op ${k} would ${op} ${path}, which is not part of State's patchable surface; ${PATCHABLE}`);
  if (segs.length === 1) refuse("forbidden_path", `op ${k} would ${op} the whole /cells array; ${PATCHABLE}`);
  const at = segs[1]!;
  if (segs.length > 2) {
    const n = ARRAY_INDEX.test(at) ? Number(at) : -1;
    const cell = w.cells[n];
    const inside =
      cell === undefined
        ? `cells are immutable and ${path} points inside one`
        : `cells are immutable: ${path} is inside cell ${cell.id} (at /cells/${n}); to change it, replace the whole cell at /cells/${n} with a new version {"id":${w.nextId},"previous_id":${cell.id},...}`;
    refuse("forbidden_path", `op ${k}: ${inside}; ${PATCHABLE}`);
  }
  return at;
}

function positionOf(w: WalkState, path: string, k: number, op: "replace" | "remove"): number {
  const at = mutationPath(w, path, k, op);
  if (at === "-") refuse("forbidden_path", `op ${k} would ${op} /cells/-, which is the end of the array, not a cell; ${op} needs a position /cells/N`);
  const range = w.cells.length === 0 ? "there are no cells at this point of the patch" : `positions at this point of the patch are 0 to ${w.cells.length - 1}`;
  if (!ARRAY_INDEX.test(at)) refuse("forbidden_path", `op ${k} path ${path}: "${at}" is not a position; a position is a decimal number without leading zeros, and ${range}`);
  const n = Number(at);
  if (n >= w.cells.length) refuse("forbidden_path", `op ${k} would ${op} ${path}, which is out of range: ${range}`);
  return n;
}

// ---------------------------------------------------------------------------------------------
// New cells: schema, ids, replacement, busy cells, PEP 723, roles.

function newCell(w: WalkState, value: unknown, k: number, old: Cell | null, path: string): Cell {
  const parsed = Cell.safeParse(value);
  if (!parsed.success) {
    refuse("invalid_cell", `op ${k} value is not a valid cell: ${issueWords(parsed.error)}. A cell is {"id","previous_id","kind":"note","text"} (notes may add "role"), {"id","previous_id","kind":"script","source"} or {"id","previous_id","kind":"cmd","argv":[...]}`);
  }
  const cell = value as Cell;
  if (cell.id !== w.nextId) {
    const how = cell.id < w.nextId ? "ids are never reused" : "ids never skip a number";
    refuse("cell_id", `the next cell id is ${w.nextId}; op ${k} used ${cell.id} (new cells take consecutive ids from runtime.next_cell_id in op order; ${how})`);
  }
  if (old === null) {
    if (cell.previous_id !== null) {
      refuse("previous_id", `op ${k} adds a new cell, so its previous_id must be null (it is ${cell.previous_id}); to make a new version of cell ${cell.previous_id}, replace it at its position instead`);
    }
  } else {
    if (cell.previous_id !== old.id) {
      refuse("previous_id", `${path} is a position; it holds cell ${old.id}, so previous_id must be ${old.id} (op ${k} has ${describeJson(cell.previous_id)})`);
    }
    const phase = busyPhase(w, old);
    if (phase !== null) {
      refuse(
        "busy_cell",
        `op ${k} replaces cell ${old.id} (at ${path}), whose execution is ${phase}; a cell cannot be replaced until its execution finishes. You may remove it instead (removal never cancels work), and to stop the work add a note with "role":"cancel" and "target_cell_id":${old.id}`,
      );
    }
  }
  if (cell.kind === "cmd") refuseArgv(cell.argv, k, cell.id);
  if (cell.kind === "script") {
    const meta = parsePep723(cell.source);
    if (!meta.ok) refuse("pep723", `op ${k} script cell ${cell.id}: ${meta.reason}`);
    if (meta.block === null) {
      refuse(
        "pep723",
        `op ${k} script cell ${cell.id} has no PEP 723 block; a script runs with \`uv run --script\` and must start with a "# /// script" block stating requires-python, e.g.\n# /// script\n# requires-python = ">=3.11"\n# dependencies = []\n# ///`,
      );
    }
  }
  if (cell.kind === "note") checkRole(w, cell, k);
  w.created.set(cell.id, cell);
  w.nextId += 1;
  return cell;
}

function refuseArgv(argv: readonly string[], k: number, id: number): void {
  const problem = argvProblem(argv);
  if (problem !== null) refuse("invalid_cell", `op ${k} cmd cell ${id}: ${problem}`);
}

function busyPhase(w: WalkState, cell: Cell): "queued" | "started" | null {
  if (w.created.has(cell.id)) return isExecutable(cell) ? "queued" : null;
  const ex = w.ctx.executions.get(cell.id);
  return ex !== undefined && ex.phase !== "finished" ? ex.phase : null;
}

function existingCell(w: WalkState, id: number): Cell | undefined {
  return w.created.get(id) ?? w.ctx.cellsEver.get(id);
}

function checkRole(w: WalkState, note: NoteCell, k: number): void {
  const who = `op ${k} note ${note.id}`;
  const misplaced: string[] = [];
  if (note.target_cell_id !== undefined && note.role !== "cancel" && note.role !== "resolution") misplaced.push(`"target_cell_id" belongs to role "cancel" or "resolution"`);
  if (note.evidence_refs !== undefined && note.role !== "resolution") misplaced.push(`"evidence_refs" belongs to role "resolution"`);
  if (note.result !== undefined && note.role !== "conclusion") misplaced.push(`"result" belongs to role "conclusion"`);
  if (misplaced.length > 0) refuse("role", `${who} has ${note.role === undefined ? "no role" : `role "${note.role}"`}, but ${misplaced.join("; ")}`);

  if (note.role === "cancel") {
    if (note.target_cell_id === undefined) refuse("role", `${who} has role "cancel" but no "target_cell_id": name the executable cell to cancel`);
    const target = existingCell(w, note.target_cell_id);
    if (target === undefined) refuse("role", `${who} cancels cell ${note.target_cell_id}, which does not exist in this session`);
    if (!isExecutable(target)) refuse("role", `${who} cancels cell ${target.id}, which is a ${target.kind}; only script and cmd cells run and can be cancelled`);
  } else if (note.role === "resolution") {
    checkResolution(w, note, who);
  } else if (note.role === "conclusion") {
    if (note.result === undefined) refuse("role", `${who} has role "conclusion" but no "result": say "success" or "failure"`);
    if (note.result === "success" && w.successNote === null) w.successNote = note.id;
  }
}

function checkResolution(w: WalkState, note: NoteCell, who: string): void {
  const target = note.target_cell_id;
  if (target === undefined) refuse("role", `${who} has role "resolution" but no "target_cell_id": name the cell whose UnknownExecution it resolves`);
  const earlier = w.resolvedHere.get(target);
  if (earlier !== undefined) refuse("role", `${who} resolves cell ${target}, which note ${earlier} earlier in this patch already resolves`);
  const ex = w.ctx.executions.get(target);
  if (ex === undefined || ex.result !== "UnknownExecution") {
    const what = ex === undefined ? "has no execution" : ex.phase === "finished" ? `finished with result ${ex.result}` : `is ${ex.phase}`;
    refuse("role", `${who} resolves cell ${target}, but cell ${target} ${what}; a resolution targets a cell whose execution is an UnknownExecution`);
  }
  if (!isUnresolvedUnknown(ex)) refuse("role", `${who} resolves cell ${target}, whose UnknownExecution note ${ex.resolved_by} already resolved`);
  const refs = note.evidence_refs ?? [];
  if (refs.length === 0) refuse("role", `${who} resolves cell ${target} without evidence: add "evidence_refs" like ["event:${Math.max(1, w.ctx.headSeq)}"] or ["cell:<id of the cell that inspected it>"]`);
  for (const ref of refs) {
    const ev = /^event:([1-9][0-9]*)$/.exec(ref);
    if (ev !== null) {
      if (Number(ev[1]) > w.ctx.headSeq) refuse("role", `${who} cites ${ref}, but the log ends at event ${w.ctx.headSeq}`);
      continue;
    }
    const c = /^cell:([1-9][0-9]*)$/.exec(ref);
    if (c !== null) {
      if (existingCell(w, Number(c[1])) === undefined) refuse("role", `${who} cites ${ref}, but cell ${c[1]} does not exist in this session`);
      continue;
    }
    refuse("role", `${who} cites ${JSON.stringify(ref)}; evidence is "event:<seq>" (1 to ${w.ctx.headSeq}) or "cell:<id>" of an existing cell`);
  }
  w.resolvedHere.set(target, note.id);
}

function checkConclusion(ctx: AdmissionContext, after: ReadonlyMap<number, ExecutionRecord>, noteId: number): void {
  const queued: number[] = [];
  const started: number[] = [];
  const unknown: number[] = [];
  for (const [id, ex] of after) {
    if (ex.phase === "queued") queued.push(id);
    else if (ex.phase === "started") started.push(id);
    else if (isUnresolvedUnknown(ex)) unknown.push(id);
  }
  const blockers: string[] = [];
  const list = (ids: number[]) => `${ids.length === 1 ? "cell" : "cells"} ${ids.sort((a, b) => a - b).join(", ")}`;
  if (queued.length > 0) blockers.push(`${list(queued)} still queued`);
  if (started.length > 0) blockers.push(`${list(started)} still running (started)`);
  if (unknown.length > 0) blockers.push(`${list(unknown)} with an unresolved UnknownExecution (add a resolution note with evidence)`);
  if (ctx.pendingObservations > 0) blockers.push(`${ctx.pendingObservations} unread observation${ctx.pendingObservations === 1 ? "" : "s"} (they arrive next round)`);
  if (blockers.length > 0) {
    refuse("conclusion_blocked", `note ${noteId} concludes "success", but success needs no pending work, no unresolved uncertainty and no unread observations; blocked by: ${blockers.join("; ")}. Wait for the work (or cancel it), then conclude in a later round`);
  }
}

function issueWords(error: z.ZodError): string {
  return error.issues
    .slice(0, 4)
    .map((i) => (i.path.length > 0 ? `${i.path.join(".")}: ${i.message}` : i.message))
    .join("; ");
}
