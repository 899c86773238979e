/**
 * Every Prometheus metric Cairn exports, defined in this one module on a per-harness prom-client
 * `Registry` (never the global one), so two harnesses in one process, or tests, never share series.
 *
 * Naming follows Prometheus' guide: base units (`_seconds`, `_bytes`), counters end in `_total`, and
 * labels are bounded (adapter, outcome, kind, result, code, direction): the API never accepts a
 * session or cell id, so no call can put one in a label.
 *
 * Metrics never throw into the harness: a negative, NaN or infinite value is ignored rather than
 * recorded (prom-client would throw on a negative counter increment).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import type { RejectionCode } from "../state/admission.js";
import type { DatabaseStats } from "../storage/contract.js";
import { VERSION } from "../version.js";

/** How a commit ended: durable, refused (nothing durable), outcome unknown, or the handle was fenced. */
export type CommitOutcome = "ok" | "rejected" | "uncertain" | "fenced";
/** The executable cell kinds. */
export type ExecutionKind = "script" | "cmd";
/** How an execution finished (ARCHITECTURE.md section 6). */
export type ExecutionResult = "success" | "error" | "cancelled" | "UnknownExecution";
/** How a run ended (its conclusion's result, or an operator's cancel). */
export type RunResult = "success" | "failure" | "cancelled";

/** Options of {@link Metrics}. */
export interface MetricsOptions {
  /** Registry to register on; default: a fresh one owned by this instance. */
  registry?: Registry;
  /** The storage adapter in use: its per-adapter series start at 0, so `rate()` works from the first scrape. */
  adapter?: string;
  /** Also collect Node's default process metrics (CPU, memory, event loop lag) on this registry; default true. */
  defaultMetrics?: boolean;
  /** The database this process serves: every series then carries a `db` label (joins survive failover). */
  db?: string;
}

/** What a `cairn serve` process is doing, exported one-hot as `cairn_worker_state{state}`. */
export type WorkerState = "starting" | "standby" | "owner" | "fenced" | "stopping";
const WORKER_STATES: readonly WorkerState[] = ["starting", "standby", "owner", "fenced", "stopping"];

const COMMIT_OUTCOMES: readonly CommitOutcome[] = ["ok", "rejected", "uncertain", "fenced"];
const EXECUTION_KINDS: readonly ExecutionKind[] = ["script", "cmd"];
const EXECUTION_RESULTS: readonly ExecutionResult[] = ["success", "error", "cancelled", "UnknownExecution"];
const RUN_RESULTS: readonly RunResult[] = ["success", "failure", "cancelled"];
/** What an operator asks of a run (the bounded label set of `cairn_operator_requests_total`). */
export type OperatorAction = "pause" | "unpause" | "cancel" | "approve" | "deny" | "fork";
const OPERATOR_ACTIONS: readonly OperatorAction[] = ["pause", "unpause", "cancel", "approve", "deny", "fork"];

// A Record keyed by the union makes the compiler flag a RejectionCode added in admission.ts and missing here.
const REJECTION_CODE_SET: Readonly<Record<RejectionCode, true>> = {
  invalid_patch: true,
  revision: true,
  forbidden_op: true,
  forbidden_path: true,
  invalid_cell: true,
  cell_id: true,
  previous_id: true,
  busy_cell: true,
  removal_order: true,
  test_failed: true,
  role: true,
  conclusion_blocked: true,
  round_conflict: true,
  pep723: true,
};
/** Every admission rejection code, the bounded label set of `cairn_patches_rejected_total` (plus "other"). */
export const REJECTION_CODES: readonly RejectionCode[] = Object.keys(REJECTION_CODE_SET) as RejectionCode[];

// fsync on a laptop SSD is ~0.5 ms; an etcd quorum write across zones 5-50 ms; a stalled quorum seconds.
const COMMIT_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const EXECUTION_BUCKETS = [0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200];
const DISPATCH_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const MODEL_ROUND_BUCKETS = [0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600];
// prom-client samples event-loop delay on a libuv timer, every 10 ms by default: about 1% of a core
// in an idle worker (bench/idle.ts). Every 1000 ms costs ~0.1% and still sees every stall, because a
// blocked loop delays whichever sample is pending; only the number of samples per scrape drops.
const EVENT_LOOP_PRECISION_MS = 1000;
const TIMER_LATENESS_BUCKETS = [0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300];

function ok(value: number): boolean {
  return Number.isFinite(value) && value >= 0;
}

/**
 * The Cairn metrics of one harness. Construct one per harness (or per process) and call its typed
 * methods; `registry.metrics()` renders the exposition text that `/metrics` serves.
 */
export class Metrics {
  /** The registry every Cairn metric (and, by default, Node's process metrics) is registered on. */
  readonly registry: Registry;

  private readonly scrapeHooks = new Set<() => void>();
  private readonly commits: Counter<"adapter" | "outcome">;
  private readonly commitDuration: Histogram<"adapter">;
  private readonly committedEvents: Counter<"adapter">;

  private readonly quorumHeld: Gauge<"adapter">;
  private readonly membersReachable: Gauge<"adapter">;
  private readonly membersTotal: Gauge<"adapter">;
  private readonly backlogCommits: Gauge<"adapter">;
  private readonly backlogBytes: Gauge<"adapter">;
  private readonly quorumWait: Gauge<"adapter">;
  private readonly epoch: Gauge<"adapter">;
  private readonly reachable: Gauge<"adapter">;

  private readonly opens: Counter;
  private readonly resumes: Counter;
  private readonly fencedTotal: Counter;
  private readonly owner: Gauge;
  private readonly worker: Gauge<"state">;
  private readonly workerReady: Gauge;

  private readonly executions: Counter<"kind" | "result">;
  private readonly launches: Counter<"sandbox" | "network">;
  private readonly sandboxed: Gauge<"sandbox">;
  private readonly executionDuration: Histogram<"kind">;
  private readonly dispatch: Histogram;
  private readonly queued: Gauge;
  private readonly running: Gauge;
  private readonly unknownUnresolved: Gauge;

  private readonly modelRounds: Counter;
  private readonly modelRoundDuration: Histogram;
  private readonly modelAttempts: Counter<"outcome">;
  private readonly modelRetries: Counter;
  private readonly patchesRejected: Counter<"code">;
  private readonly modelTokens: Counter<"direction">;

  private readonly inbox: Gauge;
  private readonly timersPending: Gauge;
  private readonly timerLateness: Histogram;

  private readonly runsStarted: Counter;
  private readonly runsEnded: Counter<"result">;
  private readonly runsActive: Gauge;
  private readonly runsBlocked: Gauge;
  private readonly runBlocks: Counter;
  private readonly runsPaused: Gauge;
  private readonly approvalsWaiting: Gauge;
  private readonly approvalOldestWait: Gauge;
  private readonly steerings: Counter<"action">;
  private readonly progress: Gauge;

  /**
   * Registers every Cairn metric on `opts.registry` (default: a new Registry). Throws prom-client's
   * error if the registry already holds a Cairn metric (one Metrics per registry).
   */
  constructor(opts: MetricsOptions = {}) {
    const registry = opts.registry ?? new Registry();
    if (opts.db !== undefined) registry.setDefaultLabels({ db: opts.db });
    this.registry = registry;
    const registers = [registry];
    // Registered first among Cairn metrics: its collect() runs the onScrape callbacks before any other
    // Cairn series is read (prom-client reads metrics in registration order, each get() starting synchronously).
    const scrapeHooks = this.scrapeHooks;
    const buildInfo = new Gauge({
      name: "cairn_build_info",
      help: "Always 1; labels carry the Cairn version and the Node version.",
      labelNames: ["version", "node"],
      registers,
      collect() {
        for (const hook of scrapeHooks) {
          try {
            hook();
          } catch {
            // A failing hook must not break /metrics; its gauges keep their last values.
          }
        }
      },
    });
    buildInfo.set({ version: VERSION, node: process.version }, 1);
    if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: EVENT_LOOP_PRECISION_MS });

    this.commits = new Counter({ name: "cairn_storage_commits_total", help: "Storage commits by adapter and outcome (ok, rejected, uncertain, fenced).", labelNames: ["adapter", "outcome"], registers });
    this.commitDuration = new Histogram({ name: "cairn_storage_commit_duration_seconds", help: "Time from commit call to durable acknowledgement (or failure).", labelNames: ["adapter"], buckets: COMMIT_BUCKETS, registers });
    this.committedEvents = new Counter({ name: "cairn_storage_committed_events_total", help: "Events made durable by successful commits.", labelNames: ["adapter"], registers });

    this.quorumHeld = new Gauge({ name: "cairn_storage_quorum_held", help: "1 while a majority of storage members answers (replicated adapter only).", labelNames: ["adapter"], registers });
    this.membersReachable = new Gauge({ name: "cairn_storage_members_reachable", help: "Storage members currently answering (replicated adapter only).", labelNames: ["adapter"], registers });
    this.membersTotal = new Gauge({ name: "cairn_storage_members_total", help: "Storage members configured (replicated adapter only).", labelNames: ["adapter"], registers });
    this.backlogCommits = new Gauge({ name: "cairn_storage_backlog_commits", help: "Commits waiting for the storage quorum.", labelNames: ["adapter"], registers });
    this.backlogBytes = new Gauge({ name: "cairn_storage_backlog_bytes", help: "Bytes of the commits waiting for the storage quorum.", labelNames: ["adapter"], registers });
    this.quorumWait = new Gauge({ name: "cairn_storage_quorum_wait_seconds_total", help: "Seconds spent waiting for the storage quorum since the database was opened (monotonic while open).", labelNames: ["adapter"], registers });
    this.epoch = new Gauge({ name: "cairn_ownership_epoch", help: "Ownership epoch this process claimed at open.", labelNames: ["adapter"], registers });
    this.reachable = new Gauge({ name: "cairn_storage_reachable", help: "1 when the storage handle is usable: not poisoned by an uncertain commit and, when replicated, holding quorum.", labelNames: ["adapter"], registers });

    this.opens = new Counter({ name: "cairn_ownership_opens_total", help: "Databases opened (ownership claimed) by this process.", registers });
    this.resumes = new Counter({ name: "cairn_resumes_total", help: "Unfinished runs resumed after an open.", registers });
    this.fencedTotal = new Counter({ name: "cairn_ownership_fenced_total", help: "Times this process lost ownership to a newer opener (it must stop).", registers });
    this.owner = new Gauge({ name: "cairn_owner", help: "1 while this process owns its database, 0 before open and after being fenced or closing.", registers });
    this.worker = new Gauge({ name: "cairn_worker_state", help: "1 for the state a cairn serve worker is in (starting, standby, owner, fenced, stopping), 0 for the others.", labelNames: ["state"], registers });
    this.workerReady = new Gauge({ name: "cairn_worker_ready", help: "1 while this worker owns its database and /readyz answers 200; 0 in standby, fenced or stopping.", registers });

    this.executions = new Counter({ name: "cairn_executions_total", help: "Finished executions by cell kind and result.", labelNames: ["kind", "result"], registers });
    this.launches = new Counter({ name: "cairn_cell_launches_total", help: "Cells launched, by sandbox (bwrap or none) and network (off or host).", labelNames: ["sandbox", "network"], registers });
    this.sandboxed = new Gauge({ name: "cairn_cell_sandbox", help: "1 for the sandbox this process runs cells in (bwrap, or none: the harness's user's reach), 0 for the other.", labelNames: ["sandbox"], registers });
    this.executionDuration = new Histogram({ name: "cairn_execution_duration_seconds", help: "Wall time of finished executions (UnknownExecution excluded: no known end).", labelNames: ["kind"], buckets: EXECUTION_BUCKETS, registers });
    this.dispatch = new Histogram({ name: "cairn_dispatch_latency_seconds", help: "Time from the committed launch authorization to the child process start.", buckets: DISPATCH_BUCKETS, registers });
    this.queued = new Gauge({ name: "cairn_executions_queued", help: "Executions accepted and not yet launched.", registers });
    this.running = new Gauge({ name: "cairn_executions_running", help: "Executions started and not yet finished.", registers });
    this.unknownUnresolved = new Gauge({ name: "cairn_unknown_executions_unresolved", help: "UnknownExecution results the model has not yet resolved.", registers });

    this.modelRounds = new Counter({ name: "cairn_model_rounds_total", help: "Model rounds completed.", registers });
    this.modelRoundDuration = new Histogram({ name: "cairn_model_round_duration_seconds", help: "Wall time of a model round, retries included.", buckets: MODEL_ROUND_BUCKETS, registers });
    this.modelAttempts = new Counter({ name: "cairn_model_attempts_total", help: "Model provider calls by outcome.", labelNames: ["outcome"], registers });
    this.modelRetries = new Counter({ name: "cairn_model_retries_total", help: "Model provider calls retried after a retryable error.", registers });
    this.patchesRejected = new Counter({ name: "cairn_patches_rejected_total", help: "Patches refused by admission, by rejection code.", labelNames: ["code"], registers });
    this.modelTokens = new Counter({ name: "cairn_model_tokens_total", help: "Model tokens consumed, by direction (input, output).", labelNames: ["direction"], registers });

    this.inbox = new Gauge({ name: "cairn_inbox_depth", help: "Observations waiting for the next model round.", registers });
    this.timersPending = new Gauge({ name: "cairn_timers_pending", help: "Durable timers not yet fired.", registers });
    this.timerLateness = new Histogram({ name: "cairn_timer_lateness_seconds", help: "How late a timer fired after its due time.", buckets: TIMER_LATENESS_BUCKETS, registers });

    this.runsStarted = new Counter({ name: "cairn_runs_started_total", help: "Runs started.", registers });
    this.runsEnded = new Counter({ name: "cairn_runs_ended_total", help: "Runs ended, by conclusion result.", labelNames: ["result"], registers });
    this.runsActive = new Gauge({ name: "cairn_runs_active", help: "Runs started and not yet ended.", registers });
    this.runsBlocked = new Gauge({ name: "cairn_runs_blocked", help: "Runs parked until an operator fixes the model's credentials or configuration (then `cairn resume`).", registers });
    this.runBlocks = new Counter({ name: "cairn_run_blocks_total", help: "Runs parked as blocked, by cause (auth, config, retry_budget).", labelNames: ["cause"], registers });
    this.runsPaused = new Gauge({ name: "cairn_runs_paused", help: "Runs an operator has paused (cairn pause) and not yet unpaused.", registers });
    this.approvalsWaiting = new Gauge({ name: "cairn_approvals_waiting", help: "Cells waiting for a person's approval (cairn approve / cairn deny).", registers });
    this.approvalOldestWait = new Gauge({
      name: "cairn_approval_oldest_wait_seconds",
      help: "How long the longest-waiting cell has waited for a person's approval, in seconds (0 when none waits); feeds the approval alert.",
      registers,
    });
    this.steerings = new Counter({ name: "cairn_operator_requests_total", help: "Operators' requests the owner applied, by action (pause, unpause, cancel, approve, deny, fork).", labelNames: ["action"], registers });
    this.progress = new Gauge({ name: "cairn_last_progress_timestamp_seconds", help: "Unix time of the last committed progress (used by the run-stuck alert).", registers });

    // Start bounded label sets at 0, so increase()/rate() see the first event.
    if (opts.adapter !== undefined) {
      for (const outcome of COMMIT_OUTCOMES) this.commits.inc({ adapter: opts.adapter, outcome }, 0);
      this.committedEvents.inc({ adapter: opts.adapter }, 0);
    }
    for (const kind of EXECUTION_KINDS) for (const result of EXECUTION_RESULTS) this.executions.inc({ kind, result }, 0);
    for (const outcome of ["ok", "error"]) this.modelAttempts.inc({ outcome }, 0);
    for (const direction of ["input", "output"]) this.modelTokens.inc({ direction }, 0);
    for (const result of RUN_RESULTS) this.runsEnded.inc({ result }, 0);
    for (const action of OPERATOR_ACTIONS) this.steerings.inc({ action }, 0);
    for (const code of REJECTION_CODES) this.patchesRejected.inc({ code }, 0);
  }

  /**
   * Runs `hook` synchronously at every scrape, before the Cairn series are rendered: the place to copy
   * state that is cheap to read but not event-driven (`storageStats(db.stats())`, `setRunsActive`,
   * `setInbox`...), with no timer running while nobody scrapes. A throwing hook is ignored (its gauges
   * keep their last values). Returns a function that removes the hook.
   */
  onScrape(hook: () => void): () => void {
    this.scrapeHooks.add(hook);
    return () => {
      this.scrapeHooks.delete(hook);
    };
  }

  /** Records one commit: its outcome, its duration, and (when ok) how many events became durable. */
  commit(adapter: string, outcome: CommitOutcome, seconds: number, events: number): void {
    this.commits.inc({ adapter, outcome });
    if (ok(seconds)) this.commitDuration.observe({ adapter }, seconds);
    if (outcome === "ok" && ok(events)) this.committedEvents.inc({ adapter }, events);
  }

  /**
   * Copies a `Database.stats()` snapshot into the storage gauges, labelled by its adapter. Fields the
   * adapter does not report (the memory and sqlite adapters have no quorum) leave their series absent
   * rather than a misleading 0, so the quorum alert never fires for a single-machine adapter.
   */
  storageStats(stats: DatabaseStats): void {
    const labels = { adapter: stats.adapter };
    const setIf = (gauge: Gauge<"adapter">, value: number | undefined): void => {
      if (value !== undefined && ok(value)) gauge.set(labels, value);
    };
    if (stats.quorumHeld !== undefined) this.quorumHeld.set(labels, stats.quorumHeld ? 1 : 0);
    setIf(this.membersReachable, stats.membersReachable);
    setIf(this.membersTotal, stats.membersTotal);
    setIf(this.backlogCommits, stats.backlogCommits);
    setIf(this.backlogBytes, stats.backlogBytes);
    setIf(this.quorumWait, stats.quorumWaitSeconds);
    setIf(this.epoch, stats.epoch);
    this.reachable.set(labels, !stats.poisoned && stats.quorumHeld !== false ? 1 : 0);
  }

  /** Ownership claimed: counts the open and sets `cairn_owner` to 1. */
  opened(): void {
    this.opens.inc();
    this.owner.set(1);
  }

  /** An unfinished run was resumed after open. */
  resumed(): void {
    this.resumes.inc();
  }

  /** Ownership lost to a newer opener: counts it and sets `cairn_owner` to 0. */
  fenced(): void {
    this.fencedTotal.inc();
    this.owner.set(0);
  }

  /** The database was closed normally: `cairn_owner` goes to 0 (nothing is counted). */
  closed(): void {
    this.owner.set(0);
  }

  /** The worker's state (cairn serve): one-hot `cairn_worker_state`, and `cairn_worker_ready`. */
  workerState(state: WorkerState, ready: boolean): void {
    for (const s of WORKER_STATES) this.worker.set({ state: s }, s === state ? 1 : 0);
    this.workerReady.set(ready ? 1 : 0);
  }

  /** The sandbox this process runs cells in. */
  sandbox(kind: "bwrap" | "none"): void {
    this.sandboxed.set({ sandbox: "bwrap" }, kind === "bwrap" ? 1 : 0);
    this.sandboxed.set({ sandbox: "none" }, kind === "none" ? 1 : 0);
  }

  /** A cell was launched (its `execution_started` committed). */
  cellLaunched(sandbox: "bwrap" | "none", network: "off" | "host"): void {
    this.launches.inc({ sandbox, network });
  }

  /** An execution finished; `seconds` is null when its end is unknown (UnknownExecution). */
  executionFinished(kind: ExecutionKind, result: ExecutionResult, seconds: number | null): void {
    this.executions.inc({ kind, result });
    if (seconds !== null && ok(seconds)) this.executionDuration.observe({ kind }, seconds);
  }

  /** Seconds from the committed launch authorization to the child process start. */
  dispatchLatency(seconds: number): void {
    if (ok(seconds)) this.dispatch.observe(seconds);
  }

  /** Current queue: executions accepted and not launched, and executions running. */
  setExecutions(queued: number, running: number): void {
    if (ok(queued)) this.queued.set(queued);
    if (ok(running)) this.running.set(running);
  }

  /** UnknownExecution results not yet resolved by the model. */
  unresolvedUnknown(n: number): void {
    if (ok(n)) this.unknownUnresolved.set(n);
  }

  /** A model round completed, taking `seconds` of wall time. */
  modelRound(seconds: number): void {
    this.modelRounds.inc();
    if (ok(seconds)) this.modelRoundDuration.observe(seconds);
  }

  /** One provider call ended, successfully or with an error. */
  modelAttempt(outcome: "ok" | "error"): void {
    this.modelAttempts.inc({ outcome });
  }

  /** A provider call is being retried. */
  modelRetry(): void {
    this.modelRetries.inc();
  }

  /**
   * A patch was refused by admission. `code` is a RejectionCode; anything else is counted as "other",
   * so a bug upstream can never make the label set unbounded.
   */
  patchRejected(code: string): void {
    this.patchesRejected.inc({ code: Object.hasOwn(REJECTION_CODE_SET, code) ? code : "other" });
  }

  /** Tokens consumed by one model call. */
  tokens(input: number, output: number): void {
    if (ok(input)) this.modelTokens.inc({ direction: "input" }, input);
    if (ok(output)) this.modelTokens.inc({ direction: "output" }, output);
  }

  /** Observations waiting for the next round. */
  setInbox(depth: number): void {
    if (ok(depth)) this.inbox.set(depth);
  }

  /** Durable timers not yet fired. */
  setTimersPending(n: number): void {
    if (ok(n)) this.timersPending.set(n);
  }

  /** A timer fired `lateSeconds` after its due time (0 when on time). */
  timerFired(lateSeconds: number): void {
    this.timerLateness.observe(ok(lateSeconds) ? lateSeconds : 0);
  }

  /** A run started. */
  runStarted(): void {
    this.runsStarted.inc();
  }

  /** A run ended with a conclusion of this result. */
  runEnded(result: RunResult): void {
    this.runsEnded.inc({ result });
  }

  /** Runs currently active in this process. */
  setRunsActive(n: number): void {
    if (ok(n)) this.runsActive.set(n);
  }

  /** Runs currently blocked (waiting for an operator). */
  setRunsBlocked(n: number): void {
    if (ok(n)) this.runsBlocked.set(n);
  }

  /** Runs an operator has paused. */
  setRunsPaused(n: number): void {
    if (ok(n)) this.runsPaused.set(n);
  }

  /** Cells waiting for approval, and how long (s) the longest has waited (0 when none). */
  setApprovalsWaiting(n: number, oldestSeconds: number): void {
    if (ok(n)) this.approvalsWaiting.set(n);
    if (ok(oldestSeconds)) this.approvalOldestWait.set(oldestSeconds);
  }

  /** The owner applied an operator's request. */
  operatorRequest(action: OperatorAction): void {
    this.steerings.inc({ action });
  }

  /** A run was parked as blocked. */
  runBlocked(cause: "auth" | "config" | "retry_budget"): void {
    this.runBlocks.inc({ cause });
  }

  /** Unix time (seconds) of the last committed progress of any run; feeds the run-stuck alert. */
  lastProgress(unixSeconds: number): void {
    if (ok(unixSeconds)) this.progress.set(unixSeconds);
  }
}
