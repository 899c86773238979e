/**
 * What a session driver needs from its harness: the one commit path, the projection, the world.
 * Kept as an interface so the round loop, dispatch and controls stay apart from ownership and I/O.
 */
import type { Logger } from "pino";
import type { CellBoundary } from "../exec/executor.js";
import type { LogEvent, NewEvent } from "../state/events.js";
import type { SessionProjection } from "../state/projection.js";
import type { Model } from "../model/contract.js";
import type { Metrics } from "../observability/metrics.js";
import type { Tracing } from "../observability/tracing.js";
import type { HarnessLimits } from "./options.js";
import type { ApprovalRule } from "../state/approval.js";
import type { HarnessWorld, TimerFunctions } from "./world.js";
import { realTimers } from "./world.js";
import { effectScope, launchKey } from "./effects.js";

/**
 * Boundaries where a test can stop the world (DBOS's debugpoint idea): the chaos suite SIGKILLs the
 * process at each. Undefined in production: no cost.
 */
export type HarnessFaultPoint =
  | "patch:committed" // a patch was accepted and committed; nothing dispatched yet
  | "execution:started-committed" // the launch is authorized and committed; the child has not run
  | "execution:exited" // the child exited; its result is not committed yet
  | "model:response-committed" // a complete model response is committed (with its verdict, when both fit one commit)
  | "effect:begun-committed" // a cell's effect begin is committed; the cell has not been answered
  | "effect:ended-committed" // a cell's effect end is committed; the cell has not been answered
  | "steer:committed" // an operator's request (pause, cancel, approval...) is committed; nothing acted on it yet
  | "approval:requested" // a cell's approval request is committed; it waits
  | "cancel:cells-stopped" // a cancelled run's started cells are recorded; queued ones and the run's end are not
  | "fork:batch-committed"; // one batch of a fork's copy of its origin is committed; the copy is not complete
export type HarnessFaults = (point: HarnessFaultPoint, detail: { session: string; cell?: number; turn?: string }) => void | Promise<void>;

export interface HarnessCore {
  readonly name: string;
  readonly world: HarnessWorld;
  readonly model: Model;
  readonly limits: HarnessLimits;
  readonly logger: Logger;
  readonly metrics: Metrics | null;
  /** Spans of this harness's runs (NO_TRACING when traces are off). */
  readonly tracing: Tracing;
  readonly faults: HarnessFaults | null;
  /** The world's timer functions (real ones unless a test injects its own). */
  readonly timers: TimerFunctions;
  /** This worker's approval rules, for every run it drives (besides each run's own). */
  readonly approval: readonly ApprovalRule[];
  /** Where a session's script cells are written: a private directory of its own. */
  scriptDir(session: string): string;
  /**
   * What a launch of `cell` in `session` gets: its CAIRN_* environment (with a fresh cell token) and
   * its boundary (sandbox, network, hidden paths, limits). `ended` revokes the token.
   */
  cellLaunch(session: string, cell: number): { env: Record<string, string>; boundary: CellBoundary; ended(): void };
  /** The boundary validators of `session` run in. */
  boundary(session: string): CellBoundary;
  /**
   * Commits one atomic batch and folds it into the projection before resolving. Serialized: commits
   * from one harness never interleave. Throws the Storage errors; after a fence or an uncertain
   * commit the harness stops and every later commit throws.
   */
  commit(events: readonly NewEvent[]): Promise<readonly LogEvent[]>;
  session(id: string): SessionProjection | undefined;
  headSeq(): number;
  /** ISO timestamp from the injected clock. */
  nowIso(): string;
  /** True once the harness is closing, fenced or poisoned: launch nothing more. */
  stopping(): boolean;
  /**
   * How long a stopping driver waits, once its cell is killed, for that cell's last output to be
   * committed: one lease length (a storage out of reach would hold it forever), Infinity without one.
   */
  stopWaitMs(): number;
  /** A session's driver stopped on an unexpected error: the run is not over, but it is not moving. */
  failed(session: string, err: unknown): void;
  /** Resolves after `ms`, or early (false) when the harness stops. */
  sleep(ms: number): Promise<boolean>;
}

/** What the owner of a database (the Harness) gives its drivers besides its configuration. */
export interface CoreOwner {
  commit(events: readonly NewEvent[]): Promise<readonly LogEvent[]>;
  session(id: string): SessionProjection | undefined;
  headSeq(): number;
  stopping(): boolean;
  stopWaitMs(): number;
  failed(session: string, err: unknown): void;
  sleep(ms: number): Promise<boolean>;
  scriptDir(session: string): string;
  boundary(session: string): CellBoundary;
  /** A cell token for the cell socket (null when it does not listen), and its revocation. */
  issueToken(session: string, cell: number): string | null;
  revokeToken(token: string): void;
}

/** The HarnessCore of database `name`, with `owner` behind its commit path and status. */
export function createCore(
  config: Pick<HarnessCore, "name" | "world" | "model" | "limits" | "logger" | "metrics" | "tracing" | "faults" | "approval">,
  owner: CoreOwner,
): HarnessCore {
  const { name, world } = config;
  config.tracing.database(name, (session) => {
    const s = owner.session(session);
    return s === undefined ? undefined : { goal: s.goal, created_at: s.created_at, seed: s.effect_seed };
  });
  return {
    ...config,
    timers: world.timers ?? realTimers,
    scriptDir: (session) => owner.scriptDir(session),
    cellLaunch: (session, cell) => {
      const env: Record<string, string> = { CAIRN_DB: name, CAIRN_SESSION: session, CAIRN_CELL: String(cell) };
      const s = owner.session(session);
      if (s !== undefined) env.CAIRN_EFFECT_KEY = launchKey(effectScope(name, s), cell);
      const token = owner.issueToken(session, cell);
      if (token !== null) env.CAIRN_CELL_TOKEN = token;
      return { env, boundary: owner.boundary(session), ended: () => (token === null ? undefined : owner.revokeToken(token)) };
    },
    boundary: (session) => owner.boundary(session),
    commit: (events) => owner.commit(events),
    session: (id) => owner.session(id),
    headSeq: () => owner.headSeq(),
    nowIso: () => new Date(world.clock.now()).toISOString(),
    stopping: () => owner.stopping(),
    stopWaitMs: () => owner.stopWaitMs(),
    failed: (session, err) => owner.failed(session, err),
    sleep: (ms) => owner.sleep(ms),
  };
}
