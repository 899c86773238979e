/**
 * step admission: the only way the model changes State (ARCHITECTURE.md section 3).
 *
 * PLACEHOLDER: the signatures below are the contract; the body is being written (see issue 2).
 */
import type { Cell, State } from "./schema.js";
import type { ExecutionRecord } from "./projection.js";

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
  /** Rounds already accepted, by round id, with the patch that was accepted and the revision it produced. */
  readonly accepted: ReadonlyMap<string, { readonly patch: unknown; readonly revision: number; readonly newCellIds: readonly number[] }>;
}

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

export interface Receipt {
  readonly round: string;
  /** The revision the accepted patch produced. */
  readonly revision: number;
  /** The State after the patch (for a replay: the current State, unchanged). */
  readonly state: State;
  readonly newCells: readonly Cell[];
  readonly removedIds: readonly number[];
  /** Observation ids this patch consumed (those delivered to the round). */
  readonly consumed: readonly string[];
  /** True when this round was already accepted with the same patch: nothing new happened. */
  readonly replay: boolean;
}

export type Admission = { readonly ok: true; readonly receipt: Receipt } | { readonly ok: false; readonly code: RejectionCode; readonly reason: string };

export function admit(_ctx: AdmissionContext, _patch: unknown, _round: string): Admission {
  throw new Error("admit: not implemented yet");
}

/**
 * Folds an accepted patch into State exactly as admission did (the reducer calls this for
 * `patch_accepted`). Deterministic; it does not validate: the patch was validated when admitted.
 * New executable cells appear in `runtime.cells` as queued (and in the returned `executions`, with
 * `queued_seq` 0 until the reducer sees their `execution_queued` event); a `resolution` note marks its
 * target's UnknownExecution `resolved_by`; the consumed observations leave `runtime.inbox`; the
 * revision advances by one. The inputs are never mutated.
 */
export function applyAccepted(
  _state: State,
  _executions: ReadonlyMap<number, ExecutionRecord>,
  _patch: unknown,
  _consumed: readonly string[],
): { state: State; executions: Map<number, ExecutionRecord>; newCells: Cell[]; removedIds: number[] } {
  throw new Error("applyAccepted: not implemented yet");
}
