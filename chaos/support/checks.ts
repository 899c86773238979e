/**
 * Assertions over a log that every chaos test makes: one launch per cell, the UnknownExecution record,
 * the observation reaching the model, the run's end.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import type { LogEvent } from "../../src/state/events.js";
import { brief, finishesOf, ofKind, startsOf } from "./log.js";

/** Lines in the effect file (0 when it does not exist). */
export function effectLines(file: string): number {
  if (!existsSync(file)) return 0;
  return readFileSync(file, "utf8").split("\n").filter((l) => l !== "").length;
}

/** Exactly one `execution_started` for `cell`; returns it. */
export function oneStart(log: readonly LogEvent[], cell: number): LogEvent<"execution_started"> {
  const starts = startsOf(log, cell);
  assert.equal(starts.length, 1, `cell ${cell} must be launched exactly once; the log:\n${brief(log)}`);
  return starts[0]!;
}

/** Exactly one `execution_finished` for `cell`; returns it. */
export function oneFinish(log: readonly LogEvent[], cell: number): LogEvent<"execution_finished"> {
  const fins = finishesOf(log, cell);
  assert.equal(fins.length, 1, `cell ${cell} must finish exactly once; the log:\n${brief(log)}`);
  return fins[0]!;
}

/**
 * Cell `cell` ended as an UnknownExecution recorded by recovery (worker lost before the result
 * commit), citing its `execution_started` event, with `worker_stopped` as expected. Returns the event.
 */
export function recoveredUnknown(log: readonly LogEvent[], cell: number, workerStopped: boolean): LogEvent<"execution_finished"> {
  const start = oneStart(log, cell);
  const fin = oneFinish(log, cell);
  assert.equal(fin.body.result, "UnknownExecution", `cell ${cell}: ${fin.body.detail}`);
  assert.ok(fin.body.unknown !== null, "an UnknownExecution carries its record");
  assert.equal(fin.body.unknown.reason, "worker_lost_before_result_commit");
  assert.equal(fin.body.unknown.worker_stopped, workerStopped, `worker_stopped: ${fin.body.detail}`);
  assert.deepEqual(fin.body.unknown.evidence_refs, [`event:${start.seq}`]);
  assert.ok(fin.seq > start.seq);
  return fin;
}

/**
 * The observation `execution:<cell>` entered the inbox once, was delivered to a later turn, and was
 * consumed by that turn's accepted patch: the model was told. Returns the observation's kind.
 */
export function observedByModel(log: readonly LogEvent[], cell: number): string {
  const id = `execution:${cell}`;
  const received = ofKind(log, "inbox_received").filter((e) => e.body.observation.id === id);
  assert.equal(received.length, 1, `observation ${id} must enter the inbox once; the log:\n${brief(log)}`);
  const recv = received[0]!;
  const turns = ofKind(log, "turn_prepared").filter((e) => e.body.delivered.includes(id));
  assert.equal(turns.length, 1, `observation ${id} must be delivered to exactly one turn; the log:\n${brief(log)}`);
  const turn = turns[0]!;
  assert.ok(turn.seq > recv.seq, "delivered after it was received");
  const accepted = ofKind(log, "patch_accepted").filter((e) => e.body.turn === turn.body.turn);
  assert.equal(accepted.length, 1, `turn ${turn.body.turn} must have one accepted patch`);
  assert.ok(accepted[0]!.body.consumed.includes(id), `the accepted patch of ${turn.body.turn} consumed ${id}`);
  return recv.body.observation.kind;
}

/** The run ended once, with `result`, because the model concluded so (not a budget or a refusal loop). */
export function endedByConclusion(log: readonly LogEvent[], result: "success" | "failure"): void {
  const ends = ofKind(log, "run_ended");
  assert.equal(ends.length, 1, `the run must end exactly once; the log:\n${brief(log)}`);
  assert.equal(ends[0]!.body.result, result, ends[0]!.body.reason);
  assert.match(ends[0]!.body.reason, new RegExp(`^the model concluded ${result}`));
}
