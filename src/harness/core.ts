/**
 * What a session driver needs from its harness: the one commit path, the projection, the world.
 * Kept as an interface so the round loop, dispatch and controls stay apart from ownership and I/O.
 */
import type { Logger } from "pino";
import type { LogEvent, NewEvent } from "../state/events.js";
import type { SessionProjection } from "../state/projection.js";
import type { Model } from "../model/contract.js";
import type { Metrics } from "../observability/metrics.js";
import type { HarnessLimits } from "./options.js";
import type { HarnessWorld, TimerFunctions } from "./world.js";
import { realTimers } from "./world.js";

/**
 * Boundaries where a test can stop the world (DBOS's debugpoint idea): the chaos suite SIGKILLs the
 * process at each. Undefined in production: no cost.
 */
export type HarnessFaultPoint =
  | "patch:committed" // a patch was accepted and committed; nothing dispatched yet
  | "execution:started-committed" // the launch is authorized and committed; the child has not run
  | "execution:exited" // the child exited; its result is not committed yet
  | "model:response-committed"; // a complete model response is committed (with its verdict, when both fit one commit)
export type HarnessFaults = (point: HarnessFaultPoint, detail: { session: string; cell?: number; turn?: string }) => void | Promise<void>;

export interface HarnessCore {
  readonly name: string;
  readonly world: HarnessWorld;
  readonly model: Model;
  readonly limits: HarnessLimits;
  readonly logger: Logger;
  readonly metrics: Metrics | null;
  readonly faults: HarnessFaults | null;
  /** The world's timer functions (real ones unless a test injects its own). */
  readonly timers: TimerFunctions;
  /** Where script cells are written. */
  readonly scriptDir: string;
  /** Environment given to every cell (the timer socket and friends), besides the session's own. */
  readonly cellEnv: (session: string, cell: number) => Record<string, string>;
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
  /** The timer socket's path, while it listens. */
  timerSocket(): string | null;
}

/** The HarnessCore of database `name`, with `owner` behind its commit path and status. */
export function createCore(
  config: Pick<HarnessCore, "name" | "world" | "model" | "limits" | "logger" | "metrics" | "faults" | "scriptDir">,
  owner: CoreOwner,
): HarnessCore {
  const { name, world } = config;
  return {
    ...config,
    timers: world.timers ?? realTimers,
    cellEnv: (session, cell) => {
      const env: Record<string, string> = { CAIRN_DB: name, CAIRN_SESSION: session, CAIRN_CELL: String(cell) };
      const socket = owner.timerSocket();
      if (socket !== null) env.CAIRN_TIMER_SOCKET = socket;
      return env;
    },
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
