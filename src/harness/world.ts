/**
 * The world the harness touches, injected so that tests control time, processes and the model.
 * Production wiring (`defaultWorld`) uses the real clock, the executor (src/exec) and /proc.
 */
import type { ProcessIdentity } from "../state/projection.js";
import type { ExecutionOutcome, LaunchSpec, Prepared } from "../exec/executor.js";
import { createExecutor } from "../exec/executor.js";
import { bootId, hostName, stopSurvivor } from "../exec/identity.js";

export type { ExecutionOutcome, LaunchSpec, Prepared };

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Waits `ms` (model-call backoff). Default: a real timer that ends early when the harness stops. */
  sleep?(ms: number): Promise<unknown>;
}

/**
 * How the harness arms its timers (session timers, the wall-time budget, retry back-off). Injected so
 * tests can run time forward without real sleeps; the default is the global setTimeout.
 */
export interface TimerFunctions {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const realTimers: TimerFunctions = {
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout),
};

export interface HarnessWorld {
  readonly clock: Clock;
  /** Default: the global setTimeout and clearTimeout. */
  readonly timers?: TimerFunctions;
  readonly host: string;
  readonly bootId: string;
  readonly executor: { prepare(spec: LaunchSpec): Promise<Prepared> };
  /** Finds a child a dead worker left behind (same host, pid AND start time) and stops its group. */
  stopSurvivor(identity: ProcessIdentity, options: { graceMs: number }): Promise<{ worker_stopped: boolean; detail: string }>;
}

export function defaultWorld(): HarnessWorld {
  return {
    clock: { now: () => Date.now() },
    timers: realTimers,
    host: hostName(),
    bootId: bootId(),
    executor: createExecutor(),
    stopSurvivor: (identity, options) => stopSurvivor(identity, options),
  };
}
