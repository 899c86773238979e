/**
 * The world the harness touches, injected so that tests control time, processes and the model.
 * Production wiring (`defaultWorld`) uses the real clock, the execa executor and /proc.
 */
import type { ProcessIdentity } from "../state/projection.js";
import type { ExecutionOutcome, LaunchSpec, Prepared } from "../exec/executor.js";
import { createExecutor } from "../exec/executor.js";
import { bootId, hostName, stopSurvivor } from "../exec/identity.js";

export type { ExecutionOutcome, LaunchSpec, Prepared };

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
}

export interface HarnessWorld {
  readonly clock: Clock;
  readonly host: string;
  readonly bootId: string;
  readonly executor: { prepare(spec: LaunchSpec): Promise<Prepared> };
  /** Finds a child a dead worker left behind (same host, pid AND start time) and stops its group. */
  stopSurvivor(identity: ProcessIdentity, options: { graceMs: number }): Promise<{ worker_stopped: boolean; detail: string }>;
}

export function defaultWorld(): HarnessWorld {
  return {
    clock: { now: () => Date.now() },
    host: hostName(),
    bootId: bootId(),
    executor: createExecutor(),
    stopSurvivor: (identity, options) => stopSurvivor(identity, options),
  };
}
