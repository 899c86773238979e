/**
 * One session's driver: controls, dispatch and the round loop, woken by commits, never polling.
 *
 * Order of work in each pass: budgets, pending control notes (cancel, conclusion), dispatch of the
 * next queued cell, then a model round when there is something to decide (no turn yet, unread
 * observations, or a turn left open by a crash). Every external action happens only after the commit
 * that authorizes it has resolved.
 */
import { admit } from "../state/admission.js";
import type { NewEvent } from "../state/events.js";
import { event, identity, observationId, turnId } from "../state/events.js";
import type { ExecutionRecord, SessionProjection } from "../state/projection.js";
import { isUnresolvedUnknown } from "../state/projection.js";
import type { Cell, NoteCell, Observation } from "../state/schema.js";
import { isExecutable } from "../state/schema.js";
import { hasCode } from "../errors.js";
import { join } from "node:path";
import type { HarnessCore } from "./core.js";
import { runValidator } from "./validators.js";
import type { ExecutionOutcome } from "./world.js";

/** setTimeout's longest delay; longer waits are re-armed in chunks. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Output is recorded in events of at most this many UTF-16 units, this many per commit. */
const OUTPUT_EVENT_CHARS = 16_384;
const OUTPUT_EVENTS_PER_COMMIT = 8;

/** Splits text into pieces of at most `max` units without cutting a surrogate pair. */
export function splitText(text: string, max: number): string[] {
  if (text.length <= max) return text.length === 0 ? [] : [text];
  const out: string[] = [];
  let i = 0;
  while (i < text.length) {
    let end = Math.min(text.length, i + max);
    const last = text.charCodeAt(end - 1);
    if (end < text.length && last >= 0xd800 && last <= 0xdbff) end -= 1;
    out.push(text.slice(i, end));
    i = end;
  }
  return out;
}

/** A cell running in this process. */
interface Running {
  readonly cellId: number;
  stop(reason: "cancelled" | "shutdown"): Promise<void>;
  cancelled: boolean;
}

export class SessionDriver {
  private running: Running | null = null;
  private launching = false;
  private driving = false;
  private again = false;
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private budgetTimer: NodeJS.Timeout | null = null;
  private readonly abort = new AbortController();
  private idleWaiters: (() => void)[] = [];
  private lastError: unknown = null;
  private ending = false;
  private recovering: Promise<number> | null = null;

  constructor(
    private readonly core: HarnessCore,
    readonly id: string,
  ) {}

  /** Asks the driver to look for work. Cheap; coalesces. */
  wake(): void {
    if (this.core.stopping()) return;
    if (this.driving) {
      this.again = true;
      return;
    }
    this.driving = true;
    void this.drive().finally(() => {
      this.driving = false;
      if (this.again && !this.core.stopping()) this.wake();
      else this.notifyIdle();
    });
  }

  /** Stops this driver: aborts a model call in flight, stops the running cell's process group. */
  async stop(reason: "shutdown" | "fenced"): Promise<void> {
    this.abort.abort();
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
    if (this.budgetTimer) clearTimeout(this.budgetTimer);
    const r = this.running;
    if (r !== null) {
      this.core.logger.warn({ session: this.id, cell: r.cellId, reason }, "stopping the running cell's process group");
      await r.stop("shutdown").catch(() => undefined);
    }
    this.notifyIdle();
  }

  /** Resolves when the driver has nothing in flight (for tests and shutdown). */
  settled(): Promise<void> {
    if (!this.driving && this.running === null && !this.launching) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  get error(): unknown {
    return this.lastError;
  }

  private notifyIdle(): void {
    if (this.driving || this.running !== null || this.launching) return;
    const w = this.idleWaiters;
    this.idleWaiters = [];
    for (const f of w) f();
  }

  private get s(): SessionProjection {
    const s = this.core.session(this.id);
    if (s === undefined) throw new Error(`session ${this.id} is not in the log`);
    return s;
  }

  private async drive(): Promise<void> {
    this.lastError = null;
    try {
      for (let pass = 0; pass < 10_000 && !this.core.stopping(); pass++) {
        this.again = false;
        if (this.s.terminal !== null) return;
        if (await this.enforceBudgets()) continue;
        this.scheduleTimers();
        if (await this.handleControls()) continue;
        await this.dispatch();
        if (this.s.terminal !== null) return;
        if (this.wantsRound()) {
          await this.round();
          continue;
        }
        if (!this.again) return;
      }
    } catch (err) {
      this.lastError = err;
      if (!this.core.stopping()) {
        this.core.logger.error({ session: this.id, err }, "session driver stopped on an error");
        this.core.failed(this.id, err);
      }
    }
  }

  // ---- budgets ---------------------------------------------------------------------------------

  private async enforceBudgets(): Promise<boolean> {
    const s = this.s;
    const b = s.budgets;
    const u = s.state.runtime.usage;
    let reason: string | null = null;
    // A round still open (prepared before a crash) may finish; only a new one is over budget.
    if (b.max_rounds !== undefined && s.turn_count >= b.max_rounds && s.open_turn === null && this.wantsRound()) {
      reason = `the round budget of ${b.max_rounds} is exhausted`;
    } else if (b.max_tokens !== undefined && u.input_tokens + u.output_tokens >= b.max_tokens) {
      reason = `the token budget of ${b.max_tokens} is exhausted (${u.input_tokens + u.output_tokens} used)`;
    } else if (b.max_wall_seconds !== undefined) {
      const elapsed = (this.core.world.clock.now() - Date.parse(s.created_at)) / 1000;
      if (elapsed >= b.max_wall_seconds) reason = `the wall-time budget of ${b.max_wall_seconds} s is exhausted`;
      else if (this.budgetTimer === null) {
        // The driver may be blocked in a model call or a validator: the timer ends the run itself.
        const left = Math.ceil((b.max_wall_seconds - elapsed) * 1000) + 10;
        this.budgetTimer = setTimeout(() => {
          this.budgetTimer = null;
          if (this.core.stopping()) return;
          const now = (this.core.world.clock.now() - Date.parse(this.s.created_at)) / 1000;
          if (now < b.max_wall_seconds!) return this.wake(); // re-armed in chunks past setTimeout's range
          void this.endRun("failure", `the wall-time budget of ${b.max_wall_seconds} s is exhausted`)
            .then(() => this.abort.abort())
            .catch((err) => this.core.logger.error({ session: this.id, err }, "could not end the run at its wall-time budget"));
        }, Math.min(left, MAX_TIMER_MS));
      }
    }
    if (reason === null) return false;
    await this.endRun("failure", reason);
    return true;
  }

  private async endRun(result: "success" | "failure", reason: string, extra: NewEvent[] = []): Promise<void> {
    // Once: the budget timer and the driver may both decide to end the run.
    if (this.ending || this.s.terminal !== null) return;
    this.ending = true;
    const at = this.core.nowIso();
    try {
      await this.core.commit([...extra, event("run_ended", this.id, identity.terminal(this.id), at, { result, reason })]);
    } catch (err) {
      this.ending = false;
      throw err;
    }
    this.core.logger.info({ session: this.id, result, reason }, "run ended");
    // A finished run launches nothing more: stop what still runs.
    if (this.running !== null) await this.running.stop("shutdown").catch(() => undefined);
  }

  // ---- timers ----------------------------------------------------------------------------------

  private scheduleTimers(): void {
    for (const t of this.s.timers.values()) {
      if (t.fired || this.timers.has(t.timer_id)) continue;
      const delay = Math.max(0, Date.parse(t.due_at) - this.core.world.clock.now());
      const handle = setTimeout(() => void this.fireTimer(t.timer_id), Math.min(delay, 2 ** 31 - 1));
      this.timers.set(t.timer_id, handle);
    }
  }

  private async fireTimer(timerId: string): Promise<void> {
    const t = this.s.timers.get(timerId);
    if (t === undefined || t.fired || this.core.stopping() || this.s.terminal !== null) return;
    const now = this.core.world.clock.now();
    const due = Date.parse(t.due_at);
    if (now < due) {
      // setTimeout caps delays; reschedule the rest.
      this.timers.set(timerId, setTimeout(() => void this.fireTimer(timerId), Math.min(due - now, 2 ** 31 - 1)));
      return;
    }
    const at = this.core.nowIso();
    const late = Math.max(0, now - due);
    const obs: Observation = {
      id: observationId.timer(timerId),
      source: "timer",
      kind: "timer_fired",
      at,
      payload: { timer_id: timerId, due_at: t.due_at, late_ms: late, cell_id: t.cell_id, note: t.note },
    };
    try {
      await this.core.commit([
        event("timer_fired", this.id, identity.timerFired(this.id, timerId), at, { timer_id: timerId, due_at: t.due_at, late_ms: late }),
        event("inbox_received", this.id, identity.inbox(this.id, obs.id), at, { observation: obs }),
      ]);
      this.core.metrics?.timerFired(late / 1000);
    } catch (err) {
      if (!this.core.stopping()) this.core.logger.error({ session: this.id, err, timer: timerId }, "could not record a fired timer");
    }
    this.wake();
  }

  // ---- controls --------------------------------------------------------------------------------

  /** Acts on accepted role notes not yet handled. Returns true when it committed something. */
  private async handleControls(): Promise<boolean> {
    const s = this.s;
    for (const cell of s.cells.values()) {
      if (cell.kind !== "note" || cell.role === undefined || s.controls.has(cell.id)) continue;
      if (cell.role === "resolution") {
        await this.control(cell, "resolved", `UnknownExecution of cell ${cell.target_cell_id} resolved with evidence ${(cell.evidence_refs ?? []).join(", ")}`, false);
        return true;
      }
      if (cell.role === "cancel") {
        await this.cancel(cell);
        return true;
      }
      await this.conclude(cell);
      return true;
    }
    return false;
  }

  private async control(note: NoteCell, outcome: "cancelled" | "stopped" | "already_finished" | "resolved" | "refused" | "concluded", detail: string, observe: boolean, extra: NewEvent[] = []): Promise<void> {
    const at = this.core.nowIso();
    const events: NewEvent[] = [...extra, event("control_handled", this.id, identity.control(this.id, note.id), at, { note_id: note.id, role: note.role!, outcome, detail })];
    if (observe) {
      const obs: Observation = { id: observationId.control(note.id), source: "control", kind: `${note.role}_${outcome}`, at, payload: { note_id: note.id, outcome, detail } };
      events.push(event("inbox_received", this.id, identity.inbox(this.id, obs.id), at, { observation: obs }));
    }
    await this.core.commit(events);
  }

  private async cancel(note: NoteCell): Promise<void> {
    const target = note.target_cell_id!;
    const ex = this.s.executions.get(target);
    if (ex === undefined || ex.phase === "finished") {
      await this.control(note, "already_finished", ex === undefined ? `cell ${target} has no execution` : `cell ${target} had already finished (${ex.result})`, true);
      return;
    }
    if (ex.phase === "queued") {
      const at = this.core.nowIso();
      await this.control(note, "cancelled", `cell ${target} was cancelled before it started`, true, [
        event("execution_finished", this.id, identity.finished(this.id, target), at, {
          cell_id: target,
          result: "cancelled",
          exit_code: null,
          signal: null,
          duration_ms: null,
          output_bytes: 0,
          dropped_bytes: 0,
          detail: `cancelled by note ${note.id} before launch`,
          unknown: null,
        }),
      ]);
      this.core.metrics?.executionFinished(ex.kind, "cancelled", null);
      return;
    }
    // Started: stop the group; the runner records UnknownExecution (cancelled_after_launch).
    const r = this.running;
    if (r !== null && r.cellId === target) {
      r.cancelled = true;
      await r.stop("cancelled");
      await this.settledRun();
      const after = this.s.executions.get(target);
      if (after !== undefined && after.phase === "finished" && after.result !== "UnknownExecution") {
        // It exited on its own before the stop reached it, and its result was recorded.
        await this.control(note, "already_finished", `cell ${target} finished (${after.result}) before the cancellation reached it`, true);
        return;
      }
      await this.control(note, "stopped", `cell ${target} was running; its process group was stopped, and what it did is unknown`, true);
      return;
    }
    // Started but not ours: recovery turns it into UnknownExecution; record the request.
    await this.control(note, "stopped", `cell ${target} was started by an earlier worker; it is recorded as UnknownExecution`, true);
  }

  private async settledRun(): Promise<void> {
    for (let i = 0; i < 600 && this.running !== null; i++) await this.core.sleep(50);
  }

  private async conclude(note: NoteCell): Promise<void> {
    if (note.result === "failure") {
      await this.endRun("failure", `the model concluded failure: ${note.text}`, [
        event("control_handled", this.id, identity.control(this.id, note.id), this.core.nowIso(), { note_id: note.id, role: "conclusion", outcome: "concluded", detail: "failure" }),
      ]);
      return;
    }
    const blockers = this.successBlockers();
    if (blockers.length > 0) {
      await this.control(note, "refused", `success refused: ${blockers.join("; ")}`, true);
      return;
    }
    const s = this.s;
    const done = s.validators_run.get(note.id) ?? [];
    for (let i = done.length; i < s.validators.length; i++) {
      const argv = [...s.validators[i]!];
      const r = await runValidator(this.core.world.executor, argv, s.cwd, this.core.limits.validatorWallTimeMs, join(this.core.scriptDir, "validators"));
      if (this.core.stopping() || this.s.terminal !== null) return;
      await this.core.commit([
        event("validator_result", this.id, identity.validator(this.id, note.id, i), this.core.nowIso(), {
          note_id: note.id,
          index: i,
          argv,
          exit_code: r.exit_code,
          passed: r.passed,
          output: r.output,
        }),
      ]);
      if (this.core.stopping()) return;
    }
    const results = this.s.validators_run.get(note.id) ?? [];
    const failed = results.filter((r) => !r.passed);
    if (failed.length > 0) {
      const what = failed.map((r) => `validator \`${r.argv.join(" ")}\` failed (exit ${r.exit_code ?? "none"}): ${r.output.slice(-1500)}`).join("\n");
      await this.control(note, "refused", `success refused: ${what}`, true);
      return;
    }
    // Something may have arrived while the validators ran: the conditions must still hold now.
    const late = this.successBlockers();
    if (late.length > 0) {
      await this.control(note, "refused", `success refused: ${late.join("; ")} (arrived while the validators ran)`, true);
      return;
    }
    await this.endRun("success", `the model concluded success: ${note.text}`, [
      event("control_handled", this.id, identity.control(this.id, note.id), this.core.nowIso(), {
        note_id: note.id,
        role: "conclusion",
        outcome: "concluded",
        detail: `success; ${results.length} validator(s) passed`,
      }),
    ]);
  }

  /** The mechanical conditions a success conclusion needs, as sentences (empty: none blocks it). */
  private successBlockers(): string[] {
    const s = this.s;
    const out: string[] = [];
    const pending = [...s.executions.values()].filter((e) => e.phase !== "finished").map((e) => e.cell_id);
    if (pending.length > 0) out.push(`cells ${pending.join(", ")} have not finished`);
    const unknown = [...s.executions.values()].filter(isUnresolvedUnknown).map((e) => e.cell_id);
    if (unknown.length > 0) out.push(`the UnknownExecution of cells ${unknown.join(", ")} is unresolved`);
    if (s.pending.length > 0) out.push(`${s.pending.length} observation(s) are unread`);
    return out;
  }

  // ---- dispatch --------------------------------------------------------------------------------

  /** The queue is paused while an error or UnknownExecution has not been seen in an accepted patch. */
  private paused(): ExecutionRecord | null {
    const s = this.s;
    for (const ex of s.executions.values()) {
      if (ex.phase !== "finished") continue;
      if (ex.result !== "error" && ex.result !== "UnknownExecution") continue;
      if (!s.consumed.has(observationId.execution(ex.cell_id))) return ex;
    }
    return null;
  }

  private async dispatch(): Promise<void> {
    if (this.running !== null || this.launching || this.core.stopping()) return;
    const s = this.s;
    const started = [...s.executions.values()].find((e) => e.phase === "started");
    if (started !== undefined) return; // an earlier worker's: recovery handles it
    if (this.paused() !== null) return;
    const next = [...s.executions.values()].filter((e) => e.phase === "queued").sort((a, b) => a.queued_seq - b.queued_seq)[0];
    if (next === undefined) return;
    const cell = s.cells.get(next.cell_id);
    if (cell === undefined || !isExecutable(cell)) throw new Error(`queued execution ${next.cell_id} has no executable cell`);
    this.launching = true;
    try {
      await this.launch(cell, next);
    } finally {
      this.launching = false;
    }
  }

  private async launch(cell: Cell & { kind: "cmd" | "script" }, ex: ExecutionRecord): Promise<void> {
    const s = this.s;
    let chunk = ex.output_chunks;
    const prepared = await this.core.world.executor.prepare({
      cellId: cell.id,
      cell: cell.kind === "cmd" ? { kind: "cmd", argv: [...cell.argv] } : { kind: "script", source: cell.source },
      cwd: s.cwd,
      scriptDir: this.core.scriptDir,
      env: this.core.cellEnv(this.id, cell.id),
      wallTimeMs: this.core.limits.executionWallTimeMs,
      outputLimitBytes: this.core.limits.executionOutputLimitBytes,
      flushIntervalMs: this.core.limits.outputFlushMs,
      onOutput: async (chunks) => {
        // Small events in small commits: every adapter takes them (etcd: 1 MiB, 126 events per commit).
        const pieces = chunks.flatMap((c) => splitText(c.data, OUTPUT_EVENT_CHARS).map((data) => ({ stream: c.stream, data })));
        for (let i = 0; i < pieces.length && !this.core.stopping(); i += OUTPUT_EVENTS_PER_COMMIT) {
          const at = this.core.nowIso();
          const events = pieces.slice(i, i + OUTPUT_EVENTS_PER_COMMIT).map((c) => {
            const n = chunk++;
            return event("execution_output", this.id, identity.output(this.id, cell.id, n), at, { cell_id: cell.id, n, stream: c.stream, data: c.data });
          });
          await this.core.commit(events);
        }
      },
    });
    if (prepared.kind === "unlaunchable") {
      await this.finish(cell.id, ex.kind, prepared.outcome, null);
      return;
    }
    const at = this.core.nowIso();
    try {
      if (this.core.stopping()) throw new Error("the harness is stopping");
      await this.core.commit([event("execution_started", this.id, identity.execution(this.id, cell.id), at, { cell_id: cell.id, ...prepared.identity })]);
    } catch (err) {
      // Nothing ran: the gate still holds the child. Kill it; the execution stays queued (or, if the
      // commit's outcome is unknown, the next owner records UnknownExecution).
      await prepared.abort();
      throw err;
    }
    await this.core.faults?.("execution:started-committed", { session: this.id, cell: cell.id });
    if (this.core.stopping() || this.s.terminal !== null) {
      // Closing, fenced or ended while the launch was being authorized: the code never runs. The
      // execution stays `started`; the next owner records it as UnknownExecution.
      await prepared.abort();
      return;
    }
    const authorized = this.core.world.clock.now();
    const running: Running = { cellId: cell.id, stop: (reason) => prepared.stop(reason), cancelled: false };
    this.running = running;
    prepared.release();
    this.core.metrics?.dispatchLatency((this.core.world.clock.now() - authorized) / 1000);
    this.core.logger.info({ session: this.id, cell: cell.id, pid: prepared.identity.pid }, "cell started");
    void prepared.done
      .then(async (outcome) => {
        if (this.core.stopping() && !running.cancelled) return; // recorded as it is: the next owner decides
        await this.finish(cell.id, ex.kind, outcome, running);
      })
      .catch((err) => {
        if (!this.core.stopping()) this.core.logger.error({ session: this.id, cell: cell.id, err }, "could not record an execution's result");
      })
      .finally(() => {
        if (this.running === running) this.running = null;
        this.wake();
        this.notifyIdle();
      });
  }

  private async finish(cellId: number, kind: "script" | "cmd", outcome: ExecutionOutcome, running: Running | null): Promise<void> {
    const at = this.core.nowIso();
    const cancelledAfterLaunch = running !== null && running.cancelled;
    const result = cancelledAfterLaunch ? "UnknownExecution" : outcome.result;
    const started = this.s.executions.get(cellId)?.started;
    const unknown = cancelledAfterLaunch
      ? { type: "UnknownExecution" as const, cell_id: cellId, reason: "cancelled_after_launch", worker_stopped: true, evidence_refs: started ? [`event:${started.seq}`] : [] }
      : null;
    const body = {
      cell_id: cellId,
      result,
      exit_code: outcome.exit_code,
      signal: outcome.signal,
      duration_ms: outcome.duration_ms,
      output_bytes: outcome.output_bytes,
      dropped_bytes: outcome.dropped_bytes,
      detail: outcome.detail,
      unknown,
    } as const;
    const obs = executionObservation(cellId, at, body.result, body.exit_code, body.detail, unknown, this.s.executions.get(cellId));
    if (running !== null) await this.core.faults?.("execution:exited", { session: this.id, cell: cellId });
    await this.core.commit([
      event("execution_finished", this.id, identity.finished(this.id, cellId), at, body),
      event("inbox_received", this.id, identity.inbox(this.id, obs.id), at, { observation: obs }),
    ]);
    this.core.metrics?.executionFinished(kind, result, outcome.duration_ms / 1000);
    this.core.logger.info({ session: this.id, cell: cellId, result, exit_code: outcome.exit_code }, "cell finished");
  }

  // ---- the round loop --------------------------------------------------------------------------

  private wantsRound(): boolean {
    const s = this.s;
    if (s.terminal !== null || this.core.stopping()) return false;
    if (s.open_turn !== null) return true;
    if (s.turn_count === 0) return true;
    return s.pending.length > 0;
  }

  private async round(): Promise<void> {
    let s = this.s;
    let turn = s.open_turn;
    if (turn === null) {
      const n = s.turn_count + 1;
      turn = turnId(this.id, n);
      const delivered = s.pending.slice(0, this.core.limits.deliverPerRound);
      await this.core.commit([event("turn_prepared", this.id, identity.turn(turn), this.core.nowIso(), { turn, n, revision: s.state.revision, delivered })]);
      s = this.s;
    }
    const started = this.core.world.clock.now();
    for (;;) {
      if (this.core.stopping()) return;
      s = this.s;
      if (s.terminal !== null) return;
      const t = s.turns.get(turn)!;
      if (t.accepted !== null) return;
      let attempt: number;
      let patch: unknown;
      if (t.response !== null) {
        // A complete response was committed before a crash: admit it without calling the model.
        attempt = t.response.attempt;
        patch = t.response.patch;
      } else {
        attempt = t.attempts + 1;
        if (attempt > this.core.limits.maxAttemptsPerTurn) {
          await this.endRun("failure", `the model gave no admissible patch in ${this.core.limits.maxAttemptsPerTurn} attempts for round ${turn}`);
          return;
        }
        const last = t.rejections[t.rejections.length - 1];
        await this.core.commit([event("model_attempt", this.id, identity.attempt(turn, attempt), this.core.nowIso(), { turn, attempt })]);
        let reply: { patch: unknown; usage: { input_tokens: number; output_tokens: number } | null };
        try {
          reply = await this.core.model.step({
            state: this.s.state,
            turn,
            attempt,
            ...(last !== undefined ? { rejection: { code: last.code, reason: last.reason, patch: last.patch ?? null } } : {}),
            signal: this.abort.signal,
          });
          if (reply === null || typeof reply !== "object") throw new TypeError(`the model returned ${String(reply)} instead of {patch, usage}`);
        } catch (err) {
          if (this.core.stopping() || this.s.terminal !== null) return;
          // A ModelError says whether to retry; anything else (a provider bug) is retried within the
          // attempt budget, and recorded like any failed attempt.
          const me = err as Error & { retryable?: boolean; usage?: { input_tokens: number; output_tokens: number } | null };
          const retryable = hasCode(err, "model") ? me.retryable === true : true;
          const message = err instanceof Error ? err.message : String(err);
          this.core.metrics?.modelAttempt("error");
          await this.core.commit([
            event("model_attempt_failed", this.id, identity.attemptFailed(turn, attempt), this.core.nowIso(), { turn, attempt, error: message, retryable, usage: hasCode(err, "model") ? (me.usage ?? null) : null }),
          ]);
          this.core.logger.warn({ session: this.id, turn, attempt, retryable, err: message }, "model attempt failed");
          if (!retryable) {
            await this.endRun("failure", `the model call failed and cannot be retried: ${message}`);
            return;
          }
          this.core.metrics?.modelRetry();
          await this.core.sleep(this.core.limits.retryBaseMs * 2 ** (attempt - 1));
          continue;
        }
        this.core.metrics?.modelAttempt("ok");
        if (reply.usage) this.core.metrics?.tokens(reply.usage.input_tokens, reply.usage.output_tokens);
        try {
          await this.core.commit([event("model_response", this.id, identity.response(turn, attempt), this.core.nowIso(), { turn, attempt, patch: toJson(reply.patch), usage: reply.usage ?? null })]);
        } catch (err) {
          if (!(hasCode(err, "rejected") && (err as { reason?: string }).reason === "too_large")) throw err;
          // Too large to record durably: refuse it like an inadmissible patch, and say why.
          const bytes = JSON.stringify(reply.patch ?? null).length;
          await this.core.commit([
            event("patch_rejected", this.id, identity.rejected(turn, attempt), this.core.nowIso(), {
              turn,
              attempt,
              code: "too_large",
              reason: `the patch is too large to record (${bytes} bytes of JSON): keep each step well under 512 KiB, e.g. split a large script or write big files from several cells`,
            }),
          ]);
          continue;
        }
        await this.core.faults?.("model:response-committed", { session: this.id, turn });
        patch = reply.patch;
      }
      const done = await this.admitPatch(turn, attempt, patch);
      if (done) {
        this.core.metrics?.modelRound((this.core.world.clock.now() - started) / 1000);
        return;
      }
    }
  }

  /** Admits a committed response. Returns true when accepted (or the round is over). */
  private async admitPatch(turn: string, attempt: number, patch: unknown): Promise<boolean> {
    const s = this.s;
    const accepted = new Map<string, { patch: unknown; revision: number; newCellIds: number[] }>();
    for (const t of s.turns.values()) {
      if (t.accepted !== null) accepted.set(t.turn, { patch: t.accepted.patch, revision: t.accepted.revision, newCellIds: [] });
    }
    const result = admit(
      { state: s.state, executions: s.executions, cellsEver: s.cells, pendingObservations: s.pending.length, headSeq: this.core.headSeq(), accepted },
      patch,
      turn,
    );
    const at = this.core.nowIso();
    if (!result.ok) {
      this.core.metrics?.patchRejected(result.code);
      this.core.logger.info({ session: this.id, turn, attempt, code: result.code, reason: result.reason }, "patch rejected");
      await this.core.commit([event("patch_rejected", this.id, identity.rejected(turn, attempt), at, { turn, attempt, code: result.code, reason: result.reason })]);
      return false;
    }
    const r = result.receipt;
    if (r.replay) return true;
    const events: NewEvent[] = [
      event("patch_accepted", this.id, identity.patch(turn), at, {
        turn,
        attempt,
        patch: toJson(patch),
        revision: r.revision,
        new_cell_ids: r.newCells.map((c) => c.id),
        removed_ids: [...r.removedIds],
        consumed: [...r.consumed],
      }),
    ];
    for (const c of r.newCells) {
      if (isExecutable(c)) events.push(event("execution_queued", this.id, identity.queued(this.id, c.id), at, { cell_id: c.id, kind: c.kind }));
    }
    // Idle: nothing left to wait for and nothing decided. Tell the model, and end a run that idles on.
    const controls = r.newCells.some((c) => c.kind === "note" && c.role !== undefined);
    const work = r.newCells.some(isExecutable) || [...s.executions.values()].some((e) => e.phase !== "finished");
    const timers = [...s.timers.values()].some((t) => !t.fired);
    if (!controls && !work && !timers && s.pending.length === 0) {
      const n = s.idle_total + 1;
      const obs: Observation = {
        id: observationId.idle(n),
        source: "idle",
        kind: "invalid_idle",
        at,
        payload: {
          message: "Your last patch left no work, no timer and nothing to wait for. Add a cell to run, or conclude with a conclusion note (success or failure).",
          idle_streak: s.idle_streak + 1,
          limit: this.core.limits.maxIdle,
        },
      };
      events.push(event("inbox_received", this.id, identity.inbox(this.id, obs.id), at, { observation: obs }));
      if (s.idle_streak + 1 >= this.core.limits.maxIdle) {
        events.push(event("run_ended", this.id, identity.terminal(this.id), at, { result: "failure", reason: `the model made ${this.core.limits.maxIdle} idle decisions in a row` }));
      }
    }
    await this.core.commit(events);
    this.core.logger.info({ session: this.id, turn, revision: r.revision, new_cells: r.newCells.map((c) => c.id) }, "patch accepted");
    await this.core.faults?.("patch:committed", { session: this.id, turn });
    return true;
  }

  // ---- recovery --------------------------------------------------------------------------------

  /**
   * Turns every `started` execution without a result into UnknownExecution, after stopping a
   * surviving child (same host, pid AND start time). Never re-runs anything.
   */
  recover(): Promise<number> {
    if (this.recovering === null) {
      this.recovering = this.recoverOnce().finally(() => {
        this.recovering = null;
      });
    }
    return this.recovering;
  }

  private async recoverOnce(): Promise<number> {
    let n = 0;
    for (const ex of [...this.s.executions.values()]) {
      if (ex.phase !== "started" || ex.started === null) continue;
      if (this.running !== null && this.running.cellId === ex.cell_id) continue;
      if (this.launching) continue; // this driver's own launch, being authorized right now
      let stopped: { worker_stopped: boolean; detail: string };
      if (ex.started.host !== this.core.world.host) {
        stopped = { worker_stopped: false, detail: `the cell ran on host ${ex.started.host}; this is ${this.core.world.host}, so its process could not be checked or stopped from here` };
      } else {
        stopped = await this.core.world.stopSurvivor(ex.started, { graceMs: this.core.limits.stopGraceMs });
      }
      const at = this.core.nowIso();
      const unknown = {
        type: "UnknownExecution" as const,
        cell_id: ex.cell_id,
        reason: "worker_lost_before_result_commit",
        worker_stopped: stopped.worker_stopped,
        evidence_refs: [`event:${ex.started.seq}`],
      };
      const detail = `the worker that started this cell stopped before recording its result; ${stopped.detail}`;
      const obs = executionObservation(ex.cell_id, at, "UnknownExecution", null, detail, unknown, ex);
      await this.core.commit([
        event("execution_finished", this.id, identity.finished(this.id, ex.cell_id), at, {
          cell_id: ex.cell_id,
          result: "UnknownExecution",
          exit_code: null,
          signal: null,
          duration_ms: null,
          output_bytes: ex.output_bytes,
          dropped_bytes: 0,
          detail,
          unknown,
        }),
        event("inbox_received", this.id, identity.inbox(this.id, obs.id), at, { observation: obs }),
      ]);
      this.core.metrics?.executionFinished(ex.kind, "UnknownExecution", null);
      this.core.logger.warn({ session: this.id, cell: ex.cell_id, worker_stopped: stopped.worker_stopped }, "recorded UnknownExecution");
      n++;
    }
    return n;
  }
}

function executionObservation(
  cellId: number,
  at: string,
  result: string,
  exitCode: number | null,
  detail: string | null,
  unknown: unknown,
  ex: ExecutionRecord | undefined,
): Observation {
  const payload: Record<string, unknown> = { cell_id: cellId, result, exit_code: exitCode };
  if (detail !== null) payload.detail = detail;
  if (unknown !== null) payload.unknown = unknown;
  if (ex !== undefined && ex.output_tail.length > 0) payload.output_tail = ex.output_tail.slice(-2000);
  return { id: observationId.execution(cellId), source: "execution", kind: `execution_${result}`, at, payload: payload as Observation["payload"] };
}

/** A model's patch as stored: plain JSON (undefined and functions dropped), so it reads back equal. */
function toJson(value: unknown): unknown {
  return value === undefined ? null : JSON.parse(JSON.stringify(value));
}
