/**
 * The Harness: opens a database (claiming ownership), starts and resumes runs, takes outside
 * observations, and follows committed events.
 *
 * It depends on the Storage contract only, never on an adapter. Every action outside the process
 * (launching a cell, calling the model, firing a timer's effect) happens after the commit that
 * authorizes it has resolved. Once fenced (another process opened the database) it launches nothing
 * more, stops its running cells' process groups and rejects every call with `ResetError {action:
 * "stop"}`; it never reopens on its own. After an uncertain commit it is poisoned: reopen to learn the
 * truth from the log.
 */
import { randomBytes } from "node:crypto";
import pino, { type Logger } from "pino";
import type { Admission } from "../state/admission.js";
import type { LogEvent, NewEvent } from "../state/events.js";
import { sessionCreated } from "../state/outcomes.js";
import type { SessionProjection } from "../state/projection.js";
import { Reducer } from "../state/reducer.js";
import type { Database, DatabaseSignal, DatabaseStats, Storage } from "../storage/contract.js";
import { loadProjection, type SnapshotPolicy } from "../storage/snapshots.js";
import { Snapshotter } from "./snapshotter.js";
import { ResetError } from "../storage/errors.js";
import { CairnError, ConfigError } from "../errors.js";
import type { Model } from "../model/contract.js";
import { reportGauges } from "../observability/gauges.js";
import type { Metrics } from "../observability/metrics.js";
import { NO_TRACING, type Tracing } from "../observability/tracing.js";
import { Boundaries, type SandboxState } from "./boundary.js";
import { createCore, type HarnessCore, type HarnessFaults } from "./core.js";
import { summarize, type Inspection } from "./inspect.js";
import { guardLease, lostLeaseError, openAfterPrevious, probeFence } from "./lease.js";
import { MailboxDelivery, postObservation } from "./mailbox.js";
import { chooseSessionId, startRequested } from "./start-request.js";
import type { OutsideObservation } from "./observations.js";
import { defaultLimits, type HarnessLimits } from "./options.js";
import { resubmit } from "./round.js";
import { SessionDrivers } from "./drivers.js";
import { TimerHousekeeping } from "./timers.js";
import { defaultWorld, type HarnessWorld } from "./world.js";
import type { HarnessOpenOptions, HarnessStatus, RunOutcome, StartOptions } from "./types.js";
import { Listeners, runOutcome } from "./listeners.js";
import { ApprovalRules, type ApprovalRule } from "../state/approval.js";
import type { SteerRequest, SteerVerdict } from "../state/steer.js";
import { applySteer } from "./steer.js";
import { Committer } from "./committer.js";
import { commitFailure, settleWithin, STOP_MESSAGES, type StopReason } from "./stop.js";

export type { HarnessOpenOptions, HarnessStatus, RunOutcome, StartOptions } from "./types.js";

export class Harness {
  private reducer = new Reducer();
  private readonly snapshotter: Snapshotter;
  private readonly drivers: SessionDrivers;
  private readonly committer: Committer;
  private statusValue: HarnessStatus = "open";
  private stopError: CairnError | null = null;
  /** Stopped, but not yet told: a lost lease waits for the storage to say whether it was fenced. */
  private settling = false;
  private unwatch: (() => void) | null = null;
  private readonly mailbox: MailboxDelivery;
  private readonly timers: TimerHousekeeping;
  private sessionsAllocated = 0;
  private closing: Promise<void> | null = null;
  private submitCwd = process.cwd();
  private readonly listeners: Listeners;
  private readonly core: HarnessCore;

  readonly logger: Logger;
  readonly metrics: Metrics | null;

  private constructor(
    private readonly db: Database,
    private readonly storage: Storage,
    readonly name: string,
    parts: { model: Model; world: HarnessWorld; logger: Logger; metrics: Metrics | null; tracing: Tracing; limits: HarnessLimits; faults: HarnessFaults | null; approval: readonly ApprovalRule[] },
    private readonly boundaries: Boundaries,
    snapshots: Partial<SnapshotPolicy> | false | undefined,
  ) {
    this.logger = parts.logger;
    this.metrics = parts.metrics;
    this.snapshotter = new Snapshotter(db, parts.logger, snapshots);
    this.committer = new Committer({
      db,
      reducer: () => this.reducer,
      assertOpen: () => this.assertOpen(),
      owner: () => ({ epoch: db.epoch, host: this.core.world.host, boot_id: this.core.world.bootId, pid: process.pid }),
      committed: (logged, seconds) => {
        if (seconds !== null) this.metrics?.commit(this.storage.adapter, "ok", seconds, logged.length);
        this.snapshotter.afterCommit(logged, this.reducer.projection());
        this.afterCommit(logged);
      },
      failed: (err, seconds, n) => this.onCommitError(err, seconds, n),
    });
    this.core = createCore(
      { name, ...parts },
      {
        commit: (events) => this.commit(events),
        session: (id) => this.reducer.session(id),
        headSeq: () => this.reducer.headSeq,
        stopping: () => this.statusValue !== "open",
        stopWaitMs: () => this.db.lease?.ttlMs ?? Infinity,
        failed: (session, err) => this.listeners.failed(session, err),
        sleep: (ms) => this.timers.sleeper.sleep(ms),
        scriptDir: (session) => boundaries.scriptDir(session),
        boundary: (session) => boundaries.forSession(this.reducer.session(session), this.otherWorkspaces(session)),
        issueToken: (session, cell) => this.timers.issue(session, cell),
        revokeToken: (token) => this.timers.revoke(token),
      },
    );
    this.listeners = new Listeners(parts.logger);
    this.drivers = new SessionDrivers(this.core);
    this.timers = new TimerHousekeeping(this.core.timers, () => this.statusValue === "open");
    this.mailbox = new MailboxDelivery(this.core, db, (m) =>
      startRequested(m, { session: (id) => this.reducer.session(id), start: (o) => this.start({ ...o, cwd: this.submitCwd }), logger: this.logger }),
    (deliver) => this.drivers.holding(deliver), (id) => this.drivers.begin(id));
  }

  /**
   * Opens `name` on `storage`, claiming ownership (every earlier opener is fenced), and folds the
   * log. Runs nothing: call `resume()` to continue unfinished runs, `start()` to begin one.
   * Throws DatabaseNotFound when `create: false` and the database does not exist.
   */
  static async open(options: HarnessOpenOptions): Promise<Harness> {
    const logger = options.logger ?? pino({ level: "silent" });
    const world = options.world ?? defaultWorld();
    // The sandbox is chosen before anything is opened: `required` without one fails here, untouched.
    const boundaries = new Boundaries(options.sandbox ?? {}, options.workDir);
    if (boundaries.state.kind === "none") logger.warn({ reason: boundaries.state.reason }, "cells run without a sandbox");
    let db: Database;
    try {
      // Launch nothing while an earlier owner's lease may still run (its cells may still act).
      db = await openAfterPrevious(options.storage, options.name, options.create ?? true, logger.child({ db: options.name }));
    } catch (err) {
      boundaries.close();
      throw err;
    }
    let h: Harness;
    try {
      const parts = { model: options.model, world, limits: defaultLimits(options.limits), metrics: options.metrics ?? null, tracing: options.tracing ?? NO_TRACING, faults: options.faults ?? null, approval: approvalRules(options.approval) };
      h = new Harness(db, options.storage, options.name, { ...parts, logger: logger.child({ db: options.name, epoch: db.epoch, host: world.host }) }, boundaries, options.snapshots);
      h.reducer = await loadProjection(db);
      h.unwatch = db.watch((signal) => h.onSignal(signal));
      guardLease(h, db, h.logger);
      await h.timers.listen(boundaries.socketPath, h.core);
    } catch (err) {
      await db.close().catch(() => undefined);
      boundaries.close();
      throw err;
    }
    options.metrics?.sandbox(boundaries.state.kind);
    if (options.submitCwd !== undefined) h.submitCwd = options.submitCwd;
    options.metrics?.opened();
    options.metrics?.lastProgress(world.clock.now() / 1000);
    h.refreshMetrics();
    h.logger.info({ head: h.reducer.headSeq, sessions: h.reducer.projection().order.length }, "database opened");
    void h.mailbox.drain();
    return h;
  }

  get status(): HarnessStatus {
    return this.statusValue;
  }

  get epoch(): number {
    return this.db.epoch;
  }

  /** Whether this harness's cells run in a sandbox, and why not when they do not. */
  get sandbox(): SandboxState {
    return this.boundaries.state;
  }

  /** The workspaces of the database's other runs (once each): hidden from `session`'s cells. */
  private otherWorkspaces(session: string): string[] {
    const own = this.reducer.session(session)?.cwd;
    const out = new Set<string>();
    for (const id of this.reducer.projection().order) {
      const cwd = this.reducer.session(id)!.cwd;
      if (id !== session && cwd !== own) out.add(cwd);
    }
    return [...out];
  }

  /** The session ids in this database, in creation order. */
  sessions(): readonly string[] {
    return this.reducer.projection().order;
  }

  session(id: string): SessionProjection | undefined {
    return this.reducer.session(id);
  }

  /**
   * Starts a new run toward `goal`: commits `session_created`, then drives it. Returns the session
   * id. The goal, cwd and validators are fixed for the run's life.
   */
  async start(options: StartOptions): Promise<string> {
    this.assertOpen();
    if (options.goal.trim() === "") throw new ConfigError("the goal is empty; say what the agent should achieve.");
    const id = chooseSessionId(options.id, this.name, this.reducer, this.sessionsAllocated);
    if (options.id === undefined) this.sessionsAllocated = Number(id.slice(1));
    await this.drivers.recoverAll(this.unfinished());
    // The run's effect keys derive from fresh randomness, so no two runs anywhere share one (effects.ts).
    await this.commit([sessionCreated(id, { ...options, effectSeed: randomBytes(16).toString("hex") }, this.core.nowIso())]);
    this.metrics?.runStarted();
    this.drivers.begin(id);
    return id;
  }

  /**
   * Continues every unfinished run: first recovery (a `started` execution without a result becomes
   * UnknownExecution, after its surviving process group is stopped; nothing is re-run), then each
   * session is scheduled. Idempotent: a second call recovers nothing new and schedules nothing twice.
   */
  resume(): Promise<{ sessions: string[]; recovered: number }> {
    this.assertOpen();
    return this.drivers.resumeAll(
      // What waited in the mailbox while no owner was live (a pause, a cancel) is applied before any
      // run does anything.
      () => this.mailbox.drained(),
      () => this.unfinished(),
      (r) => {
        this.metrics?.resumed();
        this.logger.info(r, "resumed");
      },
    );
  }

  private unfinished(): string[] {
    return this.reducer.projection().order.filter((id) => this.reducer.session(id)!.terminal === null);
  }

  /**
   * Delivers an outside observation to `session`'s inbox. The same id with the same content is a
   * no-op (`duplicate: true`); harness prefixes (`execution:`, `timer:`, `control:`, `idle:`) are
   * refused; the same id with other content is refused; a full inbox refuses with
   * `StorageRejected {reason: "backlog_full"}`: retry later.
   */
  async post(session: string, observation: OutsideObservation): Promise<{ duplicate: boolean }> {
    this.assertOpen();
    return postObservation(this.core, session, observation);
  }

  /**
   * Re-submits a `step` patch for an accepted round `turn` of `session`, as a caller does after a
   * lost acknowledgement: the accepted patch returns the original receipt (`replay: true`) and
   * changes nothing; any other patch is refused (`round_conflict`). Rounds not yet accepted belong
   * to the round loop, which admits them: submitting one throws a ConfigError and commits nothing.
   */
  async submit(session: string, turn: string, patch: unknown): Promise<Admission> {
    this.assertOpen();
    return resubmit(this.core, session, turn, patch);
  }

  /**
   * Applies an operator's request to `session` as its owner: pause, unpause, cancel, approve or deny
   * (src/state/steer.ts judges it; the verdict's events are committed as one batch). `request` is the
   * request's id: the same id again changes nothing. Returns the verdict (a refusal commits
   * nothing). Throws ConfigError for an unknown session. Outside the owner, requests travel through
   * the storage mailbox (`cairn pause`, the HTTP API), and the owner applies them the same way.
   */
  async steer(session: string, request: string, r: SteerRequest): Promise<SteerVerdict> {
    this.assertOpen();
    return applySteer(this.core, session, request, r);
  }

  /** A plain-JSON summary of every session (or one). */
  inspect(session?: string): Inspection {
    return summarize(this.name, this.reducer.projection(), session);
  }

  /** Calls `listener` with each committed batch, in order, after it is folded. Returns an unsubscribe. */
  follow(listener: (events: readonly LogEvent[]) => void): () => void {
    return this.listeners.follow(listener);
  }

  /** Calls `listener` once the harness stops being the owner (fenced), is poisoned, or closes. */
  onStop(listener: (status: HarnessStatus, error: CairnError | null) => void): () => void {
    return this.listeners.onStop(listener);
  }

  /**
   * Resolves when `session` has ended. Rejects with the harness's stop error (ResetError when
   * fenced, StorageFailure when poisoned) if it stops first.
   */
  wait(session: string): Promise<RunOutcome> {
    const stopped = () => (this.statusValue === "open" ? null : this.stopped(` before session ${session} ended`));
    return this.listeners.until(session, () => (this.settling ? null : runOutcome(session, this.reducer.session(session), stopped(), this.drivers.error(session))));
  }

  /** Resolves when no driver has anything in flight (tests and shutdown use it). */
  async settled(): Promise<void> {
    await this.drivers.settled();
  }

  /**
   * Closes: no new launches or model calls; running cells' process groups are stopped and their
   * executions stay `started` in the log (the next owner records them as UnknownExecution); the
   * database handle is released. Idempotent.
   */
  close(): Promise<void> {
    if (this.closing === null) this.closing = this.closeOnce();
    return this.closing;
  }

  private async closeOnce(): Promise<void> {
    const wasOpen = this.statusValue === "open";
    this.statusValue = "closed";
    await this.shutdown("shutdown");
    if (wasOpen) this.listeners.stopped(this.statusValue, this.stopError);
    // A write in flight may wait for a quorum this process cannot reach (the cluster is out of reach
    // and commits wait for it): close waits for it at most one lease length (the lease was given up
    // when the drivers stopped, so its loss cannot end the wait), and only a moment when the harness
    // had already stopped (fenced, poisoned, lease lost). Its outcome no longer matters here: the next
    // owner reads it from the log. A healthy storage settles it in milliseconds.
    const inFlight = Promise.all([this.committer.settled(), this.snapshotter.settled()]);
    await settleWithin(inFlight, wasOpen ? (this.db.lease?.ttlMs ?? Infinity) : 250);
    await this.db.close().catch(() => undefined);
    this.boundaries.close();
  }

  private assertOpen(): void {
    if (this.statusValue !== "open") throw this.stopped("");
  }

  /** Why this harness no longer acts: its stop error, or (closed by its caller) a plain one. */
  private stopped(when: string): CairnError {
    return this.stopError ?? new CairnError("internal", `the harness for "${this.name}" was closed${when}`);
  }

  /** The one commit path (committer.ts): folded in log order, followed. */
  private commit(caller: readonly NewEvent[]): Promise<readonly LogEvent[]> {
    return this.core.tracing.commit(this.name, caller, () => this.committer.commit(caller));
  }

  private afterCommit(logged: readonly LogEvent[]): void {
    this.listeners.committed(logged);
    const sessions = new Set(logged.map((e) => e.session));
    let consumed = false;
    for (const e of logged) if (e.kind === "patch_accepted") consumed = true;
    if (consumed && this.mailbox.wantsDrainAfterConsume()) void this.mailbox.drain();
    this.drivers.wake(sessions);
    this.refreshMetrics();
    this.metrics?.lastProgress(this.core.world.clock.now() / 1000);
    for (const e of logged) if (e.kind === "run_ended") this.metrics?.runEnded(e.body.result);
  }

  private onCommitError(err: unknown, seconds: number, n: number): void {
    const failure = commitFailure(err);
    if (failure !== null) this.metrics?.commit(this.storage.adapter, failure === "poisoned" ? "uncertain" : failure, seconds, n);
    if (failure === "fenced" || failure === "poisoned") void this.becomeStopped(failure, err as CairnError);
  }

  private onSignal(signal: DatabaseSignal): void {
    if (signal.type === "fenced") {
      void this.becomeStopped("fenced", ResetError.fenced(this.name, this.db.epoch, signal.epoch));
    } else if (signal.type === "mailbox") {
      void this.mailbox.drain();
    }
  }

  /**
   * The lease was lost (lease.ts): stop acting at once; running cells are stopped. The stop is told
   * as fenced when `fenced` resolves with the storage's ResetError, else as unreachable (`error`).
   */
  loseOwnership(error: CairnError, fenced: Promise<ResetError | null>): void {
    void this.becomeStopped("unreachable", error, fenced);
  }

  /**
   * The owner lease this process took before opening (src/cli/owner.ts) was lost: not renewed in
   * time (frozen, cut off, quorum lost) or taken by a forced acquire. Stops as a lost liveness lease
   * does: fenced when the storage shows another owner within `probeMs`, else unreachable.
   */
  ownerLeaseLost(why: string, probeMs: number): void {
    this.loseOwnership(lostLeaseError(this.name, why), probeFence(this.db, probeMs));
  }

  /** What readiness needs from the storage: its stats and whether the ownership lease is held. */
  storageState(): { stats: DatabaseStats; leaseHeld: boolean | null } {
    return { stats: this.db.stats(), leaseHeld: this.db.lease ? this.db.lease.held() : null };
  }

  /**
   * Stops acting as `status` at once; tells the stop once the drivers stopped and, when `fenced` is
   * given, once it resolved: a ResetError there turns the stop into a fence (the lease was lost
   * because another process took the database over, not because the storage was out of reach).
   */
  private async becomeStopped(status: StopReason, error: CairnError, fenced?: Promise<ResetError | null>): Promise<void> {
    if (this.statusValue !== "open") return;
    this.statusValue = status;
    this.stopError = error;
    this.settling = fenced !== undefined;
    const [found] = await Promise.all([fenced ?? Promise.resolve(null), this.shutdown(status)]);
    if (found !== null) {
      this.statusValue = "fenced";
      this.stopError = found;
    }
    this.settling = false;
    if (this.statusValue === "fenced") this.metrics?.fenced();
    const message = STOP_MESSAGES[this.statusValue as StopReason];
    if (message !== undefined) this.logger.error({ err: this.stopError.message }, message);
    this.listeners.stopped(this.statusValue, this.stopError);
  }

  private async shutdown(reason: "shutdown" | StopReason): Promise<void> {
    this.timers.sleeper.wakeAll(); // a round sleeping in its back-off ends now, before the drivers stop
    this.unwatch?.();
    this.unwatch = null;
    await this.drivers.stop(reason);
    await this.timers.close();
  }

  /** Sets every gauge from the projection and the storage's stats (serve calls it on each scrape). */
  refreshMetrics(): void {
    if (this.metrics !== null) reportGauges(this.metrics, this.reducer.projection(), this.db.stats(), this.core.world.clock.now());
  }
}

/** The worker's approval rules, validated. Throws ConfigError naming what is wrong. */
function approvalRules(rules: readonly ApprovalRule[] | undefined): readonly ApprovalRule[] {
  const parsed = ApprovalRules.safeParse(rules ?? []);
  if (!parsed.success) throw new ConfigError(`bad approval rules: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
  return Object.freeze(parsed.data);
}
