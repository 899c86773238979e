/**
 * One session's driver: a small loop that asks `nextStep` (src/state/next-step.ts) what to do and
 * performs it, woken by commits, timers and finished cells, never polling.
 *
 * Each step commits something before the next is decided, so the loop always moves; a step that
 * would repeat on an unchanged log is a bug and stops the driver with an error that says so. Every
 * external action happens only after the commit that authorizes it has resolved. The effects live
 * beside it: executions.ts (dispatch, launch, finish, recover), round.ts (the model round),
 * controls.ts (cancel, resolution, conclusion), timers.ts (session timers and the wall-time budget).
 */
import type { StopReason } from "./stop.js";
import type { NewEvent } from "../state/events.js";
import { event, identity } from "../state/events.js";
import type { NextStep } from "../state/next-step.js";
import { interrupts, nextStep, unfinished } from "../state/next-step.js";
import type { RunResult } from "../state/schema.js";
import { cancelledQueued, cancelledReason } from "../state/steer.js";
import type { SessionProjection } from "../state/projection.js";
import { isExecutable, type Cell } from "../state/schema.js";
import type { HarnessCore } from "./core.js";
import { performControl } from "./controls.js";
import { Executions } from "./executions.js";
import { runRound } from "./round.js";
import { RunBlocked } from "./model-retry.js";
import { SessionTimers } from "./timers.js";
import { speculate } from "../state/speculate.js";
import { backoffDelay, type Backoff } from "../storage/backoff.js";

/** The re-drive of a session whose pass failed: 1 s, doubling to 60 s (see scheduleRetry). */
const REDRIVE_BACKOFF: Backoff = { baseMs: 1000, maxMs: 60_000 };

export { splitText } from "./executions.js";

/** What the parts of a session's driver share. */
export interface SessionContext {
  readonly core: HarnessCore;
  readonly id: string;
  /** The session's projection now (it changes after every commit). */
  session(): SessionProjection;
  /** Aborted when the driver stops or the run ends from outside the loop: a model call in flight gives up. */
  readonly signal: AbortSignal;
  /** Commits `before` and `run_ended` once (the budget timer and the loop may both decide to end it), then stops what still runs. */
  endRun(result: RunResult, reason: string, before?: readonly NewEvent[]): Promise<void>;
  /** Asks the driver to look for work. */
  wake(): void;
  /**
   * Hands the driver events to commit with its next step (a finished cell's result and observation):
   * they are committed before anything else the session does, and together with the next round's
   * first commit when a round comes next.
   */
  carry(events: readonly NewEvent[]): void;
  /**
   * An accepted patch adds `cells` and its commit is about to be sent: the gate of the one that will
   * be dispatched next may be started now, while that commit is in flight (Executions.prepareEarly).
   */
  prepareEarly(cells: readonly Cell[]): void;
}

export class SessionDriver implements SessionContext {
  private driving = false;
  private again = false;
  private readonly abort = new AbortController();
  private idleWaiters: (() => void)[] = [];
  private lastError: unknown = null;
  /** False while the run is blocked and nobody resumed it: wake-ups do not call the model again. */
  private retryBlocked = false;
  private ending: Promise<void> | null = null;
  /** Passes that failed in a row (0: the last pass ended cleanly), for the re-drive's back-off, and its pending timer. */
  private failedPasses = 0;
  private retryHandle: unknown = null;
  private readonly executions: Executions;
  private readonly timers: SessionTimers;
  private carried: NewEvent[] = [];

  constructor(
    readonly core: HarnessCore,
    readonly id: string,
  ) {
    this.executions = new Executions(this, () => this.notifyIdle());
    this.timers = new SessionTimers(this, core.timers, () => this.abort.abort());
  }

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  session(): SessionProjection {
    const s = this.core.session(this.id);
    if (s === undefined) throw new Error(`session ${this.id} is not in the log`);
    return s;
  }

  carry(events: readonly NewEvent[]): void {
    if (this.driving) {
      // The driver is busy with something else (a model call): no waiting for it, commit now.
      void this.core.commit(events).catch((err: unknown) => {
        this.core.logger.error({ session: this.id, err }, "could not record an execution's result; the driver tries again");
        this.recarry(events);
        this.wake();
      });
      return;
    }
    this.carried.push(...events);
    this.wake();
  }

  prepareEarly(cells: readonly Cell[]): void {
    // Only when the first new executable cell will be the next dispatched: no execution queued or
    // running before it. Were another step to come first after all, it discards the gate.
    const first = cells.find(isExecutable);
    if (first === undefined || this.executions.busy) return;
    for (const ex of unfinished(this.session())) if (ex.phase === "queued") return;
    this.executions.prepareEarly(first);
  }

  /**
   * Puts back carried events whose commit failed, so the driver's next pass (or its retry after a
   * back-off) commits them: a finished cell's result is never dropped while this owner runs. A batch
   * is committed atomically, so its `execution_finished` in the log says whether it was committed.
   */
  private recarry(events: readonly NewEvent[]): void {
    if (events.length === 0 || this.core.stopping()) return;
    // An execution this driver launched that the projection no longer holds was finished and then
    // dropped from history (src/state/history.ts drops only finished executions), maybe by the fold
    // of the very commit that carried its result: that commit happened.
    const done = events.some((e) => {
      if (e.kind !== "execution_finished") return false;
      const ex = this.core.session(this.id)?.executions.get(e.body.cell_id);
      return ex === undefined || ex.phase === "finished";
    });
    if (!done) this.carried = [...events, ...this.carried];
  }

  /** Asks the driver to look for work. Cheap; coalesces. */
  wake(): void {
    if (this.core.stopping()) return;
    this.interrupt();
    if (this.driving) {
      this.again = true;
      return;
    }
    this.driving = true;
    void this.drive().finally(() => {
      // A gate prepared ahead that this pass did not launch: nothing will (see prepareEarly).
      void this.executions.discardEarly();
      this.driving = false;
      if (this.again && !this.core.stopping()) this.wake();
      else this.notifyIdle();
    });
  }

  /** Stops this driver: aborts a model call in flight, stops the running cell's process group. */
  async stop(reason: "shutdown" | StopReason): Promise<void> {
    this.abort.abort();
    this.timers.stop();
    this.cancelRetry();
    await this.executions.stopRunning(reason);
    this.notifyIdle();
  }

  /** Resolves when the driver has nothing in flight (for tests and shutdown). */
  settled(): Promise<void> {
    if (!this.driving && !this.executions.busy) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** The error that stopped the last pass of the loop, if one did. */
  get error(): unknown {
    return this.lastError;
  }

  /** Records every `started` execution without a result as UnknownExecution (see Executions.recover). */
  recover(): Promise<number> {
    // A resume is the operator saying the cause is fixed: a blocked run calls the model again.
    this.retryBlocked = true;
    // A fork being copied holds its origin's started cells until their results are copied: they run
    // (or ran) under the origin, and the fork's copier, not recovery, records what became of them.
    if ((this.core.session(this.id)?.forming ?? null) !== null) return Promise.resolve(0);
    return this.executions.recover();
  }

  /**
   * Acts on what cannot wait for the loop (src/state/next-step.ts `interrupts`): an operator's cancel
   * aborts a model call in flight and stops the running cell; a pause with `now` stops the running
   * cell. The stopped cell's result is committed by its own path (Executions.stopFor).
   */
  private interrupt(): void {
    const s = this.core.session(this.id);
    if (s === undefined) return;
    const i = interrupts(s, this.executions.runningCell);
    if (i.abortModel && !this.abort.signal.aborted) this.abort.abort();
    if (i.stopCell !== null) {
      const { cell_id, as } = i.stopCell;
      void this.executions.stopFor(cell_id, as === "cancel" ? "cancel_run" : "pause").catch((err: unknown) => {
        if (!this.core.stopping()) this.core.logger.error({ session: this.id, cell: cell_id, err }, "could not stop the running cell");
      });
    }
  }

  endRun(result: RunResult, reason: string, before: readonly NewEvent[] = []): Promise<void> {
    if (this.ending !== null) return this.ending;
    if (this.session().terminal !== null) return Promise.resolve();
    const ending = this.endOnce(result, reason, before);
    this.ending = ending;
    // A failed commit may be retried by the next decision; a committed end stays.
    ending.catch(() => {
      if (this.ending === ending) this.ending = null;
    });
    return ending;
  }

  private async endOnce(result: RunResult, reason: string, before: readonly NewEvent[]): Promise<void> {
    await this.core.commit([...before, event("run_ended", this.id, identity.terminal(this.id), this.core.nowIso(), { result, reason })]);
    this.core.logger.info({ session: this.id, result, reason }, "run ended");
    // A finished run launches nothing more: stop what still runs.
    await this.executions.stopRunning("shutdown");
  }

  private notifyIdle(): void {
    if (this.driving || this.executions.busy) return;
    const w = this.idleWaiters;
    this.idleWaiters = [];
    for (const f of w) f();
  }

  private async drive(): Promise<void> {
    const previous = this.lastError;
    this.lastError = null;
    let last: { step: string; seq: number } | null = null;
    /** Carried events taken by this pass and maybe not committed yet (kept for the retry if it fails). */
    let taken: readonly NewEvent[] = [];
    try {
      while (!this.core.stopping()) {
        this.again = false;
        this.interrupt();
        const carried = this.carried;
        const s = carried.length > 0 ? speculate(this.session(), carried) : this.session();
        const now = this.core.world.clock.now();
        const step = s === null ? null : nextStep({ session: s, limits: this.core.limits, now, busy: this.executions.busy, approval: this.core.approval });
        if (step === null || step.kind !== "dispatch") void this.executions.discardEarly();
        const roundNext = s !== null && step !== null && step.kind === "round" && step.prepare && !(s.blocked !== null && !this.retryBlocked);
        if (carried.length > 0 && !roundNext) {
          // What comes next is not a new round: the carried events go alone, now.
          this.carried = [];
          taken = carried;
          await this.core.commit(carried);
          taken = [];
          continue;
        }
        this.timers.arm(this.session(), now);
        if (s === null || step === null || step.kind === "ended" || step.kind === "wait") {
          this.failedPasses = 0;
          return;
        }
        // Blocked (a refused key, a wrong model): parked until `resume`; other work still moves.
        if (step.kind === "round" && s.blocked !== null && !this.retryBlocked) {
          // Still blocked: a `wait` asked after this pass must hear why, as one asked before it did.
          if (previous instanceof RunBlocked) this.lastError = previous;
          return;
        }
        const name = describe(step);
        if (last !== null && last.step === name && last.seq === s.last_seq) {
          throw new Error(`the driver of session ${this.id} made no progress: step ${name} committed nothing`);
        }
        last = { step: name, seq: s.last_seq };
        if (carried.length > 0 && step.kind === "round") {
          this.carried = [];
          taken = carried;
          await runRound(this, step, carried);
          taken = [];
          continue;
        }
        await this.perform(step);
      }
    } catch (err) {
      this.lastError = err;
      this.recarry(taken);
      if (err instanceof RunBlocked) this.retryBlocked = false;
      if (!this.core.stopping()) {
        if (err instanceof RunBlocked) this.core.logger.warn({ session: this.id, cause: err.cause, err: err.message }, "run blocked: waiting for an operator");
        else this.core.logger.error({ session: this.id, err, retry_in_ms: this.nextRetryMs() }, "session driver stopped on an error; it tries again");
        this.core.failed(this.id, err);
        if (!(err instanceof RunBlocked)) this.scheduleRetry();
      }
    }
  }

  /**
   * A pass that failed (a commit refused or failed before it was sent, a launch that threw) is tried
   * again after a back-off (1 s doubling to 60 s): every step is decided anew from the durable log and
   * committed under its identity, so a retry never repeats what already happened. Without it a long-
   * lived worker (`cairn serve`) would leave the run wedged until it restarts. Fencing and a poisoned
   * handle stop the harness instead (`stopping()`), and a blocked run waits for `resume`.
   */
  private nextRetryMs(): number {
    return backoffDelay(REDRIVE_BACKOFF, this.failedPasses + 1);
  }

  private scheduleRetry(): void {
    if (this.retryHandle !== null || this.core.stopping()) return;
    const delay = this.nextRetryMs();
    this.failedPasses++;
    const handle = this.core.timers.setTimeout(() => {
      this.retryHandle = null;
      this.wake();
    }, delay);
    // A pending retry alone never keeps a process alive (a CLI that is done exits).
    (handle as { unref?: () => void } | null)?.unref?.();
    this.retryHandle = handle;
  }

  private cancelRetry(): void {
    if (this.retryHandle === null) return;
    this.core.timers.clearTimeout(this.retryHandle);
    this.retryHandle = null;
  }

  /**
   * Ends a run an operator cancelled: a cell an earlier worker left started is stopped and recorded
   * (cancelled; Executions.recover), queued cells are cancelled, and the run ends as `cancelled`.
   * Nothing runs here (nextStep asks only when no cell is busy).
   */
  private async cancelRun(): Promise<void> {
    await this.executions.recover();
    await this.core.faults?.("cancel:cells-stopped", { session: this.id });
    const s = this.session();
    if (s.terminal !== null) return;
    const at = this.core.nowIso();
    const before = cancelledQueued(s, at);
    await this.endRun("cancelled", cancelledReason(s), before);
    for (const e of before) if (e.kind === "execution_finished") this.core.metrics?.executionFinished(s.executions.get(e.body.cell_id)?.kind ?? "cmd", "cancelled", null);
  }

  /** Records that cell `cellId`, next to launch, waits for a person's approval under `rule`. */
  private async requestApproval(cellId: number, rule: string): Promise<void> {
    await this.core.commit([event("approval_requested", this.id, identity.approvalRequested(this.id, cellId), this.core.nowIso(), { cell_id: cellId, rule })]);
    this.core.logger.warn({ session: this.id, cell: cellId, rule }, "cell waits for approval (cairn approve / cairn deny)");
    await this.core.faults?.("approval:requested", { session: this.id, cell: cellId });
  }

  private async perform(step: Exclude<NextStep, { kind: "ended" | "wait" }>): Promise<void> {
    switch (step.kind) {
      case "end_run":
        return this.endRun(step.result, step.reason);
      case "cancel_run":
        return this.cancelRun();
      case "request_approval":
        return this.requestApproval(step.cell.id, step.rule);
      case "fire_timer":
        return this.timers.fire(step.timer.timer_id);
      case "control":
        return performControl(this, this.executions, step.note, step.action);
      case "dispatch":
        return this.executions.launch(step.cell, step.execution);
      case "round":
        return runRound(this, step);
    }
  }
}

function describe(step: Exclude<NextStep, { kind: "ended" | "wait" }>): string {
  switch (step.kind) {
    case "end_run":
      return "end_run";
    case "cancel_run":
      return "cancel_run";
    case "request_approval":
      return `request_approval:${step.cell.id}`;
    case "fire_timer":
      return `fire_timer:${step.timer.timer_id}`;
    case "control":
      return `control:${step.note.id}`;
    case "dispatch":
      return `dispatch:${step.cell.id}`;
    case "round":
      return `round:${step.turn}`;
  }
}
