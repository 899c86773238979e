/**
 * The effect ledger: what a run's cells said they were about to do outside (`cairn effect begin
 * NAME`) and what came of it (`cairn effect end NAME --result JSON`), folded from the log.
 *
 * A name belongs to the run: any cell of the run that begins it gets the answer the ledger holds.
 * The ledger answers a begin with one of three words, decided here from the projection alone:
 *
 *   proceed    never begun (or `--retry` of one that is uncertain): the harness commits
 *              `effect_begun` first, and answers only once that commit is durable;
 *   done       ended before: the recorded result, the same every time, forever;
 *   uncertain  begun and never ended: it may have happened or not, and only the outside system can
 *              tell. The cell checks there, then ends it (it happened) or begins it again with
 *              `--retry` (it did not).
 *
 * The ledger is never cut by history (history.ts): a done effect must stay done for the run's whole
 * life. A fork starts from its parent's ledger as it was at the fork point (`forkLedger`).
 *
 * Pure: no I/O, no clock.
 */
import { z } from "zod";
import type { ExecutionRecord, SessionProjection } from "./projection.js";

/** Effect names: letters, digits and `. _ / @ + -`, up to 200 characters (no `:`, which separates identity parts). */
export const EffectName = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[A-Za-z0-9._/@+-]+$/, "an effect name may use letters, digits and . _ / @ + - (no spaces, no colons)");

/** A result is small plain JSON (an id, a URL, a status): its JSON text may not exceed this. */
export const MAX_EFFECT_RESULT_CHARS = 4096;
/** Effects listed under one cell (its runtime view and its outcome); more are counted, not listed. */
export const MAX_CELL_EFFECTS = 32;
/** Names one run's ledger may hold: past it, a begin of a new name is refused. */
export const MAX_RUN_EFFECTS = 10_000;

/** One `begin` that was answered `proceed`: committed before the answer. */
export interface EffectAttempt {
  readonly attempt: number;
  readonly cell_id: number;
  readonly seq: number;
  readonly at: string;
}

/** What the ledger holds for one name. */
export interface EffectRecord {
  readonly name: string;
  /** Every committed begin, in order (a `--retry` adds one). */
  readonly attempts: readonly EffectAttempt[];
  /** The end, once committed: final. */
  readonly ended: { readonly cell_id: number; readonly seq: number; readonly at: string; readonly result: unknown } | null;
}

/** An effect as listed under a cell that began or ended it. */
export interface CellEffect {
  readonly name: string;
  /** `begun` (by this cell, not ended yet) or `done` (ended, by this cell or a later one). */
  readonly status: "begun" | "done";
  /** The recorded result, once done. */
  readonly result?: unknown;
}

/** The ledger's answer to a begin of `name`, before any commit. */
export type BeginDecision =
  | { readonly answer: "done"; readonly record: EffectRecord }
  | { readonly answer: "uncertain"; readonly record: EffectRecord }
  /** Commit `effect_begun` with this attempt number, then answer `proceed`. */
  | { readonly answer: "proceed"; readonly attempt: number }
  | { readonly answer: "refused"; readonly reason: string };

/**
 * What a begin of `name` gets from `ledger`. `retry`: the caller checked the outside system and found
 * that an uncertain effect did not happen; it is begun again (a new attempt). A done effect is never
 * begun again, retry or not.
 */
export function decideBegin(ledger: ReadonlyMap<string, EffectRecord>, name: string, retry: boolean): BeginDecision {
  const record = ledger.get(name);
  if (record?.ended) return { answer: "done", record };
  if (record !== undefined && !retry) return { answer: "uncertain", record };
  if (record === undefined && ledger.size >= MAX_RUN_EFFECTS) {
    return { answer: "refused", reason: `this run's ledger already holds ${MAX_RUN_EFFECTS} effects, the most one run may declare; reuse names or start a new run` };
  }
  return { answer: "proceed", attempt: (record?.attempts.length ?? 0) + 1 };
}

/**
 * Where a ledger name stands for `status` and the page: `done`; `begun` while the cell of its last
 * attempt may still act (queued or started); `uncertain` once that cell finished (or left history)
 * without ending it.
 */
export function effectStatus(record: EffectRecord, executions: ReadonlyMap<number, ExecutionRecord>): "done" | "begun" | "uncertain" {
  if (record.ended !== null) return "done";
  const last = record.attempts.at(-1);
  const ex = last === undefined ? undefined : executions.get(last.cell_id);
  return ex !== undefined && ex.phase !== "finished" ? "begun" : "uncertain";
}

/** Folds an `effect_begun` into `ledger` (mutably; the records themselves are replaced, never changed). */
export function foldBegun(ledger: Map<string, EffectRecord>, body: { readonly name: string; readonly cell_id: number; readonly attempt: number }, seq: number, at: string): void {
  const prior = ledger.get(body.name);
  // A begin after the end cannot be committed by the harness (decideBegin answers done, and a
  // fenced owner cannot commit at all); a log that holds one keeps the effect done.
  ledger.set(body.name, {
    name: body.name,
    attempts: [...(prior?.attempts ?? []), { attempt: body.attempt, cell_id: body.cell_id, seq, at }],
    ended: prior?.ended ?? null,
  });
}

/** Folds an `effect_ended` into `ledger`; returns the cells whose listing changes (those that began it, and the ender). */
export function foldEnded(ledger: Map<string, EffectRecord>, body: { readonly name: string; readonly cell_id: number; readonly result: unknown }, seq: number, at: string): number[] {
  const prior = ledger.get(body.name);
  if (prior?.ended) return []; // one end per name (its identity is unique): a first end is final
  ledger.set(body.name, { name: body.name, attempts: prior?.attempts ?? [], ended: { cell_id: body.cell_id, seq, at, result: body.result } });
  return [...new Set([...(prior?.attempts ?? []).map((a) => a.cell_id), body.cell_id])];
}

/**
 * `ex` with `name` listed as `status` (replacing its entry, or appended while fewer than
 * MAX_CELL_EFFECTS are listed, else counted in `effects_omitted`).
 */
export function withCellEffect(ex: ExecutionRecord, effect: CellEffect): ExecutionRecord {
  const i = ex.effects.findIndex((e) => e.name === effect.name);
  if (i >= 0) {
    const effects = [...ex.effects];
    effects[i] = effect;
    return { ...ex, effects };
  }
  if (ex.effects.length >= MAX_CELL_EFFECTS) return { ...ex, effects_omitted: ex.effects_omitted + 1 };
  return { ...ex, effects: [...ex.effects, effect] };
}

/** The names a cell began and never saw ended, and those it began or ended that are done. */
export function cellEffectNames(ex: ExecutionRecord): { readonly uncertain: string[]; readonly done: string[] } {
  return { uncertain: ex.effects.filter((e) => e.status === "begun").map((e) => e.name), done: ex.effects.filter((e) => e.status === "done").map((e) => e.name) };
}

/**
 * The ledger a fork of `parent` starts from, forked after event `atSeq` of the parent: every begin
 * and end committed up to it, nothing after. Together with the parent's `effect_seed` (which a fork
 * keeps, so its keys are the parent's), this is what a fork must copy.
 */
export function forkLedger(parent: Pick<SessionProjection, "effects">, atSeq: number): Map<string, EffectRecord> {
  const out = new Map<string, EffectRecord>();
  for (const [name, r] of parent.effects) {
    const attempts = r.attempts.filter((a) => a.seq <= atSeq);
    const ended = r.ended !== null && r.ended.seq <= atSeq ? r.ended : null;
    if (attempts.length === 0 && ended === null) continue;
    out.set(name, { name, attempts, ended });
  }
  return out;
}
