/**
 * Control notes: the model's cancel, resolution and conclusion notes, acted on once each (a
 * `control_handled` event answers every one). A success conclusion runs the session's validators and
 * is refused while anything blocks it (src/state/next-step.ts: successBlockers).
 */
import { event, identity } from "../state/events.js";
import type { ControlAction } from "../state/next-step.js";
import { successBlockers } from "../state/next-step.js";
import type { ControlOutcome } from "../state/outcomes.js";
import { cancelledBeforeLaunch, controlEvents, finishedEvents } from "../state/outcomes.js";
import type { NoteCell } from "../state/schema.js";
import type { Executions } from "./executions.js";
import type { SessionContext } from "./session.js";
import { runValidator } from "./validators.js";

/** Acts on one accepted role note; commits its `control_handled` (or ends the run). */
export async function performControl(ctx: SessionContext, executions: Executions, note: NoteCell, action: ControlAction): Promise<void> {
  if (action === "resolve") {
    await control(ctx, note, "resolved", `UnknownExecution of cell ${note.target_cell_id} resolved with evidence ${(note.evidence_refs ?? []).join(", ")}`, false);
  } else if (action === "cancel") {
    await cancel(ctx, executions, note);
  } else {
    await conclude(ctx, note);
  }
}

function control(ctx: SessionContext, note: NoteCell, outcome: ControlOutcome, detail: string, observe: boolean): Promise<unknown> {
  return ctx.core.commit(controlEvents(ctx.session(), note, outcome, detail, ctx.core.nowIso(), observe));
}

async function cancel(ctx: SessionContext, executions: Executions, note: NoteCell): Promise<void> {
  const { core } = ctx;
  const target = note.target_cell_id!;
  const ex = ctx.session().executions.get(target);
  if (ex === undefined || ex.phase === "finished") {
    await control(ctx, note, "already_finished", ex === undefined ? `cell ${target} has no execution` : `cell ${target} had already finished (${ex.result})`, true);
    return;
  }
  if (ex.phase === "queued") {
    const s = ctx.session();
    const at = core.nowIso();
    const finished = finishedEvents(s, cancelledBeforeLaunch(target, note.id), at, false);
    await core.commit(controlEvents(s, note, "cancelled", `cell ${target} was cancelled before it started`, at, true, finished));
    core.metrics?.executionFinished(ex.kind, "cancelled", null);
    return;
  }
  // Started: stop the group; its result is recorded as UnknownExecution (cancelled_after_launch).
  if (await executions.cancelRunning(target)) {
    const after = ctx.session().executions.get(target);
    if (after !== undefined && after.phase === "finished" && after.result !== "UnknownExecution") {
      // It exited on its own before the stop reached it, and its result was recorded.
      await control(ctx, note, "already_finished", `cell ${target} finished (${after.result}) before the cancellation reached it`, true);
      return;
    }
    await control(ctx, note, "stopped", `cell ${target} was running; its process group was stopped, and what it did is unknown`, true);
    return;
  }
  // Started but not ours: recovery turns it into UnknownExecution; record the request.
  await control(ctx, note, "stopped", `cell ${target} was started by an earlier worker; it is recorded as UnknownExecution`, true);
}

async function conclude(ctx: SessionContext, note: NoteCell): Promise<void> {
  const { core, id } = ctx;
  const concluded = (detail: string) => [event("control_handled", id, identity.control(id, note.id), core.nowIso(), { note_id: note.id, role: "conclusion", outcome: "concluded", detail })];
  if (note.result === "failure") {
    await ctx.endRun("failure", `the model concluded failure: ${note.text}`, concluded("failure"));
    return;
  }
  const blockers = successBlockers(ctx.session());
  if (blockers.length > 0) {
    await control(ctx, note, "refused", `success refused: ${blockers.join("; ")}`, true);
    return;
  }
  const s = ctx.session();
  const done = s.validators_run.get(note.id) ?? [];
  // An operator's cancel or pause stops the validators between two (the one running finishes); the
  // driver then ends the run, or handles the note again once unpaused.
  const held = () => core.stopping() || ctx.session().terminal !== null || ctx.session().cancel_requested !== null || ctx.session().paused !== null;
  for (let i = done.length; i < s.validators.length; i++) {
    if (held()) return;
    const argv = [...s.validators[i]!];
    const r = await runValidator(core.world.executor, argv, s.cwd, core.limits.validatorWallTimeMs, core.scriptDir(s.id), core.boundary(s.id));
    if (held()) return;
    await core.commit([
      event("validator_result", id, identity.validator(id, note.id, i), core.nowIso(), {
        note_id: note.id,
        index: i,
        argv,
        exit_code: r.exit_code,
        passed: r.passed,
        output: r.output,
      }),
    ]);
    if (core.stopping()) return;
  }
  const results = ctx.session().validators_run.get(note.id) ?? [];
  const failed = results.filter((r) => !r.passed);
  if (failed.length > 0) {
    const what = failed.map((r) => `validator \`${r.argv.join(" ")}\` failed (exit ${r.exit_code ?? "none"}): ${r.output.slice(-1500)}`).join("\n");
    await control(ctx, note, "refused", `success refused: ${what}`, true);
    return;
  }
  if (held()) return;
  // Something may have arrived while the validators ran: the conditions must still hold now.
  const late = successBlockers(ctx.session());
  if (late.length > 0) {
    await control(ctx, note, "refused", `success refused: ${late.join("; ")} (arrived while the validators ran)`, true);
    return;
  }
  await ctx.endRun("success", `the model concluded success: ${note.text}`, concluded(`success; ${results.length} validator(s) passed`));
}
