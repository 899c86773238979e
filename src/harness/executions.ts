/**
 * A session's executions in this process: launch one (authorized by its `execution_started` commit),
 * record its output and result, stop it (cancel, shutdown, fence), and recover what an earlier worker
 * left `started` (UnknownExecution; nothing is ever re-run).
 */
import type { StopReason } from "./stop.js";
import { event, identity } from "../state/events.js";
import type { FinishedBody, ProcessOutcome, StoppedBy } from "../state/outcomes.js";
import { neverRan } from "../state/steer.js";
import { finishedEvents, lostWorker, processFinished } from "../state/outcomes.js";
import type { ExecutionRecord } from "../state/projection.js";
import type { ExecutableCell } from "../state/schema.js";
import type { SessionContext } from "./session.js";
import type { CellSpan } from "../observability/tracing.js";
import type { LaunchSpec, Prepared } from "./world.js";

/** A launch's spec, its span, and what ends it on the harness's side (its cell token, its span). */
interface Launch {
  readonly spec: LaunchSpec;
  readonly trace: CellSpan;
  readonly ended: () => void;
}

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

/** What a gate started for `cell` runs: its kind and its argv or source (the rest is the session's). */
function codeOf(cell: ExecutableCell): string {
  return JSON.stringify(cell.kind === "cmd" ? ["cmd", cell.argv] : ["script", cell.source]);
}

/** A cell running in this process. */
interface Running {
  readonly cellId: number;
  stop(reason: "cancelled" | "shutdown", settleWithinMs?: number): Promise<void>;
  /** Set once something stopped it on purpose (a cancel note, a pause with `now`, a cancel of the run). */
  stoppedBy: StoppedBy | null;
  /** Resolves once its result is recorded (or given up on) and it is no longer running. */
  readonly over: Promise<void>;
}

export class Executions {
  private running: Running | null = null;
  private launching = false;
  /** A gate being prepared ahead for the execution about to be queued (see prepareEarly). */
  private early: { readonly cellId: number; readonly code: string; readonly launch: Launch; readonly prepared: Promise<Prepared> } | null = null;
  private recovering: Promise<number> | null = null;
  /** Cells whose result was handed to the driver (`carry`) and may not be in the log yet: not lost. */
  private readonly handedOver = new Set<number>();

  constructor(
    private readonly ctx: SessionContext,
    private readonly onIdle: () => void,
  ) {}

  /** A cell runs in this process, or is being launched. */
  get busy(): boolean {
    return this.running !== null || this.launching;
  }

  /** The id of the cell running in this process (released), or null. */
  get runningCell(): number | null {
    return this.running?.cellId ?? null;
  }

  /**
   * Stops cell `cellId` for an operator (a pause with `now`, a cancel of the run) when it runs in
   * this process; resolves once its result is committed. Once per cell: a second call shares nothing
   * and returns at once. False when it does not run here.
   */
  async stopFor(cellId: number, by: "pause" | "cancel_run"): Promise<boolean> {
    const r = this.running;
    if (r === null || r.cellId !== cellId || r.stoppedBy !== null) return false;
    r.stoppedBy = by;
    this.ctx.core.logger.info({ session: this.ctx.id, cell: cellId, by }, "stopping the running cell for an operator");
    await r.stop("cancelled");
    await r.over;
    return true;
  }

  /** Stops the running cell's process group, if one runs (its execution stays `started`). */
  async stopRunning(reason: "shutdown" | StopReason): Promise<void> {
    await this.discardEarly();
    const r = this.running;
    if (r === null) return;
    if (reason !== "shutdown" || this.ctx.core.stopping()) {
      this.ctx.core.logger.warn({ session: this.ctx.id, cell: r.cellId, reason }, "stopping the running cell's process group");
    }
    // The kill is waited for; the cell's last output, at most one lease length (see stopWaitMs).
    await r.stop("shutdown", this.ctx.core.stopWaitMs()).catch(() => undefined);
  }

  /**
   * Stops cell `cellId` for a cancel note when it runs in this process, and resolves once its result
   * (UnknownExecution, or what it recorded on its own) is committed. False when it does not run here.
   */
  async cancelRunning(cellId: number): Promise<boolean> {
    const r = this.running;
    if (r === null || r.cellId !== cellId) return false;
    r.stoppedBy ??= "note";
    await r.stop("cancelled");
    await r.over;
    return true;
  }

  /** Launches the queued execution of `cell`: prepared, authorized by a commit, then released. */
  async launch(cell: ExecutableCell, ex: ExecutionRecord): Promise<void> {
    if (this.busy) throw new Error(`session ${this.ctx.id} cannot launch cell ${cell.id}: cell ${this.running?.cellId ?? "?"} is running`);
    this.launching = true;
    try {
      await this.launchOnce(cell, ex);
    } finally {
      this.launching = false;
    }
  }

  /**
   * `executor.prepare`, with a launch that throws (a bug, a script file that cannot be written)
   * turned into what it is: an execution that could not start, recorded as finished with result
   * `error` and the reason. It never ran, so it is not uncertain, and the run goes on.
   */
  private async prepareOrError(cellId: number, spec: LaunchSpec): Promise<Prepared> {
    const { core, id } = this.ctx;
    try {
      return await core.world.executor.prepare(spec);
    } catch (err) {
      if (core.stopping()) throw err;
      const why = err instanceof Error ? err.message : String(err);
      core.logger.error({ session: id, cell: cellId, err }, "the launch failed before the cell could start");
      return {
        kind: "unlaunchable",
        outcome: { result: "error", exit_code: null, signal: null, duration_ms: 0, output_bytes: 0, dropped_bytes: 0, detail: `the cell could not be started: ${why.slice(0, 1000)}` },
      };
    }
  }

  /**
   * Starts preparing `cell`'s gate now, while the commit that queues its execution is in flight, so
   * that the gate's start (a fork, three connections, about 2 to 4 ms here) is off the round's
   * critical path. Nothing runs: the gate holds the child until `execution_started` is durable, as
   * for every launch. The next launch of that cell uses it; anything else the driver does first
   * discards it (discardEarly: the gate exits 125, having run nothing).
   */
  prepareEarly(cell: ExecutableCell): void {
    if (this.busy || this.ctx.core.stopping()) return;
    if (this.early !== null) {
      if (this.early.cellId === cell.id && this.early.code === codeOf(cell)) return;
      // Left by a patch that never became durable (its commit refused, a later attempt won): its
      // cell id may now name other code.
      void this.discardEarly();
    }
    const launch = this.launchSpec(cell, 0);
    const prepared = this.prepareOrError(cell.id, launch.spec);
    prepared.catch(() => undefined); // rejected only when stopping; launch or discardEarly sees it
    this.early = { cellId: cell.id, code: codeOf(cell), launch, prepared };
  }

  /** Aborts a gate prepared ahead (prepareEarly) that no launch took; resolves once it is gone. */
  discardEarly(): Promise<void> {
    const early = this.early;
    if (early === null) return Promise.resolve();
    this.early = null;
    early.launch.ended();
    return early.prepared.then((p) => (p.kind === "gated" ? p.abort() : undefined)).catch(() => undefined);
  }

  /** The launch of `cell`, whose output so far is `firstChunk` events. */
  private launchSpec(cell: ExecutableCell, firstChunk: number): Launch {
    const { core, id } = this.ctx;
    const s = this.ctx.session();
    let chunk = firstChunk;
    const { env, boundary, ended } = core.cellLaunch(id, cell.id);
    const trace = core.tracing.cell(core.name, id, cell);
    const spec: LaunchSpec = {
      cellId: cell.id,
      cell: cell.kind === "cmd" ? { kind: "cmd", argv: [...cell.argv] } : { kind: "script", source: cell.source },
      cwd: s.cwd,
      scriptDir: core.scriptDir(id),
      env: { ...env, ...trace.env },
      boundary,
      wallTimeMs: core.limits.executionWallTimeMs,
      outputLimitBytes: core.limits.executionOutputLimitBytes,
      flushIntervalMs: core.limits.outputFlushMs,
      onOutput: async (chunks) => {
        // Small events in small commits: every adapter takes them (etcd: 1 MiB, 126 events per commit).
        const pieces = chunks.flatMap((c) => splitText(c.data, OUTPUT_EVENT_CHARS).map((data) => ({ stream: c.stream, data })));
        for (let i = 0; i < pieces.length && !core.stopping(); i += OUTPUT_EVENTS_PER_COMMIT) {
          const at = core.nowIso();
          const events = pieces.slice(i, i + OUTPUT_EVENTS_PER_COMMIT).map((c) => {
            const n = chunk++;
            return event("execution_output", id, identity.output(id, cell.id, n), at, { cell_id: cell.id, n, stream: c.stream, data: c.data });
          });
          await core.commit(events);
        }
      },
    };
    return { spec, trace, ended: () => (ended(), trace.end()) };
  }

  private async launchOnce(cell: ExecutableCell, ex: ExecutionRecord): Promise<void> {
    const { core, id } = this.ctx;
    const early = this.early;
    this.early = null;
    let prepared: Prepared;
    let launch: Launch;
    // Only a gate started for this very code: one started for a patch whose commit was refused may
    // carry the same cell id with other code.
    if (early !== null && early.cellId === cell.id && early.code === codeOf(cell) && ex.output_chunks === 0) {
      launch = early.launch;
      prepared = await early.prepared;
    } else {
      if (early !== null) {
        this.early = early;
        void this.discardEarly();
      }
      launch = this.launchSpec(cell, ex.output_chunks);
      prepared = await this.prepareOrError(cell.id, launch.spec);
    }
    if (prepared.kind === "unlaunchable") {
      launch.trace.outcome(prepared.outcome);
      launch.ended();
      await this.finish(cell.id, ex.kind, prepared.outcome, null);
      return;
    }
    const contained = { sandbox: launch.spec.boundary?.sandbox.kind ?? "none", network: launch.spec.boundary?.network ?? "host" } as const;
    try {
      if (core.stopping()) throw new Error("the harness is stopping");
      await core.commit([event("execution_started", id, identity.execution(id, cell.id), core.nowIso(), { cell_id: cell.id, ...prepared.identity, ...contained })]);
    } catch (err) {
      // Nothing ran: the gate still holds the child. Kill it; the execution stays queued (or, if the
      // commit's outcome is unknown, the next owner records UnknownExecution).
      launch.ended();
      await prepared.abort();
      throw err;
    }
    await core.faults?.("execution:started-committed", { session: id, cell: cell.id });
    if (core.stopping() || this.ctx.session().terminal !== null) {
      // Closing, fenced or ended while the launch was being authorized: the code never runs. The
      // execution stays `started`; the next owner records it as UnknownExecution.
      launch.ended();
      await prepared.abort();
      return;
    }
    if (this.ctx.session().cancel_requested !== null) {
      // Cancelled while the launch was being authorized: the gate never released it, so it never ran.
      launch.ended();
      await prepared.abort();
      await this.commitFinished(neverRan(cell.id, "the run was cancelled while this cell's launch was being authorized; it never ran"), core.nowIso());
      return;
    }
    const authorized = core.world.clock.now();
    let over!: () => void;
    const running: Running = { cellId: cell.id, stop: (reason, ms) => prepared.stop(reason, ms), stoppedBy: null, over: new Promise<void>((resolve) => (over = resolve)) };
    this.running = running;
    prepared.release();
    core.metrics?.dispatchLatency((core.world.clock.now() - authorized) / 1000);
    core.metrics?.cellLaunched(contained.sandbox, contained.network);
    core.logger.info({ session: id, cell: cell.id, pid: prepared.identity.pid }, "cell started");
    void prepared.done
      .then(async (outcome) => {
        launch.trace.outcome(outcome);
        if (core.stopping() && running.stoppedBy === null) return; // recorded as it is: the next owner decides
        await this.finish(cell.id, ex.kind, outcome, running);
      })
      .catch((err) => {
        if (!core.stopping()) core.logger.error({ session: id, cell: cell.id, err }, "could not record an execution's result");
      })
      .finally(() => {
        launch.ended();
        if (this.running === running) this.running = null;
        over();
        this.ctx.wake();
        this.onIdle();
      });
  }

  private async finish(cellId: number, kind: "script" | "cmd", outcome: ProcessOutcome, running: Running | null): Promise<void> {
    const { core, id } = this.ctx;
    const at = core.nowIso();
    const body = processFinished(this.ctx.session(), cellId, outcome, running?.stoppedBy ?? null);
    if (running !== null) await core.faults?.("execution:exited", { session: id, cell: cellId });
    // A cell that ran to its end: the driver commits its result with what comes next (the next
    // round's preparation and attempt) in one commit. A stopped cell is committed now (its note or
    // its operator waits).
    if (running !== null && running.stoppedBy === null) {
      for (const c of this.handedOver) if (this.ctx.session().executions.get(c)?.phase !== "started") this.handedOver.delete(c);
      this.handedOver.add(cellId);
      this.ctx.carry(finishedEvents(this.ctx.session(), body, at));
    } else await this.commitFinished(body, at);
    core.metrics?.executionFinished(kind, body.result, (outcome.duration_ms ?? 0) / 1000);
    core.logger.info({ session: id, cell: cellId, result: body.result, exit_code: outcome.exit_code }, "cell finished");
  }

  private async commitFinished(body: FinishedBody, at: string): Promise<void> {
    await this.ctx.core.commit(finishedEvents(this.ctx.session(), body, at));
  }

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
    const { core, id } = this.ctx;
    let n = 0;
    for (const ex of [...this.ctx.session().executions.values()]) {
      if (ex.phase !== "started" || ex.started === null) continue;
      if (this.running !== null && this.running.cellId === ex.cell_id) continue;
      if (this.launching) continue; // this driver's own launch, being authorized right now
      if (this.handedOver.has(ex.cell_id)) continue; // it finished here; the driver commits its result
      const stopped =
        ex.started.host !== core.world.host
          ? { worker_stopped: false, detail: `the cell ran on host ${ex.started.host}; this is ${core.world.host}, so its process could not be checked or stopped from here` }
          : await core.world.stopSurvivor(ex.started, { graceMs: core.limits.stopGraceMs });
      const cancelling = this.ctx.session().cancel_requested !== null;
      await this.commitFinished(lostWorker(ex, stopped, cancelling), core.nowIso());
      core.metrics?.executionFinished(ex.kind, cancelling ? "cancelled" : "UnknownExecution", null);
      core.logger.warn({ session: id, cell: ex.cell_id, worker_stopped: stopped.worker_stopped }, "recorded UnknownExecution");
      n++;
    }
    return n;
  }
}
