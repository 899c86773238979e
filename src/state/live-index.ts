/**
 * Which executions and role notes of a session are still live, kept beside the projection's maps, so
 * that the scheduling rules (next-step.ts) look at a handful of entries instead of the session's
 * whole history: a session that has run thousands of cells keeps up to 2 x HISTORY_KEEP finished
 * executions and cells (history.ts), and its driver asked about all of them several times a round
 * (about 3 `nextStep` calls a round, each scanning the cells and the executions once or twice).
 *
 * Derived data only, in WeakMaps keyed by the Map it describes: nothing is added to the projection
 * or its snapshot. An index is built by one scan of its map the first time it is asked for, and kept
 * in step from then on by the only code that changes those maps, the reducer and history.ts, which
 * change them through the functions below. speculate.ts's overlay (a view of the executions with a
 * few entries replaced) gets the index of its base with those entries placed again; any other map
 * that is not a `Map` gets none, and callers scan it as before (`executionIndex` returns null).
 *
 * The indexes answer "is there any?" questions; where the rules need the first entry in map order
 * (the oldest role note, the execution that pauses the queue), the caller scans the map only when the
 * index says there is one, so the answers are exactly those of a full scan.
 */
import type { ExecutionRecord } from "./projection.js";
import { pausesQueue } from "./projection.js";
import type { Cell } from "./schema.js";

export interface ExecutionIndex {
  /** Cell ids of executions queued or started, in the order they entered the map. */
  readonly unfinished: Set<number>;
  /** Cell ids of finished executions that may pause the queue (`error`, UnknownExecution, denied: projection.ts pausesQueue). */
  readonly troubled: Set<number>;
}

export interface CellIndex {
  /** Ids of note cells with a role (cancel, resolution, conclusion), handled or not. */
  readonly roleNotes: Set<number>;
}

const executionIndexes = new WeakMap<ReadonlyMap<number, ExecutionRecord>, ExecutionIndex>();
const cellIndexes = new WeakMap<ReadonlyMap<number, Cell>, CellIndex>();


function place(index: ExecutionIndex, id: number, ex: ExecutionRecord): void {
  if (ex.phase === "finished") index.unfinished.delete(id);
  else index.unfinished.add(id);
  if (pausesQueue(ex)) index.troubled.add(id);
  else index.troubled.delete(id);
}

/** Read-only views of a Map with some entries replaced (speculate.ts), and what they are made of. */
const overlays = new WeakMap<ReadonlyMap<number, ExecutionRecord>, { readonly base: ReadonlyMap<number, ExecutionRecord>; readonly changes: ReadonlyMap<number, ExecutionRecord> }>();

/** Records that `view` is `base` with `changes` replacing some of its entries (no new keys), so that it gets an index too. */
export function registerOverlay(view: ReadonlyMap<number, ExecutionRecord>, base: ReadonlyMap<number, ExecutionRecord>, changes: ReadonlyMap<number, ExecutionRecord>): void {
  overlays.set(view, { base, changes });
}

/**
 * The index of `executions`, built now if it has none; null when `executions` is neither a Map nor
 * a registered overlay of one.
 */
export function executionIndex(executions: ReadonlyMap<number, ExecutionRecord>): ExecutionIndex | null {
  let index = executionIndexes.get(executions);
  if (index !== undefined) return index;
  if (executions instanceof Map) {
    index = { unfinished: new Set(), troubled: new Set() };
    for (const [id, ex] of executions) place(index, id, ex);
  } else {
    const overlay = overlays.get(executions);
    const base = overlay === undefined ? null : executionIndex(overlay.base);
    if (overlay === undefined || base === null) return null;
    // The base's index with the replaced entries placed again (an overlay adds no keys).
    index = { unfinished: new Set(base.unfinished), troubled: new Set(base.troubled) };
    for (const [id, ex] of overlay.changes) place(index, id, ex);
  }
  executionIndexes.set(executions, index);
  return index;
}

/** The index of `cells`, built now if it has none; null when `cells` is not a Map. */
export function cellIndex(cells: ReadonlyMap<number, Cell>): CellIndex | null {
  if (!(cells instanceof Map)) return null;
  let index = cellIndexes.get(cells);
  if (index === undefined) {
    index = { roleNotes: new Set() };
    for (const c of cells.values()) if (c.kind === "note" && c.role !== undefined) index.roleNotes.add(c.id);
    cellIndexes.set(cells, index);
  }
  return index;
}

/** `executions.set(id, ex)`, keeping its index (if it has one) in step. */
export function setExecution(executions: Map<number, ExecutionRecord>, id: number, ex: ExecutionRecord): void {
  executions.set(id, ex);
  const index = executionIndexes.get(executions);
  if (index !== undefined) place(index, id, ex);
}

/** `executions.delete(id)`, keeping its index (if it has one) in step with what the map did. */
export function deleteExecution(executions: Map<number, ExecutionRecord>, id: number): void {
  if (!executions.delete(id)) return;
  const index = executionIndexes.get(executions);
  if (index !== undefined) {
    index.unfinished.delete(id);
    index.troubled.delete(id);
  }
}

/** `cells.set(cell.id, cell)`, keeping its index (if it has one) in step. */
export function setCell(cells: Map<number, Cell>, cell: Cell): void {
  cells.set(cell.id, cell);
  const index = cellIndexes.get(cells);
  if (index === undefined) return;
  if (cell.kind === "note" && cell.role !== undefined) index.roleNotes.add(cell.id);
  else index.roleNotes.delete(cell.id);
}

/** `cells.delete(id)`, keeping its index (if it has one) in step with what the map did. */
export function deleteCell(cells: Map<number, Cell>, id: number): void {
  if (cells.delete(id)) cellIndexes.get(cells)?.roleNotes.delete(id);
}
