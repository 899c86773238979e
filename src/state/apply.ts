/**
 * Folding an accepted patch into State: the one function both admission (its final step) and the
 * reducer (`patch_accepted`) call, so both produce exactly the same State.
 *
 * Pure: no I/O, no clock.
 */
import jsonpatch from "fast-json-patch";
import { describeJson, jsonClone } from "./canonical.js";
import type { ExecutionRecord } from "./projection.js";
import { isUnresolvedUnknown, queuedExecution, updatedRuntimeCellsView } from "./projection.js";
import type { Cell, State } from "./schema.js";
import { isExecutable } from "./schema.js";

/** Thrown by `applyAccepted` when a patch cannot be folded (a corrupt log: it was never admitted). */
export class PatchNotApplicable extends Error {
  readonly code = "internal" as const;
  constructor(message: string) {
    super(message);
    this.name = "PatchNotApplicable";
  }
}

function cellPosition(path: unknown, length: number): number {
  const m = typeof path === "string" ? /^\/cells\/(0|[1-9][0-9]*)$/.exec(path) : null;
  const n = m === null ? -1 : Number(m[1]);
  if (n < 0 || n >= length) throw new PatchNotApplicable(`accepted patch op path ${describeJson(path, 60)} is not a position in a ${length}-cell array`);
  return n;
}

/** What folding an accepted patch gives; see {@link applyAccepted}. */
export interface AppliedPatch {
  readonly state: State;
  /**
   * Only the executions the patch creates or changes (new executable cells as queued with
   * `queued_seq` 0, a resolution's target marked `resolved_by`): the caller merges them.
   */
  readonly changed: ReadonlyMap<number, ExecutionRecord>;
  /** Every execution after the patch (`executions` with `changed` over it), built on first use. */
  readonly executions: ReadonlyMap<number, ExecutionRecord>;
  readonly newCells: Cell[];
  readonly removedIds: number[];
}

/**
 * Folds an accepted patch into State exactly as admission did (the reducer calls this for
 * `patch_accepted`). Deterministic; it does not validate: the patch was validated when admitted.
 * New executable cells appear in `runtime.cells` as queued (and in `changed`, with `queued_seq` 0
 * until the reducer sees their `execution_queued` event); a `resolution` note marks its target's
 * UnknownExecution `resolved_by`; the consumed observations leave `runtime.inbox`; the revision
 * advances by one. The inputs are never mutated and the result shares nothing with `patch`.
 *
 * The cost is proportional to the State and the patch, not to the session's history: `runtime.cells`
 * is updated from `state.runtime.cells` (which must be the view of `state.cells` and `executions`, as
 * every projection's State is) for the cells the patch touched, and the executions are returned as a
 * change (`changed`), not as a copy of the session's every execution.
 * Throws `PatchNotApplicable` when the patch cannot be folded at all (not an array, an unknown op, a
 * position out of range): a log that says otherwise is corrupt.
 */
export function applyAccepted(state: State, executions: ReadonlyMap<number, ExecutionRecord>, patch: unknown, consumed: readonly string[]): AppliedPatch {
  if (!Array.isArray(patch)) throw new PatchNotApplicable(`accepted patch is not an array: ${describeJson(patch, 60)}`);
  // Applied with fast-json-patch on a copy (the State is never mutated), prototype changes banned.
  // Admission has validated every op; the positions are checked again here because the reducer
  // folds patches read back from the log.
  const doc = { cells: [...state.cells] };
  const newCells: Cell[] = [];
  const removedIds: number[] = [];
  /** Cells that left the context: removed, or replaced by a new version. */
  const left: number[] = [];
  for (const raw of patch as unknown[]) {
    const op = (raw ?? {}) as { op?: unknown; path?: unknown; value?: unknown };
    if (op.op === "test") continue;
    if (op.op === "add") {
      if (op.path !== "/cells/-") throw new PatchNotApplicable(`accepted patch adds at ${describeJson(op.path, 60)}, not at /cells/-`);
      const cell = jsonClone(op.value) as Cell;
      jsonpatch.applyOperation(doc, { op: "add", path: "/cells/-", value: cell }, false, true, true);
      newCells.push(cell);
    } else if (op.op === "replace") {
      const cell = jsonClone(op.value) as Cell;
      const n = cellPosition(op.path, doc.cells.length);
      left.push(doc.cells[n]!.id);
      jsonpatch.applyOperation(doc, { op: "replace", path: `/cells/${n}`, value: cell }, false, true, true);
      newCells.push(cell);
    } else if (op.op === "remove") {
      const n = cellPosition(op.path, doc.cells.length);
      removedIds.push(doc.cells[n]!.id);
      left.push(doc.cells[n]!.id);
      jsonpatch.applyOperation(doc, { op: "remove", path: `/cells/${n}` }, false, true, true);
    } else {
      throw new PatchNotApplicable(`accepted patch has an op step never admits: ${describeJson(raw, 80)}`);
    }
  }
  const cells = doc.cells;
  const changed = new Map<number, ExecutionRecord>();
  const current = (id: number) => changed.get(id) ?? executions.get(id);
  let next = state.runtime.next_cell_id;
  for (const c of newCells) {
    next = Math.max(next, c.id + 1);
    if (isExecutable(c)) {
      if (current(c.id) === undefined) changed.set(c.id, queuedExecution(c.id, c.kind, 0));
    } else if (c.role === "resolution" && c.target_cell_id !== undefined) {
      const ex = current(c.target_cell_id);
      if (ex !== undefined && isUnresolvedUnknown(ex)) changed.set(ex.cell_id, { ...ex, resolved_by: c.id });
    }
  }
  const gone = new Set(consumed);
  const next_state: State = {
    ...state,
    revision: state.revision + 1,
    cells,
    runtime: {
      ...state.runtime,
      next_cell_id: next,
      inbox: state.runtime.inbox.filter((o) => !gone.has(o.id)),
      cells: updatedRuntimeCellsView(state.runtime.cells, cells, [...left, ...newCells.map((c) => c.id), ...changed.keys()], current),
    },
  };
  let merged: Map<number, ExecutionRecord> | null = null;
  return {
    state: next_state,
    changed,
    get executions() {
      if (merged === null) {
        merged = new Map(executions);
        for (const [id, ex] of changed) merged.set(id, ex);
      }
      return merged;
    },
    newCells,
    removedIds,
  };
}
